//! Tiers for tests (the `testing` feature, off by default): [`MemoryTier`], a source held in
//! memory, and [`FaultyTier`], which wraps any tier and injects scripted faults. With them the
//! daemon's fault handling (an outage, a full cache, a sample that changes, a call that hangs)
//! is tested in seconds, without a file system to break or a server to stop.
//!
//! Both return the [`TierError`] variants the real tiers return for the same fault, so that
//! the stager sorts them as it sorts real ones (its module docs):
//! * a sample's own problem ([`TierError::NotFound`], [`TierError::Changed`], a permanent
//!   [`TierError::Io`] such as `EACCES`) leaves the sample out of its slot;
//! * an outage of the source ([`TierError::Unreachable`], what [`super::PosixTier`] returns for
//!   a missing source root and the S3 tier for 5xx and connection failures after its client's
//!   retries, or a transient [`TierError::Io`] such as `EIO`) is retried for
//!   `StagerConfig::retry_secs`, then fails the slot;
//! * refused credentials ([`TierError::Auth`]) and a full cache ([`TierError::Local`] with
//!   `ENOSPC`, what both real tiers return when writing the copy fails) fail the slot at once;
//! * a call that hangs makes no progress on its copy, so the stager's stall watch abandons it
//!   after `StagerConfig::timeout_secs` ([`TierError::Timeout`]) and fails the slot.

use std::collections::{BTreeMap, HashMap};
use std::ops::{Bound, Range, RangeBounds};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use super::{start_writeback, CapacityTier, Listing, SampleRef, TierError, Written};
use crate::catalog::{validate_rel_path, Catalog, CatalogEntry};
use crate::pacer::Pacer;

/// Default of [`MemoryTier::with_piece_bytes`]: small enough that a sample of a few tens of
/// KiB is written in several positional writes, as the S3 tier writes a large object in
/// ranged pieces, so that a copy can be interrupted halfway.
const DEFAULT_PIECE: u64 = 16 << 10;

/// One object of a [`MemoryTier`]: its bytes and their version.
#[derive(Debug, Clone)]
struct Object {
    bytes: Arc<Vec<u8>>,
    version: String,
}

/// A source held in memory: objects (relative path, bytes, version) that can be replaced or
/// removed while the daemon runs. The version of an object is `v<N>`, a new `N` each time it
/// is put, so a sample replaced after it was listed no longer matches its catalog entry, as a
/// rewritten file's mtime or an overwritten object's ETag would not.
///
/// A fetch copies the object into the destination a piece at a time with positional writes,
/// checking the size and version first and again after the copy, as [`super::PosixTier`] does
/// (a mismatch is [`TierError::Changed`]); it paces with the pacer and starts writeback of a
/// durable copy as it goes. The writes are made on the calling task: test samples are small,
/// and staying on the task keeps a fetch cancellable like an S3 fetch.
#[derive(Debug)]
pub struct MemoryTier {
    url: String,
    objects: Mutex<BTreeMap<String, Object>>,
    /// The number of the next version handed out.
    next_version: AtomicU64,
    /// Bytes per positional write of a fetch (at most the pacer's chunk).
    piece: u64,
    /// Per path: bytes that replace the object halfway through its next fetch.
    mid_copy: Mutex<HashMap<String, Vec<u8>>>,
}

/// `n` generated samples for a [`MemoryTier`]: `d{i % 3}/f{i:03}`, of 1 to 50,000 bytes that
/// differ from sample to sample, so that a copy of the wrong sample or a wrong range shows.
pub fn sample_files(n: u32) -> Vec<(String, Vec<u8>)> {
    (0..n)
        .map(|i| {
            let bytes = (0..(i * 7_919 % 50_000 + 1))
                .map(|b| (b ^ i) as u8)
                .collect();
            (format!("d{}/f{i:03}", i % 3), bytes)
        })
        .collect()
}

