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
//! sample's buffer; when the last one arrives the sample goes to [`Inbox::accept_decoded`],
//! which checks its length and CRC as for an uncoded frame and journals it. A sample one of
//! whose blocks cannot be decoded (an operand this node cannot read, a packet sent as lost,
//! CRCs that differ between its packets) is dropped whole and left to the tier. The
//! reassembly is here rather than `metfs_shuffle::coded::Assembler`, whose `finish` yields all of a
//! node's samples or none: here each sample enters the inbox alone as soon as it is complete,
//! and memory holds only the samples in progress.

use std::collections::HashMap;
use std::time::Instant;

use metfs_shuffle::coded::{
    carpool, decode, demands, encode, Coded, Demand, Packet, Point, Sender,
};
use metfs_shuffle::Transition;

use super::{Accepted, Broadcast, ExchangeError, Held, Inbox, Node, SenderMode};

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

/// The packets one node sends, encoded and framed round by round.
pub struct Encoder<'a> {
    plan: &'a CodedPlan,
    held: Held<'a>,
    /// The packets this node sends, in plan order, and how many are sent.
    mine: Vec<u32>,
    at: usize,
    ranks: usize,
    broadcast: Broadcast,
    /// Fault injection: the peers whose first frame is still to be corrupted.
    corrupt: Vec<bool>,
    /// Packets sent so far (each once), and their payload bytes.
    pub packets: u64,
    pub packet_bytes: u64,
    /// Frames sent (a whole packet to one receiver, or one part of it), and their payload.
    pub frames: u64,
    pub frame_bytes: u64,
}

impl<'a> Encoder<'a> {
    /// This node's packets of `plan`, their operands read from its slot of epoch
    /// `plan.epoch − 1` (the extra rank: from the tier).
    pub fn new(node: &'a Node, plan: &'a CodedPlan) -> Self {
        let me = node.spec.rank;
        let mine = (0..plan.senders.len() as u32)
            .filter(|&p| plan.senders[p as usize] == me)
            .collect();
        Self {
            plan,
            held: Held::open(node, plan.epoch.saturating_sub(1), Held::DEFAULT_CAP),
            mine,
            at: 0,
            ranks: node.ranks() as usize,
            broadcast: node.broadcast,
            corrupt: Vec::new(),
            packets: 0,
            packet_bytes: 0,
            frames: 0,
            frame_bytes: 0,
        }
    }

    /// Fault injection for tests: flips a payload byte of the first frame (with payload)
    /// sent to each peer.
    pub fn corrupt_first(mut self) -> Self {
        self.corrupt = vec![true; self.ranks];
        self
    }

    /// This round's frames to each rank: packets in plan order, each encoded once and framed
    /// for each of its receivers (whole, or its part for a ring), until the next would take
    /// a part past `max_bytes` (a part holds at least one frame).
    pub fn round(&mut self, max_bytes: usize) -> Vec<Vec<u8>> {
        let plan = self.plan;
        let ring = self.broadcast == Broadcast::Ring;
        let header = if ring { RING_HEADER } else { CODED_HEADER };
        let mut parts = vec![Vec::new(); self.ranks];
        while let Some(&p) = self.mine.get(self.at) {
            let packet = &plan.coded.packets[p as usize];
            let len = plan.payload_len(p as usize);
            // What each receiver (by ascending rank, the ring's order) gets of the payload.
            let cut: Vec<usize> = if ring {
                metfs_shuffle::wire::parts(len as u64, packet.entries.len() as u64)
                    .map(|b| b as usize)
                    .collect()
            } else {
                vec![len; packet.entries.len()]
            };
            let full = packet.entries.iter().zip(&cut).any(|(&e, &n)| {
                let part: &Vec<u8> = &parts[plan.receiver(e) as usize];
                !part.is_empty() && part.len() + header + n > max_bytes
            });
            if full {
                break;
            }
            let payload = self.encode(packet);
            if payload.is_some() {
                self.packets += 1;
                self.packet_bytes += len as u64;
            }
            let mut offset = 0;
            for (k, (&e, &n)) in packet.entries.iter().zip(&cut).enumerate() {
                let r = plan.receiver(e) as usize;
                let part = &mut parts[r];
                part.extend_from_slice(&p.to_le_bytes());
                if ring {
                    part.extend_from_slice(&(k as u32).to_le_bytes());
                }
                self.frames += 1;
                match &payload {
                    Some(b) => {
                        let crc = self
                            .held
                            .crc(plan.sample(e))
                            .expect("loaded samples are journaled");
                        part.extend_from_slice(&(n as u32).to_le_bytes());
                        part.extend_from_slice(&crc.to_le_bytes());
                        let at = part.len();
                        let bytes = if ring {
                            &b[offset..offset + n]
                        } else {
                            &b[..n]
                        };
                        part.extend_from_slice(bytes);
                        offset += n;
                        self.frame_bytes += n as u64;
                        if self.corrupt.get(r).copied().unwrap_or(false) && n > 0 {
                            part[at] ^= 0xff;
                            self.corrupt[r] = false;
                        }
                    }
                    None => {
                        part.extend_from_slice(&LOST.to_le_bytes());
                        part.extend_from_slice(&0u32.to_le_bytes());
                    }
                }
            }
            self.at += 1;
        }
        parts
    }

