//! The decision side of metfs: when does the view move on to the next mini-epoch?
//!
//! * [`Metrics`]: the metrics of one pass, by name, as a job reports them at a pass end (the
//!   control-socket protocol that carries them is `metfs_protocol`).
//! * [`policy`]: the [`policy::RfPolicy`] seam and its policies (fixed, score, Bollinger band,
//!   learned), with `rf_min` / `rf_max` enforced for all of them by [`policy::Bounded`].
//! * [`config`]: [`config::PolicyConfig`], the documented knobs of every policy, and
//!   [`config::build_policy`], which validates them and builds the bounded policy.
//! * [`history`]: the rf history of past runs, keyed by dataset and job, that `learned` replays.
//!
//! This crate does no I/O except reading and writing the history file, and never depends on
//! `metfs` or `metfs-prefetcher`.

pub mod config;
pub mod history;
pub mod policy;

/// Metrics of one pass, by name. Values are finite numbers (the protocol's reader checks them).
pub type Metrics = std::collections::BTreeMap<String, f64>;
