//! UberShuffle (paper 002): coded multicast of the samples nodes need, over fixed-size blocks.
//!
//! # The scheme (§2.2)
//!
//! A *demand* is a sample node `i` needs and does not hold, with the set `H` of live nodes
//! that hold it. Samples are cut into *points*, fixed-size blocks (below). A point needed by
//! `i` goes to **table** `I = {i} ∪ H`, **column** `i`; every point of column `k` of table `I`
//! is then held by all of `I ∖ {k}`. Each **row** of a table is one packet: the XOR of the
//! row's points, one per non-empty column. Member `k` decodes its point by XORing out the
//! others, all of which it holds. A table costs as many packets as its longest column
//! ([`tables`]). The paper's Examples 1–3 (6 unicasts, 4 coded packets, 3 with the carpool)
//! are unit tests.
//!
//! # The carpool (§3.2) and what this crate pins down
//!
//! With finitely many points, columns of one table differ in length and rows go out half
//! empty. The carpool moves points into those gaps along a DAG of columns. The paper leaves
//! several things open or prints them wrong; this module settles them as follows.
//!
//! * **Edge direction.** A point of column `i` of table `A` may move to column `i` of table
//!   `B` only if `i ∈ B ⊂ A`: the point is held by `A ∖ {i}`, so it is held by `B ∖ {i}` and
//!   every other member of `B` can still XOR it out. The text says the edge runs from `A` to
//!   `B` when `A ⊂ B`; its own example (column 1 of `{1,2,3}` to column 1 of `{1,3}`) and the
//!   decoding condition need `B ⊂ A`, the direction used here.
//! * **`α = s/q`**, the fraction of the dataset a node holds (§2). Fig. 3's caption prints
//!   `q/s`, which is above 1.
//! * **The flow, greedily, bottom layer first.** A row whose points all sit in one table `R`
//!   (its receivers) is valid exactly when each of its points is held by the other receivers,
//!   so the carpool builds rows directly, keeping for each open row its receivers `R` and the
//!   nodes `K` that hold all its points. It first keeps every table's *full* rows (those below
//!   its shortest column: no gap to fill). The remaining, *loose* points are taken by layer
//!   of the DAG from the bottom, that is by increasing table size (then table, column, sample,
//!   block, so the order is total): the points with the fewest holders are the least flexible
//!   and are placed first; points from larger tables then flow down into the rows the smaller
//!   ones opened. A point `x` (needed by `i`, held by `H`) may join an open row with
//!   `R ⊆ H` and `i ∈ K`; among those it joins the one that keeps the most common holders
//!   (`|K ∩ H|`), then the one with the most receivers, so that rows stay open to later
//!   points; with none it opens a row of its own. Its final table is the row's `R`, a subset
//!   of its own table, so every move is an edge of the DAG. Candidate rows are found by
//!   looking up, for each subset `S ⊆ H`, the most recently grown row with receivers `S`
//!   that `i` can join (or, when `H` has more than twice as many subsets as there are such
//!   receiver sets for `i`, by scanning those sets instead); each lookup weighs that one row
//!   only, not every row with receivers `S`.
//! * **Never worse than the tables.** The greedy is a heuristic; when it ends with more
//!   packets than the tables it started from (it can, by a row or two, where the tables are
//!   nearly balanced already), the tables' rows are kept ([`Coded::fallback`]).
//! * **The coding unit** is a fixed-size block (`block_bytes`), not a sample: the paper's
//!   data points are unit-sized, real samples are not. Sample `j` of `len` bytes is
//!   `⌈len/block⌉` points; its last block is zero-padded, every packet is one block, and the
//!   receiver cuts the sample back to `len`, which it knows from the catalog. A zero-byte
//!   sample has no points (the receiver creates it empty). All points of one sample share its
//!   receiver and holders, so they land in one column.
//! * **Who sends.** In the paper's model one extra rank holds everything and sends every
//!   packet ([`Sender::Extra`]; in metfs it reads the operands from the tier). In
//!   [`Sender::Peers`] the holders send, and a packet needs a node that holds all of its
//!   points and is not one of its receivers: a full row of an exclusive table never has one
//!   (each member lacks its own column), so in peers mode every point goes through the greedy,
//!   which then joins a point to a row only if the row keeps such a common holder.
//!
//! Costs on the wire (scatter-then-ring, the ports) are in [`crate::wire`]; Theorem 1's
//! prediction in [`crate::theory`]. What a plan will cost to compute (its tables, points,
//! memory and time, in closed form before planning) and the limits past which a mount
//! refuses it are in [`mod@estimate`].