    /// The payload of `packet` (a whole block), or `None` when an operand is unreadable.
    fn encode(&mut self, packet: &Packet) -> Option<Vec<u8>> {
        let plan = self.plan;
        let ids: Vec<u32> = packet.entries.iter().map(|&e| plan.sample(e)).collect();
        let why = if self.held.load(&ids) {
            match encode(packet, &plan.demands, BLOCK, &self.held) {
                Ok(b) => return Some(b),
                Err(e) => e.to_string(),
            }
        } else {
            "an operand is not in this node's slot or its journal (or the extra rank's tier)"
                .to_string()
        };
        tracing::warn!(
            epoch = plan.epoch,
            samples = ?ids,
            "cannot encode a coded packet ({why}); its receivers get these samples from the tier"
        );
        None
    }

    /// Bytes read from the tier (the extra rank).
    pub fn tier_bytes(&self) -> u64 {
        self.held.tier_bytes()
    }

    /// Whether every packet has been sent.
    pub fn done(&self) -> bool {
        self.at >= self.mine.len()
    }
}

/// One sample being reassembled.
struct Pending {
    crc: Option<u32>,
    data: Vec<u8>,
    got: Vec<bool>,
    left: usize,
    /// Complete (and handed to the inbox) or given up: later frames for it are ignored.
    closed: bool,
}

/// One packet being gathered from its parts (scatter-then-ring).
struct Gathering {
    payload: Vec<u8>,
    have: Vec<bool>,
    left: usize,
    /// This receiver's sample's CRC, from the sender's scatter frame.
    crc: Option<u32>,
    /// Decoded, or given up.
    done: bool,
}

/// One node's side of receiving coded packets (module docs).
pub struct Decoder<'a> {
    node: &'a Node,
    plan: &'a CodedPlan,
    held: Held<'a>,
    me: u32,
    /// By demand index.
    pending: HashMap<u32, Pending>,
    /// Scatter-then-ring: packets being gathered, and the parts to forward in the next stage,
    /// by rank.
    broadcast: Broadcast,
    gathering: HashMap<u32, Gathering>,
    forward: Vec<Vec<u8>>,
    /// Blocks decoded so far.
    pub blocks: u64,
    /// Parts forwarded along rings, and their payload bytes.
    pub forwarded: u64,
    pub forwarded_bytes: u64,
}

impl<'a> Decoder<'a> {
    /// Decodes with this node's slot of epoch `plan.epoch − 1`.
    pub fn new(node: &'a Node, plan: &'a CodedPlan) -> Self {
        Self {
            node,
            plan,
            held: Held::open(node, plan.epoch.saturating_sub(1), Held::DEFAULT_CAP),
            me: node.spec.rank,
            pending: HashMap::new(),
            broadcast: node.broadcast,
            gathering: HashMap::new(),
            forward: vec![Vec::new(); node.ranks() as usize],
            blocks: 0,
            forwarded: 0,
            forwarded_bytes: 0,
        }
    }

    /// The parts to forward in the next ring stage, by rank (empty for direct sending);
    /// taking them empties the queue.
    pub fn forwards(&mut self) -> Vec<Vec<u8>> {
        let n = self.forward.len();
        std::mem::replace(&mut self.forward, vec![Vec::new(); n])
    }

    /// Whether a ring stage has anything of this node's to forward.
    pub fn has_forwards(&self) -> bool {
        self.forward.iter().any(|f| !f.is_empty())
    }

