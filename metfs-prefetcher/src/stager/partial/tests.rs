//! Tests of partial copies: their names and sidecars, and stagings that continue them.

use super::*;
use crate::stager::{SlotSpec, StageError, StagerConfig};
use metfs_tier::catalog::Catalog;
use metfs_tier::pacer::Pacer;
use metfs_tier::{CapacityTier, PosixTier};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[test]
fn names_of_partials_are_told_from_other_temporary_files() {
    assert_eq!(
        partial_id("e000001-m00002-17.part", "e000001-m00002"),
        Some(17)
    );
    assert_eq!(
        partial_id("e000001-m00002-17.part.src", "e000001-m00002"),
        Some(17)
    );
    assert_eq!(partial_id("e000001-m00002-17.3", "e000001-m00002"), None);
    assert_eq!(partial_id("e000001-m00003-17.part", "e000001-m00002"), None);
    assert_eq!(partial_id("e000001-m00002-x.part", "e000001-m00002"), None);
    assert!(is_partial_name("a-1.part") && is_partial_name("a-1.part.src"));
    assert_eq!(
        slot_of("e000001-m00002-17.part.src"),
        Some("e000001-m00002")
    );
    assert!(!is_partial_name("a-1.7") && !is_partial_name("a-1.7.t"));
}

#[test]
fn a_sidecar_names_the_sample_its_version_and_the_boot() {
    let s = SampleRef {
        path: "d/x.bin".into(),
        size: 9 << 20,
        version: "123".into(),
        durable: false,
    };
    let t = sidecar_text(&s);
    assert!(
        t.contains("size 9437184\n") && t.contains("version 123\n"),
        "{t}"
    );
    assert!(t.ends_with("path d/x.bin\n"), "{t}");
    let other = SampleRef {
        version: "124".into(),
        ..s.clone()
    };
    assert_ne!(t, sidecar_text(&other));
    assert!(!boot_id().is_empty());
}

#[test]
fn only_the_tiers_passing_errors_keep_a_partial() {
    let io = |errno| TierError::Io {
        url: "u".into(),
        path: "p".into(),
        source: std::io::Error::from_raw_os_error(errno),
    };
    assert!(keeps_partial(&io(libc::EIO)));
    assert!(!keeps_partial(&io(libc::EACCES)));
    assert!(!keeps_partial(&TierError::Timeout {
        url: "u".into(),
        path: "p".into(),
        secs: 1,
    }));
}

/// A POSIX tier whose first `cuts` fetches of a large sample write part of it and fail with
/// `EIO`, as a server dropping the connection mid-copy: the first half of what was asked, in
/// order, or (`scattered`) its last quarter and then its first, as parallel ranged GETs may
/// leave it. `ranges` says whether it serves `fetch_from`, whose offsets it records.
struct Cut {
    inner: PosixTier,
    cuts: AtomicU32,
    ranges: bool,
    scattered: bool,
    froms: Mutex<Vec<u64>>,
}

impl Cut {
    fn new(src: &Path, cuts: u32, ranges: bool) -> Arc<Self> {
        Self::with(src, cuts, ranges, false)
    }

    fn with(src: &Path, cuts: u32, ranges: bool, scattered: bool) -> Arc<Self> {
        Arc::new(Self {
            inner: PosixTier::new(src).unwrap(),
            cuts: AtomicU32::new(cuts),
            ranges,
            scattered,
            froms: Mutex::default(),
        })
    }

    /// Whether this fetch of `sample` is cut (one of the first `cuts` of a large sample).
    fn cut_now(&self, sample: &SampleRef) -> bool {
        sample.size >= RESUME_MIN_BYTES
            && self
                .cuts
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok()
    }

