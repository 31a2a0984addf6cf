//! A set of node ranks as a 128-bit mask: the holders of a sample, the members of a coding
//! table, the receivers of a packet.
//!
//! The coded exchange keys its tables by node sets and enumerates their subsets, so the set
//! must be cheap to copy, hash, intersect and compare; a fixed mask is all of that. It bounds
//! the coded exchange to [`MAX_NODES`] ranks; the planner and the uncoded exchange have no such
//! bound (they never need a sample's full holder set).

use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};

/// The most node ranks a [`NodeSet`] can hold (ranks `0..128`).
pub const MAX_NODES: u32 = 128;

/// A set of node ranks below [`MAX_NODES`]. Ordered as its mask, so sorting by it is
/// deterministic.
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeSet(u128);

impl NodeSet {
    /// The empty set.
    pub const EMPTY: NodeSet = NodeSet(0);

    /// The set of the given ranks. Panics on a rank of [`MAX_NODES`] or more.
    pub fn from_ranks<I: IntoIterator<Item = u32>>(ranks: I) -> Self {
        let mut s = Self::EMPTY;
        for r in ranks {
            s.insert(r);
        }
        s
    }

    /// `{rank}`. Panics on a rank of [`MAX_NODES`] or more.
    pub fn single(rank: u32) -> Self {
        assert!(
            rank < MAX_NODES,
            "node rank {rank} is not below {MAX_NODES}"
        );
        Self(1u128 << rank)
    }

    /// Ranks `0..n` (`n ≤ MAX_NODES`).
    pub fn first(n: u32) -> Self {
        assert!(n <= MAX_NODES, "{n} nodes are more than {MAX_NODES}");
        if n == MAX_NODES {
            Self(u128::MAX)
        } else {
            Self((1u128 << n) - 1)
        }
    }

    /// The raw mask (bit `r` is rank `r`).
    pub fn bits(self) -> u128 {
        self.0
    }

    /// Adds `rank`. Panics on a rank of [`MAX_NODES`] or more.
    pub fn insert(&mut self, rank: u32) {
        *self = self.union(Self::single(rank));
    }

    /// Removes `rank` (no-op if absent or out of range).
    pub fn remove(&mut self, rank: u32) {
        if rank < MAX_NODES {
            self.0 &= !(1u128 << rank);
        }
    }

    /// Whether `rank` is in the set.
    pub fn contains(self, rank: u32) -> bool {
        rank < MAX_NODES && self.0 >> rank & 1 == 1
    }

    /// Number of ranks.
    pub fn len(self) -> u32 {
        self.0.count_ones()
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// `self ∪ other`.
    pub fn union(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    /// `self ∩ other`.
    pub fn intersection(self, other: Self) -> Self {
        Self(self.0 & other.0)
    }

    /// `self ∖ other`.
    pub fn difference(self, other: Self) -> Self {
        Self(self.0 & !other.0)
    }

    /// `self ⊆ other`.
    pub fn is_subset(self, other: Self) -> bool {
        self.0 & !other.0 == 0
    }

    /// The smallest rank, if any.
    pub fn min(self) -> Option<u32> {
        (self.0 != 0).then(|| self.0.trailing_zeros())
    }

    /// The ranks in ascending order.
    pub fn iter(self) -> impl Iterator<Item = u32> {
        let mut rest = self.0;
        std::iter::from_fn(move || {
            if rest == 0 {
                return None;
            }
            let r = rest.trailing_zeros();
            rest &= rest - 1;
            Some(r)
        })
    }

    /// Position of `rank` among the set's ranks in ascending order (its column in a table),
    /// if present.
    pub fn position(self, rank: u32) -> Option<usize> {
        self.contains(rank)
            .then(|| (self.0 & ((1u128 << rank) - 1)).count_ones() as usize)
    }

    /// Every non-empty subset, each once (in descending mask order, the set itself first).
    pub fn subsets(self) -> impl Iterator<Item = NodeSet> {
        let full = self.0;
        let mut next = Some(full);
        std::iter::from_fn(move || {
            let s = next?;
            if s == 0 {
                next = None;
                return None;
            }
            next = Some((s - 1) & full);
            Some(NodeSet(s))
        })
    }
}

impl fmt::Debug for NodeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl fmt::Display for NodeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{")?;
        for (k, r) in self.iter().enumerate() {
            if k > 0 {
                write!(f, ",")?;
            }
            write!(f, "{r}")?;
        }
        write!(f, "}}")
    }
}

/// A multiply-rotate hasher for the coding's maps, keyed by node sets and small integers.
/// The keys are not attacker-chosen (they come from the plan), so the DoS resistance of the
/// standard SipHash buys nothing here, while its cost dominates the carpool's inner loop.
#[derive(Default, Clone, Copy)]
pub(crate) struct MixHasher(u64);

impl Hasher for MixHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u8(&mut self, v: u8) {
        self.write_u64(u64::from(v));
    }

    fn write_u32(&mut self, v: u32) {
        self.write_u64(u64::from(v));
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7C_C1_B7_27_22_0A_95);
    }

    fn write_u128(&mut self, v: u128) {
        self.write_u64(v as u64);
        self.write_u64((v >> 64) as u64);
    }

    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
}

/// `HashMap`/`HashSet` state for [`MixHasher`].
pub(crate) type MixState = BuildHasherDefault<MixHasher>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_operations() {
        let a = NodeSet::from_ranks([0, 3, 127]);
        assert_eq!(a.len(), 3);
        assert!(a.contains(127) && !a.contains(1) && !a.contains(500));
        assert_eq!(a.iter().collect::<Vec<_>>(), vec![0, 3, 127]);
        assert_eq!(a.position(3), Some(1));
        assert_eq!(a.position(127), Some(2));
        assert_eq!(a.position(4), None);
        assert_eq!(a.to_string(), "{0,3,127}");
        let b = NodeSet::from_ranks([3]);
        assert!(b.is_subset(a) && !a.is_subset(b));
        assert_eq!(a.difference(b), NodeSet::from_ranks([0, 127]));
        assert_eq!(a.min(), Some(0));
        assert_eq!(NodeSet::first(128).len(), 128);
    }

    #[test]
    fn subsets_are_all_nonempty_subsets_once() {
        let a = NodeSet::from_ranks([1, 4, 9]);
        let mut subs: Vec<NodeSet> = a.subsets().collect();
        assert_eq!(subs.len(), 7);
        subs.sort();
        subs.dedup();
        assert_eq!(subs.len(), 7);
        assert!(subs.iter().all(|s| !s.is_empty() && s.is_subset(a)));
        assert_eq!(NodeSet::EMPTY.subsets().count(), 0);
    }
}
