//! Fetching: one GET or parallel ranged GETs per object, each pinned to the catalogued ETag
//! with `If-Match`, paced before it is sent, and streamed into the destination at its offset
//! with vectored writes of at most [`WRITE_BATCH`] bytes, so no object is held whole in memory.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use object_store::path::Path as ObjPath;
use object_store::{GetOptions, GetRange, GetResult, ObjectStore, ObjectStoreExt};

use crate::pacer::Pacer;
use crate::{SampleRef, TierError, Written};

use super::S3Tier;

/// Largest batch of response bytes written to the destination with one `pwrite`. Big enough to
/// keep system calls and blocking-pool hops rare, small enough that 64 requests in flight hold
/// little memory.
pub const WRITE_BATCH: usize = 512 << 10;

impl S3Tier {
    /// The size of one ranged GET: a part, or the pacer's chunk where that is smaller (so that
    /// a paced fetch asks for no more than it may read at once).
    pub(super) fn piece_bytes(&self, pacer: &Pacer) -> u64 {
        self.cfg.part_size.min(pacer.chunk_bytes()).max(1)
    }

    /// Fetches the consecutive pieces `ranges` with up to `max_parallel_parts` GETs at once,
    /// each pinned to `etag`. Pieces finish in any order; `written` is raised to the end of
    /// the longest run of finished pieces from the first, so it never counts a hole.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn fetch_pieces(
        &self,
        loc: &ObjPath,
        sample: &SampleRef,
        ranges: impl Iterator<Item = Range<u64>>,
        etag: Option<String>,
        dest: &Arc<std::fs::File>,
        pacer: &Pacer,
        written: Option<&Written>,
    ) -> Result<(), TierError> {
        let mut ranges = ranges.peekable();
        let mut prefix = ranges.peek().map_or(0, |r| r.start);
        // Finished pieces past the prefix: start -> end.
        let mut ahead = std::collections::BTreeMap::new();
        let mut done = futures::stream::iter(ranges)
            .map(|r| {
                let etag = etag.clone();
                async move {
                    self.fetch_piece(loc, sample, Some(r.clone()), etag, dest, pacer)
                        .await
                        .map(|_| r)
                }
            })
            .buffer_unordered(self.cfg.max_parallel_parts);
        while let Some(r) = done.next().await {
            let r = r?;
            ahead.insert(r.start, r.end);
            while let Some(end) = ahead.remove(&prefix) {
                prefix = end;
            }
            if let Some(w) = written {
                w.raise(prefix);
            }
        }
        Ok(())
    }

    /// Fetches one piece (`range`, or the whole object) into `dest`, conditioned on `if_match`.
    /// Returns the ETag the server reported.
    pub(super) async fn fetch_piece(
        &self,
        loc: &ObjPath,
        sample: &SampleRef,
        range: Option<Range<u64>>,
        if_match: Option<String>,
        dest: &Arc<std::fs::File>,
        pacer: &Pacer,
    ) -> Result<Option<String>, TierError> {
        let want = range.clone().unwrap_or(0..sample.size);
        if want.end > want.start {
            pacer.consume(want.end - want.start).await;
        }
        let _permit = self
            .requests
            .acquire()
            .await
            .expect("the request semaphore is never closed");
        let opts = GetOptions {
            if_match: if_match.clone(),
            range: range.clone().map(GetRange::Bounded),
            ..Default::default()
        };
        let res = match self.store.get_opts(loc, opts).await {
            Ok(r) => r,
            Err(object_store::Error::Precondition { .. }) => {
                return Err(self.changed_error(loc, sample).await)
            }
            Err(e) => return Err(self.store_error(Some(&sample.path), e)),
        };
        let found_etag = res.meta.e_tag.clone();
        let changed = |found: String| self.piece_changed(sample, if_match.as_deref(), found);
        if res.meta.size != sample.size {
            return Err(changed(format!(
                "{} bytes, ETag {}",
                res.meta.size,
                found_etag.as_deref().unwrap_or("(none)")
            )));
        }
        if let Some(expected) = &if_match {
            // The server should have refused with 412; some S3-compatible stores ignore
            // If-Match, so check the ETag they report too.
            if found_etag.as_deref() != Some(expected.as_str()) {
                return Err(changed(format!(
                    "ETag {}",
                    found_etag.as_deref().unwrap_or("(none)")
                )));
            }
        }
        if res.range != want {
            return Err(TierError::Io {
                url: self.url.clone(),
                path: sample.path.clone(),
                source: std::io::Error::other(format!(
                    "asked for bytes {want:?}, the server sent {:?}",
                    res.range
                )),
            });
        }
        self.write_body(res, want, dest, sample, if_match.as_deref())
            .await?;
        Ok(found_etag)
    }

    /// [`TierError::Changed`] for a piece of `sample` asked for with `if_match`.
    fn piece_changed(
        &self,
        sample: &SampleRef,
        if_match: Option<&str>,
        found: String,
    ) -> TierError {
        TierError::Changed {
            url: self.url.clone(),
            path: sample.path.clone(),
            expected: format!(
                "{} bytes, ETag {}",
                sample.size,
                if_match.unwrap_or("(any)")
            ),
            found,
        }
    }

    /// Streams the body of `res`, bytes `want` of `sample`, into `dest` at their offsets;
    /// fails when it is longer or shorter than that.
    async fn write_body(
        &self,
        res: GetResult,
        want: Range<u64>,
        dest: &Arc<std::fs::File>,
        sample: &SampleRef,
        if_match: Option<&str>,
    ) -> Result<(), TierError> {
        let mut stream = res.into_stream();
        let mut off = want.start;
        // Frames are kept as they arrive (reference-counted, not copied) and written together
        // with one vectored write once they add up to WRITE_BATCH.
        let mut batch: Vec<Bytes> = Vec::new();
        let mut batch_len = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| self.store_error(Some(&sample.path), e))?;
            if off + batch_len + chunk.len() as u64 > want.end {
                return Err(self.piece_changed(
                    sample,
                    if_match,
                    format!("more than {} bytes", want.end),
                ));
            }
            batch_len += chunk.len() as u64;
            batch.push(chunk);
            if batch_len >= WRITE_BATCH as u64 || batch.len() >= MAX_IOVECS {
                off = write_at(dest, std::mem::take(&mut batch), off, sample).await?;
                batch_len = 0;
            }
        }
        if !batch.is_empty() {
            off = write_at(dest, batch, off, sample).await?;
        }
        if off != want.end {
            return Err(TierError::Io {
                url: self.url.clone(),
                path: sample.path.clone(),
                source: std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "the response for bytes {want:?} ended after {} bytes",
                        off - want.start
                    ),
                ),
            });
        }
        Ok(())
    }

    /// The error for a failed `If-Match`: what the object is now, or that it is gone.
    pub(super) async fn changed_error(&self, loc: &ObjPath, sample: &SampleRef) -> TierError {
        let expected = format!("{} bytes, ETag {}", sample.size, sample.version);
        match self.store.head(loc).await {
            Ok(meta) => TierError::Changed {
                url: self.url.clone(),
                path: sample.path.clone(),
                expected,
                found: format!(
                    "{} bytes, ETag {}",
                    meta.size,
                    meta.e_tag.as_deref().unwrap_or("(none)")
                ),
            },
            Err(object_store::Error::NotFound { .. }) => TierError::NotFound {
                url: self.url.clone(),
                path: sample.path.clone(),
            },
            Err(_) => TierError::Changed {
                url: self.url.clone(),
                path: sample.path.clone(),
                expected,
                found: "a different ETag".into(),
            },
        }
    }
}

