//! A node's side of aggregate-cache mode's exchange, without the transport: what this node
//! sends to each other node for an epoch's inbox, the frames that carry the samples, and the
//! inbox that checks and keeps what arrives. `metfs-shuffle` moves the frames over MPI;
//! everything here is testable without it. The daemon's side is `daemon::aggregate`.
//!
//! # Who sends what
//!
//! Every node computes the same two layouts (epochs `t − 1` and `t`, the `shuffle` planner over
//! the daemon's catalog and settings, `CACHE/aggregate.json`) and the transition between them:
//! for each node, each sample of its next cache comes from its own slot, from one named peer,
//! or from the tier. A node sends each peer the samples the transition names it for, read from
//! its slot of epoch `t − 1`, with the CRC-32 its slot journal recorded when the sample was
//! fetched from the tier (not recomputed: what is sent is checked once, where it arrives).
//!
//! # Frames
//!
//! One sample is `id: u32, len: u64, crc: u32` (little endian) then `len` bytes. A sample the
//! sender cannot read (its copy is gone or not journaled) is sent as `len = u64::MAX` with no
//! bytes: the receiver leaves it to the tier at once instead of waiting for it.
//!
//! # The inbox
//!
//! A frame enters the inbox only if its sample is one this node expects from that sender, its
//! length is the catalog's and the CRC-32 of its bytes is the one sent; it is written to a
//! temporary file, made read-only and renamed into place, then journaled (`<id> <crc>`), so the
//! daemon's stager, which links from the inbox like from any slot and checks the CRC again,
//! never sees a partial file. Anything else is counted as rejected and left to the tier.
//! [`Inbox::complete`] appends `complete`: the daemon's staging waits for that line.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use prefetcher::catalog::Catalog;
use prefetcher::stager::{create_private_dir, read_journal};
use shuffle::{layout, transition, Layout, Transition};
use thiserror::Error;

use crate::daemon::aggregate::{
    inbox_of_epoch, slot_of_epoch, ExchangeSpec, SPEC_FILE, SPEC_VERSION,
};

/// Bytes of a frame's header.
pub const HEADER: usize = 16;

/// Errors of the exchange, each naming what it is about.
#[derive(Debug, Error)]
pub enum ExchangeError {
    #[error("{path}: {reason}")]
    Spec { path: String, reason: String },
    #[error("catalog {path}: {reason}")]
    Catalog { path: String, reason: String },
    #[error("planning epoch {epoch}: {source}")]
    Plan {
        epoch: u64,
        source: shuffle::PlanError,
    },
    #[error("inbox {path}: {source}")]
    Inbox {
        path: String,
        source: std::io::Error,
    },
    #[error("a frame from rank {from} is cut short ({have} bytes left, {need} needed)")]
    Truncated { from: u32, have: usize, need: usize },
}

/// What one node's exchange for one epoch did: one JSON line on `metfs-shuffle`'s stdout.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ExchangeReport {
    /// This node's rank.
    pub rank: u32,
    /// The epoch whose inbox was filled.
    pub epoch: u64,
    /// Samples and bytes this node sent to peers.
    pub sent_samples: u64,
    pub sent_bytes: u64,
    /// Samples and bytes it kept in its inbox.
    pub received_samples: u64,
    pub received_bytes: u64,
    /// Samples that arrived and failed their check (or were sent as unreadable).
    pub rejected: u64,
    /// Samples expected from peers and not received (rejected ones included): the daemon
    /// fetches these from the tier.
    pub missing: u64,
    /// Messages this node sent (one per peer and round with something to send).
    pub messages: u64,
    /// Rounds of the exchange (each at most the chunk size per peer).
    pub rounds: u64,
    /// Seconds from the inbox's opening on every node to its completion here.
    pub secs: f64,
}

/// One node of the exchange: its daemon's spec, catalog and footprints.
pub struct Node {
    pub spec: ExchangeSpec,
    pub catalog: Catalog,
    settings: shuffle::AggregateConfig,
    sizes: Vec<u64>,
}

/// What one frame brought.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Accepted {
    /// Samples written to the inbox, and their bytes.
    pub samples: u64,
    pub bytes: u64,
    /// Samples refused (a wrong length or CRC, not expected from that sender, or sent as
    /// missing): the daemon fetches them from the tier.
    pub rejected: u64,
}