impl MemoryTier {
    /// An empty source named `url` (the catalog's source and the daemon's `source` in status;
    /// give it a scheme such as `memory://name` so that nothing takes it for a directory).
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            objects: Mutex::default(),
            next_version: AtomicU64::new(1),
            piece: DEFAULT_PIECE,
            mid_copy: Mutex::default(),
        }
    }

    /// A source named `url` holding `files` (relative path, bytes).
    pub fn with_files(
        url: impl Into<String>,
        files: impl IntoIterator<Item = (String, Vec<u8>)>,
    ) -> Self {
        let t = Self::new(url);
        for (path, bytes) in files {
            t.put(&path, bytes);
        }
        t
    }

    /// Sets the bytes of each positional write of a fetch (at least 1; the pacer's chunk caps
    /// it). Smaller pieces make a fetch take more steps, each a point where it can be
    /// interrupted or changed.
    pub fn with_piece_bytes(mut self, bytes: u64) -> Self {
        self.piece = bytes.max(1);
        self
    }

    /// Creates or replaces the object at `path` with `bytes` under a new version, which it
    /// returns. A sample replaced after it was listed fails its next fetch with
    /// [`TierError::Changed`], as on a real tier.
    pub fn put(&self, path: &str, bytes: Vec<u8>) -> String {
        let version = format!("v{}", self.next_version.fetch_add(1, Ordering::Relaxed));
        self.objects.lock().unwrap().insert(
            path.to_string(),
            Object {
                bytes: Arc::new(bytes),
                version: version.clone(),
            },
        );
        version
    }

    /// Removes the object at `path`; a fetch of it then fails with [`TierError::NotFound`].
    /// Returns whether it was there.
    pub fn remove(&self, path: &str) -> bool {
        self.objects.lock().unwrap().remove(path).is_some()
    }

    /// The bytes and version of the object at `path`, if any.
    pub fn get(&self, path: &str) -> Option<(Vec<u8>, String)> {
        let objects = self.objects.lock().unwrap();
        let o = objects.get(path)?;
        Some((o.bytes.to_vec(), o.version.clone()))
    }

    /// Makes the next fetch of `path` meet a change of the source in the middle of its copy:
    /// it copies the first half of the object as it was, then the object is replaced by
    /// `bytes` (a new version, as [`MemoryTier::put`]) and the copy goes on from the new bytes,
    /// so the destination holds bytes of two versions, as a reader of a file rewritten under
    /// it would. The fetch's check after the copy then fails it with [`TierError::Changed`],
    /// as [`super::PosixTier`]'s does: the mixed copy must never reach a slot.
    pub fn replace_during_next_fetch(&self, path: &str, bytes: Vec<u8>) {
        self.mid_copy
            .lock()
            .unwrap()
            .insert(path.to_string(), bytes);
    }

    fn object(&self, path: &str) -> Option<Object> {
        self.objects.lock().unwrap().get(path).cloned()
    }

    fn changed(&self, sample: &SampleRef, found: &str) -> TierError {
        TierError::Changed {
            url: self.url.clone(),
            path: sample.path.clone(),
            expected: format!("{} bytes, version {}", sample.size, sample.version),
            found: found.to_string(),
        }
    }

    /// The pieces a fetch of `size` bytes writes, split at `split` when a change comes there.
    fn pieces(&self, size: u64, piece: u64, split: Option<u64>) -> Vec<Range<u64>> {
        let mut bounds = vec![0, size];
        if let Some(s) = split.filter(|&s| s > 0 && s < size) {
            bounds.insert(1, s);
        }
        let mut out = Vec::new();
        for w in bounds.windows(2) {
            let mut at = w[0];
            while at < w[1] {
                let end = (at + piece).min(w[1]);
                out.push(at..end);
                at = end;
            }
        }
        out
    }
}

#[async_trait]
impl CapacityTier for MemoryTier {
    fn url(&self) -> &str {
        &self.url
    }