/// Most buffers in one vectored write (well under the kernel's IOV_MAX of 1024).
pub(super) const MAX_IOVECS: usize = 256;

/// Writes `bufs` back to back at `off` on a blocking thread, with as few `pwritev` calls as the
/// kernel allows (and starts their writeback when the copy is to be durable); returns the
/// offset after them.
pub(super) async fn write_at(
    dest: &Arc<std::fs::File>,
    bufs: Vec<Bytes>,
    off: u64,
    sample: &SampleRef,
) -> Result<u64, TierError> {
    let file = dest.clone();
    let len: u64 = bufs.iter().map(|b| b.len() as u64).sum();
    let durable = sample.durable;
    tokio::task::spawn_blocking(move || {
        pwritev_all(&file, &bufs, off)?;
        if durable {
            crate::start_writeback(&file, off, len);
        }
        Ok::<(), std::io::Error>(())
    })
    .await
    .expect("write task panicked")
    .map_err(|source| TierError::Local {
        path: sample.path.clone(),
        source,
    })?;
    Ok(off + len)
}

/// Writes every byte of `bufs`, in order, at `off`.
pub(super) fn pwritev_all(
    file: &std::fs::File,
    bufs: &[Bytes],
    mut off: u64,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // (buffer index, bytes of it already written)
    let (mut i, mut done) = (0usize, 0usize);
    loop {
        // Written and empty buffers need no write; a write of nothing would read as a failure.
        while i < bufs.len() && bufs[i].len() == done {
            i += 1;
            done = 0;
        }
        if i == bufs.len() {
            return Ok(());
        }
        let iov: Vec<libc::iovec> = bufs[i..]
            .iter()
            .take(MAX_IOVECS)
            .enumerate()
            .map(|(k, b)| {
                let skip = if k == 0 { done } else { 0 };
                libc::iovec {
                    iov_base: b[skip..].as_ptr() as *mut libc::c_void,
                    iov_len: b.len() - skip,
                }
            })
            .collect();
        // SAFETY: every iovec points into a buffer that `bufs` keeps alive for the call, and
        // the kernel only reads from them.
        let n = unsafe {
            libc::pwritev(
                file.as_raw_fd(),
                iov.as_ptr(),
                iov.len() as libc::c_int,
                off as libc::off_t,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        let mut n = n as usize;
        off += n as u64;
        while n > 0 {
            let left = bufs[i].len() - done;
            if n >= left {
                n -= left;
                i += 1;
                done = 0;
            } else {
                done += n;
                n = 0;
            }
        }
    }
}
