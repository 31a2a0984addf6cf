//! The carpool step (§3.2): the greedy flow of loose points down the DAG of tables (see the
//! module docs of `coded` for the rules and the order).

use std::collections::{HashMap, HashSet};

use super::tables::tables;
use super::{CodeError, Coded, Demand, Packet, Point, Sender};
use crate::nodeset::MixState;
use crate::{NodeSet, MAX_NODES};

/// An open row: its receivers `R`, the nodes `K` holding all its points, its points.
struct Row {
    receivers: NodeSet,
    common: NodeSet,
    entries: Vec<Point>,
}

/// Rows by `(R, k)` for each `k ∈ K`: the rows a point needed by `k` may join if `R` is
/// within its holders. Entries go stale when a row grows (`R` grows, `K` shrinks) and, since
/// neither ever goes back, stay stale; they are dropped when met at the top of a stack.
struct Index {
    stacks: HashMap<(NodeSet, u32), Vec<u32>, MixState>,
    /// For each receiver `k`, the `R`s that have (or had) a stack for `k`.
    keys: Vec<Vec<NodeSet>>,
    listed: HashSet<(NodeSet, u32), MixState>,
}

impl Index {
    fn new() -> Self {
        Self {
            stacks: HashMap::default(),
            keys: vec![Vec::new(); MAX_NODES as usize],
            listed: HashSet::default(),
        }
    }

    /// Files row `id` under `(R, k)` for every `k ∈ K`.
    fn file(&mut self, id: u32, row: &Row) {
        for k in row.common.iter() {
            let key = (row.receivers, k);
            self.stacks.entry(key).or_default().push(id);
            if self.listed.insert(key) {
                self.keys[k as usize].push(row.receivers);
            }
        }
    }

    /// The most recently grown live row under `(r, k)`, dropping stale entries on the way.
    fn top(&mut self, rows: &[Row], r: NodeSet, k: u32) -> Option<u32> {
        let stack = self.stacks.get_mut(&(r, k))?;
        while let Some(&id) = stack.last() {
            let row = &rows[id as usize];
            if row.receivers == r && row.common.contains(k) {
                return Some(id);
            }
            stack.pop();
        }
        None
    }

    /// The `R`s filed for receiver `k`, forgetting those whose stack has emptied.
    fn live_keys(&mut self, rows: &[Row], k: u32) -> Vec<NodeSet> {
        let keys = std::mem::take(&mut self.keys[k as usize]);
        let mut kept = Vec::with_capacity(keys.len());
        for r in keys {
            if self.top(rows, r, k).is_some() {
                kept.push(r);
            } else {
                self.stacks.remove(&(r, k));
                self.listed.remove(&(r, k));
            }
        }
        self.keys[k as usize] = kept.clone();
        kept
    }
}

/// UberShuffle's packets for `demands`: the tables of §2.2, then the carpool. With
/// [`Sender::Extra`] the tables' full rows are kept as they are and the result is never
/// worse than the tables; with [`Sender::Peers`] every packet keeps a node, not one of its
/// receivers, that holds all its points.
pub fn carpool(demands: &[Demand], block_bytes: u32, sender: Sender) -> Result<Coded, CodeError> {
    let tables = tables(demands, block_bytes)?;
    let original_packets = tables.packet_count();

    let mut kept: Vec<Packet> = Vec::new();
    let mut loose: Vec<(u32, NodeSet, u32, Point)> = Vec::new(); // (|H|, table, receiver, point)
    for table in &tables.tables {
        let full = match sender {
            Sender::Extra => table.full_rows(),
            Sender::Peers => 0,
        };
        kept.extend((0..full).map(|r| table.row(r)));
        for column in &table.columns {
            for &p in &column[full..] {
                let d = &demands[p.demand as usize];
                loose.push((d.holders.len(), table.members, d.receiver, p));
            }
        }
    }
    // Bottom layer of the DAG first; the rest of the key makes the order total.
    loose.sort_unstable();

    let mut rows: Vec<Row> = Vec::new();
    let mut index = Index::new();
    for &(_, _, i, point) in &loose {
        let holders = demands[point.demand as usize].holders;
        let best = best_row(&mut index, &rows, i, holders, sender);
        let id = match best {
            Some(id) => {
                let row = &mut rows[id as usize];
                row.receivers.insert(i);
                row.common = row.common.intersection(holders);
                row.entries.push(point);
                id
            }
            None => {
                rows.push(Row {
                    receivers: NodeSet::single(i),
                    common: holders,
                    entries: vec![point],
                });
                (rows.len() - 1) as u32
            }
        };
        index.file(id, &rows[id as usize]);
    }

    let carpooled = kept.len() + rows.len();
    if sender == Sender::Extra && carpooled as u64 > original_packets {
        let mut coded = tables.into_coded();
        coded.fallback = true;
        return Ok(coded);
    }
    let mut packets = kept;
    packets.extend(rows.into_iter().map(|row| {
        let mut entries = row.entries;
        entries.sort_by_key(|p| demands[p.demand as usize].receiver);
        Packet {
            table: row.receivers,
            entries,
        }
    }));
    Ok(Coded {
        block_bytes,
        packets,
        points: tables.points,
        original_packets,
        fallback: false,
    })
}

/// The open row a point needed by `i` and held by `holders` joins, if any: `R ⊆ holders`,
/// `i ∈ K`, in peers mode `K ∩ holders ≠ ∅`; the most common holders left, then the most
/// receivers, then the first found.
fn best_row(
    index: &mut Index,
    rows: &[Row],
    i: u32,
    holders: NodeSet,
    sender: Sender,
) -> Option<u32> {
    let mut best: Option<(u32, (u32, u32))> = None;
    let mut consider = |id: u32| {
        let row = &rows[id as usize];
        let common = row.common.intersection(holders);
        if sender == Sender::Peers && common.is_empty() {
            return;
        }
        let score = (common.len(), row.receivers.len());
        if best.is_none_or(|(_, s)| score > s) {
            best = Some((id, score));
        }
    };
    let filed = index.keys[i as usize].len() as u64;
    let subsets = holders.len();
    if subsets < 64 && (1u64 << subsets) <= 2 * filed.max(1) {
        for r in holders.subsets() {
            if let Some(id) = index.top(rows, r, i) {
                consider(id);
            }
        }
    } else {
        for r in index.live_keys(rows, i) {
            if r.is_subset(holders) {
                if let Some(id) = index.top(rows, r, i) {
                    consider(id);
                }
            }
        }
    }
    best.map(|(id, _)| id)
}
