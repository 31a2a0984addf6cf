//! The kernel side: a real FUSE mount, and the cache invalidations and prunes a switch sends.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use metfs_fs::view::ROOT_INO;
use metfs_protocol::Choice;

use crate::common::*;
use metfs::daemon::DEFAULT_SESSION;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_mount_shows_the_view_and_switches() {
    if !Path::new("/dev/fuse").exists() {
        // As s3_garage's servers: a contributor's plain `cargo test` passes and names what it
        // did not run, while `scripts/test.sh` sets METFS_REQUIRE_SERVERS, where this fails.
        let why = "no /dev/fuse (modprobe fuse; a container needs --device /dev/fuse)";
        let required = std::env::var_os("METFS_REQUIRE_SERVERS").is_some_and(|v| v != "0");
        assert!(!required, "{why} (METFS_REQUIRE_SERVERS is set)");
        // Straight to the process's stderr: the harness captures eprintln! of a passing test.
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "not run: kernel::a_real_mount_shows_the_view_and_switches: {why}; set METFS_REQUIRE_SERVERS=1 to make this a failure"
        );
        return;
    }
    let t = setup(1);
    let mp = tempfile::tempdir().unwrap();
    let r = start(t.cfg.clone()).await;
    let d = r.daemon.clone();
    let adapter =
        metfs_fs::fuse::FuseAdapter::new(d.surface().fs(), d.surface().active_read_path());
    let mut fcfg = fuser::Config::default();
    fcfg.mount_options = vec![
        fuser::MountOption::FSName("metfs".into()),
        fuser::MountOption::RO,
    ];
    let mpath = mp.path().to_path_buf();
    let (session, notifier) = tokio::task::spawn_blocking(move || {
        let s = fuser::Session::new(adapter, &mpath, &fcfg)?;
        let notifier = metfs_fs::fuse::KernelNotifier::new(&s);
        s.spawn().map(|s| (s, notifier))
    })
    .await
    .unwrap()
    .expect("mount");
    let _detach = DetachOnDrop(mp.path().to_path_buf());
    d.surface().mounted(mp.path(), notifier);

    let read_mount = |root: PathBuf| {
        tokio::task::spawn_blocking(move || {
            let mut out = BTreeMap::new();
            let mut stack = vec![root.clone()];
            while let Some(dir) = stack.pop() {
                for e in std::fs::read_dir(&dir).unwrap() {
                    let p = e.unwrap().path();
                    if p.is_dir() {
                        stack.push(p);
                    } else {
                        let rel = p.strip_prefix(&root).unwrap().display().to_string();
                        out.insert(rel, std::fs::read(&p).unwrap());
                    }
                }
            }
            out
        })
    };
    let plan = planned(&t.cfg, &d, 0);
    let view = read_mount(mp.path().to_path_buf()).await.unwrap();
    assert_eq!(keys(&view), plan[0], "files through the mount");
    check_bytes(&view, &t.source);
    d.advance(DEFAULT_SESSION, true).await.unwrap();
    let view = read_mount(mp.path().to_path_buf()).await.unwrap();
    assert_eq!(
        keys(&view),
        plan[1],
        "files through the mount after the switch"
    );
    check_bytes(&view, &t.source);

    // Another process on a busy machine (a walk of /tmp, a test beside this one) can hold the
    // mount for a moment: the unmount then fails with EBUSY, and the guard detaches it.
    if let Err(e) = tokio::task::spawn_blocking(move || session.umount_and_join())
        .await
        .unwrap()
    {
        eprintln!("unmount: {e}; detached lazily");
    }
    drop(d);
    r.stop().await;
}

/// Detaches a test's mount when dropped (`MNT_DETACH`, as `umount -l`), whatever ended the
/// test: a failed assertion or unmount never leaves a mount behind. Harmless once unmounted.
struct DetachOnDrop(PathBuf);

