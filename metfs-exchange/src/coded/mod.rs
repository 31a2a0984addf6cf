//! The coded exchange (`--shuffle-code uberShuffle`): UberShuffle's XOR packets (paper 002;
//! the `metfs-shuffle` crate's `coded` module) sent by the peers that hold their operands or by the
//! paper's extra rank, directly or by scatter-then-ring.
//!
//! # The plan
//!
//! Every rank computes the same plan for epoch `t` from the transition into it
//! ([`Node::coded_plan`]): the demands (every sample a node gets from a peer, with every live
//! node that held it in `t − 1`; lengths are the catalog's bytes, not the cache footprints),
//! the carpool over blocks of [`BLOCK`] bytes, and each packet's sender (below). A zero-byte
//! sample has no blocks: it, and anything else the coded plan does not cover, goes uncoded
//! from the source the transition named, or the extra rank ([`CodedPlan::uncoded_outgoing`]). The ranks compare [`CodedPlan::digest`] before sending:
//! a rank that planned otherwise (another build) would make its receivers decode garbage.
//!
//! # The coding block: 4 KiB
//!
//! Real samples are cut into fixed-size blocks, the last one zero-padded (see the `metfs-shuffle`
//! crate). The block trades padding against the plan's size: the plan has one point per block
//! moved, every rank computes all of it, and each packet's frame carries a 12-byte header. At
//! 64 KiB, samples of mixed sizes (16–112 KiB) pad by about half; at 4 KiB by about 3%, for
//! 16 times the points. 4 KiB is also the cache's accounting block. The frames below cut the
//! padding off the wire anyway, so what the block size costs on the wire is the padding
//! inside packets (a short last block XORed with a full one travels as a full one), which a
//! smaller block keeps small.
//!
//! # Who sends: peers or the extra rank
//!
//! In peers mode (the default) the carpool runs for [`Sender::Peers`] and each packet is sent
//! by a node, not one of its receivers, holding all its points, the one that has sent the
//! fewest bytes so far (`metfs_shuffle::wire::coded_peers`). In extra mode
//! (`metfs-shuffle --sender extra`, the paper's model) the carpool runs for
//! [`Sender::Extra`], which may keep the exclusive tables' full rows, and every packet's
//! sender is the extra rank, rank `nodes`, which reads the operands from the tier; the nodes
//! only receive. Either way every rank computes the same plan, senders included.
//!
//! # Sending: direct or scatter-then-ring
//!
//! **Direct** (`--broadcast direct`): each packet is sent whole by its sender to each of its
//! receivers, point to point, in the same bulk-synchronous rounds as the uncoded exchange.
//!
//! **Scatter-then-ring** (`--broadcast ring`, Theorem 3's pseudo-broadcast): the payload of a
//! packet for `m` receivers (ascending ranks, the ring's order) is cut into `m` parts as
//! `metfs_shuffle::wire::parts` cuts it; the sender sends part `k` to the `k`-th receiver (the
//! *scatter*, in the round's first stage), then in `m − 1` ring stages each receiver
//! forwards to its successor the part it got in the stage before ([`Decoder::forwards`]),
//! until every receiver has every part; it then decodes as for a direct packet. Each stage
//! is one bulk-synchronous exchange (the transport runs ring stages until no rank has a part
//! to forward). Every receiver gets its scatter frame, even an empty part: the frame carries
//! the CRC of the sample it decodes, which differs between receivers; forwarded frames carry
//! none. The counts are `metfs_shuffle::wire::scatter_ring`'s (a unit test checks them).
//!
//! Both put the same bytes on the wire (a packet to `m` receivers costs `m` packets' bytes
//! either way, `metfs_shuffle::wire`); the ring lowers only what the sender's own port carries, for
//! `m − 1` more stages. So over point-to-point links the coded exchange cannot send fewer
//! bytes than the uncoded one; it would need a network that delivers one transmission to
//! several nodes. The report counts what was sent and, apart, each packet's payload once
//! (what such a broadcast would carry). docs/BENCHMARKS.md measures both ways of sending.
//!
//! # Frames
//!
//! Direct, to each receiver of packet `p`: `packet: u32, len: u32, crc: u32` (little endian),
//! then `len` bytes of payload. `packet` is `p`'s index in the plan; `crc` is the CRC-32 the
//! sender's slot journal recorded for the sample this receiver decodes from it (computed from
//! the tier's bytes on the extra rank; each receiver gets its own; the payload is the same for
//! all); `len` is the payload with its padding cut: blocks are zero-padded, so the XOR's bytes
//! past its longest point are zero and the receiver pads them back ([`CodedPlan::payload_len`]).
//! `len = u32::MAX` with no payload: the sender could not read an operand; each receiver
//! leaves its sample to the tier.
//!
//! Ring: `packet: u32, part: u32, len: u32, crc: u32`, then the part's `len` bytes; `crc` is
//! the receiver's in a scatter frame (`part` is the receiver's own) and 0 in a forwarded one;
//! a lost packet is a scatter frame with `len = u32::MAX` to each receiver, and nothing
//! forwarded.
//!
//! # Receiving
//!
//! A frame is decoded only if the plan names its sender for that packet and this node among
//! its receivers, and its length is the plan's (a ring part: its own part from the sender,
//! any other from its predecessor on the packet's ring, each of the cut's length; the packet
//! is decoded once all its parts are in); the packet's other points are XORed out with
//! the node's own copies (its slot of epoch `t − 1`). Blocks are put in place in their
//! sample's buffer; when the last one arrives the sample goes to [`crate::Inbox::accept_decoded`],
//! which checks its length and CRC as for an uncoded frame and journals it. A sample one of
//! whose blocks cannot be decoded (an operand this node cannot read, a packet sent as lost,
//! CRCs that differ between its packets) is dropped whole and left to the tier. The
//! reassembly is here rather than `metfs_shuffle::coded::Assembler`, whose `finish` yields all of a
//! node's samples or none: here each sample enters the inbox alone as soon as it is complete,
//! and memory holds only the samples in progress.

