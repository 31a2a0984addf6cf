//! Aggregate-cache mode (`metfs mount --aggregate`, paper 002): the nodes of a job hold the
//! dataset together, and each epoch's new assignment of samples to nodes is filled from the
//! other nodes' caches instead of the capacity tier.
//!
//! # One mini-epoch per epoch per node
//!
//! Epoch `e` is one mini-epoch on each node: its share `S(e, i)` of a uniformly random
//! partition of the dataset (the `metfs-shuffle` crate's planner, a pure function of the catalog,
//! the node count, the seed and the epoch, so every node computes every node's share). Its
//! slot holds the node's cache `C(e, i)`: the share plus the extras, samples outside the
//! share kept with probability `aggregate.extra` as the slot's bytes allow. The view shows
//! the share only, so the nodes' views partition the dataset every epoch. MET's repeat and
//! feedback run on top unchanged: the view is repeated rf times while the next epoch's slot
//! is staged.
//!
//! # Where the next slot comes from
//!
//! Staging `C(e + 1, i)` takes each sample from, in this order:
//! 1. the node's own slots (the current one holds `C(e, i)`): a hard link, as for any slot;
//! 2. the **inbox** of epoch `e + 1` (`slots/inbox-e…`, a slot-like directory with a journal
//!    of `<id> <crc>` lines): what `metfs-shuffle`, one MPI rank per node, received from the
//!    other nodes, each sample checked against its length and the CRC-32 its sender's journal
//!    recorded when it was fetched from the tier; the stager checks that CRC again as it links;
//! 3. the tier, for whatever is left: epoch 0, and samples the exchange did not bring.
//!
//! The staging creates the inbox directory when it starts (its bytes are then already
//! counted: the slot's reservation covers every sample the inbox can hold), which tells the
//! node's `metfs-shuffle` that it may fill it; it then waits until the inbox's journal ends
//! with `complete`, or `aggregate.timeout_secs` (a dead node, or no `metfs-shuffle`), and
//! stages. A timeout is logged, shown in `status` (`last_error`, `aggregate`) and the rest
//! fetched from the tier: a node's failure costs the others one slower epoch, never a sample.
//! After the staging the inbox is removed (its files live on as the slot's links).
//!
//! A fault that lasts defers as on a plain mount (docs/RELIABILITY.md, "Faults that last"):
//! deferred samples of the share are carried into the node's next epoch, shown there besides
//! that epoch's share; deferred extras are left out. A peer that expects one of them from this
//! node is sent it as missing (the sender cannot read it) and takes it from the tier.
//!
//! # Samples of several files
//!
//! With sample groups (`--group-by`, `--always`, a format; `daemon::samples`) the planner
//! deals samples and the layout is expanded back to files, in one place both sides use
//! (`metfs_exchange::layouts::EpochLayouts`): a sample's files share a node and cross
//! together, and the always files are in every node's share (each node stages its own copy
//! once; they never cross). The groups reach the exchange as `CACHE/groups.bin`, named with
//! their digest in the spec; ranks whose groups differ refuse to exchange.
//!
//! # How far coding goes
//!
//! With `--shuffle-code uberShuffle` every rank computes the whole coded plan of every epoch,
//! one entry per 4 KiB block that moves. The mount estimates that plan from the catalog
//! before any epoch (`metfs_shuffle::coded::estimate`) and refuses, with the estimate, past 128
//! nodes, 10M blocks or an estimated minute of planning, suggesting `uncoded`
//! (docs/BENCHMARKS.md, "Many nodes: coded shuffling's tables").
//!
//! # What `metfs-shuffle` reads
//!
//! `CACHE/aggregate.json` ([`ExchangeSpec`]), written at mount: the node's rank, the planner's
//! settings, the catalog's digest (ranks refuse to exchange when any differs), and where the
//! slots and the control socket are. The catalog itself is `CACHE/catalog.bin`. The spec, the
//! names of an epoch's slot and inbox and the inbox's protocol are the exchange crate's
//! (`metfs_exchange::spec`), so that both sides build them the same way.