impl std::ops::AddAssign for Accepted {
    fn add_assign(&mut self, o: Self) {
        self.samples += o.samples;
        self.bytes += o.bytes;
        self.rejected += o.rejected;
    }
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
        let spec: ExchangeSpec =
            serde_json::from_slice(&text).map_err(|e| bad(format!("not a valid spec: {e}")))?;
        if spec.v != SPEC_VERSION {
            return Err(bad(format!(
                "version {} where this metfs-shuffle reads {SPEC_VERSION}; use the daemon's metfs-shuffle",
                spec.v
            )));
        }
        let catalog = Catalog::load(&spec.catalog).map_err(|e| ExchangeError::Catalog {
            path: spec.catalog.display().to_string(),
            reason: e.to_string(),
        })?;
        let digest = format!(
            "{:016x}",
            crate::daemon::aggregate::catalog_digest(&catalog)
        );
        if digest != spec.catalog_digest {
            return Err(ExchangeError::Catalog {
                path: spec.catalog.display().to_string(),
                reason: format!(
                    "digest {digest}, but the daemon planned with {}: the source changed; remount",
                    spec.catalog_digest
                ),
            });
        }
        // As the daemon: footprints are sizes rounded up to whole blocks (aggregate mode
        // refuses a transform).
        let sizes = catalog
            .sizes()
            .iter()
            .map(|&s| prefetcher::budget::round_up(s))
            .collect();
        let settings = shuffle::AggregateConfig {
            nodes: spec.nodes,
            seed: spec.seed,
            budget: spec.budget,
            extra: spec.extra,
        };
        Ok(Self {
            spec,
            catalog,
            settings,
            sizes,
        })
    }

    /// What every rank must agree on before exchanging: the planner's settings, the code and
    /// the catalog. Compared field by field ([`Node::disagreement`]).
    pub fn agreement(&self) -> [u64; 6] {
        [
            self.spec.seed,
            u64::from(self.spec.nodes),
            self.spec.budget,
            self.spec.extra.to_bits(),
            u64::from_str_radix(&self.spec.catalog_digest, 16).unwrap_or(0),
            self.spec.code as u64,
        ]
    }

    /// The first field where `other` (rank `rank`'s [`Node::agreement`]) differs from this
    /// node's, as a sentence, or `None`.
    pub fn disagreement(&self, rank: usize, other: &[u64; 6]) -> Option<String> {
        const NAMES: [&str; 6] = [
            "seed",
            "node count",
            "budget per node",
            "extra probability",
            "catalog digest",
            "shuffle code",
        ];
        let mine = self.agreement();
        (0..6).find(|&i| mine[i] != other[i]).map(|i| {
            format!(
                "rank {rank}'s {} differs from rank {}'s ({:#x} against {:#x}): every node must mount the same source with the same --seed, --budget, --nodes, --shuffle-extra and --shuffle-code",
                NAMES[i], self.spec.rank, other[i], mine[i]
            )
        })
    }

    fn layout(&self, epoch: u64) -> Result<Layout, ExchangeError> {
        layout(&self.sizes, &self.settings, epoch)
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
        transition(prev.as_ref(), &next, &self.sizes, dead)
            .map_err(|source| ExchangeError::Plan { epoch, source })
    }

    /// For each node, the samples this node sends it for epoch `epoch`'s inbox.
    pub fn outgoing(&self, t: &Transition) -> Vec<Vec<u32>> {
        let me = self.spec.rank;
        (0..self.spec.nodes)
            .map(|j| {
                t.nodes
                    .get(j as usize)
                    .map(|p| {
                        p.peer
                            .iter()
                            .filter(|&&(_, from)| from == me)
                            .map(|&(s, _)| s)
                            .collect()
                    })
                    .unwrap_or_default()
            })
            .collect()
    }

    /// What this node expects for epoch `epoch`'s inbox: each sample and its sender.
    pub fn expected(&self, t: &Transition) -> HashMap<u32, u32> {
        t.nodes
            .get(self.spec.rank as usize)
            .map(|p| p.peer.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Frames of `ids` (in order), read from this node's slot of epoch `epoch − 1`, until
    /// `max_bytes` is reached (at least one frame); returns the frames and how many samples
    /// they carry.
    pub fn pack(&self, epoch: u64, ids: &[u32], max_bytes: usize) -> (Vec<u8>, usize) {
        let slot = slot_of_epoch(epoch.saturating_sub(1));
        let dir = self.spec.slots.join(&slot);
        let crcs = read_journal(&self.spec.slots.join(format!("{slot}.journal"))).staged;
        let mut out = Vec::new();
        let mut n = 0;
        for &id in ids {
            if n > 0 && out.len() + HEADER + self.catalog.size(id) as usize > max_bytes {
                break;
            }
            let bytes = crcs.get(&id).and_then(|&crc| {
                let mut f = std::fs::File::open(dir.join(self.catalog.path(id))).ok()?;
                let mut b = Vec::with_capacity(self.catalog.size(id) as usize);
                f.read_to_end(&mut b).ok()?;
                Some((crc, b))
            });
            out.extend_from_slice(&id.to_le_bytes());
            match bytes {
                Some((crc, b)) => {
                    out.extend_from_slice(&(b.len() as u64).to_le_bytes());
                    out.extend_from_slice(&crc.to_le_bytes());
                    out.extend_from_slice(&b);
                }
                None => {
                    out.extend_from_slice(&u64::MAX.to_le_bytes());
                    out.extend_from_slice(&0u32.to_le_bytes());
                }
            }
            n += 1;
        }
        (out, n)
    }

    /// Opens the inbox of epoch `epoch` (the daemon creates it when its staging starts).
    pub fn inbox(&self, epoch: u64, expected: HashMap<u32, u32>) -> Result<Inbox, ExchangeError> {
        let name = inbox_of_epoch(epoch);
        let dir = self.spec.slots.join(&name);
        let journal_path = self.spec.slots.join(format!("{name}.journal"));
        let err = |source| ExchangeError::Inbox {
            path: dir.display().to_string(),
            source,
        };
        let journal = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&journal_path)
            .map_err(err)?;
        Ok(Inbox {
            dir,
            journal,
            expected,
            tmp_seq: 0,
        })
    }

    /// Whether the inbox of epoch `epoch` is open (the daemon is staging that epoch).
    pub fn inbox_open(&self, epoch: u64) -> bool {
        self.spec.slots.join(inbox_of_epoch(epoch)).is_dir()
    }

    /// The catalog path of a sample (for messages).
    pub fn path_of(&self, id: u32) -> String {
        self.catalog.path(id)
    }
}

