//! Priming the kernel's entries of a new view. Right after a switch the kernel knows none of
//! the new view's files, so the first open of each costs a `LOOKUP` round trip to the daemon:
//! on the first pass over a view of small files that is about as much as the `READ` that
//! follows it, for every file, on the readers' critical path. A listing is far cheaper:
//! `READDIRPLUS` hands the kernel each entry's attributes, from which it builds the entry and
//! the inode at a few microseconds each. So after each switch (and after the mount) the daemon
//! has the new view listed through its own mount, once, by a child process. Measured on the
//! first pass after a switch over 100,000 small files with 16 readers starting at once
//! (`benches/scale.py --only prime`; docs/BENCHMARKS.md, "Scale"): 1.34x faster; the listing
//! alone takes 0.24 s.
//!
//! Invariants and choices:
//! - **The daemon never reads its own mount: a child process lists it.** A request of the
//!   daemon's own process to its mount, once a FUSE thread has read it, is waited for without
//!   any signal able to end the wait (`request_wait_answer`). Were the daemon killed then
//!   (`kill -9` of a job), its FUSE threads die, the waiting thread never gets its answer,
//!   the process never finishes exiting, and its `/dev/fuse` descriptor and its lock on the
//!   cache stay held: no remount, an unkillable process. So the listing runs in a child
//!   forked for it ([`list_in_child`]), which closes every inherited descriptor first (the
//!   device, the lock) and dies with the daemon. A daemon killed while the child waits on the
//!   mount exits at once (its thread waits on the child, interruptibly); its device closes, the
//!   kernel aborts the connection, and the child's request fails.
//! - It holds no lock of the daemon while it lists: its requests are served by the FUSE
//!   threads like any reader's, so it can neither stall them nor be stalled by a switch.
//! - It lists one directory at a time and checks between directories, and every 4,096
//!   entries, that the view is still its session's current one and that no shutdown has
//!   begun; it stops otherwise. So it holds a directory of a retired view open no longer than
//!   one listing, and the daemon's own unmount never waits for it. (An unmount from outside
//!   that is not lazy fails with EBUSY while a directory is open, as it does for any reader.)
//! - It walks the view in reverse name order, so that a walker of the mount going in name
//!   order (`os.walk`, `find`) meets it halfway instead of listing the same directories
//!   behind it.
//! - Entries it makes are the kernel's like any other: current until the next switch, pruned
//!   then with the view, reclaimable under memory pressure. What it costs is the kernel's
//!   entries and inodes of the whole view at once instead of as the first pass reaches them
//!   (that pass makes them all anyway); `prime_entries = false` turns it off.

use crate::daemon::Daemon;
use std::path::Path;
use std::time::Instant;

/// How many entries of one directory are listed between two checks that the view is still
/// current: a few milliseconds' worth.
const CHECK_EVERY: u64 = 4096;

impl Daemon {
    /// Lists the current view of every session through the mount, each from a thread of its own
    /// (see the module doc). Called once mounted.
    pub fn prime_all(&self) {
        let names: Vec<String> = self.sessions.lock().unwrap().keys().cloned().collect();
        for name in names {
            self.prime(&name);
        }
    }

    /// Lists session `name`'s current view through the mount (a child process forked by a
    /// thread of its own, see [`list_in_child`]); returns
    /// at once. Nothing happens with `prime_entries` off or before the mount.
    pub(super) fn prime(&self, name: &str) {
        if !self.cfg.prime_entries {
            return;
        }
        let Some((generation, nested)) = self
            .sessions
            .lock()
            .unwrap()
            .get(name)
            .map(|s| (s.generation(), s.schedule().nested_views()))
        else {
            return;
        };
        let mountpoint = self.surface.mountpoint();
        if mountpoint.as_os_str().is_empty() {
            return;
        }
        let root = if nested {
            mountpoint.join(name)
        } else {
            mountpoint
        };
        let me = self.me.lock().unwrap().clone();
        let name = name.to_string();
        let spawned = std::thread::Builder::new()
            .name("metfs-prime".into())
            .spawn(move || {
                let still = || {
                    me.upgrade().is_some_and(|d| {
                        !d.life.is_shutting_down()
                            && d.sessions
                                .lock()
                                .unwrap()
                                .get(&name)
                                .is_some_and(|s| s.generation() == generation)
                    })
                };
                let t0 = Instant::now();
                let walk = list_in_child(&root, &still);
                if let Some(d) = me.upgrade() {
                    d.surface
                        .note_primed(walk.entries, walk.finished.then_some(generation));
                }
                tracing::debug!(
                    session = %name,
                    generation,
                    entries = walk.entries,
                    finished = walk.finished,
                    ms = t0.elapsed().as_millis() as u64,
                    "listed the view for the kernel"
                );
            });
        if let Err(e) = spawned {
            tracing::debug!(error = %e, "cannot start the thread that lists a new view");
        }
    }
}

