//! The committer of a staging: fetched files made durable a batch at a time with one `syncfs`,
//! journaled, then renamed into the slot, on a blocking thread of its own while fetching goes
//! on (see `stage.rs`). A journaled copy is always complete and on disk.

use std::path::Path;
use std::sync::atomic::Ordering;

use super::journal::{JournalBatch, JournalWriter};
use super::{cache_err, Fetched, Progress, StageError};

/// What `commit_batches` returns: files committed and the bytes of them read from the tier, the journal, and samples whose
/// slot path the cache's file system refused as too long.
pub(super) type Committed = (u64, u64, JournalWriter, Vec<(u32, String)>);

/// Commits batches of fetched files until the channel closes: makes each durable (one `syncfs`
/// of the cache file system, or nothing with `fsync = false`), renames its files into the slot
/// and journals them. Blocking.
pub(super) fn commit_batches(
    mut rx: tokio::sync::mpsc::Receiver<Vec<Fetched>>,
    mut journal: JournalWriter,
    jpath: &Path,
    tmp_dir: &Path,
    fsync: bool,
    progress: &Progress,
) -> Result<Committed, StageError> {
    let (mut files, mut bytes) = (0u64, 0u64);
    let mut too_long = Vec::new();
    let dir = std::fs::File::open(tmp_dir).map_err(cache_err(tmp_dir))?;
    while let Some(batch) = rx.blocking_recv() {
        if fsync {
            use std::os::fd::AsRawFd;
            // SAFETY: syncfs on a directory fd we own.
            if unsafe { libc::syncfs(dir.as_raw_fd()) } != 0 {
                return Err(cache_err(tmp_dir)(std::io::Error::last_os_error()));
            }
        }
        // The batch is journaled once durable and before its renames, so that every copy in
        // the slot is journaled: a crash in the middle of the renames keeps those done (resume
        // checks each journaled copy), and what it left in tmp/ is journaled but missing, so
        // fetched again. The other order lost a whole renamed batch to such a crash.
        let mut lines = JournalBatch::with_capacity(batch.len());
        for f in &batch {
            lines.staged(f.id, f.crc);
        }
        journal.write(&lines).map_err(cache_err(jpath))?;
        for f in batch {
            // A copy written in place is where it belongs already.
            match f.tmp.as_ref().map(|tmp| std::fs::rename(tmp, &f.dst)) {
                None | Some(Ok(())) => {}
                Some(Err(e)) if e.raw_os_error() == Some(libc::ENAMETOOLONG) => {
                    // Journaled above; its `failed` line at the end of the slot withdraws it.
                    if let Some(tmp) = &f.tmp {
                        let _ = std::fs::remove_file(tmp);
                    }
                    too_long.push((f.id, format!("{}: {e}", f.dst.display())));
                    continue;
                }
                Some(Err(e)) => return Err(cache_err(&f.dst)(e)),
            }
            progress.files_done.fetch_add(1, Ordering::Relaxed);
            progress.bytes_done.fetch_add(f.bytes, Ordering::Relaxed);
            files += 1;
            bytes += f.read;
        }
    }
    Ok((files, bytes, journal, too_long))
}
