//! What an exchange costs on the wire, counted message by message from a plan: payload bytes
//! over all links, messages, bytes read from the tier, and the busiest port.
//!
//! # The network model
//!
//! The paper's §3.1: a full mesh of single-ported, full-duplex links of one bandwidth. A rank
//! sends one message at a time and receives one at a time, so an exchange takes at least its
//! busiest port's bytes (the larger of what that rank sends and receives) over the bandwidth;
//! [`Traffic::busiest_port_bytes`] is that bound, which pipelining reaches up to a message.
//! Payload only: the transport's framing (a packet's list of points, a few bytes each) is
//! left out, as the paper leaves it out.
//!
//! # Pseudo-broadcast (Theorem 3)
//!
//! A packet of `P` bytes reaches a group of `m` receivers by scatter-then-ring
//! ([`scatter_ring`]): the sender cuts it into `m` parts and sends part `k` to receiver `k`
//! (`P` bytes, `m` messages); then in `m − 1` stages each receiver forwards to the next one
//! the part it got in the stage before (`(m−1)·P` bytes, `m(m−1)` messages). A packet shorter
//! than its group has empty parts: the ring does not forward them, but the scatter still sends
//! each receiver a message, since that message also tells it its sample's checksum (the
//! transport, `metfs-shuffle --broadcast ring`, does exactly this; a test there checks its
//! counts against [`scatter_ring`]). The paper prints
//! the part worker `i` sends in stage `j + 1` as `((i + j − 2) mod n) + 1`, which is right for
//! `j = 1` only: worker `i` holds, and forwards, part `((i − j) mod n) + 1`. Each receiver
//! receives `P`; the sender's port carries `P` however large `m` is, which is where the
//! coded scheme's gain lies. In wire bytes a coded packet to `m` receivers costs `m·P`, what
//! `m` unicasts of its points cost: coding cannot lower the bytes every receiver must take
//! in, only the bytes one sender must put out.
//!
//! By default the group is the packet's receivers ([`Fanout::Receivers`]): nobody else can
//! use it. [`Fanout::All`] sends every packet to every node, the paper's broadcast setting of
//! Theorems 1 and 3.
//!
//! # The schemes
//!
//! * [`uncoded_peers`]: each sample a node needs goes from the source the planner named, one
//!   message each (the baseline: no extra rank, no tier reads).
//! * [`uncoded_extra`]: the paper's uncoded scheme: the extra rank reads each needed sample
//!   from the tier and unicasts it.
//! * [`coded_extra`]: the paper's coded scheme: the extra rank reads the operands from the
//!   tier and pseudo-broadcasts each packet.
//! * [`coded_peers`]: each packet is sent by a node holding all its points (the one that has
//!   sent the fewest bytes so far, ties to the lowest rank), then scatter-then-ring.
//!
//! Ranks `0..nodes` are the nodes; the extra rank is rank `nodes`.

use std::collections::HashSet;

use thiserror::Error;

use crate::coded::{Coded, Demand};
use crate::plan::Transition;
use crate::NodeSet;

/// The cost of one exchange.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Traffic {
    /// The paper's unit: packets (coded) or unicasts of a sample (uncoded).
    pub transmissions: u64,
    /// Payload bytes over all links.
    pub wire_bytes: u64,
    /// Point-to-point messages.
    pub messages: u64,
    /// Bytes read from the capacity tier.
    pub tier_bytes: u64,
    /// The busiest rank's larger direction: the exchange takes at least this many bytes'
    /// time at link bandwidth.
    pub busiest_port_bytes: u64,
    /// That rank (`nodes` is the extra rank).
    pub busiest_rank: u32,
}

/// Errors of the cost model.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum WireError {
    /// In peers mode a packet has no node holding all its points.
    #[error("packet {packet} has no sender: no node that is not a receiver holds all its points")]
    NoSender { packet: usize },
    /// A rank in the plan is not below the node count.
    #[error("rank {rank} is not in 0..{nodes}")]
    BadRank { rank: u32, nodes: u32 },
}

/// Which nodes a coded packet is pseudo-broadcast to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fanout {
    /// Its receivers only (the default: nobody else can use it).
    Receivers,
    /// Every node, as in the paper's broadcast model.
    All,
}

/// One scatter-then-ring pseudo-broadcast of `bytes` to `group` receivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScatterRing {
    /// Bytes over all links: `group × bytes`.
    pub wire_bytes: u64,
    /// Messages: one scatter message per receiver, then the ring's (empty parts are not
    /// forwarded).
    pub messages: u64,
    /// Bytes on the critical path, scatter then `group − 1` ring stages of the largest part:
    /// Theorem 3's `(2m − 1)/m` unicast times when `m` divides the packet.
    pub stage_bytes: u64,
}

