//! Staging one slot of plain files: resume from the journal (CRC-checked), fetch with bounded
//! concurrency under a stall watch, commit durable batches, journal them.
//!
//! Staged files are written and renamed here (and in `containers` and `reuse`), not through the
//! `metfs-durable` crate that replaces metfs's other files: a batch is made durable by one `syncfs`
//! before it is journaled, and one fsync per file would cost what that saves.

use super::commit::{commit_batches, Committed};
use futures::StreamExt;
use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::copy::is_samples_own;
use super::partial::{is_partial_name, keeps_partial, partial_id, remove_partial, Attempt};
use super::{
    cache_err, crc_of_copy, crc_of_file, create_private_dir, Fetched, Landing, Miss, Progress,
    SlotSpec, StageError, StageReport, Stager, BATCH_AGE, BATCH_BYTES, BATCH_FILES, NAME_MAX,
    PATH_MAX,
};
use super::{JournalBatch, JournalState, SlotJournal};
use crate::transform::Transformer;
use metfs_tier::backoff::Backoff;
use metfs_tier::{SampleRef, TierError, Written};

impl Stager {
    /// Creates `slot`'s directory and the temporary directory; returns the slot's directory
    /// and its journal.
    pub(super) fn prepare_slot(
        &self,
        slot: &SlotSpec,
    ) -> Result<(PathBuf, SlotJournal), StageError> {
        let dir = self.slot_path(&slot.name);
        create_private_dir(&dir).map_err(cache_err(&dir))?;
        create_private_dir(&self.tmp_dir).map_err(cache_err(&self.tmp_dir))?;
        Ok((dir, self.journal(&slot.name)))
    }

    /// Stages `slot`, resuming from its journal. Returns when every sample is in the slot or has
    /// been left out for a reason of its own. Fails, keeping what it committed, when the tier
    /// stays unavailable for [`super::StagerConfig::retry_secs`] or the cache cannot be written (full,
    /// over quota); the slot is then not complete and a later call resumes it.
    pub async fn stage(
        &self,
        slot: &SlotSpec,
        progress: Arc<Progress>,
    ) -> Result<StageReport, StageError> {
        let start = Instant::now();
        let _deferring = self.deferring_while(slot);
        let (dir, slot_journal) = self.prepare_slot(slot)?;
        let jpath = slot_journal.path().to_path_buf();
        let journal_state = slot_journal.read();
        self.transient.store(0, Ordering::Relaxed);
        let total_bytes: u64 = slot.samples.iter().map(|&s| self.catalog.size(s)).sum();
        progress.start(slot.samples.len() as u64, total_bytes);

        let mut report = StageReport::default();
        let kept = self.resume_kept(slot, &dir, &journal_state).await;
        let mut todo = self.count_kept(slot, &kept, &mut report, &progress);
        // Copies of an earlier, failed attempt at this slot, but for the partial copies of
        // samples still to fetch, which are continued (`partial`).
        let unfetched: HashSet<u32> = todo.iter().copied().collect();
        self.clean_tmp_matching(&format!("{}-", slot.name), &|n| {
            partial_id(n, &slot.name).is_some_and(|id| unfetched.contains(&id))
        })?;
        if journal_state.complete && todo.is_empty() {
            report.elapsed = start.elapsed();
            return Ok(report);
        }
        // Space freed by a background eviction is used only once it is free.
        self.evictions_done().await;
        let mut journal = slot_journal.append().map_err(cache_err(&jpath))?;
        // What the node already holds is never fetched again: samples in another slot are
        // linked (or copied) from it first, and journaled like fetched ones.
        if !slot.reuse_from.is_empty() && !todo.is_empty() && self.transform.is_none() {
            todo = self
                .reuse_into(slot, &dir, todo, &mut journal, &mut report, &progress)
                .await?;
        }
        // Fetched files are made durable a batch at a time with one syncfs, then journaled
        // (and renamed into the slot, those written in tmp/): a journaled copy is always
        // complete and on disk, at a fraction of the cost of one fsync per file. Batches are
        // committed on their own thread while fetching goes on (two batches may wait), so the
        // download never stops for the disk; a large file's writeback starts as soon as it is
        // fetched, so a batch's syncfs mostly waits for writes already under way.
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
        // A complete slot may be served (its refetch follows a damaged or missing copy):
        // copies reach it only by rename. Nothing reads an incomplete one.
        let landing = if journal_state.complete || self.transform.is_some() {
            Landing::Tmp
        } else {
            Landing::InPlace
        };
        // Small samples go a group at a time (`group`), each group as one of the concurrent
        // fetches.
        let mut stream = futures::stream::iter(self.groups(todo))
            .map(|group| {
                let made_dirs = made_dirs.clone();
                let progress = progress.clone();
                let dir = dir.clone();
                let slot_name = slot.name.clone();
                async move {
                    self.stage_group(&slot_name, &dir, group, &made_dirs, &progress, landing)
                        .await
                }
            })
            .buffer_unordered(self.cfg.concurrency.max(1))
            .flat_map(futures::stream::iter);
        let (batch, committer_gone, slot_error) = self
            .drain_fetches(&mut stream, &tx, &mut report, &progress)
            .await;
        drop(stream);
        if !committer_gone && !batch.is_empty() {
            let _ = tx.send(batch).await;
        }
        drop(tx);
        let committed = committer.await.expect("commit task panicked");
        if let Some(e) = slot_error {
            // Copies of dropped fetches (an abandoned blocking copy may still write to its
            // file, which then only lives until it closes it).
            // Partial copies left by a fetch that returned are kept for the next attempt.
            let _ = self.clean_tmp_matching(&format!("{}-", slot.name), &is_partial_name);
            tracing::warn!(slot = %slot.name, error = %e, "staging stopped; the slot keeps what it committed");
            return Err(e);
        }
        self.finish_slot(slot, committed?, &mut report)?;
        // What is left is of samples left out or linked from another slot: of no more use.
        self.remove_partials_of(&slot.name);
        report.elapsed = start.elapsed();
        Ok(report)
    }

