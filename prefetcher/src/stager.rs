//! The stager: copies one mini-epoch from the capacity tier into its slot.
//!
//! A slot is a directory `SLOTS/<name>/` holding the mini-epoch's samples under their relative
//! paths. Each sample is fetched into a temporary file in `TMP/` and its size verified (the
//! tier verifies its version too, and starts writeback as it writes). Fetched files are committed
//! in batches (at most 512 files, 512 MiB or one second): one `syncfs` makes the batch durable,
//! then its files are renamed into the slot. A file therefore appears in a slot only when it is
//! complete, verified and on disk, and a crash at any point leaves at worst orphan temporary
//! files, which [`Stager::clean_tmp`] removes at start. Batches are committed on a thread of
//! their own while the next ones download, so durability costs the download no time unless
//! the disk is slower than the tier.
//!
//! Progress is journaled in `SLOTS/<name>.journal`: one line per staged sample id, appended after
//! its rename, and a final `complete` line. A restarted daemon reads the journal, checks that each
//! journaled file still exists with its size, and fetches only the rest. The journal is not
//! fsynced per line: an entry is only ever written after the rename it records, and the resume
//! check stats every journaled file, so a lost tail only costs a refetch.
//!
//! Fetches run with bounded concurrency (`StagerConfig::concurrency`) and share one [`Pacer`], so
//! a bandwidth cap holds for the slot as a whole. Samples that fail permanently (changed or
//! deleted on the tier since cataloguing) are left out of the slot and reported in
//! [`StageReport::failed`]; transient failures are retried with exponential backoff.

use std::collections::HashSet;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::catalog::Catalog;
use crate::pacer::Pacer;
use crate::tier::{CapacityTier, SampleRef, TierError};

/// Errors of the stager.
#[derive(Debug, Error)]
pub enum StageError {
    /// The cache directory could not be written.
    #[error("cache {path}: {source}")]
    Cache {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The tier failed in a way that retrying did not fix.
    #[error("staging slot {slot}: {source}")]
    Tier {
        slot: String,
        #[source]
        source: TierError,
    },
}

/// Stager settings.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct StagerConfig {
    /// Samples fetched at once. 32 keeps a parallel file system or an object store busy with
    /// small files (each fetch is latency-bound) without flooding a node's blocking threads.
    pub concurrency: usize,
    /// Attempts per sample for transient errors (I/O, unreachable tier) before the slot fails.
    /// Five attempts with 0.2 s doubling backoff ride out about six seconds of trouble.
    pub attempts: u32,
    /// `fsync` each staged file before renaming it into the slot. Turning this off is only safe
    /// on a cache that does not outlive the node (e.g. `/dev/shm`).
    pub fsync: bool,
}

impl Default for StagerConfig {
    fn default() -> Self {
        Self {
            concurrency: 32,
            attempts: 5,
            fsync: true,
        }
    }
}

/// One mini-epoch to stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotSpec {
    /// Slot name (directory name under the slots directory), e.g. `e000002-m0005`.
    pub name: String,
    /// Sample ids of the mini-epoch.
    pub samples: Vec<u32>,
}

/// Live counters of one staging run, readable while it runs.
#[derive(Debug, Default)]
pub struct Progress {
    /// Samples in the slot.
    pub files_total: AtomicU64,
    /// Samples already in the slot (including ones found from an earlier run).
    pub files_done: AtomicU64,
    /// Bytes of the slot.
    pub bytes_total: AtomicU64,
    /// Bytes already in the slot.
    pub bytes_done: AtomicU64,
    /// Bytes fetched from the tier by this run (excludes resumed files).
    pub bytes_fetched: AtomicU64,
    /// Bytes that need no more fetching: resumed, fetched (even if not yet committed) or given
    /// up on. Moves with every file, where `bytes_done` moves with every committed batch.
    pub bytes_settled: AtomicU64,
}