    /// Decodes the frames of `part`, sent by rank `from`, and hands each sample it completes
    /// to `inbox`.
    pub fn accept(
        &mut self,
        inbox: &mut Inbox,
        from: u32,
        part: &[u8],
    ) -> Result<Accepted, ExchangeError> {
        if self.broadcast == Broadcast::Ring {
            return self.accept_ring(inbox, from, part);
        }
        self.accept_direct(inbox, from, part)
    }

    fn accept_direct(
        &mut self,
        inbox: &mut Inbox,
        from: u32,
        mut part: &[u8],
    ) -> Result<Accepted, ExchangeError> {
        let mut got = Accepted::default();
        while !part.is_empty() {
            let (head, rest) = super::take(part, CODED_HEADER, from)?;
            let word = |k: usize| u32::from_le_bytes(head[k..k + 4].try_into().expect("4 bytes"));
            let (p, len, crc) = (word(0), word(4), word(8));
            let body = if len == LOST { 0 } else { len as usize };
            let (payload, rest) = super::take(rest, body, from)?;
            part = rest;
            self.frame(inbox, from, p, len, crc, payload, &mut got)?;
        }
        Ok(got)
    }

    fn accept_ring(
        &mut self,
        inbox: &mut Inbox,
        from: u32,
        mut part: &[u8],
    ) -> Result<Accepted, ExchangeError> {
        let mut got = Accepted::default();
        while !part.is_empty() {
            let (head, rest) = super::take(part, RING_HEADER, from)?;
            let word = |k: usize| u32::from_le_bytes(head[k..k + 4].try_into().expect("4 bytes"));
            let (p, k, n, crc) = (word(0), word(4), word(8), word(12));
            let body = if n == LOST { 0 } else { n as usize };
            let (bytes, rest) = super::take(rest, body, from)?;
            part = rest;
            self.ring_frame(inbox, from, p, k, n, crc, bytes, &mut got)?;
        }
        Ok(got)
    }