    async fn list(&self) -> Result<Listing, TierError> {
        let objects = self.objects.lock().unwrap();
        Ok(Listing {
            entries: objects
                .iter()
                .map(|(path, o)| CatalogEntry {
                    version: o.version.clone(),
                    ..CatalogEntry::new(path.clone(), o.bytes.len() as u64)
                })
                .collect(),
            ..Listing::default()
        })
    }

    /// Current when the catalog came from this tier and names exactly its objects, with their
    /// sizes and versions (as the S3 tier decides, having no directory stamps either).
    async fn catalog_is_current(&self, catalog: &Catalog) -> Result<bool, TierError> {
        if catalog.source() != self.url {
            return Ok(false);
        }
        let objects = self.objects.lock().unwrap();
        Ok(objects.len() == catalog.len()
            && (0..catalog.len() as u32).all(|id| {
                objects.get(&catalog.path(id)).is_some_and(|o| {
                    o.bytes.len() as u64 == catalog.size(id) && o.version == catalog.version(id)
                })
            }))
    }

    async fn fetch(
        &self,
        sample: &SampleRef,
        dest: Arc<std::fs::File>,
        pacer: &Pacer,
    ) -> Result<u64, TierError> {
        validate_rel_path(&sample.path).map_err(|_| TierError::Escapes {
            url: self.url.clone(),
            path: sample.path.clone(),
        })?;
        let Some(start) = self.object(&sample.path) else {
            return Err(TierError::NotFound {
                url: self.url.clone(),
                path: sample.path.clone(),
            });
        };
        let found = |o: &Object| format!("{} bytes, version {}", o.bytes.len(), o.version);
        if start.bytes.len() as u64 != sample.size
            || (!sample.version.is_empty() && start.version != sample.version)
        {
            return Err(self.changed(sample, &found(&start)));
        }
        let change = self.mid_copy.lock().unwrap().remove(&sample.path);
        let half = sample.size / 2;
        let piece = self.piece.min(pacer.chunk_bytes()).max(1);
        let mut bytes = start.bytes.clone();
        let mut change = change;
        for r in self.pieces(sample.size, piece, change.as_ref().map(|_| half)) {
            if r.start >= half {
                if let Some(new) = change.take() {
                    self.put(&sample.path, new);
                    bytes = self.object(&sample.path).expect("just put").bytes;
                }
            }
            pacer.consume(r.end - r.start).await;
            // A replacement shorter than the copy so far leaves nothing more to read, as a
            // truncated file would; the check below reports it.
            let from = (r.start as usize).min(bytes.len());
            let to = (r.end as usize).min(bytes.len());
            dest.write_all_at(&bytes[from..to], r.start)
                .map_err(|e| TierError::Local {
                    path: sample.path.clone(),
                    source: e,
                })?;
            if sample.durable {
                start_writeback(&dest, r.start, r.end - r.start);
            }
            // Other fetches run between two pieces, as they do between two network reads.
            tokio::task::yield_now().await;
        }
        match self.object(&sample.path) {
            Some(o) if o.version == start.version => Ok(sample.size),
            Some(o) => Err(self.changed(sample, &found(&o))),
            None => Err(TierError::NotFound {
                url: self.url.clone(),
                path: sample.path.clone(),
            }),
        }
    }
}

/// A kind of call a tier receives; [`FaultyTier`] numbers each kind's calls separately.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// [`CapacityTier::list`].
    List,
    /// [`CapacityTier::catalog_is_current`].
    CatalogCheck,
    /// [`CapacityTier::fetch`].
    Fetch,
}

impl Op {
    fn index(self) -> usize {
        match self {
            Op::List => 0,
            Op::CatalogCheck => 1,
            Op::Fetch => 2,
        }
    }
}