    /// Ends a staging that fetched all it could: counts what the committer committed, and
    /// journals the samples left out (so a resumed run reports them without refetching) and
    /// the slot's `complete` line.
    fn finish_slot(
        &self,
        slot: &SlotSpec,
        (fetched, bytes, mut journal, too_long): Committed,
        report: &mut StageReport,
    ) -> Result<(), StageError> {
        let jpath = self.journal(&slot.name).path().to_path_buf();
        let transient = self.transient.load(Ordering::Relaxed);
        if transient > 0 {
            tracing::warn!(slot = %slot.name, retries = transient, "the tier recovered: every sample met by its errors was fetched on a retry");
        }
        report.fetched += fetched;
        report.bytes_fetched += bytes;
        report.failed.extend(too_long);
        report.failed.sort();
        let mut failed = JournalBatch::with_capacity(report.failed.len());
        for (id, _) in &report.failed {
            failed.failed(*id);
        }
        journal.write(&failed).map_err(cache_err(&jpath))?;
        journal.complete().map_err(cache_err(&jpath))?;
        Ok(())
    }

    /// Counts the samples of `slot` in `kept` as resumed; returns the others, to stage.
    fn count_kept(
        &self,
        slot: &SlotSpec,
        kept: &HashSet<u32>,
        report: &mut StageReport,
        progress: &Progress,
    ) -> Vec<u32> {
        let mut todo = Vec::new();
        for &id in &slot.samples {
            if kept.contains(&id) {
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
        todo
    }

    /// The copies of `slot` already in `dir` that staging keeps: after a clean shutdown's seal,
    /// every journaled one, unread (each is checked at its first open instead); otherwise those
    /// whose size and CRC still match the journal, read now.
    async fn resume_kept(
        &self,
        slot: &SlotSpec,
        dir: &Path,
        journal_state: &JournalState,
    ) -> HashSet<u32> {
        let sealed = self.take_sealed(&slot.name);
        if sealed && journal_state.complete && self.transform.is_none() {
            let crcs: Vec<(u32, u32)> = slot
                .samples
                .iter()
                .filter_map(|&id| Some((id, *journal_state.staged.get(&id)?)))
                .collect();
            let kept: HashSet<u32> = crcs.iter().map(|e| e.0).collect();
            tracing::info!(slot = %slot.name, copies = kept.len(), "resumed from its seal; each copy is checked at its first open");
            self.register_checks(&slot.name, crcs);
            kept
        } else {
            // Staged afresh: every journaled copy is read now, so none is left to check later.
            self.checks.lock().unwrap().remove(&slot.name);
            self.verify_journaled(dir, &slot.samples, &journal_state.staged)
                .await
        }
    }

    /// Takes the fetches of `stream` as they finish, sending full batches to the committer
    /// (`tx`) and noting samples left out in `report`. Returns the batch not sent yet, whether
    /// the committer is gone (its error is reported by the caller), and the error that stops
    /// the slot, if one did (fetches still running are then dropped; what is fetched is still
    /// committed).
    async fn drain_fetches(
        &self,
        stream: &mut (impl futures::Stream<Item = (u32, Result<Fetched, Miss>)> + Unpin),
        tx: &tokio::sync::mpsc::Sender<Vec<Fetched>>,
        report: &mut StageReport,
        progress: &Progress,
    ) -> (Vec<Fetched>, bool, Option<StageError>) {
        let mut batch: Vec<Fetched> = Vec::new();
        let mut batch_bytes = 0u64;
        let mut batch_start = Instant::now();
        let mut committer_gone = false;
        let mut slot_error = None;
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
                Err(Miss::Sample(msg)) => {
                    progress
                        .bytes_settled
                        .fetch_add(self.catalog.size(id), Ordering::Relaxed);
                    report.failed.push((id, msg));
                }
                Err(Miss::Deferred(msg)) => {
                    progress
                        .bytes_settled
                        .fetch_add(self.catalog.size(id), Ordering::Relaxed);
                    report
                        .failed
                        .push((id, format!("deferred to a later mini-epoch: {msg}")));
                    report.deferred.push(id);
                }
                Err(Miss::Slot(e)) => {
                    // Fetches still running are dropped; what is fetched is still committed.
                    slot_error = Some(e);
                    break;
                }
            }
        }
        (batch, committer_gone, slot_error)
    }