use crate::config::aggregate::{AggregateConfig, ShuffleCode};
use crate::config::MountConfig;
use crate::daemon::store::Store;
use crate::daemon::{CachePaths, DaemonError};
use metfs_exchange::layouts::EpochLayouts;
use metfs_exchange::{GroupsRef, GROUPS_FILE};
use metfs_fs::lock_order::{Level, OrderedMutex};
use metfs_plan::groups::SampleGroups;
use metfs_plan::size::format_bytes;
use metfs_shuffle::Layout;
use metfs_tier::catalog::Catalog;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

// The names, the spec and the digest the daemon and its exchange agree on live with the
// exchange (`metfs_exchange::spec`); they are re-exported here at their old paths.
pub use metfs_exchange::spec::{
    catalog_digest, inbox_dir, inbox_journal, inbox_of_epoch, slot_of_epoch, ExchangeSpec,
    SPEC_FILE, SPEC_VERSION,
};

/// How a staging's wait for the exchange ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct ExchangeWait {
    pub(super) epoch: u64,
    pub(super) complete: bool,
    pub(super) secs: f64,
}

/// A node's plan in aggregate mode (module docs).
pub(super) struct Aggregate {
    /// The planner's inputs, the same the node's exchange reads ([`EpochLayouts`]).
    plan: EpochLayouts,
    pub(super) rank: u32,
    pub(super) code: ShuffleCode,
    pub(super) timeout: Duration,
    /// Layouts of the last few epochs (the planner is pure; these are a cache).
    layouts: OrderedMutex<BTreeMap<u64, Arc<Layout>>>,
    /// The last wait for an exchange, for `status`.
    pub(super) last_wait: OrderedMutex<Option<ExchangeWait>>,
}

impl Aggregate {
    /// The plan of node `cfg.node_rank` of `cfg.nodes` over files of `footprints` (of the
    /// samples of `groups` where files are grouped), each epoch's cache at most `slot_bytes`.
    /// Refuses, with the numbers, a dataset that does not fit the nodes' slots together, or
    /// whose shares could overflow a slot in some epoch, and `uberShuffle` where its plan
    /// would pass the coded exchange's limits.
    pub(super) fn new(
        cfg: &MountConfig,
        mode: &AggregateConfig,
        footprints: Vec<u64>,
        groups: Option<SampleGroups>,
        slot_bytes: u64,
    ) -> Result<Self, DaemonError> {
        let settings = metfs_shuffle::AggregateConfig {
            nodes: cfg.nodes,
            seed: cfg.seed,
            budget: slot_bytes,
            extra: mode.extra,
        };
        let plan = EpochLayouts::new(footprints, groups, settings);
        let (units, dealt) = plan.dealt();
        let always = slot_bytes - dealt;
        let unit = if plan.groups().is_some() {
            "sample (of one or more files)"
        } else {
            "sample"
        };
        let refuse = |e: &dyn std::fmt::Display| {
            let after = if always > 0 {
                format!(" and {} of files in every view", format_bytes(always))
            } else {
                String::new()
            };
            DaemonError::Setup(format!(
                "aggregate mode ({} nodes, {} per node for one epoch after metadata{after}): {e}",
                cfg.nodes,
                format_bytes(dealt)
            ))
        };
        let first = plan.layout(0).map_err(|e| refuse(&e))?;
        // The random cut gives each share at most one sample more than an even split: with
        // that much room every epoch's share fits, so no later epoch can fail.
        let total: u64 = units.iter().sum();
        let largest = units.iter().copied().max().unwrap_or(0);
        let worst = total.div_ceil(u64::from(cfg.nodes.max(1))) + largest;
        if worst > dealt {
            return Err(refuse(&format!(
                "a node's share of an epoch can reach {} (the dataset's {} over {} nodes, plus \
                 one {unit} of up to {}), more than a slot's {}; use more nodes or a budget of \
                 at least {} per node",
                format_bytes(worst),
                format_bytes(total),
                cfg.nodes,
                format_bytes(largest),
                format_bytes(dealt),
                format_bytes(cfg.budget + 2 * (worst - dealt)),
            )));
        }
        if mode.code == ShuffleCode::UberShuffle {
            let dealt_settings = metfs_shuffle::AggregateConfig {
                budget: dealt,
                ..settings
            };
            coded_within_limits(units, &dealt_settings).map_err(|e| refuse(&e))?;
        }
        Ok(Self {
            plan,
            rank: cfg.node_rank,
            code: mode.code,
            timeout: Duration::from_secs(mode.timeout_secs),
            layouts: OrderedMutex::new(Level::Layouts, BTreeMap::from([(0, Arc::new(first))])),
            last_wait: OrderedMutex::new(Level::LastWait, None),
        })
    }

