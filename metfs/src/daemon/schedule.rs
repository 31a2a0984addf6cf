//! A session's schedule: where its mini-epochs come from. One variant per run mode, each of
//! which says what the successor of a position is, which samples a mini-epoch holds, which of
//! them its view shows, the slot it is staged into, and what a switch retires.
//!
//! * [`Schedule::Plan`]: a plain mount. The planner's epochs, cut into `nm` mini-epochs; the
//!   successor always exists.
//! * [`Schedule::Queue`]: `--dds`. Batches claimed from the shard queue (`queue` module); the
//!   mini-epoch is a sequence number of this daemon, and the successor exists once claimed.
//! * [`Schedule::Aggregate`]: `--aggregate`. Each epoch is one mini-epoch whose slot is the
//!   node's cache and whose view is the node's share (`aggregate` module).
//! * [`Schedule::Job`]: a job of a shared mount (`share` module). The views the cohort drew
//!   for it, by sequence; the successor exists once drawn, and before its first view the job
//!   has no mini-epoch of its own ([`Drawn::shown`]).
//!
//! **Invariant:** code outside this module and the modes' own modules asks the schedule and
//! never tests which mode runs; a position that does not exist is `None`, never a sentinel.

use crate::daemon::store::Store;
use crate::daemon::{aggregate, slot_name, successor};
use metfs_dds::Batch;
use metfs_plan::planner::{EpochPlan, PlanConfig};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// A session's batches when it reads from a queue.
#[derive(Debug, Default)]
pub(super) struct QueueState {
    /// Batches by sequence number: the current view's and the claimed successor's.
    pub(super) batches: BTreeMap<u32, Batch>,
    /// Sequences whose batch was handed over to be marked DONE.
    pub(super) marked: BTreeSet<u32>,
}

impl QueueState {
    /// The batch of sequence `seq`, to be marked DONE now, unless it was already.
    pub(super) fn mark(&mut self, seq: u32) -> Option<Batch> {
        let b = self.batches.get(&seq)?.clone();
        self.marked.insert(seq).then_some(b)
    }

    /// Forgets the batch of the retired sequence `seq`; returns it if it still needs its DONE
    /// mark (`after-rf`, or a view retired before its first pass ended).
    pub(super) fn retire(&mut self, seq: u32) -> Option<Batch> {
        let b = self.batches.remove(&seq)?;
        let first = self.marked.insert(seq);
        // Only the view and its successor are ever live: older marks are not needed again.
        self.marked.retain(|&s| s >= seq);
        first.then_some(b)
    }
}

/// Where a session's mini-epochs come from (module docs).
pub(super) enum Schedule {
    /// A plain mount: slices of the planner's epochs.
    Plan(Plans),
    /// `--dds`: the batches claimed from the queue, and the mini-epochs an epoch of the plan
    /// would have (for `status`; the queue decides what an epoch holds).
    Queue {
        batches: QueueState,
        mini_epochs: u32,
    },
    /// `--aggregate`: the node's cache of each epoch.
    Aggregate(Arc<aggregate::Aggregate>),
    /// A job of a shared mount: the views the cohort drew for it.
    Job(Drawn),
}

/// The planner's epochs for a session: its settings, its mini-epochs per epoch, and the plans
/// of the last few epochs (the planner is pure; these are a cache).
pub(super) struct Plans {
    cfg: PlanConfig,
    nm: u32,
    plans: BTreeMap<u64, Arc<EpochPlan>>,
}

impl Plans {
    /// A schedule of `nm` mini-epochs per epoch under `cfg`, knowing `plan` of its epoch if
    /// given.
    pub(super) fn new(cfg: PlanConfig, nm: u32, plan: Option<(u64, Arc<EpochPlan>)>) -> Self {
        Self {
            cfg,
            nm,
            plans: plan.into_iter().collect(),
        }
    }

    /// The plan of `epoch` (computed over `store`'s samples, and kept for a few epochs).
    fn plan_of(&mut self, store: &Store, epoch: u64) -> Arc<EpochPlan> {
        if let Some(p) = self.plans.get(&epoch) {
            return p.clone();
        }
        // The plan was validated for this catalog and config at startup; the planner is a pure
        // function, so a later epoch cannot fail where epoch 0 succeeded.
        let p = Arc::new(
            store
                .plan_epoch(&self.cfg, epoch)
                .expect("the planner accepted these inputs at startup"),
        );
        self.remember(epoch, p.clone());
        p
    }