/// [`list_tree`] of `root` in a child process (see the module doc), which is killed as soon as
/// `still()` fails (checked at once, then every 20 ms). Returns what the child listed; nothing
/// when the child cannot be made or is stopped.
pub(super) fn list_in_child(root: &Path, still: &dyn Fn() -> bool) -> Listed {
    use std::io::Read;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 fills the two descriptors it creates, which are owned below.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Listed::default();
    }
    // SAFETY: both descriptors were just created and are owned only here.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the child runs only what is safe after a fork of a threaded process with glibc
    // (whose fork leaves the allocator usable in the child): system calls, directory reads and
    // the allocations they need, no lock another thread of the daemon may have held (no
    // logging, no daemon state), then `_exit`.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: plain system calls in the child; `_exit` skips the parent's atexit handlers.
        unsafe {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            if libc::getppid() != parent {
                libc::_exit(0);
            }
            let w = wr.as_raw_fd() as libc::c_uint;
            // Every inherited descriptor but the pipe's write end: above all the FUSE device
            // and the cache's lock, which must close when the daemon dies.
            if w > 3 {
                libc::syscall(libc::SYS_close_range, 3u32, w - 1, 0u32);
            }
            libc::syscall(libc::SYS_close_range, w + 1, u32::MAX, 0u32);
            let l = list_tree(root, &|| true);
            let msg = [l.entries.to_le_bytes(), u64::from(l.finished).to_le_bytes()].concat();
            libc::write(w as libc::c_int, msg.as_ptr().cast(), msg.len());
            libc::_exit(0);
        }
    }
    drop(wr);
    if pid < 0 {
        return Listed::default();
    }
    let mut status = 0;
    loop {
        if !still() {
            // SAFETY: our own child, not yet reaped. A request it has in flight is answered by
            // this daemon's FUSE threads, after which it dies.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return Listed::default();
        }
        // SAFETY: waits on our own child without blocking.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid || r < 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let mut buf = Vec::new();
    let _ = std::fs::File::from(rd).read_to_end(&mut buf);
    if buf.len() != 16 {
        return Listed::default();
    }
    Listed {
        entries: u64::from_le_bytes(buf[..8].try_into().expect("8 bytes")),
        finished: buf[8] == 1,
    }
}

/// What [`list_tree`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Listed {
    /// Entries listed, directories included.
    pub entries: u64,
    /// Every directory was listed (not stopped by `still`).
    pub finished: bool,
}

/// Lists every directory below `root` (which it lists too), deepest-first in reverse name
/// order, while `still()` holds; reads only the listings (no `stat`), as the kernel's
/// `READDIRPLUS` is what it is for. A directory that cannot be opened or read is skipped.
pub(super) fn list_tree(root: &Path, still: &dyn Fn() -> bool) -> Listed {
    let mut out = Listed::default();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        if !still() {
            return out;
        }
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        // Pushed in name order, so that the last (in name order) is listed first.
        let mut below = Vec::new();
        for e in entries {
            let Ok(e) = e else { break };
            out.entries += 1;
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                below.push(e.path());
            }
            if out.entries % CHECK_EVERY == 0 && !still() {
                return out;
            }
        }
        below.sort();
        stack.extend(below);
    }
    out.finished = true;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_every_entry_deepest_first_in_reverse_name_order_and_stops_when_told() {
        let d = tempfile::tempdir().unwrap();
        for (dir, n) in [("a", 3), ("b", 2), ("b/c", 4)] {
            std::fs::create_dir_all(d.path().join(dir)).unwrap();
            for i in 0..n {
                std::fs::write(d.path().join(dir).join(format!("f{i}")), b"x").unwrap();
            }
        }
        // Entries: a, b at the top; 3 in a; 2 files and c in b; 4 in b/c.
        let all = list_tree(d.path(), &|| true);
        assert_eq!(
            all,
            Listed {
                entries: 2 + 3 + 3 + 4,
                finished: true
            }
        );
        // The order of directories, from where a walk told to stop after k listings ends.
        let cell = std::cell::Cell::new(0);
        let seen = &cell;
        let stop_after = |k: usize| {
            move || {
                seen.set(seen.get() + 1);
                seen.get() <= k
            }
        };
        let one = list_tree(d.path(), &stop_after(1));
        assert_eq!(
            one,
            Listed {
                entries: 2,
                finished: false
            },
            "the root only"
        );
        seen.set(0);
        let two = list_tree(d.path(), &stop_after(2));
        // After the root comes b, the last in name order: its 3 entries.
        assert_eq!(two.entries, 2 + 3);
        seen.set(0);
        let three = list_tree(d.path(), &stop_after(3));
        // Then b/c, deepest first, before a.
        assert_eq!(three.entries, 2 + 3 + 4);
        assert!(!three.finished);
        // A directory that is gone is skipped, not an end.
        assert!(list_tree(&d.path().join("gone"), &|| true).finished);
        // A child process lists the same, and is stopped (listing nothing) when told.
        assert_eq!(list_in_child(d.path(), &|| true), all);
        assert_eq!(list_in_child(d.path(), &|| false), Listed::default());
    }
}