use std::collections::HashMap;
use std::time::Instant;

use metfs_shuffle::coded::{carpool, demands, Coded, Demand, Point, Sender};
use metfs_shuffle::Transition;

use super::{ExchangeError, Node, SenderMode};

mod decode;
mod encode;

pub use decode::Decoder;
pub use encode::Encoder;

/// The coding block in bytes (module docs).
pub const BLOCK: u32 = 4096;

/// Bytes of a coded frame's header.
pub const CODED_HEADER: usize = 12;

/// Bytes of a ring frame's header (a part of a packet, module docs).
pub const RING_HEADER: usize = 16;

/// `len` of a frame whose packet the sender could not encode.
const LOST: u32 = u32::MAX;

/// One epoch's coded exchange, the same on every rank (module docs).
#[derive(Debug, Clone)]
pub struct CodedPlan {
    /// The epoch being filled.
    pub epoch: u64,
    /// The demands with at least one block; the packets' points index them.
    pub demands: Vec<Demand>,
    /// The packets.
    pub coded: Coded,
    /// Each packet's sender.
    pub senders: Vec<u32>,
    /// For each receiver, `(sample, from)`: what goes uncoded (zero-byte samples).
    uncoded: Vec<Vec<(u32, u32)>>,
    /// Seconds it took to compute.
    pub secs: f64,
}

