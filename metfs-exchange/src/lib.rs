//! A node's side of aggregate-cache mode's exchange, without the transport: what this node
//! sends to each other node for an epoch's inbox, the frames that carry it, and the inbox that
//! checks and keeps what arrives. `metfs-shuffle` (`src/bin/metfs-shuffle/`, the `mpi`
//! feature) moves the frames over MPI; everything here is testable without it. The daemon's
//! side is `metfs`'s `daemon::aggregate`; what both sides agree on (the spec file, the names of
//! an epoch's slot and inbox, the catalog digest) is [`spec`]. `metfs` re-exports this crate
//! as `metfs_exchange`.
//!
//! The crate is apart from `metfs` so that it builds and tests without the daemon's heavy
//! dependencies (FUSE, etcd's gRPC, plotters): it needs only the catalog and the slot journal
//! (`metfs-tier`, `metfs-prefetcher`) and the plans (`metfs-shuffle`), and MPI only for the binary.
//!
//! # Who sends what
//!
//! Every node computes the same two layouts (epochs `t − 1` and `t`, the `metfs-shuffle` planner over
//! the daemon's catalog and settings, `CACHE/aggregate.json`) and the transition between them:
//! for each node, each sample of its next cache comes from its own slot, from one named peer,
//! or from the tier. What crosses the network is read from the sender's slot of epoch
//! `t − 1`, which holds its whole cache `C(t − 1, i)` (share and extras), and travels with the
//! CRC-32 that slot's journal recorded when the sample was fetched from the tier (not
//! recomputed: what is sent is checked once, where it arrives).
//!
//! * **Uncoded** ([`uncoded`], the default): a node sends each peer the samples the
//!   transition names it for, one frame per sample.
//! * **Coded** ([`coded`], `--shuffle-code uberShuffle`): every node computes the same
//!   UberShuffle plan for the epoch (the demands of the transition, the carpool in peers mode,
//!   each packet's sender); a node encodes the packets it is the sender of and sends each to
//!   its receivers, which decode their blocks with what they hold and reassemble the samples.
//!   What the coded plan does not cover (zero-byte samples) goes uncoded.
//!
//! # The extra rank
//!
//! With [`SenderMode::Extra`] (`metfs-shuffle --sender extra`, the paper's model) the job has
//! one rank more than nodes, rank `nodes`, which is no node: no daemon, no cache. It is built
//! from rank 0's spec and catalog ([`Node::extra`], which refuses another spec version or a
//! catalog whose digest is not the spec's) and reads from the capacity tier (the daemons'
//! POSIX source) every sample it sends uncoded ([`Node::outgoing`]: everything a node would
//! get from a peer) or every operand of the coded packets (the carpool for the extra rank,
//! every packet's sender). The nodes send nothing and expect everything from it
//! ([`Node::expected`]); what they receive goes through the same checks. What it reads is
//! the catalogued sample or nothing (the `slot` module docs): a sample changed at the source
//! is sent as missing and its node's daemon finds out for itself. The transport's flags are
//! the same on every rank, and part of what the ranks agree on before the first exchange.
//!
//! # Rounds
//!
//! The transport is bulk-synchronous: in each round every rank hands every other rank one
//! part of at most the chunk size ([`uncoded::Outbox::round`], [`coded::Encoder::round`]) and
//! passes each part it receives to [`Inbox::accept`] or [`coded::Decoder::accept`]; with
//! [`Broadcast::Ring`] the round is followed by ring stages, each handing on the parts
//! [`coded::Decoder::forwards`] queued, until no rank has a part to forward; all this until no
//! rank has anything left. It counts what it puts on the wire and takes off it, frame by
//! frame and message by message ([`ExchangeReport`]).
//!
//! # The inbox
//!
//! A sample enters the inbox ([`Inbox`]) only if it is one this node expects (from that
//! sender, for an uncoded frame), its length is the catalog's and the CRC-32 of its bytes is
//! its sender's; it is written to a temporary file, made read-only and renamed into place,
//! then journaled (`<id> <crc>`), so the daemon's stager, which links from the inbox like from
//! any slot and checks the CRC again, never sees a partial file. Anything else is counted as
//! rejected and left to the tier. [`Inbox::complete`] appends `complete`: the daemon's
//! staging waits for that line.