    /// Keeps epoch `epoch`'s plan, with the plans of the two epochs before it at most.
    fn remember(&mut self, epoch: u64, plan: Arc<EpochPlan>) {
        self.plans.insert(epoch, plan);
        while self.plans.len() > 3 {
            let first = *self.plans.keys().next().unwrap();
            self.plans.remove(&first);
        }
    }
}

/// A job's views as the cohort draws them, by sequence: a job's mini-epoch is the sequence
/// number of its view (0 for the first), its epoch the view's.
#[derive(Debug)]
pub(super) struct Drawn {
    /// What its slots' names begin with (see [`Drawn::new`]).
    slots: String,
    /// The current view's and the drawn successor's.
    views: BTreeMap<u32, DrawnView>,
    /// Whether the job has shown a view: before its first one (it waits for the jobs joining
    /// with it) its successor is sequence 0, and it has no mini-epoch to record or save.
    shown: bool,
}

/// One view a cohort drew for a job.
#[derive(Debug, Clone)]
pub(super) struct DrawnView {
    /// The job's epoch the view belongs to.
    pub(super) epoch: u64,
    pub(super) samples: Vec<u32>,
    /// Their footprint.
    pub(super) bytes: u64,
}

/// The prefix of the slots of job `name` admitted at generation `join`: unique to that join,
/// as generations are unique on a mount and across its restarts.
pub(super) fn job_slots(name: &str, join: u64) -> String {
    format!("{name}.j{join}")
}

/// The slot named by a job's prefix `slots` for its view `target`.
pub(super) fn job_slot(slots: &str, target: (u64, u32)) -> String {
    format!("{slots}.{}", slot_name(target))
}

impl Drawn {
    /// A job that joins, waiting for its first view, whose slots are named `slots.eE-mM`.
    /// `slots` is unique to this join (see [`job_slots`]): a job that leaves and joins again
    /// under its name starts again at sequence 0, and its earlier self's slots may still be
    /// on the node (draining, or held as donors), so the same name would have the new job
    /// stage into a directory the old one's deletion then removes.
    pub(super) fn new(slots: String) -> Self {
        Self {
            slots,
            views: BTreeMap::new(),
            shown: false,
        }
    }

    /// A job resumed at sequence `seq`, showing `view`, its slots named `slots.eE-mM`.
    pub(super) fn resumed(slots: String, seq: u32, view: DrawnView) -> Self {
        Self {
            slots,
            views: BTreeMap::from([(seq, view)]),
            shown: true,
        }
    }

    /// What its slots' names begin with.
    pub(super) fn slots(&self) -> &str {
        &self.slots
    }

    /// Whether the job has shown a view yet.
    pub(super) fn shown(&self) -> bool {
        self.shown
    }

    /// The sequence of the view after position `seq`.
    fn next_seq(&self, seq: u32) -> u32 {
        if self.shown {
            seq + 1
        } else {
            0
        }
    }

    /// The view of sequence `seq`, if drawn.
    pub(super) fn view(&self, seq: u32) -> Option<&DrawnView> {
        self.views.get(&seq)
    }

    /// Whether the successor of position `seq` is drawn.
    pub(super) fn has_successor(&self, seq: u32) -> bool {
        self.views.contains_key(&self.next_seq(seq))
    }

    /// Hands the job `view` as the successor of position `seq`.
    pub(super) fn draw_successor(&mut self, seq: u32, view: DrawnView) {
        let next = self.next_seq(seq);
        self.views.insert(next, view);
    }
}

impl Schedule {
    /// Mini-epochs per epoch (`status`, `Start`): 1 where each view is its own.
    pub(super) fn mini_epochs(&self) -> u32 {
        match self {
            Schedule::Plan(p) => p.nm,
            Schedule::Queue { mini_epochs, .. } => *mini_epochs,
            Schedule::Aggregate(_) | Schedule::Job(_) => 1,
        }
    }