mod carpool;
mod codec;
pub mod estimate;
mod tables;

#[cfg(test)]
mod tests;

pub use carpool::carpool;
pub use codec::{decode, encode, Assembler, CodecError, Samples};
pub use estimate::{estimate, Estimate, EstimateError};
pub use tables::{tables, Table, Tables};

use thiserror::Error;

use crate::plan::{Layout, Transition};
use crate::{NodeSet, MAX_NODES};

/// A sample one node needs and does not hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Demand {
    /// The sample's id.
    pub sample: u32,
    /// Its length in bytes (from the catalog).
    pub len: u64,
    /// The node that needs it.
    pub receiver: u32,
    /// The live nodes that hold it; never contains `receiver`, never empty.
    pub holders: NodeSet,
}

impl Demand {
    /// The table its points start in: `{receiver} ∪ holders`.
    pub fn table(&self) -> NodeSet {
        self.holders.union(NodeSet::single(self.receiver))
    }

    /// Number of points (blocks) of `block_bytes`.
    pub fn blocks(&self, block_bytes: u32) -> u64 {
        self.len.div_ceil(u64::from(block_bytes))
    }
}

/// One block of one demand: the coding unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Point {
    /// Index of the demand in the demand list.
    pub demand: u32,
    /// Block index within the sample.
    pub block: u32,
}

/// One coded packet: the XOR of its points, one block long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    /// The table it is a row of: every point of column `k` is held by `table ∖ {k}`.
    pub table: NodeSet,
    /// Its points, one per receiver, by ascending receiver.
    pub entries: Vec<Point>,
}

impl Packet {
    /// The nodes that decode a point from it.
    pub fn receivers(&self, demands: &[Demand]) -> NodeSet {
        NodeSet::from_ranks(
            self.entries
                .iter()
                .map(|p| demands[p.demand as usize].receiver),
        )
    }

    /// The nodes that hold all its points (none of them a receiver): who can send it in
    /// peers mode.
    pub fn common_holders(&self, demands: &[Demand]) -> NodeSet {
        self.entries.iter().fold(NodeSet::first(MAX_NODES), |k, p| {
            k.intersection(demands[p.demand as usize].holders)
        })
    }

    /// Checks the decoding condition: distinct receivers, each point held by every other
    /// receiver.
    pub fn check(&self, demands: &[Demand]) -> Result<(), CodeError> {
        let receivers = self.receivers(demands);
        if receivers.len() as usize != self.entries.len() || self.entries.is_empty() {
            return Err(CodeError::BadPacket(format!(
                "{} points for receivers {receivers}",
                self.entries.len()
            )));
        }
        for p in &self.entries {
            let d = &demands[p.demand as usize];
            let others = receivers.difference(NodeSet::single(d.receiver));
            if !others.is_subset(d.holders) {
                return Err(CodeError::BadPacket(format!(
                    "sample {} (for node {}) is held by {} but must be XORed out by {}",
                    d.sample, d.receiver, d.holders, others
                )));
            }
        }
        Ok(())
    }
}

/// Who sends the packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sender {
    /// One extra rank holding every operand (the paper's master; in metfs it reads them from
    /// the tier).
    Extra,
    /// The nodes themselves: a packet is sent by a node holding all its points.
    Peers,
}

/// The coded exchange: packets that together deliver every point of the demands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Coded {
    /// The coding unit in bytes; every packet is this long.
    pub block_bytes: u32,
    /// The packets, each a valid row (see [`Packet::check`]).
    pub packets: Vec<Packet>,
    /// Number of points (blocks) delivered.
    pub points: u64,
    /// Packets of the paper's §2.2 tables for the same demands (for comparison).
    pub original_packets: u64,
    /// True when the carpool ended with more packets than the tables and the tables' rows
    /// were kept instead.
    pub fallback: bool,
}

