#![recursion_limit = "256"]
//! The metfs daemon as a library: configuration, the daemon's state machine and the control
//! socket, with the crates split out along dependency weight re-exported at their old paths:
//! the view index, the filesystem core and its FUSE adapter (`metfs-fs`), the protocol, the run
//! report, dynamic sharding and aggregate mode's exchange (`metfs-exchange`). The `metfs`
//! binary (`bin/metfs/`) is a thin CLI over these modules; tests, fuzz targets and benchmarks
//! use them directly.

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

// Split out along dependency weight, kept at their old paths for the daemon and the CLI.
pub use metfs_dds as dds;
pub use metfs_exchange as exchange;
pub use metfs_fs::{fs, fuse, view};
pub use metfs_protocol as protocol;
pub use metfs_report as report;
