//! Deferred samples: what the tier could not give for longer than the defer bound, carried
//! into a later mini-epoch instead of holding the view back.
//!
//! A staging whose target has failed for `stager.defer_after_secs` runs *deferring*: a sample
//! whose transient errors outlast `stager.retry_secs` is left out of that slot as deferred
//! (the stager's `StageReport::deferred`) and the slot completes, so the view moves on. The
//! session's [`Deferred`] then carries those samples into the mini-epoch after, where they are
//! staged and shown with its own samples; one the tier gives there is *recovered*; one it still
//! cannot give is carried on again, across the end of the epoch if need be.
//!
//! # Invariants
//!
//! * A carried sample is added to one mini-epoch's members at a time, and only while it fits:
//!   the mini-epoch's bytes with the carried ones stay within the slot's bytes; the rest waits
//!   for the next one. So the budget holds whatever is carried.
//! * A sample is carried at most once at a time (a set), and counted as deferred once per
//!   deferral and as recovered once, when a staging gives it (carried into that mini-epoch, or
//!   in its plan anyway).
//! * What is carried is saved with the position (`state.json`'s `deferred`, written at each
//!   switch): a restarted daemon carries the same samples on, and shows the current
//!   mini-epoch with the carried samples its slot was staged with. So a sample carried when
//!   the daemon stops still reaches the job in the same epoch once the tier gives it. A saved
//!   carry naming a sample the catalog does not have is refused as a corrupt `state.json`.
//! * A stratified (or clustered) plan holds each class (cluster) within one sample of its
//!   share in every mini-epoch; carrying samples moves a mini-epoch off that bound. The move
//!   is told, not hidden: each `deferred` and `recovered` event says which class moved most
//!   and by how many samples ([`class_shift`]), and the log says it too.

use std::collections::{BTreeMap, BTreeSet};

use metfs_plan::planner::Strategy;
use metfs_protocol::event::ClassShift;
use metfs_tier::catalog::Catalog;
use serde::{Deserialize, Serialize};

/// A session's deferred samples (see the module docs); saved as they are.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
pub struct Deferred {
    /// Samples waiting for a mini-epoch to be staged in, by id.
    carried: BTreeSet<u32>,
    /// The mini-epoch they were last added to, and which of them.
    added: Option<((u64, u32), Vec<u32>)>,
    /// Deferrals so far (a sample deferred twice counts twice).
    deferred_total: u64,
    /// Carried samples a later staging gave.
    recovered_total: u64,
}

impl Deferred {
    /// Adds to the members of `target` (a mini-epoch of `bytes` bytes in a slot of
    /// `slot_bytes`) the carried samples that fit, smallest first; returns them.
    pub(super) fn add_to(
        &mut self,
        target: (u64, u32),
        members: &mut Vec<u32>,
        bytes: &mut u64,
        slot_bytes: u64,
        footprint: impl Fn(u32) -> u64,
    ) -> Vec<u32> {
        if self.carried.is_empty() {
            return Vec::new();
        }
        let mut by_size: Vec<u32> = self
            .carried
            .iter()
            .copied()
            .filter(|id| members.binary_search(id).is_err())
            .collect();
        by_size.sort_by_key(|&id| footprint(id));
        let mut added = Vec::new();
        for id in by_size {
            let f = footprint(id);
            if bytes.saturating_add(f) > slot_bytes {
                break;
            }
            *bytes += f;
            added.push(id);
        }
        members.extend(&added);
        members.sort_unstable();
        self.added = Some((target, added.clone()));
        added
    }

    /// The carried samples [`Deferred::add_to`] gave `target`, for its view.
    pub(super) fn added_to(&self, target: (u64, u32)) -> &[u32] {
        match &self.added {
            Some((t, ids)) if *t == target => ids,
            _ => &[],
        }
    }