impl Drop for DetachOnDrop {
    fn drop(&mut self) {
        use std::os::unix::ffi::OsStrExt;
        let Ok(c) = std::ffi::CString::new(self.0.as_os_str().as_bytes()) else {
            return;
        };
        // SAFETY: `c` is a valid NUL-terminated path for the call's duration.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
            // Not root: the setuid helper detaches a user's own FUSE mount.
            let _ = std::process::Command::new("fusermount3")
                .args(["-u", "-z"])
                .arg(&self.0)
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

/// A switch drops the kernel's cached root entries of the old view, then the root's inode,
/// before `advance` answers: by then every new lookup resolves in the new view.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switch_invalidates_the_old_roots_entries_before_it_answers() {
    let t = setup_with(1, "read_path = \"pread\"");
    let r = start(t.cfg.clone()).await;
    let d = r.daemon.clone();
    let kernel = Recorder::default();
    let mp = tempfile::tempdir().unwrap();
    d.surface().mounted(mp.path(), kernel.clone());
    let old_names = d.surface().fs().current().root_names();
    assert!(!old_names.is_empty());
    assert!(kernel.calls().is_empty(), "nothing is sent before a switch");
    let reply = d.advance(DEFAULT_SESSION, true).await.unwrap();
    assert_eq!(reply.decision, Choice::Advance);
    let mut want: Vec<Notified> = old_names
        .into_iter()
        .map(|n| Notified::Entry(ROOT_INO, n))
        .collect();
    want.push(Notified::Inode(ROOT_INO));
    assert_eq!(kernel.calls(), want);
    drop(d);
    r.stop().await;
}

/// On the cached read path the kernel's references pin a retired view: after the switch the
/// daemon prunes the inodes of the old view the kernel still holds, the file before its
/// directory, until they are forgotten; then the view drains and its slot is evicted. A kernel
/// without prune gets the entry invalidated by name instead (never a root entry the current
/// view also has), and is not asked to prune again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retired_view_held_by_the_kernel_is_pruned_until_it_drains() {
    for no_prune in [false, true] {
        let t = setup_with(1, "read_path = \"cached\"");
        let r = start(t.cfg.clone()).await;
        let d = r.daemon.clone();
        let kernel = Recorder {
            no_prune,
            ..Default::default()
        };
        let mp = tempfile::tempdir().unwrap();
        d.surface().mounted(mp.path(), kernel.clone());
        // The kernel looks up a directory and a file in it, and keeps both.
        let fs = d.surface().fs();
        let old = fs.current();
        // `cats` and `dogs` hold files only (`birds` holds directories).
        let dir_name = ["cats", "dogs"]
            .into_iter()
            .find(|n| old.root_names().iter().any(|r| r == n))
            .expect("cats or dogs in the first view")
            .to_string();
        let dir = fs.lookup(ROOT_INO, &dir_name).unwrap();
        let fh = fs.opendir(dir.ino).unwrap();
        let mut file_name = None;
        fs.readdir(dir.ino, fh, 0, false, |e| {
            if e.name != "." && e.name != ".." && file_name.is_none() {
                file_name = Some(e.name.to_string());
            }
            false
        })
        .unwrap();
        fs.release(fh);
        let file_name = file_name.expect("a file in the directory");
        let file = fs.lookup(dir.ino, &file_name).unwrap();
        assert!(!file.is_dir);
        d.advance(DEFAULT_SESSION, true).await.unwrap();
        assert_eq!(status_u64(&d, "draining_slots"), 1, "the old view is held");
        let pruned = |calls: &[Notified]| {
            calls
                .iter()
                .any(|c| matches!(c, Notified::Prune(inos) if inos == &vec![file.ino, dir.ino]))
        };
        if no_prune {
            let entry = Notified::Entry(dir.ino, file_name.clone());
            wait_for("the file's entry invalidated by name", || {
                kernel.calls().contains(&entry)
            })
            .await
            .unwrap_or_else(|e| panic!("{e}: {:?}", kernel.calls()));
            let calls = kernel.calls();
            let prunes = calls
                .iter()
                .filter(|c| matches!(c, Notified::Prune(_)))
                .count();
            assert_eq!(prunes, 1, "asked to prune again after it failed: {calls:?}");
            // After the switch's own invalidations (which end with the root's inode), no
            // root entry the current view also has is invalidated.
            let switch_end = calls
                .iter()
                .position(|c| c == &Notified::Inode(ROOT_INO))
                .unwrap();
            let current = fs.current().root_names();
            for c in &calls[switch_end..] {
                if let Notified::Entry(ROOT_INO, name) = c {
                    assert!(
                        !current.contains(name),
                        "{name}: the current view's entry was invalidated"
                    );
                }
            }
        } else {
            wait_for("the held inodes pruned", || pruned(&kernel.calls()))
                .await
                .unwrap_or_else(|e| {
                    panic!(
                        "{e}: {:?} (file {}, dir {})",
                        kernel.calls(),
                        file.ino,
                        dir.ino
                    )
                });
        }
        // The kernel forgets them: the view drains and its slot goes.
        fs.forget(file.ino, 1);
        fs.forget(dir.ino, 1);
        wait_for("the retired view evicted", || {
            status_u64(&d, "draining_slots") == 0
        })
        .await
        .unwrap();
        drop((fs, old));
        drop(d);
        r.stop().await;
    }
}