    /// The planner's settings (the budget is the whole slot's).
    pub(super) fn settings(&self) -> &metfs_shuffle::AggregateConfig {
        self.plan.settings()
    }

    /// Epoch `epoch`'s layout (every node's share and cache).
    pub(super) fn layout(&self, epoch: u64) -> Arc<Layout> {
        let mut ls = self.layouts.lock().unwrap();
        if let Some(l) = ls.get(&epoch) {
            return l.clone();
        }
        // `new` checked that every epoch's shares fit: the planner cannot refuse a later one.
        let l = Arc::new(
            self.plan
                .layout(epoch)
                .expect("aggregate mode checked at mount that every epoch fits"),
        );
        ls.insert(epoch, l.clone());
        while ls.len() > 4 {
            ls.pop_first();
        }
        l
    }

    /// What this node's slot of epoch `epoch` holds (share and extras) and its footprint.
    pub(super) fn cache(&self, epoch: u64) -> (Vec<u32>, u64) {
        let l = self.layout(epoch);
        (l.cache(self.rank).to_vec(), l.cache_bytes(self.rank))
    }

    /// What this node's view of epoch `epoch` shows: its share.
    pub(super) fn share(&self, epoch: u64) -> Vec<u32> {
        self.layout(epoch).share(self.rank).to_vec()
    }

    /// Creates the inbox of epoch `epoch` (empty): the node's exchange may fill it now.
    pub(super) fn open_inbox(slots: &Path, epoch: u64) {
        let dir = inbox_dir(slots, epoch);
        if let Err(e) = metfs_prefetcher::stager::create_private_dir(&dir) {
            tracing::warn!(inbox = %dir.display(), error = %e, "cannot create the exchange's inbox; the epoch comes from the tier");
        }
    }