    /// The journaled samples of `samples` whose copy in `dir` still has the catalogued size and
    /// the journaled CRC. Reads every such copy, a few at a time.
    pub(super) async fn verify_journaled(
        &self,
        dir: &Path,
        samples: &[u32],
        journaled: &HashMap<u32, u32>,
    ) -> HashSet<u32> {
        let todo: Vec<(u32, u32, PathBuf, Option<u64>)> = samples
            .iter()
            .filter_map(|&id| {
                let crc = *journaled.get(&id)?;
                // A transformed copy's size is not the catalog's: its CRC alone checks it.
                let size = match self.transform {
                    Some(_) => None,
                    None => Some(self.catalog.size(id)),
                };
                Some((id, crc, dir.join(self.staged_path(id)), size))
            })
            .collect();
        let checks = todo.into_iter().map(|(id, crc, path, size)| {
            async move {
                let checked = tokio::task::spawn_blocking(move || match std::fs::metadata(&path) {
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Check::Missing,
                    Ok(m)
                        if size.is_none_or(|s| m.len() == s)
                            && crc_of_file(&path).is_ok_and(|c| c == crc) =>
                    {
                        Check::Good
                    }
                    _ => Check::Differs,
                })
                .await;
                // A check the runtime cancelled (the daemon is shutting down) keeps nothing and
                // says nothing: the copy was not found wanting, only not checked.
                let ok = matches!(checked, Ok(Check::Good));
                match checked {
                    // A batch is journaled before its renames: a crash between them leaves
                    // journaled copies that never reached the slot.
                    Ok(Check::Missing) => {
                        tracing::debug!(
                            sample = id,
                            "a journaled copy never reached the slot; fetching it"
                        )
                    }
                    Ok(Check::Differs) => {
                        tracing::warn!(
                            sample = id,
                            "a journaled copy differs from what was staged; fetching it again"
                        )
                    }
                    _ => {}
                }
                (id, ok)
            }
        });
        futures::stream::iter(checks)
            .buffer_unordered(8)
            .filter_map(|(id, ok)| async move { ok.then_some(id) })
            .collect()
            .await
    }