impl Progress {
    /// Bytes of the slot still to fetch: what pacing has to move before the slot is staged.
    pub fn bytes_to_fetch(&self) -> u64 {
        self.bytes_total
            .load(Ordering::Relaxed)
            .saturating_sub(self.bytes_settled.load(Ordering::Relaxed))
    }
}

/// Outcome of staging a slot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StageReport {
    /// Samples fetched from the tier by this run.
    pub fetched: u64,
    /// Samples already present from an earlier run (journal).
    pub resumed: u64,
    /// Bytes read from the tier.
    pub bytes_fetched: u64,
    /// Samples left out, with why.
    pub failed: Vec<(u32, String)>,
    /// Wall time.
    pub elapsed: Duration,
}

/// Files fetched before a batch is made durable: at most this many ...
const BATCH_FILES: usize = 512;
/// ... or this many bytes ...
const BATCH_BYTES: u64 = 512 << 20;
/// ... or after this long, so that a slow tier still makes steady, resumable progress. A crash
/// loses at most one batch of fetched data.
const BATCH_AGE: Duration = Duration::from_secs(1);

/// A sample fetched into a temporary file, waiting for its batch to be committed.
struct Fetched {
    id: u32,
    tmp: PathBuf,
    dst: PathBuf,
    bytes: u64,
}

/// Copies mini-epochs from a tier into slots. Cheap to clone.
#[derive(Clone)]
pub struct Stager {
    tier: Arc<dyn CapacityTier>,
    catalog: Arc<Catalog>,
    slots_dir: PathBuf,
    tmp_dir: PathBuf,
    cfg: StagerConfig,
    pacer: Pacer,
    tier_bytes: Arc<AtomicU64>,
}

fn cache_err(path: &Path) -> impl FnOnce(std::io::Error) -> StageError + '_ {
    move |source| StageError::Cache {
        path: path.display().to_string(),
        source,
    }
}

impl Stager {
    /// A stager writing slots under `slots_dir` and temporary files under `tmp_dir` (same file
    /// system, so renames are atomic).
    pub fn new(
        tier: Arc<dyn CapacityTier>,
        catalog: Arc<Catalog>,
        slots_dir: PathBuf,
        tmp_dir: PathBuf,
        cfg: StagerConfig,
        pacer: Pacer,
    ) -> Self {
        Self {
            tier,
            catalog,
            slots_dir,
            tmp_dir,
            cfg,
            pacer,
            tier_bytes: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Bytes read from the tier by this stager since it was made.
    pub fn tier_bytes_read(&self) -> u64 {
        self.tier_bytes.load(Ordering::Relaxed)
    }

    /// The pacer shared by every fetch.
    pub fn pacer(&self) -> &Pacer {
        &self.pacer
    }

    /// Directory of slot `name`.
    pub fn slot_path(&self, name: &str) -> PathBuf {
        self.slots_dir.join(name)
    }

    fn journal_path(&self, name: &str) -> PathBuf {
        self.slots_dir.join(format!("{name}.journal"))
    }

    /// Removes temporary files left by an interrupted run.
    pub fn clean_tmp(&self) -> Result<(), StageError> {
        std::fs::create_dir_all(&self.tmp_dir).map_err(cache_err(&self.tmp_dir))?;
        for ent in std::fs::read_dir(&self.tmp_dir).map_err(cache_err(&self.tmp_dir))? {
            let ent = ent.map_err(cache_err(&self.tmp_dir))?;
            let _ = std::fs::remove_file(ent.path());
        }
        Ok(())
    }

    /// True when the slot's journal says it is complete.
    pub fn is_complete(&self, name: &str) -> bool {
        read_journal(&self.journal_path(name)).1
    }

    /// Deletes a slot and its journal.
    pub fn evict(&self, name: &str) -> Result<(), StageError> {
        let p = self.slot_path(name);
        // Journal first: a half-deleted slot must never look complete.
        match std::fs::remove_file(self.journal_path(name)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(cache_err(&p)(e)),
        }
        match std::fs::remove_dir_all(&p) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(cache_err(&p)(e)),
        }
    }

    /// Names of slots present in the slots directory.
    pub fn present_slots(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Ok(rd) = std::fs::read_dir(&self.slots_dir) {
            for e in rd.flatten() {
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    if let Some(n) = e.file_name().to_str() {
                        out.push(n.to_string());
                    }
                }
            }
        }
        out.sort();
        out
    }