pub mod coded;
mod inbox;
pub mod layouts;
mod slot;
pub mod spec;
pub mod uncoded;

#[cfg(test)]
mod tests;

pub use inbox::{Accepted, Inbox};
pub use layouts::EpochLayouts;
pub use slot::Held;
pub use spec::{ExchangeSpec, GroupsRef, ShuffleCode, GROUPS_FILE, SPEC_FILE, SPEC_VERSION};

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use metfs_plan::budget::{footprints, Staged};
use metfs_plan::groups::SampleGroups;
use metfs_shuffle::{transition, Layout, Transition};
use metfs_tier::catalog::Catalog;
use thiserror::Error;

use spec::{catalog_digest, inbox_dir, inbox_journal, parse_spec};

/// Errors of the exchange, each naming what it is about.
#[derive(Debug, Error)]
pub enum ExchangeError {
    #[error("{path}: {reason}")]
    Spec { path: String, reason: String },
    #[error("catalog {path}: {reason}")]
    Catalog { path: String, reason: String },
    #[error("sample groups {path}: {reason}")]
    Groups { path: String, reason: String },
    #[error("planning epoch {epoch}: {source}")]
    Plan {
        epoch: u64,
        source: metfs_shuffle::PlanError,
    },
    #[error("inbox {path}: {source}")]
    Inbox {
        path: String,
        source: std::io::Error,
    },
    #[error("a frame from rank {from} is cut short ({have} bytes left, {need} needed)")]
    Truncated { from: u32, have: usize, need: usize },
    /// A rank sent frames to the extra rank, which only sends (another build, or a bug).
    #[error("rank {from} sent frames to the extra rank, which only sends")]
    ToExtra { from: u32 },
    /// The extra rank's tier cannot be read.
    #[error("tier {path}: {reason}")]
    Tier { path: String, reason: String },
    /// The coded plan of an epoch cannot be made (every rank fails alike: it is pure).
    #[error("the coded exchange of epoch {epoch}: {reason}")]
    Coded { epoch: u64, reason: String },
}

/// What one node's exchange for one epoch did: one JSON line on `metfs-shuffle`'s stdout.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ExchangeReport {
    /// This node's rank.
    pub rank: u32,
    /// The epoch whose inbox was filled.
    pub epoch: u64,
    /// How samples crossed: `uncoded`, or `uberShuffle` (coded packets, plus uncoded frames
    /// for what the coded plan does not cover).
    pub code: ShuffleCode,
    /// Samples this node sent uncoded, one frame each.
    pub sent_samples: u64,
    /// Bytes this node put on the wire: every frame to every peer, headers included (a coded
    /// packet counts once for each receiver it was sent to).
    pub sent_bytes: u64,
    /// Coded packets this node encoded and sent, each counted once however many receivers
    /// it went to.
    pub packets: u64,
    /// Their payload bytes, each packet once: what one broadcast of each would carry.
    pub packet_bytes: u64,
    /// Blocks this node decoded from coded packets.
    pub decoded_blocks: u64,
    /// Samples and bytes it kept in its inbox.
    pub received_samples: u64,
    pub received_bytes: u64,
    /// Samples that arrived and failed their check (or were sent as unreadable).
    pub rejected: u64,
    /// Samples expected from peers and not received (rejected ones included): the daemon
    /// fetches these from the tier.
    pub missing: u64,
    /// Messages this node sent (one per peer and stage with something to send).
    pub messages: u64,
    /// Bytes this node received on the wire, headers included: with
    /// [`sent_bytes`](Self::sent_bytes), its port's load.
    pub recv_bytes: u64,
    /// Frames this node sent: uncoded samples, coded packets to one receiver each (direct),
    /// or parts of packets (scatter-then-ring, forwarded parts included). With
    /// [`payload_bytes`](Self::payload_bytes), what `metfs_shuffle::wire` counts as messages and
    /// wire bytes.
    pub frames: u64,
    /// Their payload, headers left out.
    pub payload_bytes: u64,
    /// Of those, the parts this node forwarded along a ring, and their payload.
    pub forwarded: u64,
    pub forwarded_bytes: u64,
    /// Bytes this rank read from the capacity tier (the extra rank: every operand it sends).
    pub tier_bytes: u64,
    /// Who sent: the holders (`peers`) or the extra rank (`extra`).
    pub sender: SenderMode,
    /// How coded packets reached their receivers: `direct` or `ring`.
    pub broadcast: Broadcast,
    /// Ring stages after the scatters (0 for direct).
    pub stages: u64,
    /// Rounds of the exchange (each at most the chunk size per peer).
    pub rounds: u64,
    /// Seconds this node spent computing the coded plan (each rank computes all of it).
    pub plan_secs: f64,
    /// Seconds from the inbox's opening on every node to its completion here.
    pub secs: f64,
}