    /// One part `k` of packet `p`: from the packet's sender if it is this node's own part
    /// (with its CRC), else from this node's predecessor on the packet's ring. Forwards it to
    /// the successor unless the successor is where it started; decodes the packet once every
    /// part is in.
    #[allow(clippy::too_many_arguments)]
    fn ring_frame(
        &mut self,
        inbox: &mut Inbox,
        from: u32,
        p: u32,
        k: u32,
        n: u32,
        crc: u32,
        bytes: &[u8],
        got: &mut Accepted,
    ) -> Result<(), ExchangeError> {
        let plan = self.plan;
        let me = self.me;
        let members: Vec<u32> = plan
            .coded
            .packets
            .get(p as usize)
            .map(|packet| packet.entries.iter().map(|&e| plan.receiver(e)).collect())
            .unwrap_or_default();
        let m = members.len();
        let pos = members.iter().position(|&r| r == me);
        let len = if m > 0 {
            plan.payload_len(p as usize)
        } else {
            0
        };
        let cut: Vec<usize> = metfs_shuffle::wire::parts(len as u64, m as u64)
            .map(|b| b as usize)
            .collect();
        let valid = pos.filter(|&pos| {
            let k = k as usize;
            let expected_from = if k == pos {
                plan.senders[p as usize]
            } else {
                members[(pos + m - 1) % m]
            };
            k < m && from == expected_from && (n == LOST && k == pos || n as usize == cut[k])
        });
        let Some(pos) = valid else {
            tracing::warn!(
                packet = p,
                part = k,
                from,
                "a part of a coded packet this node does not expect from that rank; ignored"
            );
            got.rejected += 1;
            return Ok(());
        };
        let k = k as usize;
        let sender = plan.senders[p as usize];
        if n == LOST {
            let done = self.gathering.get(&p).is_some_and(|g| g.done);
            if !done {
                self.gathering.insert(
                    p,
                    Gathering {
                        payload: Vec::new(),
                        have: Vec::new(),
                        left: 0,
                        crc: None,
                        done: true,
                    },
                );
                self.frame(inbox, sender, p, LOST, 0, &[], got)?;
            }
            return Ok(());
        }
        let g = self.gathering.entry(p).or_insert_with(|| Gathering {
            payload: vec![0; len],
            have: vec![false; m],
            left: m,
            crc: None,
            done: false,
        });
        if g.done || g.have[k] {
            if !g.done {
                tracing::warn!(
                    packet = p,
                    part = k,
                    from,
                    "a part arrived twice; kept the first"
                );
            }
            return Ok(());
        }
        // Part `k` started at member `k` and has made `(pos − k) mod m` hops: it goes on
        // until the member before `k` has it.
        if (pos + m - k) % m < m - 1 {
            let next = &mut self.forward[members[(pos + 1) % m] as usize];
            next.extend_from_slice(&p.to_le_bytes());
            next.extend_from_slice(&(k as u32).to_le_bytes());
            next.extend_from_slice(&n.to_le_bytes());
            next.extend_from_slice(&0u32.to_le_bytes());
            next.extend_from_slice(bytes);
            self.forwarded += 1;
            self.forwarded_bytes += bytes.len() as u64;
        }
        let start: usize = cut[..k].iter().sum();
        g.payload[start..start + bytes.len()].copy_from_slice(bytes);
        g.have[k] = true;
        g.left -= 1;
        if k == pos {
            g.crc = Some(crc);
        }
        if g.left == 0 {
            g.done = true;
            let payload = std::mem::take(&mut g.payload);
            let crc = g.crc.expect("this node's own part is in");
            self.frame(inbox, sender, p, len as u32, crc, &payload, got)?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn frame(
        &mut self,
        inbox: &mut Inbox,
        from: u32,
        p: u32,
        len: u32,
        crc: u32,
        payload: &[u8],
        got: &mut Accepted,
    ) -> Result<(), ExchangeError> {
        let plan = self.plan;
        let me = self.me;
        let packet = plan
            .coded
            .packets
            .get(p as usize)
            .filter(|_| plan.senders[p as usize] == from);
        let Some((packet, point)) = packet.and_then(|packet| {
            let point = packet.entries.iter().find(|&&e| plan.receiver(e) == me)?;
            Some((packet, *point))
        }) else {
            tracing::warn!(
                packet = p,
                from,
                "a coded frame this node does not expect from that rank; ignored"
            );
            got.rejected += 1;
            return Ok(());
        };
        let d = plan.demands[point.demand as usize];
        let state = self.pending.entry(point.demand).or_insert_with(|| Pending {
            crc: None,
            data: vec![0; d.len as usize],
            got: vec![false; d.blocks(BLOCK) as usize],
            left: d.blocks(BLOCK) as usize,
            closed: false,
        });
        if state.closed {
            return Ok(());
        }
        let expected_len = plan.payload_len(p as usize);
        let why = if len == LOST {
            Some("the sender could not read an operand".to_string())
        } else if len as usize != expected_len {
            Some(format!(
                "a payload of {len} bytes, the plan's is {expected_len}"
            ))
        } else if *state.crc.get_or_insert(crc) != crc {
            Some("its packets disagree on its CRC".to_string())
        } else {
            let others: Vec<u32> = packet
                .entries
                .iter()
                .filter(|&&e| e != point)
                .map(|&e| plan.sample(e))
                .collect();
            if !self.held.load(&others) {
                Some("this node cannot read a sample it must XOR out".to_string())
            } else {
                let mut block = payload.to_vec();
                block.resize(BLOCK as usize, 0);
                match decode(packet, &block, me, &plan.demands, BLOCK, &self.held) {
                    Ok((_, block)) => {
                        let b = point.block as usize;
                        if state.got[b] {
                            tracing::warn!(
                                sample = d.sample,
                                block = b,
                                from,
                                "a block arrived twice; kept the first"
                            );
                            return Ok(());
                        }
                        state.got[b] = true;
                        state.left -= 1;
                        self.blocks += 1;
                        let start = b * BLOCK as usize;
                        let n = point_len(&d, point);
                        state.data[start..start + n].copy_from_slice(&block[..n]);
                        None
                    }
                    Err(e) => Some(e.to_string()),
                }
            }
        };
        if let Some(why) = why {
            tracing::warn!(
                sample = %self.node.path_of(d.sample),
                packet = p,
                from,
                "a sample cannot be decoded ({why}); the tier serves it"
            );
            state.closed = true;
            state.data = Vec::new();
            got.rejected += 1;
            return Ok(());
        }
        if state.left == 0 {
            state.closed = true;
            let data = std::mem::take(&mut state.data);
            let crc = state.crc.expect("set by its first frame");
            *got += inbox.accept_decoded(self.node, d.sample, crc, &data)?;
        }
        Ok(())
    }

    /// Samples some of whose blocks never arrived (left to the tier).
    pub fn incomplete(&self) -> usize {
        let expected = self.plan.decoded_for(self.me).count();
        let closed = self.pending.values().filter(|s| s.closed).count();
        expected - closed
    }
}
