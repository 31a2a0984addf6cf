//! Staging a slot in HDF5 container mode: the mini-epoch's rows of each container, journaled
//! per container file.

use super::{
    cache_err, crc_of_file, create_private_dir, JournalBatch, Progress, SlotSpec, StageError,
    StageReport, Stager,
};
use metfs_tier::TierError;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

impl Stager {
    /// Stages a container-mode slot: for each container file with rows in `slot`, one HDF5 file
    /// with just those rows, written to a temporary file, fsynced and renamed into the slot under
    /// the container's relative path. The journal records `file <index> <size> <crc32>` per
    /// staged container; a resumed run keeps files whose size and CRC match. Containers are
    /// staged one at a time (each is already a streaming, chunk-parallel copy) so that memory
    /// stays bounded. Faults are sorted as for files (see the module docs).
    pub async fn stage_containers(
        &self,
        slot: &SlotSpec,
        containers: Arc<crate::hdf5::Containers>,
        progress: Arc<Progress>,
    ) -> Result<StageReport, StageError> {
        let start = Instant::now();
        let (dir, slot_journal) = self.prepare_slot(slot)?;
        let jpath = slot_journal.path().to_path_buf();
        self.clean_tmp_matching(&format!("{}-", slot.name), &|_| false)?;
        // Container index -> (size, CRC-32) of its staged file. Entries without a CRC (older
        // journals) cannot be checked and are staged again.
        let done = slot_journal.read().files;
        // Every container appears in every view (with zero rows if the mini-epoch has none of
        // its rows), so that user code opening a container by name always finds it.
        let mut rows_of: Vec<Vec<u64>> = vec![Vec::new(); containers.files().len()];
        for (fi, rows) in containers.rows_by_file(&slot.samples) {
            rows_of[fi] = rows;
        }
        let by_file: Vec<(usize, Vec<u64>)> = rows_of.into_iter().enumerate().collect();
        let total: u64 = slot.samples.iter().map(|&s| self.catalog.size(s)).sum();
        progress.start(by_file.len() as u64, total);
        let mut journal = slot_journal.append().map_err(cache_err(&jpath))?;
        let mut report = StageReport::default();
        for (fi, rows) in by_file {
            let rel = containers.files()[fi].path.clone();
            let dst = dir.join(&rel);
            let planned: u64 = rows.len() as u64 * containers.sample_size(fi);
            let kept = match done.get(&fi).copied() {
                Some((n, crc)) => {
                    let d2 = dst.clone();
                    tokio::task::spawn_blocking(move || {
                        std::fs::metadata(&d2).is_ok_and(|m| m.len() == n)
                            && crc_of_file(&d2).is_ok_and(|c| c == crc)
                    })
                    .await
                    .unwrap_or(false)
                }
                None => false,
            };
            if kept {
                report.resumed += 1;
            } else {
                if let Some(p) = dst.parent() {
                    create_private_dir(p).map_err(cache_err(p))?;
                }
                match self.stage_container(slot, &containers, fi, rows).await? {
                    Ok((tmp, n, crc)) => {
                        // Journaled before the rename, as a batch of plain copies is (see the
                        // journal's module doc): a kill between the two leaves a journaled
                        // container that resume finds missing and stages again, never a
                        // staged one that no entry vouches for (a refetch of the whole file).
                        let mut entry = JournalBatch::default();
                        entry.file(fi, n, crc);
                        journal.write(&entry).map_err(cache_err(&jpath))?;
                        std::fs::rename(&tmp, &dst).map_err(cache_err(&dst))?;
                        self.tier_bytes.fetch_add(planned, Ordering::Relaxed);
                        progress.bytes_fetched.fetch_add(planned, Ordering::Relaxed);
                        report.fetched += 1;
                        report.bytes_fetched += planned;
                    }
                    Err(msg) => {
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
        journal.complete().map_err(cache_err(&jpath))?;
        report.elapsed = start.elapsed();
        Ok(report)
    }
}

impl Stager {
    /// Writes container `fi`'s rows of `slot` into a temporary file, made durable and read-only;
    /// returns it with its size and CRC-32, or the container's own problem (it changed, it
    /// cannot be staged) as `Ok(Err(reason))`. A full cache fails the slot at once; other
    /// I/O and library errors (an outage of the source, a hung or failing file system) are
    /// retried like a file's transient errors, then fail the slot.
    pub(super) async fn stage_container(
        &self,
        slot: &SlotSpec,
        containers: &Arc<crate::hdf5::Containers>,
        fi: usize,
        rows: Vec<u64>,
    ) -> Result<Result<(PathBuf, u64, u32), String>, StageError> {
        use crate::hdf5::Hdf5Error;
        // Unlike a file's, `retry_secs` counts from the container's first attempt.
        let mut backoff = self.tier_backoff();
        loop {
            let seq = self.attempt_seq.fetch_add(1, Ordering::Relaxed);
            let tmp = self.tmp_dir.join(format!("{}-c{fi}.{seq}", slot.name));
            let (c, pacer, fsync, t2, rows2) = (
                containers.clone(),
                self.pacer.clone(),
                self.cfg.fsync,
                tmp.clone(),
                rows.clone(),
            );
            let r = tokio::task::spawn_blocking(move || {
                let n = crate::hdf5::stage_rows(&c, fi, &rows2, &t2, &pacer)?;
                let io = |source| Hdf5Error::Io {
                    file: t2.display().to_string(),
                    source,
                };
                std::fs::set_permissions(&t2, std::fs::Permissions::from_mode(0o400))
                    .map_err(io)?;
                if fsync {
                    std::fs::File::open(&t2)
                        .and_then(|f| f.sync_all())
                        .map_err(io)?;
                }
                let crc = crc_of_file(&t2).map_err(io)?;
                Ok::<_, Hdf5Error>((n, crc))
            })
            .await
            .expect("container staging task panicked");
            let e = match r {
                Ok((n, crc)) => return Ok(Ok((tmp, n, crc))),
                Err(e) => e,
            };
            let _ = std::fs::remove_file(&tmp);
            let text = e.to_string();
            let out_of_space = match &e {
                Hdf5Error::Io { source, .. } => {
                    matches!(
                        source.raw_os_error(),
                        Some(libc::ENOSPC) | Some(libc::EDQUOT)
                    )
                }
                // The library reports a failed write in its own words.
                _ => text.contains("No space left on device") || text.contains("Disk quota"),
            };
            if out_of_space {
                return Err(StageError::Cache {
                    path: tmp.display().to_string(),
                    source: std::io::Error::from_raw_os_error(libc::ENOSPC),
                });
            }
            if !matches!(e, Hdf5Error::Io { .. } | Hdf5Error::Library { .. }) {
                return Ok(Err(text));
            }
            let Some(delay) = backoff.next_wait() else {
                return Err(StageError::Tier {
                    slot: slot.name.clone(),
                    source: TierError::Unreachable {
                        url: self.tier.url().to_string(),
                        reason: text,
                    },
                });
            };
            tracing::warn!(error = %text, "staging a container failed; retrying with backoff");
            tokio::time::sleep(delay).await;
        }
    }
}
