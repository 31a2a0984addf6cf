#![recursion_limit = "256"]
//! The metfs daemon as a library: configuration, the daemon's state machine and the control
//! socket. The crates split out along dependency weight (the view index, the file system core
//! and its FUSE adapter in `metfs-fs`, the protocol, the run report, dynamic sharding, aggregate
//! mode's exchange) are named by their own paths, never re-exported here. The `metfs` binary
//! (`bin/metfs/`) is a thin CLI over these modules; tests, fuzz targets and benchmarks use them
//! directly.

pub mod client;
pub mod config;
pub mod control;
pub mod daemon;
pub mod doctor;
pub mod events;
pub mod logging;
pub mod metrics;
pub mod mount;
pub mod rotate;
pub mod runas;