    /// Creates `slot`'s directory and the temporary directory; returns the slot's directory
    /// and its journal's path.
    fn prepare_slot(&self, slot: &SlotSpec) -> Result<(PathBuf, PathBuf), StageError> {
        let dir = self.slot_path(&slot.name);
        std::fs::create_dir_all(&dir).map_err(cache_err(&dir))?;
        std::fs::create_dir_all(&self.tmp_dir).map_err(cache_err(&self.tmp_dir))?;
        Ok((dir, self.journal_path(&slot.name)))
    }

    /// Stages `slot`, resuming from its journal. Returns when every sample is in the slot or has
    /// failed permanently.
    pub async fn stage(
        &self,
        slot: &SlotSpec,
        progress: Arc<Progress>,
    ) -> Result<StageReport, StageError> {
        let start = Instant::now();
        let (dir, jpath) = self.prepare_slot(slot)?;
        let (journaled, complete) = read_journal(&jpath);
        let total_bytes: u64 = slot.samples.iter().map(|&s| self.catalog.size(s)).sum();
        progress
            .files_total
            .store(slot.samples.len() as u64, Ordering::Relaxed);
        progress.bytes_total.store(total_bytes, Ordering::Relaxed);
        progress.files_done.store(0, Ordering::Relaxed);
        progress.bytes_done.store(0, Ordering::Relaxed);
        progress.bytes_fetched.store(0, Ordering::Relaxed);
        progress.bytes_settled.store(0, Ordering::Relaxed);

        let mut report = StageReport::default();
        let mut todo = Vec::new();
        for &id in &slot.samples {
            let ok = journaled.contains(&id)
                && std::fs::metadata(dir.join(self.catalog.path(id)))
                    .map(|m| m.len() == self.catalog.size(id))
                    .unwrap_or(false);
            if ok {
                report.resumed += 1;
                progress.files_done.fetch_add(1, Ordering::Relaxed);
                progress
                    .bytes_done
                    .fetch_add(self.catalog.size(id), Ordering::Relaxed);
                progress
                    .bytes_settled
                    .fetch_add(self.catalog.size(id), Ordering::Relaxed);
            } else {
                todo.push(id);
            }
        }
        if complete && todo.is_empty() {
            report.elapsed = start.elapsed();
            return Ok(report);
        }
        let journal = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&jpath)
            .map_err(cache_err(&jpath))?;
        // Fetched files wait in tmp/ until their batch is made durable with one syncfs, then
        // are renamed into the slot and journaled: a file in a slot is always complete and on
        // disk, at a fraction of the cost of one fsync per file. Batches are committed on
        // their own thread while fetching goes on (two batches may wait), so the download
        // never stops for the disk; each file's writeback starts as soon as it is fetched, so
        // a batch's syncfs mostly waits for writes already under way.
        let (tx, rx) = tokio::sync::mpsc::channel::<Vec<Fetched>>(2);
        let committer = {
            let tmp_dir = self.tmp_dir.clone();
            let fsync = self.cfg.fsync;
            let progress = progress.clone();
            let jpath = jpath.clone();
            tokio::task::spawn_blocking(move || {
                commit_batches(rx, journal, &jpath, &tmp_dir, fsync, &progress)
            })
        };
        let made_dirs = Arc::new(Mutex::new(HashSet::<String>::new()));
        let mut stream = futures::stream::iter(todo)
            .map(|id| {
                let made_dirs = made_dirs.clone();
                let progress = progress.clone();
                let dir = dir.clone();
                let slot_name = slot.name.clone();
                async move {
                    let r = self
                        .stage_one(&slot_name, &dir, id, &made_dirs, &progress)
                        .await;
                    (id, r)
                }
            })
            .buffer_unordered(self.cfg.concurrency.max(1));
        let mut batch: Vec<Fetched> = Vec::new();
        let mut batch_bytes = 0u64;
        let mut batch_start = Instant::now();
        let mut committer_gone = false;
        while let Some((id, r)) = stream.next().await {
            match r {
                Ok(f) => {
                    if batch.is_empty() {
                        batch_start = Instant::now();
                    }
                    batch_bytes += f.bytes;
                    batch.push(f);
                    if batch.len() >= BATCH_FILES
                        || batch_bytes >= BATCH_BYTES
                        || batch_start.elapsed() >= BATCH_AGE
                    {
                        batch_bytes = 0;
                        if tx.send(std::mem::take(&mut batch)).await.is_err() {
                            // The committer failed; its error is reported below.
                            committer_gone = true;
                            break;
                        }
                    }
                }
                Err(msg) => {
                    progress
                        .bytes_settled
                        .fetch_add(self.catalog.size(id), Ordering::Relaxed);
                    report.failed.push((id, msg));
                }
            }
        }
        drop(stream);
        if !committer_gone && !batch.is_empty() {
            let _ = tx.send(batch).await;
        }
        drop(tx);
        let (fetched, bytes, mut journal) = committer.await.expect("commit task panicked")?;
        report.fetched += fetched;
        report.bytes_fetched += bytes;
        report.failed.sort();
        // Failed samples are recorded so a resumed run reports them without refetching.
        for (id, _) in &report.failed {
            writeln!(journal, "failed {id}").map_err(cache_err(&jpath))?;
        }
        writeln!(journal, "complete").map_err(cache_err(&jpath))?;
        journal.sync_all().map_err(cache_err(&jpath))?;
        report.elapsed = start.elapsed();
        Ok(report)
    }

    async fn stage_one(
        &self,
        slot_name: &str,
        dir: &Path,
        id: u32,
        made_dirs: &Mutex<HashSet<String>>,
        progress: &Progress,
    ) -> Result<Fetched, String> {
        let (rel_dir, _) = self.catalog.dir_and_name(id);
        let rel = self.catalog.path(id);
        if !rel_dir.is_empty() && !made_dirs.lock().unwrap().contains(rel_dir) {
            std::fs::create_dir_all(dir.join(rel_dir))
                .map_err(|e| format!("creating {}: {e}", dir.join(rel_dir).display()))?;
            made_dirs.lock().unwrap().insert(rel_dir.to_string());
        }
        let sample = SampleRef {
            path: rel.clone(),
            size: self.catalog.size(id),
            version: self.catalog.version(id).to_string(),
            durable: self.cfg.fsync,
        };
        let tmp = self.tmp_dir.join(format!("{slot_name}-{id}"));
        let mut delay = Duration::from_millis(200);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)
                .map_err(|e| format!("creating {}: {e}", tmp.display()))?;
            let file = Arc::new(file);
            match self.tier.fetch(&sample, file.clone(), &self.pacer).await {
                Ok(n) if n == sample.size => {
                    self.tier_bytes.fetch_add(n, Ordering::Relaxed);
                    progress.bytes_fetched.fetch_add(n, Ordering::Relaxed);
                    progress.bytes_settled.fetch_add(n, Ordering::Relaxed);
                    let len = file.metadata().map(|m| m.len()).unwrap_or(u64::MAX);
                    if len != sample.size {
                        let _ = std::fs::remove_file(&tmp);
                        return Err(format!(
                            "`{rel}`: staged copy is {len} bytes, expected {}",
                            sample.size
                        ));
                    }
                    drop(file);
                    return Ok(Fetched {
                        id,
                        tmp,
                        dst: dir.join(&rel),
                        bytes: n,
                    });
                }
                Ok(n) => {
                    let _ = std::fs::remove_file(&tmp);
                    return Err(format!(
                        "`{rel}`: tier returned {n} bytes, expected {}",
                        sample.size
                    ));
                }
                Err(e) => {
                    let _ = std::fs::remove_file(&tmp);
                    let transient =
                        matches!(e, TierError::Io { .. } | TierError::Unreachable { .. });
                    if !transient || attempt >= self.cfg.attempts {
                        tracing::warn!(sample = %rel, error = %e, attempt, "sample left out of the slot");
                        return Err(e.to_string());
                    }
                    tracing::debug!(sample = %rel, error = %e, attempt, "retrying fetch");
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
            }
        }
    }
}

