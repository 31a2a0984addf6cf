//! Tests of the ledger: the eviction order, shares and refusals, release on leave, invariants
//! under arbitrary operations (proptest), and the simulation of the paper's staggered-arrival
//! case against LRU.

use proptest::prelude::{prop, prop_assert, proptest};

use super::sim::{simulate, staggered_case, SimConfig};
use super::*;

#[test]
fn evicts_unpinned_then_lowest_refcount_then_oldest() {
    let mut l = Ledger::new(4, Policy::RefCnt);
    l.join(0, 2).unwrap();
    l.join(1, 2).unwrap();
    l.need(0, &[10, 11, 12, 13]).unwrap();
    l.need(1, &[11, 12]).unwrap();
    for s in [10, 11, 12, 13] {
        l.pin(0, &[(s, 1)]).unwrap();
        assert!(!l.stage(s, 1).unwrap().hit);
        l.consumed(0, &[s]).unwrap();
        l.unpin(0, &[s]).unwrap();
    }
    // Job 0 read all four; job 1 still needs 11 and 12. 10 and 13 have no references left,
    // and 10 is the older: it goes first, then 13, and only then 11 (older than 12).
    assert_eq!(l.refcount(11), 1);
    l.pin(1, &[(20, 1)]).unwrap();
    assert_eq!(l.stage(20, 1).unwrap().evicted, vec![10]);
    l.unpin(1, &[20]).unwrap();
    // 20 has no references either, but was used after 13.
    l.pin(0, &[(21, 1), (22, 1)]).unwrap();
    assert_eq!(l.stage(21, 1).unwrap().evicted, vec![13]);
    assert_eq!(l.stage(22, 1).unwrap().evicted, vec![20]);
    // Now only 11, 12 (refcount 1) and the pinned 21, 22 are left.
    l.unpin(0, &[21, 22]).unwrap();
    l.touch(11);
    l.pin(1, &[(30, 1), (31, 1)]).unwrap();
    assert_eq!(l.stage(30, 1).unwrap().evicted, vec![21]);
    assert_eq!(l.stage(31, 1).unwrap().evicted, vec![22]);
    l.unpin(1, &[30, 31]).unwrap();
    l.pin(0, &[(40, 1)]).unwrap();
    // 30 and 31 have refcount 0 and go before 11 and 12, whatever their age.
    assert_eq!(l.stage(40, 1).unwrap().evicted, vec![30]);
    assert!(l.is_staged(11) && l.is_staged(12));
    assert!(l.used() <= l.budget());
}

#[test]
fn lru_ignores_references() {
    let mut l = Ledger::new(2, Policy::Lru);
    l.join(0, 1).unwrap();
    l.join(1, 1).unwrap();
    l.need(1, &[1]).unwrap();
    for s in [1, 2] {
        l.pin(0, &[(s, 1)]).unwrap();
        l.stage(s, 1).unwrap();
        l.unpin(0, &[s]).unwrap();
    }
    l.pin(0, &[(3, 1)]).unwrap();
    // Job 1 still needs 1, but it is the oldest.
    assert_eq!(l.stage(3, 1).unwrap().evicted, vec![1]);
}

#[test]
fn a_hit_evicts_nothing_and_pins_are_never_evicted() {
    let mut l = Ledger::new(3, Policy::RefCnt);
    l.join(0, 3).unwrap();
    l.pin(0, &[(1, 1), (2, 1), (3, 1)]).unwrap();
    for s in [1, 2, 3] {
        l.stage(s, 1).unwrap();
    }
    let hit = l.stage(2, 1).unwrap();
    assert!(hit.hit && hit.evicted.is_empty());
    // Everything is pinned: a sample nobody pins finds no room, and nothing is lost.
    assert_eq!(
        l.stage(9, 1),
        Err(LedgerError::NoRoom {
            sample: 9,
            size: 1,
            pinned: 3,
            budget: 3
        })
    );
    assert_eq!(l.staged_count(), 3);
    assert_eq!(
        l.stage(2, 5),
        Err(LedgerError::SizeChanged {
            sample: 2,
            staged: 1,
            size: 5
        })
    );
}

