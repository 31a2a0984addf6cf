//! The paper's §2.2 coding tables: a point needed by `i` and held by `H` goes to table
//! `{i} ∪ H`, column `i`; each row is one packet.

use std::collections::HashMap;

use super::{check_demands, CodeError, Coded, Demand, Packet, Point};
use crate::nodeset::MixState;
use crate::NodeSet;

/// One table: its members and one column of points per member (by ascending rank).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    /// The table's nodes.
    pub members: NodeSet,
    /// `columns[c]`: the points needed by the `c`-th member (ascending rank), in demand order.
    pub columns: Vec<Vec<Point>>,
}

impl Table {
    /// Its packets: the longest column's length.
    pub fn rows(&self) -> usize {
        self.columns.iter().map(Vec::len).max().unwrap_or(0)
    }

    /// Rows with every column filled: the shortest column's length.
    pub fn full_rows(&self) -> usize {
        self.columns.iter().map(Vec::len).min().unwrap_or(0)
    }

    /// Row `r` as a packet: the `r`-th point of each column that has one.
    pub fn row(&self, r: usize) -> Packet {
        Packet {
            table: self.members,
            entries: self
                .columns
                .iter()
                .filter_map(|c| c.get(r).copied())
                .collect(),
        }
    }
}

/// All non-empty tables of a set of demands, by ascending member mask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tables {
    /// The tables.
    pub tables: Vec<Table>,
    /// The coding unit they were cut with.
    pub block_bytes: u32,
    /// Number of points in them.
    pub points: u64,
}

impl Tables {
    /// Number of packets: the sum of the tables' longest columns.
    pub fn packet_count(&self) -> u64 {
        self.tables.iter().map(|t| t.rows() as u64).sum()
    }

    /// Every row of every table as a packet.
    pub fn packets(&self) -> Vec<Packet> {
        self.tables
            .iter()
            .flat_map(|t| (0..t.rows()).map(move |r| t.row(r)))
            .collect()
    }

    /// The paper's coded scheme without the carpool: the tables' rows.
    pub fn into_coded(self) -> Coded {
        let packets = self.packets();
        Coded {
            block_bytes: self.block_bytes,
            original_packets: packets.len() as u64,
            packets,
            points: self.points,
            fallback: false,
        }
    }
}

/// Builds the tables of §2.2 for `demands`, cut into points of `block_bytes`.
pub fn tables(demands: &[Demand], block_bytes: u32) -> Result<Tables, CodeError> {
    let points = check_demands(demands, block_bytes)?;
    let mut by_members: HashMap<NodeSet, Table, MixState> = HashMap::default();
    for (k, d) in demands.iter().enumerate() {
        let members = d.table();
        let table = by_members.entry(members).or_insert_with(|| Table {
            members,
            columns: vec![Vec::new(); members.len() as usize],
        });
        let column = members
            .position(d.receiver)
            .expect("a table contains its receiver");
        for block in 0..d.blocks(block_bytes) as u32 {
            table.columns[column].push(Point {
                demand: k as u32,
                block,
            });
        }
    }
    let mut tables: Vec<Table> = by_members.into_values().collect();
    tables.sort_by_key(|t| t.members);
    Ok(Tables {
        tables,
        block_bytes,
        points,
    })
}