/// Commits batches of fetched files until the channel closes: makes each durable (one `syncfs`
/// of the cache file system, or nothing with `fsync = false`), renames its files into the slot
/// and journals them. Returns the files and bytes committed, and the journal. Blocking.
fn commit_batches(
    mut rx: tokio::sync::mpsc::Receiver<Vec<Fetched>>,
    mut journal: std::fs::File,
    jpath: &Path,
    tmp_dir: &Path,
    fsync: bool,
    progress: &Progress,
) -> Result<(u64, u64, std::fs::File), StageError> {
    let (mut files, mut bytes) = (0u64, 0u64);
    let dir = std::fs::File::open(tmp_dir).map_err(cache_err(tmp_dir))?;
    while let Some(batch) = rx.blocking_recv() {
        if fsync {
            use std::os::fd::AsRawFd;
            // SAFETY: syncfs on a directory fd we own.
            if unsafe { libc::syncfs(dir.as_raw_fd()) } != 0 {
                return Err(cache_err(tmp_dir)(std::io::Error::last_os_error()));
            }
        }
        let mut lines = String::with_capacity(batch.len() * 8);
        for f in batch {
            std::fs::rename(&f.tmp, &f.dst).map_err(cache_err(&f.dst))?;
            lines.push_str(&f.id.to_string());
            lines.push('\n');
            progress.files_done.fetch_add(1, Ordering::Relaxed);
            progress.bytes_done.fetch_add(f.bytes, Ordering::Relaxed);
            files += 1;
            bytes += f.bytes;
        }
        // Entries only ever follow the renames they record; a lost tail costs a refetch.
        journal
            .write_all(lines.as_bytes())
            .map_err(cache_err(jpath))?;
    }
    Ok((files, bytes, journal))
}