    /// A staging of `members` (a mini-epoch's samples, ascending, carried ones included) gave
    /// all but `deferred`: the carried samples among the others are recovered (whether added
    /// to it or in its plan anyway), and `deferred` are carried. Returns the recovered ones.
    pub(super) fn staged(&mut self, members: &[u32], deferred: &[u32]) -> Vec<u32> {
        let again: BTreeSet<u32> = deferred.iter().copied().collect();
        let recovered: Vec<u32> = self
            .carried
            .iter()
            .copied()
            .filter(|id| !again.contains(id) && members.binary_search(id).is_ok())
            .collect();
        for id in &recovered {
            self.carried.remove(id);
        }
        self.recovered_total += recovered.len() as u64;
        self.deferred_total += again.len() as u64;
        self.carried.extend(again);
        recovered
    }

    /// How many samples are carried now.
    pub(super) fn carried(&self) -> u64 {
        self.carried.len() as u64
    }

    /// The samples carried now, by id.
    pub(super) fn carried_ids(&self) -> Vec<u32> {
        self.carried.iter().copied().collect()
    }

    /// Deferrals so far, and carried samples recovered.
    pub(super) fn totals(&self) -> (u64, u64) {
        (self.deferred_total, self.recovered_total)
    }

    /// What to save with the position: `None` while nothing was ever deferred, so that the
    /// saved position of a run without lasting faults is what it always was.
    pub(super) fn saved(&self) -> Option<Deferred> {
        (*self != Deferred::default()).then(|| self.clone())
    }

    /// Checks a saved carry against a catalog of `samples` samples: every id it names must be
    /// one. The error names the first that is not.
    pub(super) fn check(&self, samples: u32) -> Result<(), String> {
        let added = self.added.iter().flat_map(|(_, ids)| ids);
        match self.carried.iter().chain(added).find(|&&id| id >= samples) {
            Some(id) => Err(format!(
                "deferred: sample {id} is not in the catalog ({samples} samples)"
            )),
            None => Ok(()),
        }
    }
}