/// A failure [`FaultyTier`] returns instead of forwarding a call, each as the real tiers
/// report that fault (see the module docs for how the stager treats each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The source cannot be reached ([`TierError::Unreachable`]): transient, retried.
    Unreachable,
    /// An I/O error with this errno ([`TierError::Io`]): `EIO`, `ESTALE`, `ENOTCONN` and the
    /// like are transient and retried; `EACCES`, `EPERM`, `ELOOP`, `EISDIR` and
    /// `ENAMETOOLONG` are the sample's own and leave it out.
    Io(i32),
    /// The sample is gone ([`TierError::NotFound`]): left out of its slot.
    NotFound,
    /// Credentials refused ([`TierError::Auth`]): the slot fails at once.
    Auth,
    /// The cache is full: a fetch writes half of its copy, then fails with
    /// [`TierError::Local`] carrying `ENOSPC`, as a real tier's write into the cache would.
    /// The slot fails at once and the daemon reports the cache out of space. On a listing or
    /// catalog check (which write nothing) it is returned as is, which no real tier would.
    CacheFull,
}

/// How long a call [`FaultyTier`] holds back hangs before it goes on to the inner tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hang {
    /// For this long.
    For(Duration),
    /// Until [`FaultyTier::release`] is called after the call began.
    UntilReleased,
}

/// What a [`Rule`] does to the calls it matches.
#[derive(Clone)]
enum Action {
    Fail(Failure),
    Hang(Hang),
    Run(Arc<dyn Fn() + Send + Sync>),
}

/// Which calls a fault applies to, and the fault. Calls of each [`Op`] are numbered from 0 in
/// the order they reach the [`FaultyTier`] ([`FaultyTier::calls`] is the next number), over its
/// whole life, so a rule added after `n` fetches with `Rule::fetches(n + 3..)` starts with the
/// fourth fetch from then. Build one with [`Rule::calls`] or [`Rule::fetches`], narrow it with
/// [`Rule::of_path`], and give it its fault with [`Rule::fail`], [`Rule::hang`] or
/// [`Rule::run`].
#[derive(Clone)]
pub struct Rule {
    op: Op,
    /// Numbers of the matched calls: `from..to`.
    from: u64,
    to: u64,
    /// Only calls about this sample (fetches of it); `None`: every call in the range.
    path: Option<String>,
    action: Action,
}

impl std::fmt::Debug for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let action = match &self.action {
            Action::Fail(x) => format!("fail {x:?}"),
            Action::Hang(h) => format!("hang {h:?}"),
            Action::Run(_) => "run a hook".into(),
        };
        f.debug_struct("Rule")
            .field("op", &self.op)
            .field("calls", &(self.from..self.to))
            .field("path", &self.path)
            .field("action", &action)
            .finish()
    }
}

