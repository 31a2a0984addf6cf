//! The uncoded exchange: each sample a peer needs is sent whole by the one node the transition
//! names, read from its slot of epoch `t − 1`; in extra mode by the extra rank, read from the
//! tier (the paper's uncoded scheme, §2.1).
//!
//! # Frames
//!
//! One sample is `id: u32, len: u64, crc: u32` (little endian) then `len` bytes. A sample the
//! sender cannot read (its copy is gone or not journaled) is sent as `len = u64::MAX` with no
//! bytes: the receiver leaves it to the tier at once instead of waiting for it.

use super::{Held, Node};

/// Bytes of an uncoded frame's header.
pub const HEADER: usize = 16;

/// What this node sends each peer uncoded for one epoch, cut into rounds.
pub struct Outbox<'a> {
    node: &'a Node,
    held: Held<'a>,
    /// For each rank, the samples to send it, in order.
    lists: Vec<Vec<u32>>,
    /// For each rank, how many of them have been sent.
    cursor: Vec<usize>,
    corrupt: bool,
    /// Samples sent so far, and their bytes (headers left out).
    pub samples: u64,
    pub bytes: u64,
}

impl<'a> Outbox<'a> {
    /// Sends `lists[j]` to rank `j` for epoch `epoch`'s inbox, read from this node's slot of
    /// epoch `epoch − 1`.
    pub fn new(node: &'a Node, epoch: u64, lists: Vec<Vec<u32>>) -> Self {
        let cursor = vec![0; lists.len()];
        Self {
            node,
            held: Held::open(
                node,
                epoch.saturating_sub(1),
                if node.is_extra() {
                    Held::DEFAULT_CAP
                } else {
                    0
                },
            ),
            lists,
            cursor,
            corrupt: false,
            samples: 0,
            bytes: 0,
        }
    }

    /// Fault injection for tests: flips a byte of the first sample sent to each peer.
    pub fn corrupt_first(mut self) -> Self {
        self.corrupt = true;
        self
    }

    /// This round's frames to each rank: whole samples, in order, until the next would take
    /// a part past `max_bytes` (at least one sample per part with anything left).
    pub fn round(&mut self, max_bytes: usize) -> Vec<Vec<u8>> {
        let mut parts = vec![Vec::new(); self.lists.len()];
        for (j, part) in parts.iter_mut().enumerate() {
            let first = self.cursor[j] == 0;
            for &id in &self.lists[j][self.cursor[j]..] {
                let size = self.node.catalog.size(id) as usize;
                if !part.is_empty() && part.len() + HEADER + size > max_bytes {
                    break;
                }
                part.extend_from_slice(&id.to_le_bytes());
                match self.held.read(id) {
                    Some((crc, b)) => {
                        part.extend_from_slice(&(b.len() as u64).to_le_bytes());
                        part.extend_from_slice(&crc.to_le_bytes());
                        part.extend_from_slice(&b);
                        self.bytes += b.len() as u64;
                    }
                    None => {
                        part.extend_from_slice(&u64::MAX.to_le_bytes());
                        part.extend_from_slice(&0u32.to_le_bytes());
                    }
                }
                self.cursor[j] += 1;
                self.samples += 1;
            }
            // A first frame with bytes (not sent as missing, not empty).
            if self.corrupt
                && first
                && part.len() > HEADER
                && part[4..12] != u64::MAX.to_le_bytes()
                && part[4..12] != [0; 8]
            {
                part[HEADER] ^= 0xff;
            }
        }
        parts
    }

    /// Bytes read from the tier (the extra rank).
    pub fn tier_bytes(&self) -> u64 {
        self.held.tier_bytes()
    }

    /// Whether everything has been sent.
    pub fn done(&self) -> bool {
        self.cursor
            .iter()
            .zip(&self.lists)
            .all(|(&c, l)| c >= l.len())
    }
}