/// Reads a journal: the staged sample ids and whether the slot is complete. A missing or
/// unreadable journal means nothing is staged; unparsable lines (a torn last line after a crash)
/// are ignored.
fn read_journal(path: &Path) -> (HashSet<u32>, bool) {
    let mut done = HashSet::new();
    let mut complete = false;
    if let Ok(f) = std::fs::File::open(path) {
        for line in std::io::BufReader::new(f).lines().map_while(Result::ok) {
            if line == "complete" {
                complete = true;
            } else if let Ok(id) = line.parse::<u32>() {
                done.insert(id);
            }
        }
    }
    (done, complete)
}

impl Stager {
    /// Stages a container-mode slot: for each container file with rows in `slot`, one HDF5 file
    /// with just those rows, written to a temporary file, fsynced and renamed into the slot under
    /// the container's relative path. The journal records `file <index> <size>` per staged
    /// container; a resumed run keeps files whose size matches. Containers are staged one at a
    /// time (each is already a streaming, chunk-parallel copy) so that memory stays bounded.
    pub async fn stage_containers(
        &self,
        slot: &SlotSpec,
        containers: Arc<crate::hdf5::Containers>,
        progress: Arc<Progress>,
    ) -> Result<StageReport, StageError> {
        let start = Instant::now();
        let (dir, jpath) = self.prepare_slot(slot)?;
        let mut done: std::collections::HashMap<usize, u64> = Default::default();
        if let Ok(f) = std::fs::File::open(&jpath) {
            for line in std::io::BufReader::new(f).lines().map_while(Result::ok) {
                let mut it = line.split_whitespace();
                if let (Some("file"), Some(i), Some(n)) = (it.next(), it.next(), it.next()) {
                    if let (Ok(i), Ok(n)) = (i.parse(), n.parse()) {
                        done.insert(i, n);
                    }
                }
            }
        }
        // Every container appears in every view (with zero rows if the mini-epoch has none of
        // its rows), so that user code opening a container by name always finds it.
        let mut rows_of: Vec<Vec<u64>> = vec![Vec::new(); containers.files().len()];
        for (fi, rows) in containers.rows_by_file(&slot.samples) {
            rows_of[fi] = rows;
        }
        let by_file: Vec<(usize, Vec<u64>)> = rows_of.into_iter().enumerate().collect();
        let total: u64 = slot.samples.iter().map(|&s| self.catalog.size(s)).sum();
        progress
            .files_total
            .store(by_file.len() as u64, Ordering::Relaxed);
        progress.bytes_total.store(total, Ordering::Relaxed);
        progress.files_done.store(0, Ordering::Relaxed);
        progress.bytes_done.store(0, Ordering::Relaxed);
        progress.bytes_settled.store(0, Ordering::Relaxed);
        let mut journal = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&jpath)
            .map_err(cache_err(&jpath))?;
        let mut report = StageReport::default();
        for (fi, rows) in by_file {
            let rel = containers.files()[fi].path.clone();
            let dst = dir.join(&rel);
            let planned: u64 = rows.len() as u64 * containers.sample_size(fi);
            let have = std::fs::metadata(&dst).map(|m| m.len()).ok();
            if have.is_some() && done.get(&fi).copied() == have {
                report.resumed += 1;
            } else {
                if let Some(p) = dst.parent() {
                    std::fs::create_dir_all(p).map_err(cache_err(p))?;
                }
                let tmp = self.tmp_dir.join(format!("{}-c{fi}", slot.name));
                let c = containers.clone();
                let pacer = self.pacer.clone();
                let fsync = self.cfg.fsync;
                let t2 = tmp.clone();
                let r = tokio::task::spawn_blocking(move || -> Result<u64, String> {
                    let n = crate::hdf5::stage_rows(&c, fi, &rows, &t2, &pacer)
                        .map_err(|e| e.to_string())?;
                    if fsync {
                        std::fs::File::open(&t2)
                            .and_then(|f| f.sync_all())
                            .map_err(|e| format!("fsync {}: {e}", t2.display()))?;
                    }
                    Ok(n)
                })
                .await
                .expect("container staging task panicked");
                match r {
                    Ok(n) => {
                        std::fs::rename(&tmp, &dst).map_err(cache_err(&dst))?;
                        writeln!(journal, "file {fi} {n}").map_err(cache_err(&jpath))?;
                        self.tier_bytes.fetch_add(planned, Ordering::Relaxed);
                        progress.bytes_fetched.fetch_add(planned, Ordering::Relaxed);
                        report.fetched += 1;
                        report.bytes_fetched += planned;
                    }
                    Err(msg) => {
                        let _ = std::fs::remove_file(&tmp);
                        tracing::warn!(container = %rel, error = %msg, "container left out of the slot");
                        for &s in &slot.samples {
                            if containers.locate(s).0 == fi {
                                report.failed.push((s, msg.clone()));
                            }
                        }
                    }
                }
            }
            progress.files_done.fetch_add(1, Ordering::Relaxed);
            progress.bytes_done.fetch_add(planned, Ordering::Relaxed);
            progress.bytes_settled.fetch_add(planned, Ordering::Relaxed);
        }
        writeln!(journal, "complete").map_err(cache_err(&jpath))?;
        journal.sync_all().map_err(cache_err(&jpath))?;
        report.elapsed = start.elapsed();
        Ok(report)
    }
}