    /// The mini-epoch after `cur`: `None` until the queue has handed it out or the cohort has
    /// drawn it.
    pub(super) fn successor(&self, cur: (u64, u32)) -> Option<(u64, u32)> {
        match self {
            Schedule::Plan(p) => Some(successor(cur, p.nm)),
            Schedule::Aggregate(_) => Some(successor(cur, 1)),
            Schedule::Queue { batches, .. } => {
                let seq = cur.1.wrapping_add(1);
                batches.batches.get(&seq).map(|b| (b.epoch, seq))
            }
            Schedule::Job(d) => {
                let seq = d.next_seq(cur.1);
                d.views.get(&seq).map(|v| (v.epoch, seq))
            }
        }
    }

    /// The samples of mini-epoch `target` and their footprint: what its slot holds (none
    /// for a batch or view not handed out).
    pub(super) fn members(&mut self, store: &Store, target: (u64, u32)) -> (Vec<u32>, u64) {
        match self {
            Schedule::Plan(p) => {
                let plan = p.plan_of(store, target.0);
                let me = &plan.mini_epochs[target.1 as usize];
                (me.samples.clone(), me.bytes)
            }
            Schedule::Queue { batches, .. } => batches
                .batches
                .get(&target.1)
                .map_or((Vec::new(), 0), |b| (b.samples.clone(), b.bytes)),
            Schedule::Aggregate(a) => a.cache(target.0),
            Schedule::Job(d) => d
                .views
                .get(&target.1)
                .map_or((Vec::new(), 0), |v| (v.samples.clone(), v.bytes)),
        }
    }

    /// The samples the view of mini-epoch `target` shows: its members, but in aggregate mode
    /// only the node's share (the slot also holds the extras kept for the exchange).
    pub(super) fn view_members(&mut self, store: &Store, target: (u64, u32)) -> Vec<u32> {
        match self {
            Schedule::Aggregate(a) => a.share(target.0),
            _ => self.members(store, target).0,
        }
    }

    /// The slot of mini-epoch `target`: a job's carry its join's prefix.
    pub(super) fn slot_of(&self, target: (u64, u32)) -> String {
        match self {
            Schedule::Job(d) => job_slot(&d.slots, target),
            _ => slot_name(target),
        }
    }

    /// What the slot a switch to `succ` retires may be kept for, where the schedule knows:
    /// the members of the mini-epoch after `succ`; nothing from a queue (the next batch is not
    /// claimed yet). `None` for a job: what the other jobs drew is the cohort's to say.
    pub(super) fn kept_for(&mut self, store: &Store, succ: (u64, u32)) -> Option<Vec<u32>> {
        match self {
            Schedule::Queue { .. } => Some(Vec::new()),
            Schedule::Job(_) => None,
            Schedule::Plan(_) | Schedule::Aggregate(_) => {
                let after = self.successor(succ)?;
                Some(self.members(store, after).0)
            }
        }
    }

    /// Leaves mini-epoch `seq` for its successor: forgets its batch or view. Returns the
    /// queue's batch if it still needs its DONE mark (`after-rf`, or a view retired before
    /// its first pass ended).
    pub(super) fn retire(&mut self, seq: u32) -> Option<Batch> {
        match self {
            Schedule::Queue { batches, .. } => batches.retire(seq),
            Schedule::Job(d) if !d.shown => {
                d.shown = true;
                None
            }
            Schedule::Job(d) => {
                d.views.remove(&seq);
                None
            }
            Schedule::Plan(_) | Schedule::Aggregate(_) => None,
        }
    }

    /// The epoch whose plan a switch to `target` will want and the settings to make it with,
    /// if it is not known yet: made ahead of the switch, off the async threads.
    pub(super) fn plan_wanted(&self, target: (u64, u32)) -> Option<(u64, PlanConfig)> {
        match self {
            Schedule::Plan(p) => {
                let after = successor(target, p.nm);
                (!p.plans.contains_key(&after.0)).then(|| (after.0, p.cfg.clone()))
            }
            _ => None,
        }
    }

    /// Keeps a plan made at [`Schedule::plan_wanted`]'s request.
    pub(super) fn remember_plan(&mut self, epoch: u64, plan: Arc<EpochPlan>) {
        if let Schedule::Plan(p) = self {
            p.remember(epoch, plan);
        }
    }