/// Splits `need` bytes off the front of what rank `from` sent, or says the frame is cut short.
fn take(buf: &[u8], need: usize, from: u32) -> Result<(&[u8], &[u8]), ExchangeError> {
    if buf.len() < need {
        return Err(ExchangeError::Truncated {
            from,
            have: buf.len(),
            need,
        });
    }
    Ok(buf.split_at(need))
}

/// Who sends what the nodes need (`metfs-shuffle --sender`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum SenderMode {
    /// The nodes that hold a sample send it (or the packets of it); no extra rank.
    #[default]
    Peers,
    /// The paper's model: one more rank than nodes, the last, holds no cache and reads from
    /// the capacity tier every sample (uncoded) or every operand (coded) it sends.
    Extra,
}

/// How a coded packet reaches its receivers (`metfs-shuffle --broadcast`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Broadcast {
    /// The sender sends the whole packet to each receiver.
    #[default]
    Direct,
    /// Scatter-then-ring (Theorem 3): the sender sends each receiver one part, then the
    /// receivers pass the parts around a ring.
    Ring,
}

/// How many words [`Node::agreement`] has.
pub const AGREEMENT: usize = 7;

/// The groups of `bytes`, checked against the digest `r` names, over files of `sizes`.
fn read_groups(r: &GroupsRef, bytes: &[u8], sizes: &[u64]) -> Result<SampleGroups, ExchangeError> {
    let bad = |reason: String| ExchangeError::Groups {
        path: r.path.display().to_string(),
        reason,
    };
    let digest = format!("{:016x}", layouts::groups_digest(bytes));
    if digest != r.digest {
        return Err(bad(format!(
            "digest {digest}, but the daemon planned with {}: remount",
            r.digest
        )));
    }
    SampleGroups::decode(bytes, sizes).map_err(|e| bad(e.to_string()))
}

/// One node of the exchange: its daemon's spec, catalog and footprints; or the extra rank,
/// which has the spec and catalog of rank 0 and reads the tier instead of a slot.
pub struct Node {
    pub spec: ExchangeSpec,
    pub catalog: Catalog,
    /// The daemon's planner inputs, groups included.
    layouts: EpochLayouts,
    /// Who sends ([`Node::with_modes`]).
    pub sender: SenderMode,
    /// How coded packets travel.
    pub broadcast: Broadcast,
    /// The extra rank's tier (its resolved root); `None` on a node.
    tier: Option<PathBuf>,
}