    /// Writes part of bytes `from..` of `sample` into `dest` as a cut copy does, raises
    /// `written` to the prefix that is in place, and fails.
    fn cut(
        &self,
        sample: &SampleRef,
        dest: &std::fs::File,
        from: u64,
        written: &Written,
    ) -> TierError {
        use std::os::unix::fs::FileExt;
        let bytes = std::fs::read(self.inner.root().join(&sample.path)).unwrap();
        let (from, size) = (from as usize, bytes.len());
        let done = if self.scattered {
            let q = (size - from) / 4;
            dest.write_all_at(&bytes[size - q..], (size - q) as u64)
                .unwrap();
            dest.write_all_at(&bytes[from..from + q], from as u64)
                .unwrap();
            from + q
        } else {
            let h = (size - from) / 2;
            dest.write_all_at(&bytes[from..from + h], from as u64)
                .unwrap();
            from + h
        };
        written.raise(done as u64);
        TierError::Io {
            url: self.url().into(),
            path: sample.path.clone(),
            source: std::io::Error::from_raw_os_error(libc::EIO),
        }
    }
}

#[async_trait::async_trait]
impl CapacityTier for Cut {
    fn url(&self) -> &str {
        self.inner.url()
    }
    async fn list(&self) -> Result<metfs_tier::Listing, TierError> {
        self.inner.list().await
    }
    async fn catalog_is_current(&self, c: &Catalog) -> Result<bool, TierError> {
        self.inner.catalog_is_current(c).await
    }
    async fn fetch(
        &self,
        sample: &SampleRef,
        dest: Arc<std::fs::File>,
        pacer: &Pacer,
    ) -> Result<u64, TierError> {
        if self.cut_now(sample) {
            return Err(self.cut(sample, &dest, 0, &Written::default()));
        }
        self.inner.fetch(sample, dest, pacer).await
    }
    async fn fetch_from(
        &self,
        sample: &SampleRef,
        dest: Arc<std::fs::File>,
        from: u64,
        pacer: &Pacer,
        written: Arc<Written>,
    ) -> Result<Option<u64>, TierError> {
        if !self.ranges {
            return Ok(None);
        }
        self.froms.lock().unwrap().push(from);
        if self.cut_now(sample) {
            return Err(self.cut(sample, &dest, from, &written));
        }
        self.inner
            .fetch_from(sample, dest, from, pacer, written)
            .await
    }
}

const BIG: usize = RESUME_MIN_BYTES as usize + 12345;

/// A source of one large sample and two small ones; its directory.
fn source(d: &Path) -> PathBuf {
    let src = d.join("src");
    std::fs::create_dir_all(&src).unwrap();
    let big: Vec<u8> = (0..BIG).map(|i| (i % 253) as u8).collect();
    std::fs::write(src.join("big.bin"), big).unwrap();
    std::fs::write(src.join("a.bin"), b"small a").unwrap();
    std::fs::write(src.join("b.bin"), vec![9u8; 100_000]).unwrap();
    src
}

async fn stager(d: &Path, tier: Arc<dyn CapacityTier>, retry_secs: u64) -> (Stager, Arc<Catalog>) {
    let l = tier.list().await.unwrap();
    let cat = Arc::new(Catalog::from_entries(tier.url(), l.entries).unwrap());
    let cfg = StagerConfig {
        retry_secs,
        ..StagerConfig::default()
    };
    let st = Stager::new(
        tier,
        cat.clone(),
        d.join("cache/slots"),
        d.join("cache/tmp"),
        cfg,
        Pacer::unlimited(),
    );
    st.clean_tmp().unwrap();
    (st, cat)
}

fn spec(cat: &Catalog) -> SlotSpec {
    SlotSpec {
        name: "e000000-m00000".into(),
        samples: (0..cat.len() as u32).collect(),
        ..Default::default()
    }
}

fn assert_slot_is_source(st: &Stager, cat: &Catalog, src: &Path) {
    for id in 0..cat.len() as u32 {
        let a = std::fs::read(src.join(cat.path(id))).unwrap();
        let b = std::fs::read(st.slot_path("e000000-m00000").join(cat.path(id))).unwrap();
        assert!(a == b, "{}", cat.path(id));
    }
}

