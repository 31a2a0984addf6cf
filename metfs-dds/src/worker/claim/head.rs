//! The head of the queue as a worker last saw it: the given-back shards (TODO, oldest epoch
//! first) and the cursors of a window of its epoch's stripes, each with the revision it was
//! read or written at.
//!
//! A claim is a transaction that compares what it read; what it read need not be fresh. So a
//! worker keeps the head it last knew, and the claim transaction reads the head again in its
//! `else` branch. A claim whose view still holds (most of them: a node's own stripe, moved on
//! only by itself) is then **one** round trip, and one that lost the race gets the head that
//! beat it in the same answer, where it used to cost a read after the failed transaction. The
//! compares stay the only judge of a claim, so a stale head costs a round trip, never a shard
//! taken twice.
//!
//! Invariants of a kept head:
//! * cursors only move forward, so a stripe a kept head shows used up is used up: a worker may
//!   go wide (read every stripe) on a kept head;
//! * a head read now is read serializable (from etcd's applied state, without waiting for its
//!   raft loop), so it is as old as a few writes at most: the same two rules hold for it;
//! * a kept head may miss shards given back since: the queue's watch marks it stale
//!   ([`super::super::Shared::todo_changed`]) on every put under `todo/`, and a worker
//!   concludes that its epoch has nothing left only on a head read just now, and that the job
//!   is finished only on a linearizable read of what is left (`Worker::left`): a state older
//!   than the worker's own last read could show a shard whose claim it saw as neither DOING
//!   nor TODO (still behind its stripe's cursor), and the job as done.

use etcd_client::{GetOptions, SortOrder, SortTarget, TxnOp, TxnOpResponse};

use crate::keys::parse;
use crate::keys::{Keys, Kind};
use crate::DdsError;

use super::Window;

/// A given-back shard: (epoch, its TODO key, shard).
pub(super) type Back = (u64, String, u32);

/// The head of the queue for one epoch and window of stripes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Head {
    /// The epoch whose cursors these are.
    pub(super) epoch: u64,
    pub(super) window: Window,
    /// The head of the given-back shards, oldest epoch first.
    pub(super) todo: Vec<Back>,
    /// Each stripe of `window`: its cursor and the cursor's revision (`(0, 0)`: no cursor key
    /// yet, which etcd compares as revision 0).
    pub(super) cursors: Vec<(u32, i64)>,
}

impl Head {
    /// The head of an epoch nobody has claimed from, as a worker that moves to it assumes:
    /// every cursor of `window` at its start, and the given-back shards it just read.
    pub(super) fn untouched(epoch: u64, window: Window, todo: Vec<Back>) -> Self {
        Self {
            epoch,
            window,
            todo,
            cursors: vec![(0, 0); window.len as usize],
        }
    }

    /// The head after this worker's own claim at `revision` moved a stripe's cursor
    /// (`moved`: the stripe and where its cursor is now) and took the given-back shards `back`.
    pub(super) fn after_claim(&mut self, moved: Option<(u32, u32)>, back: &[Back], revision: i64) {
        if let Some((stripe, to)) = moved {
            if let Some(c) = stripe
                .checked_sub(self.window.first)
                .and_then(|i| self.cursors.get_mut(i as usize))
            {
                *c = (to, revision);
            }
        }
        self.todo.retain(|t| !back.iter().any(|b| b.1 == t.1));
    }
}

/// The reads of the head of `epoch`'s `window`: the given-back shards, then the window's
/// cursors. In a read-only transaction, or in a claim's `else` branch.
///
/// Serializable: etcd answers a read-only transaction of serializable reads from its applied
/// state, without the linearizable read's wait for its raft loop, which queues behind the
/// writes of a busy job (its own handling of transactions had p50 <= 50 ms at 1,024 simulated
/// nodes, `benches/nodes.py`, where a claim's write took 3 ms). A head read so may be a few
/// writes old; that is as safe as a kept head (see the module docs): cursors only move on, and
/// the claim's compares judge. Inside a claim's `else` branch the flag is moot (a write
/// transaction is applied in order).
pub(super) fn reads(keys: &Keys, epoch: u64, window: Window) -> [TxnOp; 2] {
    let opts = GetOptions::new()
        .with_prefix()
        .with_keys_only()
        .with_sort(SortTarget::Key, SortOrder::Ascend)
        .with_limit(256)
        .with_serializable();
    let from = keys.cursor(epoch, window.first);
    let to = keys.cursor(epoch, window.first + window.len);
    [
        TxnOp::get(keys.todo_all(), Some(opts)),
        TxnOp::get(
            from,
            Some(GetOptions::new().with_range(to).with_serializable()),
        ),
    ]
}

/// The head in the answers to [`reads`].
pub(super) fn parse_head(
    keys: &Keys,
    epoch: u64,
    window: Window,
    answers: Vec<TxnOpResponse>,
) -> Result<Head, DdsError> {
    let mut gets = answers.into_iter().filter_map(|o| match o {
        TxnOpResponse::Get(g) => Some(g),
        _ => None,
    });
    let (Some(todo), Some(cursor)) = (gets.next(), gets.next()) else {
        return Err(DdsError::BadRecord {
            key: keys.cursor(epoch, window.first),
            reason: "etcd answered the read with fewer results than asked".into(),
        });
    };
    let todo = todo
        .kvs()
        .iter()
        .filter_map(|kv| {
            let (kind, e, k) = keys.parse_shard(kv.key())?;
            (kind == Kind::Todo).then(|| (e, String::from_utf8_lossy(kv.key()).into_owned(), k))
        })
        .collect();
    let mut cursors = vec![(0, 0); window.len as usize];
    for kv in cursor.kvs() {
        if let Some((_, s)) = keys.parse_cursor(kv.key()) {
            if let Some(c) = s
                .checked_sub(window.first)
                .and_then(|i| cursors.get_mut(i as usize))
            {
                *c = (parse::<u32>(kv.key(), kv.value())?, kv.mod_revision());
            }
        }
    }
    Ok(Head {
        epoch,
        window,
        todo,
        cursors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head() -> Head {
        let w = Window { first: 4, len: 3 };
        let mut h = Head::untouched(2, w, vec![(1, "t/a".into(), 7), (2, "t/b".into(), 9)]);
        h.cursors[1] = (5, 40);
        h
    }

    #[test]
    fn a_claim_moves_its_stripe_and_drops_what_it_took() {
        let mut h = head();
        h.after_claim(Some((5, 9)), &[(1, "t/a".into(), 7)], 51);
        assert_eq!(h.cursors, vec![(0, 0), (9, 51), (0, 0)]);
        assert_eq!(h.todo, vec![(2, "t/b".into(), 9)]);
    }

    #[test]
    fn a_stripe_outside_the_window_changes_nothing() {
        let mut h = head();
        let before = h.clone();
        h.after_claim(Some((9, 3)), &[], 60);
        h.after_claim(Some((1, 3)), &[], 61);
        assert_eq!(h, before);
    }
}
