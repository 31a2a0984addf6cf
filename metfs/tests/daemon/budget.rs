//! The cache stays within its budget, and samples it can keep are read from the tier once.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use metfs_protocol::Choice;

use crate::common::*;
use metfs::daemon::DEFAULT_SESSION;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_never_exceeds_the_budget_across_switches() {
    let t = setup(1);
    // Sampled from before the daemon exists, through the first staging and every switch.
    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (stop, peak, cache) = (stop.clone(), peak.clone(), t.cache.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(allocated(&cache), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let r = start(t.cfg.clone()).await;
    let d = r.daemon.clone();
    let nm = status_u64(&d, "mini_epochs");
    for _ in 0..nm + 1 {
        // Reading opens backing files, as a job does: their slot drains when they close.
        check_bytes(&read_view(&d.surface().fs()), &t.source);
        d.advance(DEFAULT_SESSION, true).await.unwrap();
        wait_next_ready(&d).await;
        peak.fetch_max(allocated(&t.cache), Ordering::Relaxed);
    }
    stop.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let peak = peak.load(Ordering::Relaxed);
    // The cache must have held two slots at once for the check to mean anything.
    assert!(peak > status_u64(&d, "slot_bytes"), "peak {peak}");
    assert!(
        peak <= BUDGET,
        "the cache took {peak} bytes, over the budget of {BUDGET}"
    );
    drop(d);
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dataset_that_fits_one_slot_is_read_from_the_tier_once() {
    // 16 MiB: a slot holds ~7 MiB, the whole ~5 MiB dataset.
    let t = setup_full(1, 16 << 20, "");
    let dataset: u64 = t.source.values().map(|v| v.len() as u64).sum();
    let r = start(t.cfg.clone()).await;
    let d = r.daemon.clone();
    assert_eq!(status_u64(&d, "mini_epochs"), 1);
    for _ in 0..3 {
        wait_next_ready(&d).await;
        // Current and successor hold the same samples: the successor's are links.
        assert_cache_bytes_count_links_once(&d, &t.cache);
        assert_eq!(
            d.advance(DEFAULT_SESSION, true).await.unwrap().decision,
            Choice::Advance
        );
        check_bytes(&read_view(&d.surface().fs()), &t.source);
    }
    wait_next_ready(&d).await;
    assert_eq!(status_u64(&d, "epoch"), 3);
    assert_eq!(
        status_u64(&d, "tier_bytes_read"),
        dataset,
        "samples already on the node were fetched again"
    );
    assert_eq!(status_u64(&d, "reused_bytes"), 4 * dataset);
    drop(d);
    r.stop().await;

    // After a restart, the successor is still taken from the node, not the tier.
    let slots = t.cache.join("slots");
    let journal = slots.join("e000004-m00000.journal");
    std::fs::remove_file(&journal).unwrap();
    std::fs::remove_dir_all(slots.join("e000004-m00000")).unwrap();
    let r = start(t.cfg.clone()).await;
    let d = r.daemon.clone();
    wait_next_ready(&d).await;
    assert_eq!(
        status_u64(&d, "tier_bytes_read"),
        0,
        "refetched after a restart"
    );
    assert_eq!(status_u64(&d, "reused_bytes"), dataset);
    assert_cache_bytes_count_links_once(&d, &t.cache);
    assert_eq!(
        d.advance(DEFAULT_SESSION, true).await.unwrap().decision,
        Choice::Advance
    );
    check_bytes(&read_view(&d.surface().fs()), &t.source);
    // The old slot is gone now: its links are the new slot's alone, still counted.
    for _ in 0..300 {
        if d.status().draining_slots == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    wait_next_ready(&d).await;
    assert_cache_bytes_count_links_once(&d, &t.cache);
    assert!(status_u64(&d, "cache_bytes") <= 16 << 20);
    drop(d);
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dataset_that_fits_the_budget_but_not_one_slot_is_read_from_the_tier_once() {
    // 10 MiB: a slot holds ~4 MiB, so the ~5 MiB dataset makes two mini-epochs, which the
    // budget holds together: each epoch's (random) mini-epochs are all on the node already.
    let budget = 10 << 20;
    let t = setup_full(1, budget, "");
    let dataset: u64 = t.source.values().map(|v| v.len() as u64).sum();
    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (stop, peak, cache) = (stop.clone(), peak.clone(), t.cache.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(allocated(&cache), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let r = start(t.cfg.clone()).await;
    let d = r.daemon.clone();
    assert_eq!(status_u64(&d, "mini_epochs"), 2);
    for _ in 0..6 {
        wait_next_ready(&d).await;
        assert_cache_bytes_count_links_once(&d, &t.cache);
        check_bytes(&read_view(&d.surface().fs()), &t.source);
        assert_eq!(
            d.advance(DEFAULT_SESSION, true).await.unwrap().decision,
            Choice::Advance
        );
    }
    wait_next_ready(&d).await;
    stop.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    assert_eq!(status_u64(&d, "epoch"), 3);
    assert_eq!(
        status_u64(&d, "tier_bytes_read"),
        dataset,
        "a sample the budget could keep was fetched again"
    );
    let peak = peak.load(Ordering::Relaxed);
    assert!(
        peak <= budget,
        "the cache took {peak} bytes, over the budget of {budget}"
    );
    drop(d);
    r.stop().await;
}