fn tmp_entries(d: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d.join("cache/tmp"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Fails a staging of the source's slot with the large sample cut mid-copy (`scattered`: see
/// [`Cut`]); returns the partial's length and its sidecar's mark.
async fn fail_mid_copy(d: &Path, src: &Path, scattered: bool) -> (u64, u64) {
    let (st, cat) = stager(d, Cut::with(src, u32::MAX, true, scattered), 0).await;
    let err = st.stage(&spec(&cat), Arc::default()).await.unwrap_err();
    assert!(matches!(err, StageError::Tier { .. }), "{err}");
    let big = (0..cat.len() as u32)
        .find(|&i| cat.path(i) == "big.bin")
        .unwrap();
    let left = tmp_entries(d);
    let part = format!("e000000-m00000-{big}.part");
    assert_eq!(
        left,
        [part.clone(), format!("{part}.src")],
        "the partial is kept"
    );
    let tmp = d.join("cache/tmp");
    let side = std::fs::read_to_string(tmp.join(format!("{part}.src"))).unwrap();
    let mark = side
        .lines()
        .last()
        .unwrap()
        .strip_prefix("written ")
        .unwrap();
    (
        std::fs::metadata(tmp.join(part)).unwrap().len(),
        mark.parse().unwrap(),
    )
}

#[tokio::test]
async fn a_copy_cut_mid_way_is_continued_by_its_retry() {
    let d = tempfile::tempdir().unwrap();
    let src = source(d.path());
    let tier = Cut::new(&src, 1, true);
    let (st, cat) = stager(d.path(), tier.clone(), 60).await;
    let r = st.stage(&spec(&cat), Arc::default()).await.unwrap();
    assert_eq!((r.fetched, r.failed.len()), (3, 0));
    // A large sample's first attempt is made with `fetch_from` too, from 0.
    assert_eq!(*tier.froms.lock().unwrap(), [0, BIG as u64 / 2]);
    let total: u64 = (0..cat.len() as u32).map(|i| cat.size(i)).sum();
    assert_eq!(st.tier_bytes_read(), total - BIG as u64 / 2);
    assert_eq!(r.bytes_fetched, total - BIG as u64 / 2);
    assert_slot_is_source(&st, &cat, &src);
    assert!(tmp_entries(d.path()).is_empty());
    // The journaled CRC is the whole copy's: a fresh stager's check keeps every copy.
    let (st, cat) = stager(d.path(), tier, 60).await;
    let r = st.stage(&spec(&cat), Arc::default()).await.unwrap();
    assert_eq!((r.fetched, r.resumed), (0, 3));
}

#[tokio::test]
async fn a_partial_left_by_a_failed_staging_is_continued_by_the_next() {
    let d = tempfile::tempdir().unwrap();
    let src = source(d.path());
    let (kept, mark) = fail_mid_copy(d.path(), &src, false).await;
    assert_eq!((kept, mark), (BIG as u64 / 2, BIG as u64 / 2));
    // A restarted daemon: a new stager, whose start cleans `TMP/` but for partials.
    let tier = Cut::new(&src, 0, true);
    let (st, cat) = stager(d.path(), tier.clone(), 60).await;
    let r = st.stage(&spec(&cat), Arc::default()).await.unwrap();
    assert_eq!(*tier.froms.lock().unwrap(), [kept]);
    assert_eq!(r.fetched + r.resumed, 3);
    assert_eq!(st.tier_bytes_read(), r.bytes_fetched);
    assert!(
        st.tier_bytes_read() < BIG as u64,
        "{}",
        st.tier_bytes_read()
    );
    assert_slot_is_source(&st, &cat, &src);
    assert!(tmp_entries(d.path()).is_empty());
}

#[tokio::test]
async fn a_partial_of_another_version_is_fetched_again_from_0() {
    let d = tempfile::tempdir().unwrap();
    let src = source(d.path());
    fail_mid_copy(d.path(), &src, false).await;
    // The same size, new bytes and a new stamp.
    let p = src.join("big.bin");
    std::fs::write(&p, vec![1u8; BIG]).unwrap();
    let later = std::time::SystemTime::now() + Duration::from_secs(5);
    std::fs::File::options()
        .write(true)
        .open(&p)
        .unwrap()
        .set_modified(later)
        .unwrap();
    let tier = Cut::new(&src, 0, true);
    let (st, cat) = stager(d.path(), tier.clone(), 60).await;
    let r = st.stage(&spec(&cat), Arc::default()).await.unwrap();
    assert_eq!(*tier.froms.lock().unwrap(), [0], "not continued");
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    assert!(st.tier_bytes_read() >= BIG as u64);
    assert_slot_is_source(&st, &cat, &src);
}

/// A copy whose pieces landed out of order (the file as long as the sample, a hole inside) is
/// continued from its mark, by the retry and after a restart, never from its length.
#[tokio::test]
async fn a_copy_written_out_of_order_is_continued_from_its_mark() {
    let d = tempfile::tempdir().unwrap();
    let src = source(d.path());
    let q = BIG as u64 / 4;
    let tier = Cut::with(&src, 1, true, true);
    let (st, cat) = stager(d.path(), tier.clone(), 60).await;
    let r = st.stage(&spec(&cat), Arc::default()).await.unwrap();
    assert_eq!((r.fetched, r.failed.len()), (3, 0));
    assert_eq!(*tier.froms.lock().unwrap(), [0, q]);
    let total: u64 = (0..cat.len() as u32).map(|i| cat.size(i)).sum();
    assert_eq!(st.tier_bytes_read(), total - q);
    assert_slot_is_source(&st, &cat, &src);

    let d = tempfile::tempdir().unwrap();
    let src = source(d.path());
    let (len, mark) = fail_mid_copy(d.path(), &src, true).await;
    assert_eq!((len, mark), (BIG as u64, q));
    let tier = Cut::new(&src, 0, true);
    let (st, cat) = stager(d.path(), tier.clone(), 60).await;
    let r = st.stage(&spec(&cat), Arc::default()).await.unwrap();
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    assert_eq!(*tier.froms.lock().unwrap(), [q]);
    assert_slot_is_source(&st, &cat, &src);
    assert!(tmp_entries(d.path()).is_empty());
}

#[test]
fn a_mark_is_read_only_whole_and_after_this_copys_identity() {
    let id = "metfs partial 1\nboot b\nsize 9\nversion 1\npath x\n";
    assert_eq!(
        read_mark(format!("{id}{}", mark_line(7)).as_bytes(), id),
        Some(7)
    );
    assert_eq!(read_mark(id.as_bytes(), id), None, "no mark");
    let torn = format!("{id}written 0000000");
    assert_eq!(read_mark(torn.as_bytes(), id), None, "a mark cut short");
    let other = id.replace("version 1", "version 2");
    assert_eq!(
        read_mark(format!("{other}{}", mark_line(7)).as_bytes(), id),
        None
    );
}

#[tokio::test]
async fn a_tier_without_ranges_fetches_the_whole_sample() {
    let d = tempfile::tempdir().unwrap();
    let src = source(d.path());
    fail_mid_copy(d.path(), &src, false).await;
    let (st, cat) = stager(d.path(), Cut::new(&src, 0, false), 60).await;
    let r = st.stage(&spec(&cat), Arc::default()).await.unwrap();
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    assert!(st.tier_bytes_read() >= BIG as u64);
    assert_slot_is_source(&st, &cat, &src);
    assert!(tmp_entries(d.path()).is_empty());
}

#[tokio::test]
async fn an_evicted_slot_takes_its_partials_with_it() {
    let d = tempfile::tempdir().unwrap();
    let src = source(d.path());
    fail_mid_copy(d.path(), &src, false).await;
    let (st, _) = stager(d.path(), Cut::new(&src, 0, true), 60).await;
    assert_eq!(tmp_entries(d.path()).len(), 2, "a start keeps partials");
    st.evict("e000000-m00000").unwrap();
    assert!(tmp_entries(d.path()).is_empty());
}

#[tokio::test]
async fn a_start_removes_the_partials_of_a_slot_that_is_gone() {
    let d = tempfile::tempdir().unwrap();
    let src = source(d.path());
    fail_mid_copy(d.path(), &src, false).await;
    std::fs::remove_dir_all(d.path().join("cache/slots/e000000-m00000")).unwrap();
    stager(d.path(), Cut::new(&src, 0, true), 60).await;
    assert!(tmp_entries(d.path()).is_empty());
}