    /// Checks that sample `id` can have a copy in the slot at `dir` (its path fits the cache's
    /// file system) and makes its directory there; returns its relative path, the copy's path
    /// in the slot and what the tier is asked for.
    pub(super) fn prepare_one(
        &self,
        dir: &Path,
        id: u32,
        made_dirs: &Mutex<HashSet<String>>,
    ) -> Result<(String, PathBuf, SampleRef), Miss> {
        let (rel_dir, _) = self.catalog.dir_and_name(id);
        let rel = self.catalog.path(id);
        let dst = dir.join(self.staged_path(id));
        // A path the cache's file system cannot hold is this sample's problem, not the slot's:
        // found before fetching anything.
        if dst.as_os_str().len() >= PATH_MAX || rel.split('/').any(|c| c.len() > NAME_MAX) {
            return Err(Miss::Sample(format!(
                "`{rel}`: its path in the cache ({} bytes) is too long for the file system",
                dst.as_os_str().len()
            )));
        }
        if !rel_dir.is_empty() && !made_dirs.lock().unwrap().contains(rel_dir) {
            let d = dir.join(rel_dir);
            match create_private_dir(&d) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENAMETOOLONG) => {
                    return Err(Miss::Sample(format!(
                        "`{rel}`: creating {}: {e}",
                        d.display()
                    )))
                }
                Err(e) => return Err(Miss::Slot(cache_err(&d)(e))),
            }
            made_dirs.lock().unwrap().insert(rel_dir.to_string());
        }
        let sample = SampleRef {
            path: rel.clone(),
            size: self.catalog.size(id),
            version: self.catalog.version(id).to_string(),
            durable: self.cfg.fsync,
        };
        Ok((rel, dst, sample))
    }

    /// Where an attempt at sample `id`'s copy is written: a fresh name in `TMP/`, or the copy's
    /// own path in the slot.
    pub(super) fn landing_path(
        &self,
        slot_name: &str,
        id: u32,
        dst: &Path,
        landing: Landing,
    ) -> PathBuf {
        match landing {
            Landing::Tmp => {
                let seq = self.attempt_seq.fetch_add(1, Ordering::Relaxed);
                self.tmp_dir.join(format!("{slot_name}-{id}.{seq}"))
            }
            Landing::InPlace => dst.to_path_buf(),
        }
    }

    /// Counts a copy of `size` bytes fetched, `read` of them from the tier (the rest were a
    /// continued partial's).
    pub(super) fn count_fetched(&self, progress: &Progress, size: u64, read: u64) {
        self.tier_bytes.fetch_add(read, Ordering::Relaxed);
        progress.bytes_fetched.fetch_add(read, Ordering::Relaxed);
        progress.bytes_settled.fetch_add(size, Ordering::Relaxed);
    }

    /// Makes a complete copy of `size` source bytes at `tmp` what the slot keeps: transformed
    /// (when a transform is set) and read-only, with its CRC-32. Returns its path, bytes and
    /// CRC.
    async fn finish_copy(
        &self,
        file: Arc<std::fs::File>,
        tmp: PathBuf,
        rel: &str,
        size: u64,
    ) -> Result<(PathBuf, u64, u32), Miss> {
        Ok(match &self.transform {
            Some(t) => {
                drop(file);
                let (tmp, bytes) = self.transform_one(t, rel, tmp).await?;
                std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o400))
                    .map_err(|e| Miss::Slot(cache_err(&tmp)(e)))?;
                let t2 = tmp.clone();
                let crc = tokio::task::spawn_blocking(move || crc_of_file(&t2))
                    .await
                    .expect("checksum task panicked")
                    .map_err(|e| Miss::Slot(cache_err(&tmp)(e)))?;
                (tmp, bytes, crc)
            }
            None => {
                // Through the descriptor written: no second open, no path lookup.
                file.set_permissions(std::fs::Permissions::from_mode(0o400))
                    .map_err(|e| Miss::Slot(cache_err(&tmp)(e)))?;
                let crc = if size <= metfs_tier::SMALL_FILE_BYTES {
                    // A small copy's few pages, just written and read from memory:
                    // cheaper here than handed to a blocking thread and back.
                    crc_of_copy(&file, size)
                } else {
                    let f = file.clone();
                    tokio::task::spawn_blocking(move || crc_of_copy(&f, size))
                        .await
                        .expect("checksum task panicked")
                }
                .map_err(|e| Miss::Slot(cache_err(&tmp)(e)))?;
                drop(file);
                (tmp, size, crc)
            }
        })
    }

    /// Stages sample `id` alone: fetched (a large one's partial copy continued where an earlier
    /// attempt left one, `partial`), checked and finished, its tier errors retried with backoff.
    pub(super) async fn stage_one(
        &self,
        slot_name: &str,
        dir: &Path,
        id: u32,
        made_dirs: &Mutex<HashSet<String>>,
        progress: &Progress,
        landing: Landing,
    ) -> Result<Fetched, Miss> {
        let (rel, dst, sample) = self.prepare_one(dir, id, made_dirs)?;
        let resumable = self.resumable(&sample);
        // Made at the first transient failure: `retry_secs` counts from there.
        let mut backoff: Option<Backoff> = None;
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let Attempt {
                path: tmp,
                file,
                from,
                mut mark,
            } = self.open_attempt(slot_name, id, &dst, &sample, landing)?;
            let file = Arc::new(file);
            let written = Arc::new(Written::new(from));
            // A fetch dropped before it returns (its slot failed) takes its partial copy with
            // it, wherever it was written.
            let mut unfinished = Unfinished(Some(tmp.clone()), resumable);
            let res = self
                .fetch_watched(&sample, file.clone(), from, &written, mark.as_mut())
                .await;
            let e = match res {
                Ok((start, n)) if start + n == sample.size => {
                    let len = file.metadata().map(|m| m.len()).unwrap_or(u64::MAX);
                    if len != sample.size {
                        // The copy goes with `unfinished`.
                        return Err(Miss::Sample(format!(
                            "`{rel}`: staged copy is {len} bytes, expected {}",
                            sample.size
                        )));
                    }
                    if resumable {
                        // Complete: never continued again (see `partial`).
                        let _ = std::fs::remove_file(super::partial::sidecar_of(&tmp));
                    }
                    let (tmp, bytes, crc) = self.finish_copy(file, tmp, &rel, sample.size).await?;
                    self.count_fetched(progress, sample.size, n);
                    unfinished.finished();
                    return Ok(Fetched {
                        id,
                        tmp: (landing == Landing::Tmp || resumable).then_some(tmp),
                        dst,
                        bytes,
                        read: n,
                        crc,
                    });
                }
                Ok((start, n)) => TierError::Changed {
                    url: self.tier.url().to_string(),
                    path: rel.clone(),
                    expected: format!("{} bytes", sample.size),
                    found: format!("{} bytes", start + n),
                },
                Err(e) => e,
            };
            drop(file);
            if resumable && keeps_partial(&e) {
                if let Some(m) = mark.as_mut() {
                    m.record(&written);
                }
                unfinished.finished();
            } else {
                drop(unfinished);
            }
            let delay =
                self.retry_or_miss(e, &rel, &tmp, slot_name, attempt, &mut backoff, progress)?;
            tokio::time::sleep(delay).await;
        }
    }

    /// What a failed fetch of `rel` leads to: the wait before its next attempt, or why the
    /// sample (or its whole slot) is given up. `backoff` is made at the first transient
    /// failure, so `retry_secs` counts from there.
    #[allow(clippy::too_many_arguments)]
    fn retry_or_miss(
        &self,
        e: TierError,
        rel: &str,
        tmp: &Path,
        slot_name: &str,
        attempt: u32,
        backoff: &mut Option<Backoff>,
        progress: &Progress,
    ) -> Result<Duration, Miss> {
        match e {
            TierError::Local { source, .. } => {
                // The cache's problem (full, over quota, failing): the node's condition.
                Err(Miss::Slot(cache_err(tmp)(source)))
            }
            // A fetch that hung is not retried here: on a POSIX source its thread may stay
            // stuck in the kernel, and retrying at once would pile up stuck threads. The
            // slot fails, and the daemon's growing pause spaces the next attempts.
            TierError::Auth { .. } | TierError::Timeout { .. } => {
                Err(Miss::Slot(StageError::Tier {
                    slot: slot_name.to_string(),
                    source: e,
                }))
            }
            e if is_samples_own(&e) => {
                tracing::warn!(sample = %rel, error = %e, "sample left out of the slot");
                Err(Miss::Sample(e.to_string()))
            }
            e => {
                let backoff = backoff.get_or_insert_with(|| self.tier_backoff());
                let Some(delay) = backoff.next_wait() else {
                    if self.is_deferring(slot_name) {
                        tracing::warn!(sample = %rel, error = %e, attempt, "the tier kept failing; the sample is deferred to a later mini-epoch");
                        return Err(Miss::Deferred(e.to_string()));
                    }
                    tracing::warn!(sample = %rel, error = %e, attempt, "the tier kept failing; the slot fails and is staged again later");
                    return Err(Miss::Slot(StageError::Tier {
                        slot: slot_name.to_string(),
                        source: e,
                    }));
                };
                progress.retries.fetch_add(1, Ordering::Relaxed);
                *progress.last_retry_error.lock().unwrap() = Some(e.to_string());
                if self.transient.fetch_add(1, Ordering::Relaxed) == 0 {
                    tracing::warn!(sample = %rel, error = %e, "transient tier error; retrying with backoff (further ones are logged at debug level)");
                } else {
                    tracing::debug!(sample = %rel, error = %e, attempt, "retrying fetch");
                }
                Ok(delay)
            }
        }
    }
}

