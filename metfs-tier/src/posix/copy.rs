//! Copying one sample out of a POSIX source: opened without leaving the root, its type,
//! size and version checked before and after, copied paced by `copy_file_range` (a large
//! file) or through a buffer (a small one, hashed as it passes), its writeback started as it
//! goes. A copy is written in order from its first byte (or from where an interrupted one
//! stopped, `CapacityTier::fetch_from`), so a copy cut short holds a prefix of the sample.

use crate::error::local;
use crate::pacer::Pacer;
use crate::{
    start_writeback, Copied, GroupMember, SampleRef, TierError, Written, SMALL_FILE_BYTES,
};

use super::{posix_version, PosixTier};

thread_local! {
    /// The buffer a blocking thread copies small files through, made once per thread.
    static SMALL_BUF: std::cell::RefCell<Vec<u8>> =
        std::cell::RefCell::new(vec![0; SMALL_FILE_BYTES as usize]);
}

impl PosixTier {
    /// One member of a group: its file made, the sample copied and hashed, the copy finished
    /// and closed.
    pub(super) fn fetch_member(&self, m: GroupMember, pacer: &Pacer) -> Result<Copied, TierError> {
        let path = &m.sample.path;
        let dest = (m.open)().map_err(|e| local(path, e))?;
        let mut crc = None;
        // `fetch_blocking` returns only a complete copy of the catalogued size (a short one is
        // `TierError::Changed`), so what reaches `finish` is complete, as the trait asks.
        let bytes = self.fetch_blocking(&m.sample, &dest, 0, pacer, Some(&mut crc), None)?;
        (m.finish)(&dest).map_err(|e| local(path, e))?;
        Ok(Copied {
            bytes,
            crc: crc.map(|h| h.finalize()),
        })
    }

    /// Copies bytes `from..` of `sample` into `dest` at their own offsets, in order; returns how
    /// many (`size - from`). With `crc`, the bytes are hashed as they are written, which only a
    /// whole copy through a buffer can do: `crc` is then `Some` on return, and `None` when the
    /// copy took `copy_file_range` (a large file) or began past byte 0.
    pub(super) fn fetch_blocking(
        &self,
        sample: &SampleRef,
        dest: &std::fs::File,
        from: u64,
        pacer: &Pacer,
        mut crc: Option<&mut Option<crc32fast::Hasher>>,
        written: Option<&Written>,
    ) -> Result<u64, TierError> {
        let src = self.open_regular(sample)?;
        let from = from.min(sample.size);
        let mut at = Cursor {
            off_in: from as i64,
            off_out: from as i64,
            hasher: crc
                .as_ref()
                .filter(|_| from == 0)
                .map(|_| crc32fast::Hasher::new()),
            buf: Vec::new(),
            written,
        };
        self.copy_paced(sample, &src, dest, pacer, &mut at)?;
        self.check_unchanged(
            sample,
            &src.metadata().map_err(|e| self.io_err(&sample.path, e))?,
        )?;
        if at.off_out as u64 != sample.size {
            return Err(TierError::Changed {
                url: self.url.clone(),
                path: sample.path.clone(),
                expected: format!("{} bytes", sample.size),
                found: format!("{} bytes read", at.off_out),
            });
        }
        if let Some(out) = crc.as_mut() {
            **out = at.hasher;
        }
        Ok(at.off_out as u64 - from)
    }

    /// Opens `sample`, refusing anything but a regular file of its catalogued size and
    /// version.
    fn open_regular(&self, sample: &SampleRef) -> Result<std::fs::File, TierError> {
        use std::os::unix::fs::FileTypeExt;
        // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever. It
        // changes nothing for the regular files that pass the type check below.
        let src = self.open_source(&sample.path)?;
        let first_md = src.metadata().map_err(|e| self.io_err(&sample.path, e))?;
        let ft = first_md.file_type();
        if !ft.is_file() {
            let kind = if ft.is_fifo() {
                "a FIFO"
            } else if ft.is_socket() {
                "a socket"
            } else if ft.is_char_device() || ft.is_block_device() {
                "a device"
            } else if ft.is_dir() {
                "a directory"
            } else {
                "not a file"
            };
            return Err(TierError::NotRegular {
                url: self.url.clone(),
                path: sample.path.clone(),
                kind: kind.into(),
            });
        }
        self.check_unchanged(sample, &first_md)?;
        Ok(src)
    }

    /// Fails with [`TierError::Changed`] when `md` is not of `sample`'s size and version.
    fn check_unchanged(&self, sample: &SampleRef, md: &std::fs::Metadata) -> Result<(), TierError> {
        let found_v = posix_version(md);
        if md.len() != sample.size || (!sample.version.is_empty() && found_v != sample.version) {
            return Err(TierError::Changed {
                url: self.url.clone(),
                path: sample.path.clone(),
                expected: format!("{} bytes, mtime {}", sample.size, sample.version),
                found: format!("{} bytes, mtime {}", md.len(), found_v),
            });
        }
        Ok(())
    }