/// An epoch's inbox being filled (module docs).
pub struct Inbox {
    dir: PathBuf,
    journal: std::fs::File,
    /// Sample → the rank it must come from.
    expected: HashMap<u32, u32>,
    tmp_seq: u64,
}

impl Inbox {
    /// Checks and keeps the samples of `frames`, sent by rank `from`.
    pub fn accept(
        &mut self,
        node: &Node,
        from: u32,
        mut frames: &[u8],
    ) -> Result<Accepted, ExchangeError> {
        let mut got = Accepted::default();
        while !frames.is_empty() {
            if frames.len() < HEADER {
                return Err(ExchangeError::Truncated {
                    from,
                    have: frames.len(),
                    need: HEADER,
                });
            }
            let id = u32::from_le_bytes(frames[0..4].try_into().expect("4 bytes"));
            let len = u64::from_le_bytes(frames[4..12].try_into().expect("8 bytes"));
            let crc = u32::from_le_bytes(frames[12..16].try_into().expect("4 bytes"));
            frames = &frames[HEADER..];
            if len == u64::MAX {
                tracing::warn!(sample = %node.path_of(id), from, "the sender could not read the sample; the tier serves it");
                got.rejected += 1;
                continue;
            }
            if (frames.len() as u64) < len {
                return Err(ExchangeError::Truncated {
                    from,
                    have: frames.len(),
                    need: len as usize,
                });
            }
            let (bytes, rest) = frames.split_at(len as usize);
            frames = rest;
            let expected = self.expected.get(&id) == Some(&from);
            let size_ok = (id as usize) < node.catalog.len() && node.catalog.size(id) == len;
            let actual = crc32fast::hash(bytes);
            if !(expected && size_ok && actual == crc) {
                tracing::warn!(
                    sample = id,
                    from,
                    expected,
                    len,
                    crc = format_args!("{crc:08x}"),
                    actual = format_args!("{actual:08x}"),
                    "a sample from a peer failed its check; the tier serves it"
                );
                got.rejected += 1;
                continue;
            }
            self.keep(node, id, crc, bytes)?;
            self.expected.remove(&id);
            got.samples += 1;
            got.bytes += len;
        }
        Ok(got)
    }

