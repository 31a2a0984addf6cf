//! Read replies spliced from the slot file into the FUSE device, without a copy in the daemon.
//!
//! A read the daemon serves (a cache miss on the cached path, every read on the pread path)
//! used to cost a `pread` of the slot file into a buffer, then a `writev` of that buffer to
//! `/dev/fuse`, which copies it into the kernel's reply pages: two copies where a native read
//! makes one. A splice reply hands the slot file's page-cache pages to a pipe by reference
//! (`splice` from the file, which runs the file's readahead as `pread` does) behind the 16-byte
//! reply header, then splices the pipe into the device, which copies each page once into the
//! reply. libfuse answers reads so when a filesystem asks for it; fuser has no such reply, so
//! the adapter writes it on the session's device descriptor itself. Measured as an ordinary
//! user (docs/BENCHMARKS.md): cold reads of 4 MiB files gained in each of seven interleaved
//! runs (medians +0.09 and +0.08 of native, to about 0.86x), small files did not change. The
//! device is not asked to move the pages (`SPLICE_F_MOVE`): taking them out of the slot file's
//! page cache cost small files 6-7% of their cold rate side by side.
//!
//! Invariants:
//! * **One message per pipe.** The header and every data page are in the pipe before the one
//!   splice into the device, which takes a whole message or nothing. So the pipe must hold
//!   one page for the header and one per data page: a request that needs more than the pipe
//!   holds is not spliced (the caller replies from a buffer). The pipe is grown to 2 MiB where
//!   the process may (root), else to the system's `pipe-max-size` (1 MiB by default, which
//!   holds a 1,020 KiB reply); the kernel's read requests are at most 128 KiB on a mount whose
//!   readahead an ordinary user cannot raise, 1 MiB at most anywhere.
//! * **Nothing half sent.** Anything that fails before the device write (the pipe, the file)
//!   leaves the request unanswered and the caller replies the ordinary way. The pipe is then
//!   dropped, since it may hold part of a message, and a new one is made at the next read.
//!   A device write that fails with ENOENT means the request is gone (interrupted): it needs
//!   no reply. Any other device error is reported as not sent, so the caller replies; if the
//!   kernel did take the message, that second reply is refused as unknown, which is harmless,
//!   where a missing reply would hang the reader.
//! * **The reply goes on the descriptor that read the request.** The kernel finds the request
//!   in the queue of the device descriptor written to, so this needs every FUSE thread to
//!   read from the session's one descriptor (no cloned descriptors per thread).
//! * Each FUSE thread has its own pipe (thread-local), so replies never interleave.

use std::cell::RefCell;
use std::fs::File;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// `struct fuse_out_header`: length, error, unique.
const HEADER: usize = 16;

/// The pipe size asked for first: a header page and a 1 MiB reply, rounded up to a power of
/// two pages as the kernel sizes pipes. A user's pipes may take at most `pipe-user-pages-soft`
/// pages in all (64 MiB by default): a few FUSE threads' pipes are a small part of it.
const PIPE_WANTED: usize = 2 << 20;

const PAGE: usize = 4096;

/// Splices read replies into one FUSE session's device.
pub struct Splicer {
    dev: OwnedFd,
}

/// A thread's pipe and how many pages it holds.
struct Pipe {
    r: OwnedFd,
    w: OwnedFd,
    pages: usize,
}

thread_local! {
    static PIPE: RefCell<Option<Pipe>> = const { RefCell::new(None) };
}