#[test]
fn shares_are_fixed_at_join_and_a_join_that_cannot_fit_is_refused() {
    let mut l = Ledger::new(100, Policy::RefCnt);
    l.join(0, 60).unwrap();
    assert_eq!(
        l.join(1, 50),
        Err(LedgerError::JoinRefused {
            job: 1,
            share: 50,
            free: 40,
            budget: 100
        })
    );
    assert_eq!(l.join(0, 10), Err(LedgerError::DuplicateJob { job: 0 }));
    l.join(1, 40).unwrap();
    assert_eq!(l.unshared(), 0);
    assert_eq!(
        l.pin(1, &[(1, 30), (2, 20)]),
        Err(LedgerError::OverShare {
            job: 1,
            pinned: 50,
            share: 40
        })
    );
    // All or none: the refused pin left nothing pinned.
    assert!(!l.is_pinned(1));
    // A sample both pin counts against both shares but is stored once.
    l.pin(0, &[(1, 30)]).unwrap();
    l.pin(1, &[(1, 30)]).unwrap();
    assert_eq!(l.pinned(), 30);
    l.stage(1, 30).unwrap();
    assert_eq!(l.used(), 30);
    assert_eq!(l.pin(9, &[(1, 1)]), Err(LedgerError::UnknownJob { job: 9 }));
}

#[test]
fn leaving_releases_references_pins_and_share() {
    let mut l = Ledger::new(10, Policy::RefCnt);
    l.join(0, 5).unwrap();
    l.join(1, 5).unwrap();
    l.need(0, &[1, 2]).unwrap();
    l.need(1, &[1, 2]).unwrap();
    l.pin(1, &[(1, 5)]).unwrap();
    l.stage(1, 5).unwrap();
    assert_eq!(l.refcount(1), 2);
    l.leave(1).unwrap();
    assert_eq!(l.refcount(1), 1);
    assert!(!l.is_pinned(1));
    assert_eq!(l.unshared(), 5);
    assert_eq!(l.leave(1), Err(LedgerError::UnknownJob { job: 1 }));
    // The sample is evictable now.
    l.join(2, 5).unwrap();
    l.pin(2, &[(7, 5), (8, 0)]).unwrap();
    l.stage(7, 5).unwrap();
    l.pin(0, &[(9, 5)]).unwrap();
    assert_eq!(l.stage(9, 5).unwrap().evicted, vec![1]);
}

proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Arbitrary joins, needs, pins, stages, reads and leaves: the store never holds more than
    /// its budget, a pinned sample is never evicted, and a pinned sample always finds room.
    #[test]
    fn invariants_hold(ops in prop::collection::vec((0u8..7, 0u32..4, 0u32..24, 1u64..6), 1..300)) {
        let mut l = Ledger::new(40, Policy::RefCnt);
        for (op, job, s, size) in ops {
            // A sample's size is fixed by its id.
            let size_of = |s: u32| u64::from(s % 5) + 1;
            let _ = size;
            match op {
                0 => { let _ = l.join(job, 10); }
                1 => { let _ = l.need(job, &[s, s + 1, s + 2]); }
                2 => {
                    if l.pin(job, &[(s, size_of(s))]).is_ok() {
                        let st = l.stage(s, size_of(s));
                        prop_assert!(st.is_ok(), "a pinned sample found no room: {:?}", st);
                        for e in st.unwrap().evicted {
                            prop_assert!(!l.is_pinned(e), "evicted pinned sample {}", e);
                        }
                    }
                }
                3 => { let _ = l.unpin(job, &[s]); }
                4 => { let _ = l.consumed(job, &[s]); l.touch(s); }
                5 => { let _ = l.leave(job); }
                _ => {
                    if let Ok(st) = l.stage(s, size_of(s)) {
                        for e in st.evicted {
                            prop_assert!(!l.is_pinned(e));
                        }
                    }
                }
            }
            prop_assert!(l.used() <= l.budget());
            prop_assert!(l.pinned() <= l.budget());
        }
    }
}

#[test]
fn refcnt_misses_fewer_than_lru_when_jobs_arrive_staggered() {
    // The paper's case scaled down by ten: four jobs over random 75% samples of 1333 samples,
    // arriving a quarter epoch apart, two epochs each, DSA draws; the store holds a quarter of
    // the union. RefCnt keeps what a later job still needs; LRU keeps what was read last.
    let jobs = staggered_case(4, 1333, 1000, 250, 2, 3);
    let run = |policy| {
        simulate(&SimConfig {
            jobs: jobs.clone(),
            capacity: 333,
            lookahead: 8,
            policy,
            dependent: true,
            seed: 1,
        })
        .unwrap()
    };
    let (rc, lru) = (run(Policy::RefCnt), run(Policy::Lru));
    assert_eq!(rc.reads, 8000);
    assert_eq!(lru.reads, 8000);
    let ratio = rc.misses as f64 / lru.misses as f64;
    assert!(
        ratio <= 0.9,
        "RefCnt {} misses, LRU {} ({ratio:.2}x)",
        rc.misses,
        lru.misses
    );
}