    /// Waits until the exchange has filled epoch `epoch`'s inbox (its journal says
    /// `complete`), or the timeout, or until `stop` says the daemon is going; says so (in the
    /// log and the store's last error) when it gave up.
    pub(super) async fn wait_for_exchange(
        &self,
        slots: &Path,
        epoch: u64,
        stop: &(dyn Fn() -> bool + Sync),
        store: &Store,
    ) -> ExchangeWait {
        let journal = inbox_journal(slots, epoch);
        let t0 = Instant::now();
        let complete = loop {
            if journal.is_complete() {
                break true;
            }
            if t0.elapsed() >= self.timeout || stop() {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let wait = ExchangeWait {
            epoch,
            complete,
            secs: t0.elapsed().as_secs_f64(),
        };
        if complete {
            tracing::info!(epoch, secs = wait.secs, "the exchange filled the inbox");
        } else if !stop() {
            let msg = format!(
                "aggregate: the exchange for epoch {epoch} did not complete within {} s (a node died, or metfs-shuffle is not running on this node): the samples it did not bring come from the tier",
                self.timeout.as_secs()
            );
            tracing::warn!("{msg}");
            store.note_error(msg);
        }
        *self.last_wait.lock().unwrap() = Some(wait);
        wait
    }

    /// Removes epoch `epoch`'s inbox once its slot is staged (the slot's links keep the files).
    pub(super) fn close_inbox(slots: &Path, epoch: u64) {
        // `remove_dir_all` does not follow symlinks inside the directory.
        let _ = std::fs::remove_dir_all(inbox_dir(slots, epoch));
        let _ = inbox_journal(slots, epoch).remove();
    }
}

/// Refuses `--shuffle-code uberShuffle` where its plan would be too large to compute every
/// epoch on every node (`metfs_shuffle::coded::estimate`: more nodes than a coding table names, or
/// more points than its limit), with the estimate, before any epoch is planned. The
/// units' footprints (a file's, or a sample's files') stand in for the catalog's bytes.
fn coded_within_limits(
    units: &[u64],
    settings: &metfs_shuffle::AggregateConfig,
) -> Result<(), metfs_shuffle::coded::EstimateError> {
    let e = metfs_shuffle::coded::estimate(
        units,
        settings.nodes,
        settings.extra,
        settings.budget,
        metfs_exchange::coded::BLOCK,
    )?;
    metfs_shuffle::coded::estimate::check(e).map(|_| ())
}

impl Aggregate {
    /// Writes `CACHE/aggregate.json` for the node's `metfs-shuffle`.
    pub(super) fn write_exchange_spec(
        &self,
        catalog: &Catalog,
        cfg: &MountConfig,
        paths: &CachePaths,
    ) -> Result<(), DaemonError> {
        let write = |path: &Path, bytes: &[u8]| {
            metfs_durable::write(path, bytes, metfs_durable::Durability::Atomic)
                .map_err(|e| DaemonError::Setup(format!("cannot write {}: {e}", path.display())))
        };
        // The groups first: a spec never names a groups file that is not there yet.
        let groups = match self.plan.groups() {
            Some(g) => {
                let path = paths.root.join(GROUPS_FILE);
                let bytes = g.encode();
                write(&path, &bytes)?;
                Some(GroupsRef {
                    path,
                    digest: format!("{:016x}", self.plan.groups_digest()),
                })
            }
            None => None,
        };
        let a = self.settings();
        let spec = ExchangeSpec {
            v: SPEC_VERSION,
            rank: self.rank,
            nodes: a.nodes,
            seed: a.seed,
            budget: a.budget,
            extra: a.extra,
            code: self.code,
            catalog_digest: format!("{:016x}", catalog_digest(catalog)),
            source: cfg.source.clone(),
            slots: paths.slots.clone(),
            catalog: paths.catalog.clone(),
            groups,
            socket: cfg.socket.clone(),
            pid: std::process::id(),
        };
        let text = serde_json::to_vec_pretty(&spec).expect("the spec serializes");
        write(&paths.root.join(SPEC_FILE), &text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(nodes: u32, per_node: usize) -> (Vec<u64>, metfs_shuffle::AggregateConfig) {
        let sizes = vec![110 * 1024; nodes as usize * per_node];
        let total: u64 = sizes.iter().sum();
        let settings = metfs_shuffle::AggregateConfig {
            nodes,
            seed: 1,
            budget: 3 * total / u64::from(nodes),
            extra: 1.0 / f64::from(nodes.max(2) - 1),
        };
        (sizes, settings)
    }

    #[test]
    fn coded_plans_within_the_limits_pass() {
        let (sizes, s) = settings(8, 1_000);
        assert_eq!(coded_within_limits(&sizes, &s), Ok(()));
    }

    #[test]
    fn coded_plans_past_the_limits_are_refused_with_the_numbers() {
        // 128 nodes of 10,000 samples of 110 KiB: ~35M blocks move per epoch.
        let (sizes, s) = settings(128, 10_000);
        let e = coded_within_limits(&sizes, &s).unwrap_err().to_string();
        for want in [
            "35.3M points (blocks that move) per epoch",
            "limit of 10.0M",
            "tables",
            "GiB",
            "uncoded",
        ] {
            assert!(e.contains(want), "{want}: {e}");
        }
        let (sizes, s) = settings(256, 10);
        let e = coded_within_limits(&sizes, &s).unwrap_err().to_string();
        assert!(e.contains("at most 128 nodes, not 256"), "{e}");
        assert!(e.contains("--shuffle-code uncoded"), "{e}");
        let (sizes, mut s) = settings(8, 10);
        s.nodes = 0;
        let e = coded_within_limits(&sizes, &s).unwrap_err().to_string();
        assert!(e.contains("at least one node"), "{e}");
    }
}