/// How far a staging of one mini-epoch moved its composition from the plan under `strategy`:
/// `added` are carried samples staged into it, `deferred` its samples left out (a carried
/// sample deferred again is in both, and moves nothing). `None` for a composition without
/// classes, or where no class moved.
pub(super) fn class_shift(
    strategy: Strategy,
    catalog: &Catalog,
    added: &[u32],
    deferred: &[u32],
) -> Option<ClassShift> {
    let (classes, name): (&[u32], &dyn Fn(u32) -> String) = match strategy {
        Strategy::Stratified => (catalog.labels()?, &|c| catalog.label_name(c).to_string()),
        Strategy::Clustered => (catalog.clusters()?, &|c| {
            catalog.cluster_name(c).to_string()
        }),
        Strategy::Sequential | Strategy::Random => return None,
    };
    let mut moved: BTreeMap<u32, i64> = BTreeMap::new();
    for &id in added {
        *moved.entry(classes[id as usize]).or_default() += 1;
    }
    for &id in deferred {
        *moved.entry(classes[id as usize]).or_default() -= 1;
    }
    moved.retain(|_, n| *n != 0);
    let (&class, &samples) = moved
        .iter()
        .max_by_key(|(&c, n)| (n.abs(), std::cmp::Reverse(c)))?;
    Some(ClassShift {
        class: name(class),
        samples,
        classes_moved: moved.len() as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deferred_sample_is_carried_until_a_staging_gives_it() {
        let mut d = Deferred::default();
        assert!(d.staged(&[5, 7, 9], &[7, 9]).is_empty());
        assert_eq!(d.carried(), 2);
        // The next mini-epoch has room for one of them only (sizes 10 and 30; 25 free).
        let (mut m, mut bytes) = (vec![1, 2], 75);
        let added = d.add_to((0, 1), &mut m, &mut bytes, 100, |id| {
            if id == 7 {
                10
            } else {
                30
            }
        });
        assert_eq!((added, m, bytes), (vec![7], vec![1, 2, 7], 85));
        assert_eq!(d.added_to((0, 1)), &[7]);
        assert!(d.added_to((0, 2)).is_empty());
        // 7 came; 9 waits on.
        assert_eq!(d.staged(&[1, 2, 7], &[]), vec![7]);
        assert_eq!(d.carried(), 1);
        let (mut m, mut bytes) = (vec![3], 10);
        let added = d.add_to((1, 0), &mut m, &mut bytes, 100, |_| 30);
        assert_eq!(added, vec![9]);
        // Deferred again: still carried, counted twice, recovered never.
        assert!(d.staged(&[3, 9], &[9]).is_empty());
        assert_eq!((d.carried(), d.totals()), (1, (3, 1)));
    }

    #[test]
    fn a_saved_carry_loads_back_equal_and_is_checked_against_the_catalog() {
        let mut d = Deferred::default();
        assert_eq!(d.saved(), None, "nothing deferred, nothing saved");
        d.staged(&[5, 7, 9], &[7, 9]);
        let (mut m, mut b) = (vec![1], 0);
        d.add_to((0, 2), &mut m, &mut b, 100, |_| 10);
        let text = serde_json::to_string(&d.saved().unwrap()).unwrap();
        let back: Deferred = serde_json::from_str(&text).unwrap();
        assert_eq!(back, d);
        assert_eq!(back.added_to((0, 2)), &[7, 9]);
        assert!(back.check(10).is_ok());
        let e = back.check(9).unwrap_err();
        assert!(e.contains("sample 9") && e.contains("9 samples"), "{e}");
    }

    #[test]
    fn a_carried_sample_already_in_the_mini_epoch_is_not_added_twice() {
        let mut d = Deferred::default();
        d.staged(&[4], &[4]);
        let (mut m, mut b) = (vec![4, 5], 20);
        assert!(d.add_to((1, 0), &mut m, &mut b, 100, |_| 10).is_empty());
        assert_eq!((m.clone(), b), (vec![4, 5], 20));
        // Staged there as planned: recovered.
        assert_eq!(d.staged(&m, &[]), vec![4]);
        assert_eq!(d.carried(), 0);
    }

    /// Samples carried into a stratified mini-epoch and left out of it move its classes off
    /// the plan; the class that moved most is named with its signed count, a carried sample
    /// deferred again moves nothing, and a composition without classes has no shift.
    #[test]
    fn the_class_a_carry_moved_most_is_named_with_how_far() {
        use metfs_tier::catalog::CatalogEntry;
        let entries =
            (0..8).map(|i| CatalogEntry::new(format!("{}/{i}.bin", ["cat", "dog"][i % 2]), 1));
        let mut cat = Catalog::from_entries("s", entries).unwrap();
        cat.label_by_first_dir();
        let class = |id: u32| {
            cat.label_name(cat.labels().unwrap()[id as usize])
                .to_string()
        };
        let (cats, dogs): (Vec<u32>, Vec<u32>) = (0..8).partition(|&id| class(id) == "cat");
        // Two cats carried in, one dog left out.
        let s = class_shift(Strategy::Stratified, &cat, &cats[..2], &dogs[..1]).unwrap();
        assert_eq!(
            (s.class.as_str(), s.samples, s.classes_moved),
            ("cat", 2, 2)
        );
        // One cat carried in and deferred again, two dogs left out.
        let s = class_shift(
            Strategy::Stratified,
            &cat,
            &cats[..1],
            &[cats[0], dogs[0], dogs[1]],
        )
        .unwrap();
        assert_eq!(
            (s.class.as_str(), s.samples, s.classes_moved),
            ("dog", -2, 1)
        );
        assert!(class_shift(Strategy::Stratified, &cat, &cats[..1], &cats[..1]).is_none());
        assert!(class_shift(Strategy::Random, &cat, &cats[..2], &[]).is_none());
    }
}