    /// Copies `src` into `dest` a paced chunk at a time until the catalogued size is copied or
    /// the source ends, by `copy_file_range` where the file systems allow it (a large file)
    /// and through a buffer otherwise.
    fn copy_paced(
        &self,
        sample: &SampleRef,
        src: &std::fs::File,
        dest: &std::fs::File,
        pacer: &Pacer,
        at: &mut Cursor,
    ) -> Result<(), TierError> {
        let chunk = pacer.chunk_bytes();
        // A small file is read and written through a buffer: `copy_file_range` sets up an
        // in-kernel splice per call, which costs more than copying a few pages.
        let small = sample.size <= SMALL_FILE_BYTES;
        let mut use_cfr = !small;
        while (at.off_out as u64) < sample.size {
            let want = (sample.size - at.off_out as u64).min(chunk);
            pacer.consume_blocking(want);
            let n = if use_cfr {
                match copy_range(src, dest, at, want) {
                    Ok(n) => {
                        // The bytes never pass through here: the caller reads the copy for
                        // its CRC.
                        at.hasher = None;
                        n
                    }
                    Err(e)
                        if matches!(
                            e.raw_os_error(),
                            Some(libc::EXDEV)
                                | Some(libc::ENOSYS)
                                | Some(libc::EINVAL)
                                | Some(libc::EOPNOTSUPP)
                        ) =>
                    {
                        use_cfr = false;
                        continue;
                    }
                    Err(e) => return Err(local(&sample.path, e)),
                }
            } else {
                self.copy_buffered(sample, src, dest, at, want)?
            };
            if n == 0 {
                break; // source shrank; the caller's check reports it
            }
            if let Some(w) = at.written {
                w.raise(at.off_out as u64);
            }
            // A small file's few pages are left to the batch's `syncfs`, which writes many
            // of them out together; one writeback request per file costs a system call and
            // an I/O of its own.
            if sample.durable && !small {
                start_writeback(dest, at.off_out as u64 - n, n);
            }
        }
        Ok(())
    }

    /// Copies up to `want` bytes at `at` through a buffer, hashing them; returns how many.
    fn copy_buffered(
        &self,
        sample: &SampleRef,
        src: &std::fs::File,
        dest: &std::fs::File,
        at: &mut Cursor,
        want: u64,
    ) -> Result<u64, TierError> {
        use std::os::unix::fs::FileExt;
        let Cursor {
            off_in,
            off_out,
            hasher,
            buf,
            ..
        } = at;
        let mut copy = |buf: &mut [u8]| -> Result<u64, TierError> {
            let r = src
                .read_at(buf, *off_in as u64)
                .map_err(|e| self.io_err(&sample.path, e))?;
            dest.write_all_at(&buf[..r], *off_out as u64)
                .map_err(|e| local(&sample.path, e))?;
            if let Some(h) = hasher.as_mut() {
                h.update(&buf[..r]);
            }
            *off_in += r as i64;
            *off_out += r as i64;
            Ok(r as u64)
        };
        if want <= SMALL_FILE_BYTES {
            // The thread's own buffer: a new one per small file cost a page fault and
            // the zeroing of fresh pages per file, 7% of the daemon's CPU while it
            // staged 500,000 files of 1-4 KiB (the allocator hands the top of a
            // thread's heap back to the kernel between files).
            SMALL_BUF.with(|b| copy(&mut b.borrow_mut()[..want as usize]))
        } else {
            buf.resize(want.min(1 << 20) as usize, 0);
            copy(buf)
        }
    }
}

/// Where a copy stands: the offsets in the source and in the copy, the CRC-32 of what passed
/// through a buffer (`None` when not asked for, or once a chunk took `copy_file_range`), and
/// the buffer of chunks too large for the thread's own.
struct Cursor<'w> {
    off_in: i64,
    off_out: i64,
    hasher: Option<crc32fast::Hasher>,
    buf: Vec<u8>,
    /// Raised as the copy's (in-order) prefix grows, where the caller asked.
    written: Option<&'w Written>,
}

/// One `copy_file_range` of up to `want` bytes at `at`'s offsets, which it advances.
fn copy_range(
    src: &std::fs::File,
    dest: &std::fs::File,
    at: &mut Cursor,
    want: u64,
) -> std::io::Result<u64> {
    use std::os::fd::AsRawFd;
    // SAFETY: both fds are open for the duration of the call; offsets are ours.
    let r = unsafe {
        libc::copy_file_range(
            src.as_raw_fd(),
            &mut at.off_in,
            dest.as_raw_fd(),
            &mut at.off_out,
            want as usize,
            0,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(r as u64)
}