impl Pipe {
    fn new() -> std::io::Result<Pipe> {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded, so both descriptors are open and ours alone.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let max = std::fs::read_to_string("/proc/sys/fs/pipe-max-size")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .unwrap_or(1 << 20);
        let mut size = -1;
        for want in [PIPE_WANTED, max.min(PIPE_WANTED)] {
            // SAFETY: fcntl on a descriptor we own; F_SETPIPE_SZ returns the size set.
            size = unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, want as libc::c_int) };
            if size > 0 {
                break;
            }
        }
        if size <= 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Pipe {
            r,
            w,
            pages: size as usize / PAGE,
        })
    }

    /// Puts the header and `len` bytes of `file` at `offset` in the pipe.
    fn fill(&self, header: &[u8], file: &File, offset: u64, len: usize) -> bool {
        // SAFETY: a write of a buffer we own to a descriptor we own.
        let n = unsafe { libc::write(self.w.as_raw_fd(), header.as_ptr().cast(), header.len()) };
        if n != header.len() as isize {
            return false;
        }
        let mut off = offset as libc::loff_t;
        let mut left = len;
        while left > 0 {
            // SAFETY: splice between descriptors we hold; `off` is ours and the kernel
            // advances it. NONBLOCK applies to the pipe only: a full pipe (a miscount) fails
            // with EAGAIN rather than waiting for a reader that is this thread.
            let n = unsafe {
                libc::splice(
                    file.as_raw_fd(),
                    &mut off,
                    self.w.as_raw_fd(),
                    std::ptr::null_mut(),
                    left,
                    libc::SPLICE_F_NONBLOCK,
                )
            };
            match n {
                n if n > 0 => left -= n as usize,
                0 => return false,
                _ => {
                    if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                        return false;
                    }
                }
            }
        }
        true
    }
}

impl Splicer {
    /// A splicer writing to a duplicate of the session's device descriptor `dev`; fails if
    /// this process cannot make a pipe that holds a 128 KiB reply.
    pub fn new(dev: BorrowedFd<'_>) -> std::io::Result<Splicer> {
        if Pipe::new()?.pages < 33 {
            return Err(std::io::Error::other(
                "a pipe holds less than a 128 KiB reply",
            ));
        }
        Ok(Splicer {
            dev: dev.try_clone_to_owned()?,
        })
    }

    /// Answers request `unique` with `len` bytes of `file` at `offset` (`len` > 0, all within
    /// the file). `true` if the request needs no other reply; `false` if nothing was sent and
    /// the caller must reply.
    pub fn reply(&self, unique: u64, file: &File, offset: u64, len: usize) -> bool {
        let total = HEADER + len;
        let mut header = [0u8; HEADER];
        header[..4].copy_from_slice(&(total as u32).to_ne_bytes());
        header[8..].copy_from_slice(&unique.to_ne_bytes());
        PIPE.with(|cell| {
            let mut cell = cell.borrow_mut();
            if cell.is_none() {
                *cell = Pipe::new().ok();
            }
            let Some(pipe) = cell.as_ref() else {
                return false;
            };
            let pages = (offset as usize % PAGE + len).div_ceil(PAGE);
            if pages + 1 > pipe.pages {
                return false;
            }
            if !pipe.fill(&header, file, offset, len) {
                *cell = None;
                return false;
            }
            // SAFETY: splice between descriptors we hold; the device takes the whole message.
            let n = unsafe {
                libc::splice(
                    pipe.r.as_raw_fd(),
                    std::ptr::null_mut(),
                    self.dev.as_raw_fd(),
                    std::ptr::null_mut(),
                    total,
                    0,
                )
            };
            if n == total as isize {
                return true;
            }
            // ENOENT: the request is gone (interrupted) and needs no reply.
            let gone =
                n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOENT);
            *cell = None;
            gone
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pipe_holds_a_reply_of_at_least_1020_kib() {
        assert!(Pipe::new().unwrap().pages >= 256);
    }

    #[test]
    fn fill_puts_header_and_file_bytes_in_order() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("f");
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let f = File::open(&path).unwrap();
        let p = Pipe::new().unwrap();
        let header = [7u8; HEADER];
        assert!(p.fill(&header, &f, 4096 * 3 + 5, 100_000));
        let mut got = vec![0u8; HEADER + 100_000];
        let mut done = 0;
        while done < got.len() {
            // SAFETY: a read into a buffer we own from a descriptor we own.
            let n = unsafe {
                libc::read(
                    p.r.as_raw_fd(),
                    got[done..].as_mut_ptr().cast(),
                    got.len() - done,
                )
            };
            assert!(n > 0);
            done += n as usize;
        }
        assert_eq!(&got[..HEADER], &header);
        assert_eq!(&got[HEADER..], &data[4096 * 3 + 5..4096 * 3 + 5 + 100_000]);
    }

    #[test]
    fn a_file_shorter_than_asked_is_not_filled() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("f");
        std::fs::write(&path, [1u8; 10]).unwrap();
        let f = File::open(&path).unwrap();
        let p = Pipe::new().unwrap();
        assert!(!p.fill(&[0; HEADER], &f, 0, 20));
    }
}
