//! The stager against an injected tier (`metfs_tier::testing`, the `testing` feature): the
//! failures a `FaultyTier` injects are sorted as the real tiers' ones.

use std::sync::Arc;

use metfs_prefetcher::stager::{SlotSpec, StageError, Stager, StagerConfig};
use metfs_tier::catalog::Catalog;
use metfs_tier::pacer::Pacer;
use metfs_tier::testing::{sample_files, Failure, FaultyTier, MemoryTier, Op, Rule};
use metfs_tier::{CapacityTier, TierError};

/// The stager sorts the injected failures as it sorts the real tiers' ones.
#[tokio::test]
async fn the_stager_treats_injected_failures_as_real_ones() {
    let mem = Arc::new(MemoryTier::with_files("memory://t", sample_files(12)));
    let tier = Arc::new(FaultyTier::new(mem.clone()));
    let cat =
        Arc::new(Catalog::from_entries(mem.url(), tier.list().await.unwrap().entries).unwrap());
    let d = tempfile::tempdir().unwrap();
    let cfg = StagerConfig {
        concurrency: 4,
        retry_secs: 1,
        ..Default::default()
    };
    let st = Stager::new(
        tier.clone(),
        cat.clone(),
        d.path().join("slots"),
        d.path().join("tmp"),
        cfg,
        Pacer::unlimited(),
    );
    let spec = SlotSpec {
        name: "s".into(),
        samples: (0..cat.len() as u32).collect(),
        reuse_from: Vec::new(),
        defer: false,
    };
    // A full cache fails the slot at once, as out of space, and leaves no partial copy.
    let full = tier.fail_fetches(3.., Failure::CacheFull);
    let e = st.stage(&spec, Arc::default()).await.unwrap_err();
    assert!(e.is_out_of_space(), "{e}");
    assert_eq!(std::fs::read_dir(d.path().join("tmp")).unwrap().count(), 0);
    tier.end(full);
    // An outage longer than the retry window fails the slot as the tier's.
    let n = tier.calls(Op::Fetch);
    let outage = tier.fail_fetches(n + 1.., Failure::Unreachable);
    let e = st.stage(&spec, Arc::default()).await.unwrap_err();
    assert!(
        matches!(
            e,
            StageError::Tier {
                source: TierError::Unreachable { .. },
                ..
            }
        ),
        "{e}"
    );
    tier.end(outage);
    // A permanent I/O error and a changed sample leave just those samples out (two of the
    // last samples, which the failed attempts above did not reach).
    tier.add(
        Rule::fetches(..)
            .of_path(cat.path(9))
            .fail(Failure::Io(libc::EACCES)),
    );
    mem.put(&cat.path(11), vec![9; 3]);
    let r = st.stage(&spec, Arc::default()).await.unwrap();
    let out: Vec<u32> = r.failed.iter().map(|f| f.0).collect();
    assert_eq!(out, [9, 11], "{:?}", r.failed);
    for id in (0..cat.len() as u32).filter(|id| ![9, 11].contains(id)) {
        let copy = std::fs::read(st.slot_path("s").join(cat.path(id))).unwrap();
        assert_eq!(copy, mem.get(&cat.path(id)).unwrap().0);
    }
}
