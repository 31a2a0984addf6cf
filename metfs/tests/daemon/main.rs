//! The daemon driven as a library on a temporary POSIX tier: a directory of generated files as
//! the source and another as the cache. Most tests go through `FsCore` (what the FUSE adapter
//! calls) without a mount, doing what the kernel would: `lookup` then `forget`, `opendir` /
//! `readdir` / `release`, `open` / `read` / `release`. One test mounts the view with FUSE and
//! reads it with `std::fs`.

mod common;

mod budget;
mod faults;
mod kernel;
mod learned;
mod model;
mod paced;
mod passes;
mod resume;