impl Node {
    /// Reads `CACHE/aggregate.json` and the catalog it names; refuses a spec of another
    /// version and a catalog whose digest is not the daemon's.
    pub fn open(cache: &Path) -> Result<Self, ExchangeError> {
        let path = cache.join(SPEC_FILE);
        let bad = |reason: String| ExchangeError::Spec {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read(&path).map_err(|e| {
            bad(format!(
                "{e} (is the daemon of this node mounted with --aggregate?)"
            ))
        })?;
        let spec = parse_spec(&text).map_err(bad)?;
        let catalog = Catalog::load(&spec.catalog).map_err(|e| ExchangeError::Catalog {
            path: spec.catalog.display().to_string(),
            reason: e.to_string(),
        })?;
        let groups = match &spec.groups {
            Some(g) => std::fs::read(&g.path).map_err(|e| ExchangeError::Groups {
                path: g.path.display().to_string(),
                reason: e.to_string(),
            })?,
            None => Vec::new(),
        };
        Self::from_parts(spec, catalog, &groups)
    }

    /// The groups file's bytes as this node read them (empty without groups): what the extra
    /// rank is sent.
    pub fn groups_bytes(&self) -> Vec<u8> {
        self.layouts
            .groups()
            .map_or_else(Vec::new, SampleGroups::encode)
    }

    /// The extra rank (rank `nodes`), from rank 0's spec (`aggregate.json`'s bytes), catalog
    /// (`catalog.bin`'s bytes) and groups ([`Node::groups_bytes`]), reading samples from the
    /// POSIX directory `tier` (the daemons' source). Refuses a spec of another version, a
    /// catalog or groups whose digest is not the spec's, and a tier that is not a directory.
    pub fn extra(
        spec: &[u8],
        catalog: &[u8],
        groups: &[u8],
        tier: &Path,
    ) -> Result<Self, ExchangeError> {
        let bad = |reason: String| ExchangeError::Spec {
            path: "rank 0's aggregate.json".into(),
            reason,
        };
        let mut spec = parse_spec(spec).map_err(bad)?;
        let catalog = Catalog::from_bytes(catalog, "rank 0's catalog").map_err(|e| {
            ExchangeError::Catalog {
                path: "rank 0's catalog".into(),
                reason: e.to_string(),
            }
        })?;
        let root = std::fs::canonicalize(tier)
            .ok()
            .filter(|p| p.is_dir())
            .ok_or_else(|| ExchangeError::Tier {
                path: tier.display().to_string(),
                reason: "not a directory this rank can read (the extra rank reads a POSIX \
                         tier: the daemons' source, or --tier)"
                    .into(),
            })?;
        spec.rank = spec.nodes;
        let mut node = Self::from_parts(spec, catalog, groups)?;
        node.tier = Some(root);
        node.sender = SenderMode::Extra;
        Ok(node)
    }

    /// Sets who sends and how coded packets travel (the transport's flags, the same on every
    /// rank: they are part of [`Node::agreement`]'s check in `metfs-shuffle`).
    pub fn with_modes(mut self, sender: SenderMode, broadcast: Broadcast) -> Self {
        self.sender = sender;
        self.broadcast = broadcast;
        self
    }

    /// Whether this is the extra rank.
    pub fn is_extra(&self) -> bool {
        self.tier.is_some()
    }

    /// The extra rank's tier root.
    pub(crate) fn tier(&self) -> Option<&Path> {
        self.tier.as_deref()
    }

    /// Ranks in the exchange: the nodes, and the extra rank in [`SenderMode::Extra`].
    pub fn ranks(&self) -> u32 {
        self.spec.nodes + u32::from(self.sender == SenderMode::Extra)
    }

    fn from_parts(
        spec: ExchangeSpec,
        catalog: Catalog,
        groups: &[u8],
    ) -> Result<Self, ExchangeError> {
        let digest = format!("{:016x}", catalog_digest(&catalog));
        if digest != spec.catalog_digest {
            return Err(ExchangeError::Catalog {
                path: spec.catalog.display().to_string(),
                reason: format!(
                    "digest {digest}, but the daemon planned with {}: the source changed; remount",
                    spec.catalog_digest
                ),
            });
        }
        // As the daemon: copies' footprints (aggregate mode refuses a transform).
        let sizes = footprints(catalog.sizes(), Staged::Copy);
        let groups = match &spec.groups {
            Some(g) => Some(read_groups(g, groups, &sizes)?),
            None => None,
        };
        let settings = metfs_shuffle::AggregateConfig {
            nodes: spec.nodes,
            seed: spec.seed,
            budget: spec.budget,
            extra: spec.extra,
        };
        Ok(Self {
            spec,
            catalog,
            layouts: EpochLayouts::new(sizes, groups, settings),
            sender: SenderMode::Peers,
            broadcast: Broadcast::Direct,
            tier: None,
        })
    }

    /// What every rank must agree on before exchanging: the planner's settings, the code, the
    /// catalog and the sample groups. Compared field by field ([`Node::disagreement`]).
    pub fn agreement(&self) -> [u64; AGREEMENT] {
        [
            self.spec.seed,
            u64::from(self.spec.nodes),
            self.spec.budget,
            self.spec.extra.to_bits(),
            u64::from_str_radix(&self.spec.catalog_digest, 16).unwrap_or(0),
            self.spec.code as u64,
            self.layouts.groups_digest(),
        ]
    }

    /// The first field where `other` (rank `rank`'s [`Node::agreement`]) differs from this
    /// node's, as a sentence, or `None`.
    pub fn disagreement(&self, rank: usize, other: &[u64; AGREEMENT]) -> Option<String> {
        const NAMES: [&str; AGREEMENT] = [
            "seed",
            "node count",
            "budget per node",
            "extra probability",
            "catalog digest",
            "shuffle code",
            "sample groups digest",
        ];
        let mine = self.agreement();
        (0..AGREEMENT).find(|&i| mine[i] != other[i]).map(|i| {
            format!(
                "rank {rank}'s {} differs from rank {}'s ({:#x} against {:#x}): every node must mount the same source with the same --seed, --budget, --nodes, --shuffle-extra, --shuffle-code and sample settings (--group-by, --always, --include, --exclude, --format)",
                NAMES[i], self.spec.rank, other[i], mine[i]
            )
        })
    }

    fn layout(&self, epoch: u64) -> Result<Layout, ExchangeError> {
        self.layouts
            .layout(epoch)
            .map_err(|source| ExchangeError::Plan { epoch, source })
    }

    /// The transition into epoch `epoch` (from `epoch − 1`), with `dead` nodes.
    pub fn transition(&self, epoch: u64, dead: &[u32]) -> Result<Transition, ExchangeError> {
        let next = self.layout(epoch)?;
        let prev = if epoch == 0 {
            None
        } else {
            Some(self.layout(epoch - 1)?)
        };
        transition(prev.as_ref(), &next, self.layouts.sizes(), dead)
            .map_err(|source| ExchangeError::Plan { epoch, source })
    }

    /// For each rank, the samples this rank sends it uncoded for epoch `epoch`'s inbox: in
    /// peers mode what the transition names it the source of; in extra mode everything a node
    /// gets from a peer, all sent by the extra rank (and nothing by the nodes).
    pub fn outgoing(&self, t: &Transition) -> Vec<Vec<u32>> {
        let me = self.spec.rank;
        let extra = self.sender == SenderMode::Extra;
        (0..self.ranks())
            .map(|j| {
                t.nodes
                    .get(j as usize)
                    .map(|p| {
                        p.peer
                            .iter()
                            .filter(|&&(_, from)| {
                                if extra {
                                    me == self.spec.nodes
                                } else {
                                    from == me
                                }
                            })
                            .map(|&(s, _)| s)
                            .collect()
                    })
                    .unwrap_or_default()
            })
            .collect()
    }

    /// What this node expects for epoch `epoch`'s inbox: each sample and its sender (the
    /// extra rank, `nodes`, in extra mode).
    pub fn expected(&self, t: &Transition) -> HashMap<u32, u32> {
        let extra = self.sender == SenderMode::Extra;
        t.nodes
            .get(self.spec.rank as usize)
            .map(|p| {
                p.peer
                    .iter()
                    .map(|&(s, from)| (s, if extra { self.spec.nodes } else { from }))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Opens the inbox of epoch `epoch` (the daemon creates it when its staging starts),
    /// expecting each sample of `expected` uncoded from the rank it names.
    pub fn inbox(&self, epoch: u64, expected: HashMap<u32, u32>) -> Result<Inbox, ExchangeError> {
        let dir = inbox_dir(&self.spec.slots, epoch);
        let err = |source| ExchangeError::Inbox {
            path: dir.display().to_string(),
            source,
        };
        let journal = inbox_journal(&self.spec.slots, epoch)
            .append()
            .map_err(err)?;
        Ok(Inbox::new(dir, journal, expected))
    }

    /// Whether the inbox of epoch `epoch` is open (the daemon is staging that epoch).
    pub fn inbox_open(&self, epoch: u64) -> bool {
        inbox_dir(&self.spec.slots, epoch).is_dir()
    }

    /// The catalog path of a sample (for messages).
    pub fn path_of(&self, id: u32) -> String {
        self.catalog.path(id)
    }
}
