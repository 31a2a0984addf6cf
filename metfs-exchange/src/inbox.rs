//! An epoch's inbox: what arrives from peers, checked, written whole and journaled (see the
//! crate docs, and [`crate::spec`] for the protocol with the daemon). Uncoded frames arrive as
//! they were sent ([`Inbox::accept`]); coded samples arrive reassembled from decoded blocks
//! ([`Inbox::accept_decoded`]); both go through the same check and the same journal.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use metfs_prefetcher::stager::{create_private_dir, JournalWriter};

use super::uncoded::HEADER;
use super::{ExchangeError, Node};

/// What a part (frames from one sender) brought.
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

/// An epoch's inbox being filled (module docs).
pub struct Inbox {
    dir: PathBuf,
    journal: JournalWriter,
    /// Sample → the rank it must come from, uncoded.
    expected: HashMap<u32, u32>,
    /// Samples that must come decoded from coded packets.
    decoded: HashSet<u32>,
    tmp_seq: u64,
}

impl Inbox {
    pub(super) fn new(dir: PathBuf, journal: JournalWriter, expected: HashMap<u32, u32>) -> Self {
        Self {
            dir,
            journal,
            expected,
            decoded: HashSet::new(),
            tmp_seq: 0,
        }
    }

    /// Adds samples that arrive decoded from coded packets (any sender: the decoder checks
    /// each packet's sender against the plan).
    pub fn expect_decoded(&mut self, ids: impl IntoIterator<Item = u32>) {
        self.decoded.extend(ids);
    }

    /// Checks and keeps one sample reassembled from coded packets: it must be one this node
    /// expects decoded, of the catalog's length, with the CRC-32 its senders gave.
    pub fn accept_decoded(
        &mut self,
        node: &Node,
        id: u32,
        crc: u32,
        bytes: &[u8],
    ) -> Result<Accepted, ExchangeError> {
        let expected = self.decoded.contains(&id);
        let size_ok =
            (id as usize) < node.catalog.len() && node.catalog.size(id) == bytes.len() as u64;
        let actual = crc32fast::hash(bytes);
        if !(expected && size_ok && actual == crc) {
            tracing::warn!(
                sample = id,
                expected,
                len = bytes.len(),
                crc = format_args!("{crc:08x}"),
                actual = format_args!("{actual:08x}"),
                "a sample decoded from coded packets failed its check; the tier serves it"
            );
            return Ok(Accepted {
                rejected: 1,
                ..Default::default()
            });
        }
        self.keep(node, id, crc, bytes)?;
        self.decoded.remove(&id);
        Ok(Accepted {
            samples: 1,
            bytes: bytes.len() as u64,
            rejected: 0,
        })
    }

    /// Checks and keeps the samples of `frames`, sent by rank `from`.
    pub fn accept(
        &mut self,
        node: &Node,
        from: u32,
        mut frames: &[u8],
    ) -> Result<Accepted, ExchangeError> {
        let mut got = Accepted::default();
        while !frames.is_empty() {
            let (header, rest) = super::take(frames, HEADER, from)?;
            let id = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes"));
            let len = u64::from_le_bytes(header[4..12].try_into().expect("8 bytes"));
            let crc = u32::from_le_bytes(header[12..16].try_into().expect("4 bytes"));
            frames = rest;
            if len == u64::MAX {
                tracing::warn!(sample = %node.path_of(id), from, "the sender could not read the sample; the tier serves it");
                got.rejected += 1;
                continue;
            }
            let (bytes, rest) =
                super::take(frames, usize::try_from(len).unwrap_or(usize::MAX), from)?;
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
        self.journal.staged(id, crc).map_err(err)
    }

    /// Samples still expected and not received.
    pub fn missing(&self) -> usize {
        self.expected.len() + self.decoded.len()
    }

    /// Marks the inbox complete: the daemon's staging takes it now.
    pub fn complete(self) -> Result<(), ExchangeError> {
        let path = self.dir;
        self.journal
            .complete()
            .map_err(|source| ExchangeError::Inbox {
                path: path.display().to_string(),
                source,
            })
    }
}