impl Rule {
    /// Calls of `op` numbered in `calls` (`n..` for every call from the `n`th on: an outage
    /// that does not end by itself; `n..m` for one that ends after call `m - 1`). Until a
    /// fault is given, the rule fails them with [`Failure::Unreachable`].
    pub fn calls(op: Op, calls: impl RangeBounds<u64>) -> Self {
        let from = match calls.start_bound() {
            Bound::Included(&n) => n,
            Bound::Excluded(&n) => n.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let to = match calls.end_bound() {
            Bound::Included(&n) => n.saturating_add(1),
            Bound::Excluded(&n) => n,
            Bound::Unbounded => u64::MAX,
        };
        Self {
            op,
            from,
            to,
            path: None,
            action: Action::Fail(Failure::Unreachable),
        }
    }

    /// Fetches numbered in `calls`: [`Rule::calls`] of [`Op::Fetch`].
    pub fn fetches(calls: impl RangeBounds<u64>) -> Self {
        Self::calls(Op::Fetch, calls)
    }

    /// Only the calls in the range that fetch `path` (the numbering stays the tier's, over
    /// every path).
    pub fn of_path(mut self, path: impl Into<String>) -> Self {
        self.path = Some(path.into());
        self
    }

    /// The matched calls fail with `failure` without reaching the inner tier.
    pub fn fail(mut self, failure: Failure) -> Self {
        self.action = Action::Fail(failure);
        self
    }

    /// The matched calls hang as `hang` says, then go on to the inner tier. A hung call
    /// writes nothing; one its caller drops (the stager abandoning a stalled fetch) ends there.
    pub fn hang(mut self, hang: Hang) -> Self {
        self.action = Action::Hang(hang);
        self
    }

    /// `hook` runs at each matched call, before it goes on to the inner tier: for example a
    /// [`MemoryTier::put`] that changes the sample being fetched after it was listed.
    pub fn run(mut self, hook: impl Fn() + Send + Sync + 'static) -> Self {
        self.action = Action::Run(Arc::new(hook));
        self
    }

    fn matches(&self, op: Op, n: u64, path: Option<&str>) -> bool {
        self.op == op
            && (self.from..self.to).contains(&n)
            && self.path.as_deref().is_none_or(|p| Some(p) == path)
    }
}

/// The handle of a rule added to a [`FaultyTier`], to end it with [`FaultyTier::end`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultId(u64);

/// Wraps a tier and applies [`Rule`]s to its calls: failures, hangs and hooks, by call number
/// and path; calls no rule matches go to the inner tier untouched. Where several rules match a
/// call, the one added first applies. It also counts what happened, for tests to check: calls
/// per [`Op`], successful fetches per path, and calls hanging now.
pub struct FaultyTier {
    inner: Arc<dyn CapacityTier>,
    rules: Mutex<Vec<(FaultId, Rule)>>,
    next_id: AtomicU64,
    /// Calls received, per [`Op::index`].
    calls: [AtomicU64; 3],
    /// Per path: fetches that returned `Ok` (bytes handed to the stager).
    fetched: Mutex<BTreeMap<String, u64>>,
    /// Calls hanging now.
    hanging: AtomicUsize,
    /// Bumped by [`FaultyTier::release`]; a hang waits for it to move past its value at the
    /// call's start.
    released: tokio::sync::watch::Sender<u64>,
}

impl std::fmt::Debug for FaultyTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultyTier")
            .field("inner", &self.inner.url())
            .field("rules", &self.rules.lock().unwrap())
            .finish_non_exhaustive()
    }
}

impl FaultyTier {
    /// `inner` with no faults yet.
    pub fn new(inner: Arc<dyn CapacityTier>) -> Self {
        Self {
            inner,
            rules: Mutex::default(),
            next_id: AtomicU64::new(0),
            calls: Default::default(),
            fetched: Mutex::default(),
            hanging: AtomicUsize::new(0),
            released: tokio::sync::watch::channel(0).0,
        }
    }

    /// Adds `rule`; it applies to the calls it matches from now on.
    pub fn add(&self, rule: Rule) -> FaultId {
        let id = FaultId(self.next_id.fetch_add(1, Ordering::Relaxed));
        self.rules.lock().unwrap().push((id, rule));
        id
    }

    /// Fetches numbered in `calls` fail with `failure`: [`Rule::fetches`] and [`Rule::fail`].
    pub fn fail_fetches(&self, calls: impl RangeBounds<u64>, failure: Failure) -> FaultId {
        self.add(Rule::fetches(calls).fail(failure))
    }

    /// Fetches numbered in `calls` hang: [`Rule::fetches`] and [`Rule::hang`].
    pub fn hang_fetches(&self, calls: impl RangeBounds<u64>, hang: Hang) -> FaultId {
        self.add(Rule::fetches(calls).hang(hang))
    }

    /// Ends a rule: calls from now on no longer meet it (an outage that ends). Calls hanging
    /// under it keep hanging until their time is up or [`FaultyTier::release`].
    pub fn end(&self, id: FaultId) {
        self.rules.lock().unwrap().retain(|(i, _)| *i != id);
    }