    /// Whether positions are sequence numbers of this daemon's handouts (a queue's batches, a
    /// cohort's views) rather than places in a plan every node shares.
    pub(super) fn by_sequence(&self) -> bool {
        matches!(self, Schedule::Queue { .. } | Schedule::Job(_))
    }

    /// Whether its views show under `MNT/<session>` (a job of a shared mount) rather than at
    /// the mount's root: views are built nested, switched per job in the filesystem core,
    /// and a switch drops only that directory's kernel entries.
    pub(super) fn nested_views(&self) -> bool {
        matches!(self, Schedule::Job(_))
    }

    /// Whether it stages into a store other sessions share (a job of a shared mount): the
    /// store makes room by its policy before a staging, the pace may hold its switch back,
    /// a staged next view is saved in the shared save file, and its rf-history key is the
    /// name it joined with (a `pass_end`'s job key does not re-key it).
    pub(super) fn in_shared_store(&self) -> bool {
        matches!(self, Schedule::Job(_))
    }

    /// Whether this is a job still waiting for its first view (it has no mini-epoch yet).
    pub(super) fn before_first_view(&self) -> bool {
        matches!(self, Schedule::Job(d) if !d.shown)
    }

    /// The queue's batches, with `--dds`.
    pub(super) fn queue_mut(&mut self) -> Option<&mut QueueState> {
        match self {
            Schedule::Queue { batches, .. } => Some(batches),
            _ => None,
        }
    }

    /// A job's drawn views.
    pub(super) fn drawn(&self) -> Option<&Drawn> {
        match self {
            Schedule::Job(d) => Some(d),
            _ => None,
        }
    }

    /// A job's drawn views, to hand it the next.
    pub(super) fn drawn_mut(&mut self) -> Option<&mut Drawn> {
        match self {
            Schedule::Job(d) => Some(d),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(epoch: u64) -> DrawnView {
        DrawnView {
            epoch,
            samples: vec![1, 2],
            bytes: 10,
        }
    }

    #[test]
    fn a_job_has_no_successor_until_drawn_and_its_first_view_is_sequence_0() {
        let mut s = Schedule::Job(Drawn::new(job_slots("a", 7)));
        assert!(s.before_first_view());
        assert_eq!(s.successor((0, 0)), None);
        s.drawn_mut().unwrap().draw_successor(0, view(0));
        assert_eq!(s.successor((0, 0)), Some((0, 0)));
        assert_eq!(s.slot_of((0, 0)), "a.j7.e000000-m00000");
        // The switch out of the lobby keeps the view it switches to.
        assert!(s.retire(0).is_none());
        assert!(!s.before_first_view());
        assert!(s.drawn().unwrap().view(0).is_some());
        assert_eq!(s.successor((0, 0)), None);
        s.drawn_mut().unwrap().draw_successor(0, view(1));
        assert_eq!(s.successor((0, 0)), Some((1, 1)));
        s.retire(0);
        assert!(s.drawn().unwrap().view(0).is_none());
        assert!(s.drawn().unwrap().has_successor(0));
    }

    #[test]
    fn a_queue_has_no_successor_until_claimed() {
        let s = Schedule::Queue {
            batches: QueueState::default(),
            mini_epochs: 4,
        };
        assert_eq!(s.successor((3, 7)), None);
        assert!(s.by_sequence());
        assert_eq!(s.mini_epochs(), 4);
    }
}

#[cfg(test)]
mod queue_state_tests {
    use super::*;

    fn batch(epoch: u64) -> Batch {
        Batch {
            epoch,
            shards: vec![1],
            lengths: vec![1],
            samples: vec![7],
            bytes: 4096,
            holder: metfs_dds::Holder {
                node: "n".into(),
                inc: 1,
            },
        }
    }

    #[test]
    fn a_batch_is_handed_over_once() {
        let mut q = QueueState::default();
        q.batches.insert(0, batch(0));
        q.batches.insert(1, batch(0));
        // after-pass: marked at the first pass, not again when it retires.
        assert!(q.mark(0).is_some());
        assert!(q.mark(0).is_none());
        assert!(q.retire(0).is_none());
        // after-rf: marked when it retires.
        assert_eq!(q.retire(1).map(|b| b.epoch), Some(0));
        assert!(q.batches.is_empty());
        assert!(q.mark(2).is_none(), "nothing claimed under 2");
    }
}