/// The part sizes of a packet of `bytes` cut for `m` receivers: the first `bytes mod m` get
/// one byte more. Part `k` goes to the `k`-th receiver by ascending rank.
pub fn parts(bytes: u64, m: u64) -> impl Iterator<Item = u64> {
    (0..m).map(move |k| bytes / m + u64::from(k < bytes % m))
}

/// The cost of one scatter-then-ring to `group ≥ 1` receivers.
pub fn scatter_ring(bytes: u64, group: u32) -> ScatterRing {
    let m = u64::from(group.max(1));
    let sent_parts = parts(bytes, m).filter(|&p| p > 0).count() as u64;
    ScatterRing {
        wire_bytes: m * bytes,
        messages: m + sent_parts * (m - 1),
        stage_bytes: bytes + (m - 1) * bytes.div_ceil(m),
    }
}

/// Per-rank bytes sent and received.
struct Ports {
    sent: Vec<u64>,
    received: Vec<u64>,
    traffic: Traffic,
}

impl Ports {
    fn new(ranks: u32) -> Self {
        Self {
            sent: vec![0; ranks as usize],
            received: vec![0; ranks as usize],
            traffic: Traffic::default(),
        }
    }

    fn unicast(&mut self, from: u32, to: u32, bytes: u64) {
        self.sent[from as usize] += bytes;
        self.received[to as usize] += bytes;
        self.traffic.wire_bytes += bytes;
        self.traffic.messages += 1;
    }

    /// Scatter from `from` to `group` (ascending ranks, the ring's order), then the ring.
    fn scatter_ring(&mut self, from: u32, group: NodeSet, bytes: u64) {
        let members: Vec<u32> = group.iter().collect();
        let m = members.len() as u64;
        let part: Vec<u64> = parts(bytes, m).collect();
        for (k, &r) in members.iter().enumerate() {
            self.unicast(from, r, part[k]);
        }
        // Stage s: member k forwards the part that started at member k − s + 1.
        for s in 1..members.len() {
            for (k, &r) in members.iter().enumerate() {
                let origin = (k + members.len() - (s - 1)) % members.len();
                let next = members[(k + 1) % members.len()];
                if part[origin] > 0 {
                    self.unicast(r, next, part[origin]);
                }
            }
        }
    }

    fn finish(mut self) -> Traffic {
        let (rank, bytes) = self
            .sent
            .iter()
            .zip(&self.received)
            .map(|(s, r)| *s.max(r))
            .enumerate()
            .max_by_key(|&(rank, b)| (b, std::cmp::Reverse(rank)))
            .unwrap_or((0, 0));
        self.traffic.busiest_port_bytes = bytes;
        self.traffic.busiest_rank = rank as u32;
        self.traffic
    }
}

/// Bytes of the distinct samples among `demands`: what the extra rank reads from the tier.
fn distinct_sample_bytes(demands: &[Demand]) -> u64 {
    let mut seen = HashSet::new();
    demands
        .iter()
        .filter(|d| seen.insert(d.sample))
        .map(|d| d.len)
        .sum()
}

/// The uncoded peer exchange of a transition: one message per sample from its planned source.
/// Its tier bytes are the plan's tier reads.
pub fn uncoded_peers(transition: &Transition, sizes: &[u64]) -> Result<Traffic, WireError> {
    let nodes = transition.nodes.len() as u32;
    let mut ports = Ports::new(nodes);
    for (i, plan) in transition.nodes.iter().enumerate() {
        for &(j, from) in &plan.peer {
            if from >= nodes {
                return Err(WireError::BadRank { rank: from, nodes });
            }
            ports.unicast(from, i as u32, sizes[j as usize]);
            ports.traffic.transmissions += 1;
        }
    }
    ports.traffic.tier_bytes = transition.tier_bytes();
    Ok(ports.finish())
}

/// The paper's uncoded scheme: the extra rank reads every needed sample from the tier and
/// unicasts it to each node that needs it.
pub fn uncoded_extra(demands: &[Demand]) -> Traffic {
    let nodes = demands.iter().map(|d| d.receiver + 1).max().unwrap_or(0);
    let mut ports = Ports::new(nodes + 1);
    for d in demands {
        ports.unicast(nodes, d.receiver, d.len);
        ports.traffic.transmissions += 1;
    }
    ports.traffic.tier_bytes = distinct_sample_bytes(demands);
    ports.finish()
}

/// The paper's coded scheme: the extra rank (rank `nodes`) reads the operands from the tier
/// and pseudo-broadcasts each packet to its receivers or to all `nodes` nodes.
pub fn coded_extra(
    coded: &Coded,
    demands: &[Demand],
    nodes: u32,
    fanout: Fanout,
) -> Result<Traffic, WireError> {
    check_ranks(demands, nodes)?;
    let mut ports = Ports::new(nodes + 1);
    let all = NodeSet::first(nodes);
    for packet in &coded.packets {
        let group = match fanout {
            Fanout::Receivers => packet.receivers(demands),
            Fanout::All => all,
        };
        ports.scatter_ring(nodes, group, u64::from(coded.block_bytes));
        ports.traffic.transmissions += 1;
    }
    ports.traffic.tier_bytes = distinct_sample_bytes(demands);
    Ok(ports.finish())
}