    /// Releases every call hanging now under [`Hang::UntilReleased`] (later ones hang again).
    pub fn release(&self) {
        self.released.send_modify(|n| *n += 1);
    }

    /// Calls of `op` received so far: the number the next one gets.
    pub fn calls(&self, op: Op) -> u64 {
        self.calls[op.index()].load(Ordering::Relaxed)
    }

    /// Calls hanging now.
    pub fn hanging(&self) -> usize {
        self.hanging.load(Ordering::Relaxed)
    }

    /// Fetches of `path` that succeeded.
    pub fn fetched(&self, path: &str) -> u64 {
        self.fetched.lock().unwrap().get(path).copied().unwrap_or(0)
    }

    /// Successful fetches per path.
    pub fn fetch_counts(&self) -> BTreeMap<String, u64> {
        self.fetched.lock().unwrap().clone()
    }

    /// Numbers the call and applies the first rule that matches it: `Err` to fail it, `Ok`
    /// (after a hang or a hook) to go on to the inner tier.
    async fn intercept(&self, op: Op, path: Option<&str>) -> Result<(), Failure> {
        let n = self.calls[op.index()].fetch_add(1, Ordering::Relaxed);
        let action = self
            .rules
            .lock()
            .unwrap()
            .iter()
            .find(|(_, r)| r.matches(op, n, path))
            .map(|(_, r)| r.action.clone());
        match action {
            None => Ok(()),
            Some(Action::Fail(f)) => Err(f),
            Some(Action::Run(hook)) => {
                hook();
                Ok(())
            }
            Some(Action::Hang(h)) => {
                // Counted down on every way out, a caller dropping the call included.
                struct Hanging<'a>(&'a AtomicUsize);
                impl Drop for Hanging<'_> {
                    fn drop(&mut self) {
                        self.0.fetch_sub(1, Ordering::Relaxed);
                    }
                }
                self.hanging.fetch_add(1, Ordering::Relaxed);
                let _hanging = Hanging(&self.hanging);
                match h {
                    Hang::For(d) => tokio::time::sleep(d).await,
                    Hang::UntilReleased => {
                        let mut rx = self.released.subscribe();
                        let at = *rx.borrow_and_update();
                        // The sender lives as long as `self`: this ends only on a release.
                        let _ = rx.wait_for(|&now| now > at).await;
                    }
                }
                Ok(())
            }
        }
    }

    fn error(&self, failure: Failure, what: &str) -> TierError {
        let url = self.inner.url().to_string();
        let path = what.to_string();
        match failure {
            Failure::Unreachable => TierError::Unreachable {
                url,
                reason: "injected outage: the source does not answer".into(),
            },
            Failure::Io(errno) => TierError::Io {
                url,
                path,
                source: std::io::Error::from_raw_os_error(errno),
            },
            Failure::NotFound => TierError::NotFound { url, path },
            Failure::Auth => TierError::Auth {
                url,
                reason: "injected: the server refused the credentials".into(),
            },
            Failure::CacheFull => TierError::Local {
                path,
                source: std::io::Error::from_raw_os_error(libc::ENOSPC),
            },
        }
    }
}

#[async_trait]
impl CapacityTier for FaultyTier {
    fn url(&self) -> &str {
        self.inner.url()
    }

    async fn list(&self) -> Result<Listing, TierError> {
        match self.intercept(Op::List, None).await {
            Ok(()) => self.inner.list().await,
            Err(f) => Err(self.error(f, "(listing)")),
        }
    }

    async fn catalog_is_current(&self, catalog: &Catalog) -> Result<bool, TierError> {
        match self.intercept(Op::CatalogCheck, None).await {
            Ok(()) => self.inner.catalog_is_current(catalog).await,
            Err(f) => Err(self.error(f, "(catalog check)")),
        }
    }