    fn keep(&mut self, node: &Node, id: u32, crc: u32, bytes: &[u8]) -> Result<(), ExchangeError> {
        let rel = node.catalog.path(id);
        let dst = self.dir.join(&rel);
        let err = |source| ExchangeError::Inbox {
            path: dst.display().to_string(),
            source,
        };
        if let Some(parent) = dst.parent() {
            if !parent.is_dir() {
                // One private directory per level, as the stager makes them.
                let mut p = self.dir.clone();
                for c in Path::new(&rel)
                    .parent()
                    .into_iter()
                    .flat_map(|p| p.components())
                {
                    p.push(c);
                    if !p.is_dir() {
                        create_private_dir(&p).map_err(err)?;
                    }
                }
            }
        }
        self.tmp_seq += 1;
        let tmp = self.dir.join(format!(".in-{id}-{}", self.tmp_seq));
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(bytes)?;
            f.set_permissions(std::fs::Permissions::from_mode(0o400))?;
            std::fs::rename(&tmp, &dst)
        };
        if let Err(e) = write() {
            let _ = std::fs::remove_file(&tmp);
            return Err(err(e));
        }
        writeln!(self.journal, "{id} {crc:08x}").map_err(err)
    }

    /// Samples still expected and not received.
    pub fn missing(&self) -> usize {
        self.expected.len()
    }

    /// Marks the inbox complete: the daemon's staging takes it now.
    pub fn complete(mut self) -> Result<(), ExchangeError> {
        let path = self.dir.clone();
        writeln!(self.journal, "complete").map_err(|source| ExchangeError::Inbox {
            path: path.display().to_string(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::aggregate::ShuffleCode;
    use prefetcher::catalog::CatalogEntry;

    /// Two nodes' caches side by side: each has its spec, the catalog, and its slot of epoch 0
    /// staged (files and journal) as the daemon would.
    fn two_nodes(dir: &Path) -> (Node, Node) {
        let sizes: Vec<u64> = (0..40).map(|i| 1000 + 37 * i).collect();
        let cat = Catalog::from_entries(
            "test",
            sizes
                .iter()
                .enumerate()
                .map(|(i, &s)| CatalogEntry::new(format!("c{}/s{i:03}.bin", i % 3), s)),
        )
        .unwrap();
        let nodes: Vec<Node> = (0..2u32)
            .map(|rank| {
                let cache = dir.join(format!("n{rank}"));
                let slots = cache.join("slots");
                std::fs::create_dir_all(&slots).unwrap();
                let catalog = cache.join("catalog.bin");
                cat.save(&catalog).unwrap();
                let spec = ExchangeSpec {
                    v: SPEC_VERSION,
                    rank,
                    nodes: 2,
                    seed: 3,
                    budget: 1 << 20,
                    extra: 0.0,
                    code: ShuffleCode::Uncoded,
                    catalog_digest: format!(
                        "{:016x}",
                        crate::daemon::aggregate::catalog_digest(&cat)
                    ),
                    source: "test".into(),
                    slots: slots.clone(),
                    catalog,
                    socket: cache.join("metfs.sock"),
                    pid: std::process::id(),
                };
                std::fs::write(cache.join(SPEC_FILE), serde_json::to_vec(&spec).unwrap()).unwrap();
                Node::open(&cache).unwrap()
            })
            .collect();
        // Each node's slot of epoch 0: its share, with bytes a function of the sample.
        for n in &nodes {
            let t0 = n.transition(0, &[]).unwrap();
            let slot = slot_of_epoch(0);
            let mut journal = String::new();
            for &id in &t0.nodes[n.spec.rank as usize].tier {
                let bytes = content(id, n.catalog.size(id));
                let p = n.spec.slots.join(&slot).join(n.catalog.path(id));
                std::fs::create_dir_all(p.parent().unwrap()).unwrap();
                std::fs::write(&p, &bytes).unwrap();
                journal += &format!("{id} {:08x}\n", crc32fast::hash(&bytes));
            }
            std::fs::write(n.spec.slots.join(format!("{slot}.journal")), journal).unwrap();
        }
        let mut it = nodes.into_iter();
        (it.next().unwrap(), it.next().unwrap())
    }

    fn content(id: u32, len: u64) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u32 ^ id.wrapping_mul(2654435761)) as u8)
            .collect()
    }

    fn open_inbox(n: &Node, epoch: u64) -> Inbox {
        create_private_dir(&n.spec.slots.join(inbox_of_epoch(epoch))).unwrap();
        let t = n.transition(epoch, &[]).unwrap();
        n.inbox(epoch, n.expected(&t)).unwrap()
    }

    #[test]
    fn what_one_node_sends_the_other_arrives_whole_and_journaled() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = two_nodes(dir.path());
        let t = a.transition(1, &[]).unwrap();
        let to_b = &a.outgoing(&t)[1];
        assert_eq!(
            b.expected(&t).values().filter(|&&f| f == 0).count(),
            to_b.len()
        );
        assert!(!to_b.is_empty());
        // Small rounds: several frames per round, every sample once.
        let mut inbox = open_inbox(&b, 1);
        let (mut at, mut got) = (0, Accepted::default());
        while at < to_b.len() {
            let (frames, k) = a.pack(1, &to_b[at..], 4096);
            assert!(k >= 1);
            at += k;
            got += inbox.accept(&b, 0, &frames).unwrap();
        }
        assert_eq!(got.samples as usize, to_b.len());
        assert_eq!(got.rejected, 0);
        assert_eq!(inbox.missing(), b.expected(&t).len() - to_b.len());
        inbox.complete().unwrap();
        let j = read_journal(&b.spec.slots.join(format!("{}.journal", inbox_of_epoch(1))));
        assert!(j.complete);
        for &id in to_b {
            let p = b
                .spec
                .slots
                .join(inbox_of_epoch(1))
                .join(b.catalog.path(id));
            let bytes = std::fs::read(&p).unwrap();
            assert_eq!(bytes, content(id, b.catalog.size(id)));
            assert_eq!(j.staged[&id], crc32fast::hash(&bytes));
            assert_eq!(
                std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
                0o400
            );
        }
    }

    #[test]
    fn a_corrupted_or_unexpected_sample_is_refused_and_left_to_the_tier() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = two_nodes(dir.path());
        let t = a.transition(1, &[]).unwrap();
        let to_b = a.outgoing(&t)[1].clone();
        let mut inbox = open_inbox(&b, 1);
        // A flipped payload byte: the CRC no longer matches.
        let (mut frames, _) = a.pack(1, &to_b[..1], usize::MAX);
        frames[HEADER] ^= 0xff;
        let got = inbox.accept(&b, 0, &frames).unwrap();
        assert_eq!((got.samples, got.rejected), (0, 1));
        // The right bytes from the wrong sender.
        let (frames, _) = a.pack(1, &to_b[..1], usize::MAX);
        let got = inbox.accept(&b, 1, &frames).unwrap();
        assert_eq!((got.samples, got.rejected), (0, 1));
        // A sample the sender cannot read travels as missing.
        let slot = a.spec.slots.join(slot_of_epoch(0));
        std::fs::remove_file(slot.join(a.catalog.path(to_b[1]))).unwrap();
        let (frames, k) = a.pack(1, &to_b[1..2], usize::MAX);
        assert_eq!((k, frames.len()), (1, HEADER));
        assert_eq!(inbox.accept(&b, 0, &frames).unwrap().rejected, 1);
        // Cut short: an error naming the sender, nothing kept.
        let (frames, _) = a.pack(1, &to_b[2..3], usize::MAX);
        let e = inbox
            .accept(&b, 0, &frames[..frames.len() - 1])
            .unwrap_err();
        assert!(e.to_string().contains("rank 0"), "{e}");
        assert_eq!(inbox.missing(), b.expected(&t).len());
        let inbox_dir = b.spec.slots.join(inbox_of_epoch(1));
        assert!(walk(&inbox_dir).is_empty(), "{:?}", walk(&inbox_dir));
    }

    fn walk(d: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(d).unwrap().flatten() {
            if e.path().is_dir() {
                out.extend(walk(&e.path()));
            } else {
                out.push(e.path());
            }
        }
        out
    }

    #[test]
    fn ranks_that_differ_are_named_with_the_setting() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = two_nodes(dir.path());
        assert_eq!(a.disagreement(1, &b.agreement()), None);
        let mut other = b.agreement();
        other[0] += 1;
        let why = a.disagreement(1, &other).unwrap();
        assert!(
            why.contains("rank 1's seed differs") && why.contains("--seed"),
            "{why}"
        );
        // A spec of another version, and a catalog that changed under the daemon.
        let cache = dir.path().join("n1");
        let text = std::fs::read_to_string(cache.join(SPEC_FILE)).unwrap();
        std::fs::write(cache.join(SPEC_FILE), text.replace("\"v\":1", "\"v\":9")).unwrap();
        assert!(Node::open(&cache)
            .err()
            .unwrap()
            .to_string()
            .contains("version 9"));
        std::fs::write(cache.join(SPEC_FILE), &text).unwrap();
        let cat = Catalog::from_entries("test", [CatalogEntry::new("x.bin", 5)]).unwrap();
        cat.save(&cache.join("catalog.bin")).unwrap();
        let e = Node::open(&cache).err().unwrap().to_string();
        assert!(e.contains("the source changed"), "{e}");
    }
}