/// Coded peers mode: each packet is sent by a node holding all its points (the one that has
/// sent the fewest bytes so far, ties to the lowest rank) and pseudo-broadcast to its
/// receivers. Returns the cost and each packet's sender.
pub fn coded_peers(
    coded: &Coded,
    demands: &[Demand],
    nodes: u32,
) -> Result<(Traffic, Vec<u32>), WireError> {
    check_ranks(demands, nodes)?;
    let mut ports = Ports::new(nodes);
    let mut senders = Vec::with_capacity(coded.packets.len());
    for (k, packet) in coded.packets.iter().enumerate() {
        let candidates = packet.common_holders(demands);
        let from = candidates
            .iter()
            .filter(|&r| r < nodes)
            .min_by_key(|&r| (ports.sent[r as usize], r))
            .ok_or(WireError::NoSender { packet: k })?;
        ports.scatter_ring(
            from,
            packet.receivers(demands),
            u64::from(coded.block_bytes),
        );
        ports.traffic.transmissions += 1;
        senders.push(from);
    }
    Ok((ports.finish(), senders))
}

fn check_ranks(demands: &[Demand], nodes: u32) -> Result<(), WireError> {
    for d in demands {
        let top = d.holders.union(NodeSet::single(d.receiver));
        if let Some(rank) = top.iter().find(|&r| r >= nodes) {
            return Err(WireError::BadRank { rank, nodes });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coded::{carpool, tables, Sender};

    #[test]
    fn scatter_ring_counts() {
        // Four receivers, 400 bytes: 4 parts of 100, scatter 4 messages, 3 stages of 4.
        let s = scatter_ring(400, 4);
        assert_eq!(s.wire_bytes, 1600);
        assert_eq!(s.messages, 16);
        // (2·4 − 1)/4 × 400
        assert_eq!(s.stage_bytes, 700);
        // Fewer bytes than receivers: every receiver gets a scatter message, empty parts are
        // not forwarded.
        assert_eq!(scatter_ring(2, 4).messages, 4 + 2 * 3);
        let mut ports = Ports::new(5);
        ports.scatter_ring(4, NodeSet::from_ranks([0, 1, 2, 3]), 2);
        assert_eq!(ports.finish().messages, 10);
        assert_eq!(scatter_ring(10, 1).messages, 1);

        let mut ports = Ports::new(5);
        ports.scatter_ring(4, NodeSet::from_ranks([0, 1, 2, 3]), 400);
        assert!(ports.received[..4].iter().all(|&r| r == 400));
        assert_eq!(ports.sent[4], 400);
        assert!(ports.sent[..4].iter().all(|&s| s == 300));
        let t = ports.finish();
        assert_eq!(
            (t.wire_bytes, t.messages, t.busiest_port_bytes),
            (1600, 16, 400)
        );
    }

    #[test]
    fn coded_saves_the_senders_port_not_the_wire() {
        let caches = [vec![2u32, 3, 4, 8], vec![6, 7, 8, 9], vec![1, 3, 4, 5]];
        let assigned = [vec![3u32, 5, 8], vec![1, 4, 9], vec![2, 6, 7]];
        let mut demands = Vec::new();
        for (i, wants) in assigned.iter().enumerate() {
            for &j in wants.iter().filter(|j| !caches[i].contains(j)) {
                let holders =
                    NodeSet::from_ranks((0..3).filter(|&k| caches[k as usize].contains(&j)));
                demands.push(Demand {
                    sample: j,
                    len: 6,
                    receiver: i as u32,
                    holders,
                });
            }
        }
        let uncoded = uncoded_extra(&demands);
        assert_eq!((uncoded.wire_bytes, uncoded.busiest_port_bytes), (36, 36));
        let coded = carpool(&demands, 6, Sender::Extra).unwrap();
        let t = coded_extra(&coded, &demands, 3, Fanout::Receivers).unwrap();
        assert_eq!(t.transmissions, 3);
        assert_eq!(t.wire_bytes, 36); // 6 points reach their receivers, 6 bytes each
        assert_eq!(t.busiest_port_bytes, 18); // the extra rank sends 3 packets
        assert_eq!(t.tier_bytes, 36);
        let all = coded_extra(&coded, &demands, 3, Fanout::All).unwrap();
        assert_eq!(all.wire_bytes, 54);
        let original = tables(&demands, 6).unwrap().into_coded();
        assert!(coded_peers(&original, &demands, 3).is_err());
        let peers = carpool(&demands, 6, Sender::Peers).unwrap();
        let (t, senders) = coded_peers(&peers, &demands, 3).unwrap();
        assert_eq!(senders.len(), peers.packets.len());
        assert_eq!(t.tier_bytes, 0);
    }
}