    async fn fetch(
        &self,
        sample: &SampleRef,
        dest: Arc<std::fs::File>,
        pacer: &Pacer,
    ) -> Result<u64, TierError> {
        match self.intercept(Op::Fetch, Some(&sample.path)).await {
            Ok(()) => {
                let r = self.inner.fetch(sample, dest, pacer).await;
                if r.is_ok() {
                    *self
                        .fetched
                        .lock()
                        .unwrap()
                        .entry(sample.path.clone())
                        .or_default() += 1;
                }
                r
            }
            Err(Failure::CacheFull) => {
                // What a full disk looks like to a copy: the first bytes fit, then a write
                // fails. The stager must remove the partial copy.
                let half = vec![0u8; (sample.size / 2) as usize];
                let _ = dest.write_all_at(&half, 0);
                Err(self.error(Failure::CacheFull, &sample.path))
            }
            Err(f) => Err(self.error(f, &sample.path)),
        }
    }

    /// The inner tier's, behind the same scripted faults as [`CapacityTier::fetch`] (a full
    /// cache fails it before any byte is written).
    async fn fetch_from(
        &self,
        sample: &SampleRef,
        dest: Arc<std::fs::File>,
        from: u64,
        pacer: &Pacer,
        written: Arc<Written>,
    ) -> Result<Option<u64>, TierError> {
        self.intercept(Op::Fetch, Some(&sample.path))
            .await
            .map_err(|f| self.error(f, &sample.path))?;
        let r = self
            .inner
            .fetch_from(sample, dest, from, pacer, written)
            .await;
        if matches!(r, Ok(Some(_))) {
            *self
                .fetched
                .lock()
                .unwrap()
                .entry(sample.path.clone())
                .or_default() += 1;
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_of(t: &MemoryTier, path: &str) -> SampleRef {
        let (bytes, version) = t.get(path).unwrap();
        SampleRef {
            path: path.into(),
            size: bytes.len() as u64,
            version,
            durable: false,
        }
    }

    fn dest(d: &tempfile::TempDir, name: &str) -> (std::path::PathBuf, Arc<std::fs::File>) {
        let p = d.path().join(name);
        (p.clone(), Arc::new(std::fs::File::create(&p).unwrap()))
    }

    #[tokio::test]
    async fn memory_tier_lists_fetches_in_pieces_and_notices_changes() {
        let t = MemoryTier::with_files("memory://t", sample_files(5)).with_piece_bytes(1000);
        let l = t.list().await.unwrap();
        assert_eq!(l.entries.len(), 5);
        let cat = Catalog::from_entries(t.url(), l.entries).unwrap();
        assert!(t.catalog_is_current(&cat).await.unwrap());
        let d = tempfile::tempdir().unwrap();
        let path = "d1/f004";
        let s = sample_of(&t, path);
        let (p, f) = dest(&d, "a");
        assert_eq!(t.fetch(&s, f, &Pacer::unlimited()).await.unwrap(), s.size);
        assert_eq!(std::fs::read(&p).unwrap(), t.get(path).unwrap().0);
        // Replaced after it was listed: the catalogued version is refused.
        t.put(path, vec![1; 10]);
        assert!(!t.catalog_is_current(&cat).await.unwrap());
        let (_, f) = dest(&d, "b");
        let e = t.fetch(&s, f, &Pacer::unlimited()).await.unwrap_err();
        assert!(matches!(e, TierError::Changed { .. }), "{e}");
        assert!(t.remove(path));
        let (_, f) = dest(&d, "c");
        let e = t.fetch(&s, f, &Pacer::unlimited()).await.unwrap_err();
        assert!(matches!(e, TierError::NotFound { .. }), "{e}");
    }

    #[tokio::test]
    async fn a_change_in_the_middle_of_a_copy_mixes_bytes_and_fails_the_fetch() {
        let t = MemoryTier::with_files("memory://t", sample_files(4)).with_piece_bytes(512);
        let path = "d0/f003";
        let s = sample_of(&t, path);
        let old = t.get(path).unwrap().0;
        let new = vec![0xAB; old.len()];
        t.replace_during_next_fetch(path, new.clone());
        let d = tempfile::tempdir().unwrap();
        let (p, f) = dest(&d, "a");
        let e = t.fetch(&s, f, &Pacer::unlimited()).await.unwrap_err();
        assert!(matches!(e, TierError::Changed { .. }), "{e}");
        let copy = std::fs::read(&p).unwrap();
        let half = old.len() / 2;
        assert_eq!(
            &copy[..half],
            &old[..half],
            "the first half is the old version"
        );
        assert_eq!(&copy[half..], &new[half..], "the rest is the new one");
        assert_eq!(t.get(path).unwrap().0, new);
    }

    #[tokio::test]
    async fn rules_apply_by_call_number_and_path_and_end() {
        let mem = Arc::new(MemoryTier::with_files("memory://t", sample_files(3)));
        let t = FaultyTier::new(mem.clone());
        let s = sample_of(&mem, "d0/f000");
        let d = tempfile::tempdir().unwrap();
        let pacer = Pacer::unlimited();
        let fetch = |name: &str| {
            let (_, f) = dest(&d, name);
            t.fetch(&s, f, &pacer)
        };
        let outage = t.fail_fetches(1..3, Failure::Unreachable);
        let full = t.add(
            Rule::fetches(5..)
                .of_path("d1/f001")
                .fail(Failure::CacheFull),
        );
        assert!(fetch("0").await.is_ok());
        assert!(matches!(
            fetch("1").await,
            Err(TierError::Unreachable { .. })
        ));
        assert!(matches!(
            fetch("2").await,
            Err(TierError::Unreachable { .. })
        ));
        assert!(fetch("3").await.is_ok(), "the outage ended after call 2");
        t.end(outage);
        assert!(fetch("4").await.is_ok());
        assert!(
            fetch("5").await.is_ok(),
            "the other rule is for another path"
        );
        t.end(full);
        assert_eq!(t.calls(Op::Fetch), 6);
        assert_eq!(t.fetched("d0/f000"), 4);
        t.add(Rule::calls(Op::List, ..).fail(Failure::Io(libc::EIO)));
        assert!(matches!(t.list().await, Err(TierError::Io { .. })));
    }

    #[tokio::test]
    async fn a_hang_lasts_until_released_and_ends_when_dropped() {
        let mem = Arc::new(MemoryTier::with_files("memory://t", sample_files(2)));
        let t = Arc::new(FaultyTier::new(mem.clone()));
        let s = sample_of(&mem, "d1/f001");
        let d = tempfile::tempdir().unwrap();
        t.hang_fetches(0..2, Hang::UntilReleased);
        let (p, f) = dest(&d, "a");
        let call = {
            let (t, s) = (t.clone(), s.clone());
            tokio::spawn(async move { t.fetch(&s, f, &Pacer::unlimited()).await })
        };
        while t.hanging() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(
            std::fs::metadata(&p).unwrap().len(),
            0,
            "a hung call writes nothing"
        );
        t.release();
        assert_eq!(call.await.unwrap().unwrap(), s.size);
        assert_eq!(t.hanging(), 0);
        // Dropped while it hangs (a caller's timeout): counted out.
        let (_, f) = dest(&d, "b");
        let r = tokio::time::timeout(
            Duration::from_millis(50),
            t.fetch(&s, f, &Pacer::unlimited()),
        )
        .await;
        assert!(r.is_err());
        assert_eq!(t.hanging(), 0);
        t.hang_fetches(2..3, Hang::For(Duration::from_millis(30)));
        let (_, f) = dest(&d, "c");
        assert_eq!(t.fetch(&s, f, &Pacer::unlimited()).await.unwrap(), s.size);
    }
}
