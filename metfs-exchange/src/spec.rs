//! What a node's daemon and its exchange agree on, in one place: the spec the daemon writes at
//! mount (`CACHE/aggregate.json`, [`ExchangeSpec`]), how samples cross ([`ShuffleCode`], the
//! `--shuffle-code` setting), the names of an epoch's slot and inbox in the stager's slot
//! directory, and the catalog digest both sides compare. The daemon (`metfs`'s
//! `daemon::aggregate`) writes and opens; the exchange (this crate, `metfs-shuffle`) reads and
//! fills.
//!
//! # The inbox's protocol
//!
//! 1. The daemon's staging of epoch `e` creates the inbox directory [`inbox_dir`] (empty, 0700):
//!    from then on the exchange may fill it, and its bytes are already counted in the slot's
//!    reservation. Until it exists, the exchange waits ([`crate::Node::inbox_open`]).
//! 2. The exchange renames each checked sample into it and appends `<id> <crc>` to its journal
//!    ([`inbox_journal`], the stager's [`SlotJournal`]), then `complete` (`crate::inbox`).
//! 3. The daemon waits for `complete` (or its timeout), stages the slot linking from the inbox
//!    as from any slot, and removes the directory and its journal.
//!
//! **Invariant:** both sides build these names with the functions below and nothing else, and a
//! spec of another [`SPEC_VERSION`] is refused, never half read: a daemon and an exchange of
//! different builds either agree on every path or do not exchange at all.

use std::path::{Path, PathBuf};

use metfs_prefetcher::stager::{slot_name, SlotJournal};
use metfs_tier::catalog::Catalog;
use serde::{Deserialize, Serialize};

/// The file `metfs-shuffle` reads in the cache directory.
pub const SPEC_FILE: &str = "aggregate.json";

/// The sample groups' file in the cache directory, when samples are groups
/// ([`crate::layouts`]).
pub const GROUPS_FILE: &str = "groups.bin";

/// Version of [`ExchangeSpec`]; `metfs-shuffle` refuses another. 2: the sample groups.
pub const SPEC_VERSION: u32 = 2;

/// How the samples a node needs cross the network.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum ShuffleCode {
    /// Each needed sample is sent once, by one node that holds it (the baseline).
    #[default]
    #[serde(rename = "uncoded")]
    #[cfg_attr(feature = "clap", value(name = "uncoded"))]
    Uncoded,
    /// UberShuffle's coded multicast (paper 002): XOR packets over fixed-size blocks, each
    /// useful to several nodes at once, sent by the nodes that hold their operands.
    #[serde(rename = "uberShuffle")]
    #[cfg_attr(feature = "clap", value(name = "uberShuffle"))]
    UberShuffle,
}

impl std::fmt::Display for ShuffleCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ShuffleCode::Uncoded => "uncoded",
            ShuffleCode::UberShuffle => "uberShuffle",
        })
    }
}

/// What the exchange of a node needs to know of its daemon (`CACHE/aggregate.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExchangeSpec {
    /// [`SPEC_VERSION`].
    pub v: u32,
    /// This node's rank.
    pub rank: u32,
    /// Nodes in the job.
    pub nodes: u32,
    /// The planner's seed.
    pub seed: u64,
    /// Bytes one node holds for one epoch (a slot).
    pub budget: u64,
    /// Probability of keeping an extra sample.
    pub extra: f64,
    /// How samples cross between nodes.
    pub code: ShuffleCode,
    /// Digest of the catalog (paths, sizes, versions): the same on every node, or the ranks
    /// refuse to exchange.
    pub catalog_digest: String,
    /// The capacity tier's URL.
    pub source: String,
    /// The stager's slot directory (slots, journals, inboxes).
    pub slots: PathBuf,
    /// The saved catalog.
    pub catalog: PathBuf,
    /// The sample groups the daemon plans over ([`GROUPS_FILE`]), where samples are not each
    /// one file: planned over alike on every rank ([`crate::layouts::EpochLayouts`]).
    #[serde(default)]
    pub groups: Option<GroupsRef>,
    /// The daemon's control socket.
    pub socket: PathBuf,
    /// The daemon's process id: the exchange stops when it is gone.
    pub pid: u32,
}

/// Where the sample groups are and the digest of their bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupsRef {
    /// The groups file ([`metfs_plan::groups::SampleGroups::encode`]).
    pub path: PathBuf,
    /// [`crate::layouts::groups_digest`] of its bytes, 16 hex digits.
    pub digest: String,
}

/// Reads an [`ExchangeSpec`], refusing another version.
pub(crate) fn parse_spec(text: &[u8]) -> Result<ExchangeSpec, String> {
    let spec: ExchangeSpec =
        serde_json::from_slice(text).map_err(|e| format!("not a valid spec: {e}"))?;
    if spec.v != SPEC_VERSION {
        return Err(format!(
            "version {} where this metfs-shuffle reads {SPEC_VERSION}; use the daemon's metfs-shuffle",
            spec.v
        ));
    }
    Ok(spec)
}

/// The slot of epoch `epoch` in aggregate mode (its one mini-epoch, `0`).
pub fn slot_of_epoch(epoch: u64) -> String {
    slot_name(epoch, 0)
}

/// The inbox the exchange fills for epoch `epoch`'s slot: its name in the slot directory.
pub fn inbox_of_epoch(epoch: u64) -> String {
    format!("inbox-e{epoch:06}")
}

/// The inbox directory of epoch `epoch` under the slot directory `slots`.
pub fn inbox_dir(slots: &Path, epoch: u64) -> PathBuf {
    slots.join(inbox_of_epoch(epoch))
}

/// The journal of epoch `epoch`'s inbox under the slot directory `slots`.
pub fn inbox_journal(slots: &Path, epoch: u64) -> SlotJournal {
    SlotJournal::of(slots, &inbox_of_epoch(epoch))
}

/// Digest of a catalog: every sample's path, size and version, in catalog order. The spec
/// carries it as 16 hex digits ([`ExchangeSpec::catalog_digest`]).
pub fn catalog_digest(catalog: &Catalog) -> u64 {
    metfs_plan::digest::catalog_digest(catalog, metfs_plan::digest::CatalogDigest::Contents)
}