/// Failed sample ids recorded in a complete slot's journal.
pub fn journal_failures(slots_dir: &Path, name: &str) -> Vec<u32> {
    let mut out = Vec::new();
    if let Ok(f) = std::fs::File::open(slots_dir.join(format!("{name}.journal"))) {
        for line in std::io::BufReader::new(f).lines().map_while(Result::ok) {
            if let Some(id) = line.strip_prefix("failed ").and_then(|s| s.parse().ok()) {
                out.push(id);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tier::PosixTier;

    async fn setup(n: usize) -> (tempfile::TempDir, Stager, Arc<Catalog>) {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("src");
        for i in 0..n {
            let p = src.join(format!("c{}/f {i}.bin", i % 3));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, vec![i as u8; i * 100]).unwrap();
        }
        let tier = Arc::new(PosixTier::new(&src).unwrap());
        let l = tier.list().await.unwrap();
        let cat = Arc::new(Catalog::from_entries(tier.url(), l.entries).unwrap());
        let st = Stager::new(
            tier,
            cat.clone(),
            d.path().join("cache/slots"),
            d.path().join("cache/tmp"),
            StagerConfig::default(),
            Pacer::unlimited(),
        );
        (d, st, cat)
    }

    #[tokio::test]
    async fn stages_and_resumes() {
        let (d, st, cat) = setup(20).await;
        let spec = SlotSpec {
            name: "e0-m0".into(),
            samples: (0..cat.len() as u32).collect(),
        };
        let r = st.stage(&spec, Arc::default()).await.unwrap();
        assert_eq!(r.fetched, 20);
        assert!(r.failed.is_empty());
        assert!(st.is_complete("e0-m0"));
        for id in 0..cat.len() as u32 {
            let a = std::fs::read(d.path().join("src").join(cat.path(id))).unwrap();
            let b = std::fs::read(st.slot_path("e0-m0").join(cat.path(id))).unwrap();
            assert_eq!(a, b);
        }
        assert!(std::fs::read_dir(d.path().join("cache/tmp"))
            .unwrap()
            .next()
            .is_none());
        // A second run refetches nothing.
        let r = st.stage(&spec, Arc::default()).await.unwrap();
        assert_eq!((r.fetched, r.resumed), (0, 20));
        // A partial journal resumes: drop the completion line and two entries.
        let j = d.path().join("cache/slots/e0-m0.journal");
        let text = std::fs::read_to_string(&j).unwrap();
        let keep: Vec<&str> = text.lines().filter(|l| *l != "complete").skip(2).collect();
        std::fs::write(&j, keep.join("\n") + "\n").unwrap();
        let r = st.stage(&spec, Arc::default()).await.unwrap();
        assert_eq!((r.fetched, r.resumed), (2, 18));
        st.evict("e0-m0").unwrap();
        assert!(!st.is_complete("e0-m0"));
        assert!(!st.slot_path("e0-m0").exists());
    }

    #[tokio::test]
    async fn changed_sample_is_left_out_and_reported() {
        let (d, st, cat) = setup(6).await;
        let victim = 3u32;
        std::fs::write(d.path().join("src").join(cat.path(victim)), b"changed").unwrap();
        let spec = SlotSpec {
            name: "s".into(),
            samples: (0..cat.len() as u32).collect(),
        };
        let r = st.stage(&spec, Arc::default()).await.unwrap();
        assert_eq!(r.failed.len(), 1);
        assert_eq!(r.failed[0].0, victim);
        assert!(r.failed[0].1.contains("changed"), "{}", r.failed[0].1);
        assert!(!st.slot_path("s").join(cat.path(victim)).exists());
        assert_eq!(
            journal_failures(&d.path().join("cache/slots"), "s"),
            vec![victim]
        );
    }
}