/// Errors of the coded exchange's planning.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum CodeError {
    /// The block size is zero.
    #[error("the coding block must be at least one byte")]
    ZeroBlock,
    /// A node rank is beyond what a [`NodeSet`] holds.
    #[error("coded exchange supports up to {MAX_NODES} nodes, not {0}")]
    TooManyNodes(u32),
    /// A demand's receiver already holds the sample.
    #[error("node {receiver} needs sample {sample} but already holds it")]
    ReceiverHolds { sample: u32, receiver: u32 },
    /// Nobody holds a demanded sample.
    #[error(
        "node {receiver} needs sample {sample}, which no live node holds (read it from the tier)"
    )]
    NoHolder { sample: u32, receiver: u32 },
    /// The same sample is demanded twice by one node.
    #[error("node {receiver} needs sample {sample} twice")]
    Duplicate { sample: u32, receiver: u32 },
    /// A sample has more blocks than a block index counts.
    #[error("sample {sample} has more than 2^32 blocks of {block_bytes} bytes")]
    TooManyBlocks { sample: u32, block_bytes: u32 },
    /// More demands than a point can index.
    #[error("{0} demands are more than 2^32")]
    TooManyDemands(usize),
    /// A transition that does not follow the layout (or catalog) given with it.
    #[error("{0}")]
    Mismatch(String),
    /// A packet breaks the decoding condition.
    #[error("bad packet: {0}")]
    BadPacket(String),
}

/// Checks demands for coding and returns their total number of points.
pub(crate) fn check_demands(demands: &[Demand], block_bytes: u32) -> Result<u64, CodeError> {
    if block_bytes == 0 {
        return Err(CodeError::ZeroBlock);
    }
    u32::try_from(demands.len()).map_err(|_| CodeError::TooManyDemands(demands.len()))?;
    let mut seen = std::collections::HashSet::with_capacity(demands.len());
    let mut points = 0u64;
    for d in demands {
        if d.receiver >= MAX_NODES {
            return Err(CodeError::TooManyNodes(d.receiver + 1));
        }
        if d.holders.contains(d.receiver) {
            return Err(CodeError::ReceiverHolds {
                sample: d.sample,
                receiver: d.receiver,
            });
        }
        if d.holders.is_empty() {
            return Err(CodeError::NoHolder {
                sample: d.sample,
                receiver: d.receiver,
            });
        }
        if !seen.insert((d.sample, d.receiver)) {
            return Err(CodeError::Duplicate {
                sample: d.sample,
                receiver: d.receiver,
            });
        }
        let blocks = d.blocks(block_bytes);
        if blocks > u64::from(u32::MAX) {
            return Err(CodeError::TooManyBlocks {
                sample: d.sample,
                block_bytes,
            });
        }
        points += blocks;
    }
    Ok(points)
}

/// The demands of a transition: every sample a live node gets from a peer, with all the live
/// nodes that held it in `prev` (the coded exchange may use any of them, not only the source
/// the plan named). Samples read from the tier are not demands.
pub fn demands(
    prev: &Layout,
    transition: &Transition,
    sizes: &[u64],
) -> Result<Vec<Demand>, CodeError> {
    let n = prev.nodes();
    if n > MAX_NODES {
        return Err(CodeError::TooManyNodes(n));
    }
    let out_of_range = transition
        .nodes
        .iter()
        .flat_map(|p| &p.peer)
        .any(|&(j, _)| j >= prev.samples() || j as usize >= sizes.len());
    if transition.nodes.len() != n as usize || out_of_range {
        return Err(CodeError::Mismatch(format!(
            "a transition for {} nodes does not follow a layout of {} nodes and {} samples \
             with a catalog of {} samples",
            transition.nodes.len(),
            n,
            prev.samples(),
            sizes.len()
        )));
    }
    // Slot of each sample in `holders`, for the samples some node needs from a peer.
    const NONE: u32 = u32::MAX;
    let mut slot = vec![NONE; prev.samples() as usize];
    let mut holders: Vec<NodeSet> = Vec::new();
    for plan in &transition.nodes {
        for &(j, _) in &plan.peer {
            if slot[j as usize] == NONE {
                slot[j as usize] = holders.len() as u32;
                holders.push(NodeSet::EMPTY);
            }
        }
    }
    for k in 0..n {
        if transition.is_dead(k) {
            continue;
        }
        for &j in prev.cache(k) {
            let s = slot[j as usize];
            if s != NONE {
                holders[s as usize].insert(k);
            }
        }
    }
    let mut out = Vec::new();
    for (i, plan) in transition.nodes.iter().enumerate() {
        for &(j, _) in &plan.peer {
            out.push(Demand {
                sample: j,
                len: sizes[j as usize],
                receiver: i as u32,
                holders: holders[slot[j as usize] as usize],
            });
        }
    }
    Ok(out)
}