impl Node {
    /// The coded plan of epoch `epoch`, from `t`, the transition into it (module docs).
    pub fn coded_plan(&self, epoch: u64, t: &Transition) -> Result<CodedPlan, ExchangeError> {
        let t0 = Instant::now();
        let bad = |reason: String| ExchangeError::Coded { epoch, reason };
        let nodes = self.spec.nodes;
        let all = if epoch == 0 {
            Vec::new()
        } else {
            let prev = self.layout(epoch - 1)?;
            demands(&prev, t, self.catalog.sizes()).map_err(|e| bad(e.to_string()))?
        };
        let mut uncoded = vec![Vec::new(); nodes as usize];
        let mut coded_demands = Vec::with_capacity(all.len());
        for d in all {
            if d.len > 0 {
                coded_demands.push(d);
                continue;
            }
            let peer = &t.nodes[d.receiver as usize].peer;
            let from = peer
                .binary_search_by_key(&d.sample, |&(s, _)| s)
                .map(|k| peer[k].1)
                .map_err(|_| bad(format!("sample {} has no source", d.sample)))?;
            let from = if self.sender == SenderMode::Extra {
                nodes
            } else {
                from
            };
            uncoded[d.receiver as usize].push((d.sample, from));
        }
        let extra = self.sender == SenderMode::Extra;
        let who = if extra { Sender::Extra } else { Sender::Peers };
        let coded = carpool(&coded_demands, BLOCK, who).map_err(|e| bad(e.to_string()))?;
        let senders = if extra {
            vec![nodes; coded.packets.len()]
        } else {
            metfs_shuffle::wire::coded_peers(&coded, &coded_demands, nodes)
                .map_err(|e| bad(e.to_string()))?
                .1
        };
        Ok(CodedPlan {
            epoch,
            demands: coded_demands,
            coded,
            senders,
            uncoded,
            secs: t0.elapsed().as_secs_f64(),
        })
    }
}

/// The bytes of `point` within its block (the last block of a sample is short).
fn point_len(d: &Demand, point: Point) -> usize {
    let start = u64::from(point.block) * u64::from(BLOCK);
    d.len.saturating_sub(start).min(u64::from(BLOCK)) as usize
}

impl CodedPlan {
    /// Packet `p`'s payload on the wire: up to its longest point (module docs).
    pub fn payload_len(&self, p: usize) -> usize {
        self.coded.packets[p]
            .entries
            .iter()
            .map(|&e| point_len(&self.demands[e.demand as usize], e))
            .max()
            .unwrap_or(0)
    }

    fn receiver(&self, point: Point) -> u32 {
        self.demands[point.demand as usize].receiver
    }

    fn sample(&self, point: Point) -> u32 {
        self.demands[point.demand as usize].sample
    }

    /// The samples `rank` decodes from packets.
    pub fn decoded_for(&self, rank: u32) -> impl Iterator<Item = u32> + '_ {
        self.demands
            .iter()
            .filter(move |d| d.receiver == rank)
            .map(|d| d.sample)
    }

    /// For each rank, the samples `rank` sends it uncoded.
    pub fn uncoded_outgoing(&self, rank: u32) -> Vec<Vec<u32>> {
        self.uncoded
            .iter()
            .map(|l| {
                l.iter()
                    .filter(|&&(_, from)| from == rank)
                    .map(|&(s, _)| s)
                    .collect()
            })
            .collect()
    }

    /// What `rank` receives uncoded: each sample and its sender.
    pub fn uncoded_expected(&self, rank: u32) -> HashMap<u32, u32> {
        self.uncoded
            .get(rank as usize)
            .map(|l| l.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Whether any rank sends anything uncoded (then every rank takes part in those rounds).
    pub fn has_uncoded(&self) -> bool {
        self.uncoded.iter().any(|l| !l.is_empty())
    }

    /// A digest of everything the ranks must agree on: block, demands, packets, senders and
    /// what goes uncoded (FNV-1a, stable across builds).
    pub fn digest(&self) -> u64 {
        let mut h = metfs_plan::digest::Fnv1a::new();
        let mut put = |x: u64| {
            h.write_u64(x);
        };
        put(self.epoch);
        put(u64::from(BLOCK));
        for d in &self.demands {
            put(u64::from(d.sample) | u64::from(d.receiver) << 32);
            put(d.len);
            put(d.holders.bits() as u64);
            put((d.holders.bits() >> 64) as u64);
        }
        for (p, &from) in self.coded.packets.iter().zip(&self.senders) {
            put(p.entries.len() as u64 | u64::from(from) << 32);
            for e in &p.entries {
                put(u64::from(e.demand) | u64::from(e.block) << 32);
            }
        }
        for (i, l) in self.uncoded.iter().enumerate() {
            for &(s, from) in l {
                put(i as u64 | u64::from(s) << 16 | u64::from(from) << 48);
            }
        }
        h.finish()
    }
}