impl Stager {
    /// Runs the transform on the fetched copy `tmp` of sample `rel`: returns the file holding
    /// the output (in `tmp/`, the fetched copy removed) and its size, or leaves the sample
    /// out with the transform's reason.
    async fn transform_one(
        &self,
        t: &Transformer,
        rel: &str,
        tmp: PathBuf,
    ) -> Result<(PathBuf, u64), Miss> {
        let data = tokio::fs::read(&tmp)
            .await
            .map_err(|e| Miss::Slot(cache_err(&tmp)(e)))?;
        let _ = std::fs::remove_file(&tmp);
        let out = match t.apply(rel, &data).await {
            Ok(out) => out,
            Err(e) => {
                tracing::warn!(sample = %rel, error = %e, "the transform failed; sample left out of the slot");
                return Err(Miss::Sample(format!("`{rel}`: transform: {e}")));
            }
        };
        drop(data);
        let mut name = tmp.into_os_string();
        name.push(".t");
        let path = PathBuf::from(name);
        let write = {
            let (path, out) = (path.clone(), out);
            tokio::task::spawn_blocking(move || {
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&path)?;
                f.write_all(&out)?;
                Ok::<u64, std::io::Error>(out.len() as u64)
            })
        };
        match write.await.expect("write task panicked") {
            Ok(n) => Ok((path, n)),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                Err(Miss::Slot(cache_err(&path)(e)))
            }
        }
    }
}

/// A copy being written, deleted if its fetch ends without handing it over (an error, or the
/// fetch's future dropped), with its sidecar when it is a partial copy (`partial`).
struct Unfinished(Option<PathBuf>, bool);

impl Unfinished {
    fn finished(&mut self) {
        self.0 = None;
    }
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            if self.1 {
                remove_partial(&p);
            } else {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

/// What [`Stager::verify_journaled`] found of one journaled copy.
enum Check {
    /// Present, of the catalogued size, with the journaled CRC.
    Good,
    /// Not in the slot: its batch was journaled, then a crash came before its rename.
    Missing,
    /// Present but not what was staged (or unreadable).
    Differs,
}
