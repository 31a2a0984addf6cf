//! Mounting and unmounting: mountpoint checks, the mount registry, the background daemon and
//! `metfs umount`.
//!
//! Registry. A running daemon records `{mountpoint, socket, pid, cache}` in a small JSON file
//! named after its mountpoint, under `/run/metfs` (root) or `$TMPDIR/metfs-<uid>`. `metfs
//! umount MOUNTPOINT` finds the socket there, asks the daemon to shut down (which saves the
//! position and keeps the cache), and waits for it to exit. If the daemon is gone (killed), the
//! stale FUSE mount is detached directly.
//!
//! Unprivileged mounts. An ordinary user mounts through the setuid `fusermount3` (fuser falls
//! back to it when `mount(2)` is refused), but `fusermount3` opens `/dev/fuse` as the calling
//! user, like every libfuse mount: where the device is 0600 (as on some nodes) no ordinary user
//! can mount FUSE at all. [`check_fuse_device`] says so up front instead of a bare "Permission
//! denied", and likewise for a kernel without FUSE and a node without `fusermount3`.
//!
//! Background start. `metfs mount` without `--foreground` re-executes itself with
//! `--foreground --ready-fd N` in a new session, stdio detached, and waits on the pipe: the
//! child writes `ready` once the mount is live and the first mini-epoch is staged, or the
//! error that stopped it. So the parent's exit status is the mount's outcome, which is what a
//! Slurm script needs.

use std::io::{Read, Write};
use std::os::fd::{FromRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Errors of mounting and unmounting.
#[derive(Debug, Error)]
pub enum MountError {
    /// The mountpoint is unusable.
    #[error("mountpoint {path}: {reason}")]
    Mountpoint { path: String, reason: String },
    /// Not a metfs mount.
    #[error("{0} is not a metfs mount")]
    NotMounted(String),
    /// The background daemon failed.
    #[error("{0}")]
    Daemon(String),
    /// A system call failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

/// A registry entry.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Registered {
    /// Absolute mountpoint.
    pub mountpoint: PathBuf,
    /// Control socket.
    pub socket: PathBuf,
    /// Daemon pid.
    pub pid: u32,
    /// Cache directory.
    pub cache: PathBuf,
}

fn registry_dir() -> PathBuf {
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    if uid == 0 && Path::new("/run").is_dir() {
        PathBuf::from("/run/metfs")
    } else {
        std::env::temp_dir().join(format!("metfs-{uid}"))
    }
}

fn registry_file(mountpoint: &Path) -> PathBuf {
    let h = metfs_plan::digest::Fnv1a::of(mountpoint.as_os_str().as_encoded_bytes());
    registry_dir().join(format!("{h:016x}.json"))
}

/// Makes a path absolute without touching it (a dead FUSE mount cannot be stat'ed).
pub fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// Records a running daemon.
pub fn register(r: &Registered) -> std::io::Result<()> {
    let dir = registry_dir();
    std::fs::create_dir_all(&dir)?;
    let f = registry_file(&r.mountpoint);
    // Rebuilt at every mount, so readers need it whole but not crash-proof.
    metfs_durable::write(
        &f,
        &serde_json::to_vec(r).unwrap(),
        metfs_durable::Durability::Atomic,
    )
    .map_err(|e| std::io::Error::new(e.io_error().kind(), e.to_string()))
}

/// Removes a registry entry.
pub fn unregister(mountpoint: &Path) {
    let _ = std::fs::remove_file(registry_file(mountpoint));
}

/// Looks a mountpoint up in the registry.
pub fn lookup(mountpoint: &Path) -> Option<Registered> {
    std::fs::read(registry_file(mountpoint))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
}

fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether a metfs FUSE mount sits at `mountpoint` (live or with a dead daemon).
pub fn is_metfs_mount(mountpoint: &Path) -> bool {
    // Mounted directly by root the type is `fuse` with source `metfs`; through fusermount3 it
    // is `fuse.metfs`.
    mounted_fstype(mountpoint)
        .is_some_and(|(t, src)| t == "fuse.metfs" || (t.starts_with("fuse") && src == "metfs"))
}

/// The filesystem type and source mounted at `mountpoint`, from /proc/self/mountinfo.
fn mounted_fstype(mountpoint: &Path) -> Option<(String, String)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = mountpoint.to_string_lossy();
    let mut found = None;
    for line in info.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        if fields.len() < 5 {
            continue;
        }
        if unescape_mountinfo(fields[4]) == want {
            if let Some(dash) = fields.iter().position(|f| *f == "-") {
                found = Some((
                    fields.get(dash + 1).unwrap_or(&"").to_string(),
                    fields.get(dash + 2).unwrap_or(&"").to_string(),
                ));
            }
        }
    }
    found
}

/// Whether `pid` is a running process. A killed daemon whose parent has not reaped it yet is a
/// zombie: it still has a pid but serves nothing, so it counts as dead.
pub fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // The state follows the parenthesised command name, which may contain spaces.
            let state = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().next());
            !matches!(state, Some("Z") | Some("X") | None)
        }
        Err(_) => false,
    }
}

/// What a FUSE mount needs of the node, read once so that [`fuse_prerequisites`] can judge it
/// without touching the system (and be tested so).
#[derive(Debug, Clone)]
pub struct FuseNode {
    /// `/proc/filesystems`, or `None` where it cannot be read.
    pub filesystems: Option<String>,
    /// Whether `/dev/fuse` exists, and its permission bits.
    pub device_mode: Option<u32>,
    /// Whether this process may open `/dev/fuse` for reading and writing.
    pub device_access: bool,
    /// The effective uid.
    pub uid: u32,
    /// The mount helper an ordinary user's mount would run (`FUSERMOUNT_PATH`, else the first
    /// `fusermount3`/`fusermount` that fuser would find), if any.
    pub helper: Option<PathBuf>,
}

impl FuseNode {
    /// Reads this node's facts.
    pub fn probe() -> Self {
        // SAFETY: access on a constant C string; geteuid cannot fail.
        let (device_access, uid) = unsafe {
            (
                libc::access(c"/dev/fuse".as_ptr(), libc::R_OK | libc::W_OK) == 0,
                libc::geteuid(),
            )
        };
        FuseNode {
            filesystems: std::fs::read_to_string("/proc/filesystems").ok(),
            device_mode: std::fs::metadata("/dev/fuse")
                .ok()
                .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777),
            device_access,
            uid,
            helper: find_fusermount(
                std::env::var_os("FUSERMOUNT_PATH"),
                std::env::var_os("PATH"),
            ),
        }
    }
}

/// The mount helper fuser runs for an ordinary user: `FUSERMOUNT_PATH` if set, else
/// `fusermount3` or `fusermount` on `PATH`, then in `/sbin` and `/bin` (fuser's own order).
fn find_fusermount(
    explicit: Option<std::ffi::OsString>,
    path: Option<std::ffi::OsString>,
) -> Option<PathBuf> {
    let executable = |p: &Path| {
        let Ok(c) = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()) else {
            return false;
        };
        // SAFETY: access on a valid C string.
        p.is_file() && unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0
    };
    if let Some(e) = explicit {
        let p = PathBuf::from(e);
        return executable(&p).then_some(p);
    }
    let mut dirs: Vec<PathBuf> = path
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.extend([PathBuf::from("/sbin"), PathBuf::from("/bin")]);
    ["fusermount3", "fusermount"]
        .iter()
        .flat_map(|name| dirs.iter().map(move |d| d.join(name)))
        .find(|p| executable(p))
}

/// Judges whether a FUSE mount can work on `node`, with an error that names what is missing and
/// what provides it: a kernel without FUSE, a device this user may not open, or no
/// `fusermount3` for an ordinary user (root mounts with mount(2) and needs none).
pub fn fuse_prerequisites(node: &FuseNode) -> Result<(), MountError> {
    let in_kernel = node.filesystems.as_deref().is_none_or(|f| {
        f.lines()
            .any(|l| l.split_whitespace().last() == Some("fuse"))
    });
    if !in_kernel || node.device_mode.is_none() {
        let why = match (in_kernel, node.device_mode) {
            (false, None) => "fuse is not in /proc/filesystems and there is no /dev/fuse",
            (false, Some(_)) => "fuse is not in /proc/filesystems",
            _ => "there is no /dev/fuse",
        };
        return Err(MountError::Daemon(format!(
            "this kernel offers no FUSE ({why}): load the `fuse` module (`modprobe fuse`, root) \
             or ask the administrators; in a container, pass the host's /dev/fuse into it"
        )));
    }
    let uid = node.uid;
    if uid != 0 && !node.device_access {
        let mode = node.device_mode.unwrap_or(0) & 0o777;
        return Err(MountError::Daemon(format!(
            "/dev/fuse (mode {mode:o}) cannot be opened by uid {uid}: FUSE is reserved to root on \
             this node. fusermount3 opens the device as the calling user too, so no FUSE mount can \
             work; ask the administrators for access (most distributions make /dev/fuse 0666; a \
             site may grant a group read and write)"
        )));
    }
    if uid != 0 && node.helper.is_none() {
        return Err(MountError::Daemon(format!(
            "no fusermount3 found (FUSERMOUNT_PATH unset; not on PATH, /sbin or /bin): uid {uid} \
             is not root, and an ordinary user mounts FUSE through the setuid fusermount3 of the \
             `fuse3` package (Debian and Ubuntu: apt-get install fuse3; RHEL and Fedora: dnf \
             install fuse3)"
        )));
    }
    Ok(())
}

/// Checks that a FUSE mount can work here ([`fuse_prerequisites`] on this node's facts).
pub fn check_fuse_device() -> Result<(), MountError> {
    fuse_prerequisites(&FuseNode::probe())
}

fn detach(mountpoint: &Path) -> Result<(), MountError> {
    let c = std::ffi::CString::new(mountpoint.as_os_str().as_encoded_bytes()).map_err(|_| {
        MountError::Mountpoint {
            path: mountpoint.display().to_string(),
            reason: "contains a NUL byte".into(),
        }
    })?;
    // SAFETY: valid C string.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    // Unprivileged users go through fusermount3.
    let st = std::process::Command::new("fusermount3")
        .args(["-u", "-z"])
        .arg(mountpoint)
        .status();
    match st {
        Ok(s) if s.success() => Ok(()),
        _ => Err(MountError::Io {
            what: format!("unmounting {}", mountpoint.display()),
            source: err,
        }),
    }
}

/// Checks that `mountpoint` can be mounted on: an existing empty directory. A stale metfs
/// mount (its daemon dead) is detached first.
pub fn check_mountpoint(mountpoint: &Path) -> Result<(), MountError> {
    let bad = |reason: String| MountError::Mountpoint {
        path: mountpoint.display().to_string(),
        reason,
    };
    if is_metfs_mount(mountpoint) {
        let alive = lookup(mountpoint).is_some_and(|r| pid_alive(r.pid));
        if alive {
            return Err(bad(
                "metfs is already mounted here; `metfs umount` it first".into(),
            ));
        }
        tracing::warn!(mountpoint = %mountpoint.display(), "detaching a stale metfs mount whose daemon is gone");
        detach(mountpoint)?;
        unregister(mountpoint);
    }
    let md = std::fs::metadata(mountpoint).map_err(|e| bad(e.to_string()))?;
    if !md.is_dir() {
        return Err(bad("not a directory".into()));
    }
    let mut rd = std::fs::read_dir(mountpoint).map_err(|e| bad(e.to_string()))?;
    if rd.next().is_some() {
        return Err(bad(
            "not empty; metfs mounts only on an empty directory so that nothing is hidden".into(),
        ));
    }
    Ok(())
}

/// Unmounts `mountpoint`: asks the daemon to shut down (keeping the cache) and waits for it.
pub fn umount(mountpoint: &Path, timeout: Duration) -> Result<(), MountError> {
    let mp = absolute(mountpoint);
    let reg = lookup(&mp);
    let is_metfs = is_metfs_mount(&mp);
    if reg.is_none() && !is_metfs {
        return Err(MountError::NotMounted(mp.display().to_string()));
    }
    if let Some(r) = &reg {
        if pid_alive(r.pid) {
            let _ = crate::client::request::<metfs_protocol::ShuttingDown>(
                &r.socket,
                &metfs_protocol::Request::Shutdown,
            );
            let t = Instant::now();
            while pid_alive(r.pid) && t.elapsed() < timeout {
                std::thread::sleep(Duration::from_millis(20));
            }
            if pid_alive(r.pid) {
                // SAFETY: plain signal to the daemon's pid.
                unsafe { libc::kill(r.pid as i32, libc::SIGTERM) };
                let t = Instant::now();
                while pid_alive(r.pid) && t.elapsed() < Duration::from_secs(5) {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }
    if is_metfs_mount(&mp) {
        detach(&mp)?;
    }
    unregister(&mp);
    Ok(())
}

/// Runs `metfs` again in the background with `--foreground --ready-fd`, and waits until it
/// reports ready or fails.
pub fn spawn_background(args: &[std::ffi::OsString], log: &Path) -> Result<u32, MountError> {
    use std::os::unix::process::CommandExt;
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 fills two fds.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(MountError::Io {
            what: "pipe".into(),
            source: std::io::Error::last_os_error(),
        });
    }
    let (rfd, wfd) = (fds[0], fds[1]);
    let logf = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| MountError::Io {
            what: format!("opening log {}", log.display()),
            source: e,
        })?;
    let exe = std::env::current_exe().map_err(|e| MountError::Io {
        what: "finding the metfs executable".into(),
        source: e,
    })?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(args)
        .arg("--foreground")
        .arg("--ready-fd")
        .arg(wfd.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(logf);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::setsid();
            let flags = libc::fcntl(wfd, libc::F_GETFD);
            libc::fcntl(wfd, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| MountError::Io {
        what: "starting the daemon".into(),
        source: e,
    })?;
    // SAFETY: we own both fds; the parent keeps only the read end.
    unsafe { libc::close(wfd) };
    let mut r = unsafe { std::fs::File::from_raw_fd(rfd) };
    let mut msg = String::new();
    let _ = r.read_to_string(&mut msg);
    let msg = msg.trim();
    if msg == "ready" {
        return Ok(child.id());
    }
    // A refused mount returns once its daemon is gone: it holds the cache's lock until then,
    // and a caller that retries at once (a corrected flag) must not find it still held.
    reap_within(&mut child, std::time::Duration::from_secs(10));
    if msg.is_empty() {
        let tail = std::fs::read_to_string(log)
            .map(|t| {
                t.lines()
                    .rev()
                    .take(5)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .unwrap_or_default();
        return Err(MountError::Daemon(format!(
            "the daemon exited before the mount was ready; log {}:\n{tail}",
            log.display()
        )));
    }
    Err(MountError::Daemon(
        msg.strip_prefix("error: ").unwrap_or(msg).to_string(),
    ))
}

/// Waits up to `limit` for `child` to exit (it reported a failure and is on its way out).
fn reap_within(child: &mut std::process::Child, limit: std::time::Duration) {
    let end = std::time::Instant::now() + limit;
    while std::time::Instant::now() < end {
        match child.try_wait() {
            Ok(None) => std::thread::sleep(std::time::Duration::from_millis(10)),
            Ok(Some(_)) | Err(_) => return,
        }
    }
}

/// Marks the ready fd close-on-exec in the daemon: the parent waits for its end of the pipe
/// to close, so a process the daemon starts (a transform worker) must never inherit it.
pub fn keep_ready_fd_private(fd: Option<RawFd>) {
    let Some(fd) = fd else { return };
    // SAFETY: fcntl on an fd number; a bad number only makes the calls fail.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFD);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
        }
    }
}

/// Tells the waiting parent the outcome (no-op without a ready fd).
pub fn signal_ready(fd: Option<RawFd>, outcome: Result<(), String>) {
    let Some(fd) = fd else { return };
    // SAFETY: the fd was handed to us by the parent for exactly this.
    let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
    let _ = match outcome {
        Ok(()) => writeln!(f, "ready"),
        Err(e) => writeln!(f, "error: {e}"),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape_mountinfo("/a\\040b"), "/a b");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
    }

    #[test]
    fn mountpoint_checks() {
        let d = tempfile::tempdir().unwrap();
        assert!(check_mountpoint(d.path()).is_ok());
        std::fs::write(d.path().join("x"), b"").unwrap();
        let e = check_mountpoint(d.path()).unwrap_err().to_string();
        assert!(e.contains("not empty"), "{e}");
        let e = check_mountpoint(&d.path().join("x"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a directory"), "{e}");
        assert!(check_mountpoint(&d.path().join("missing")).is_err());
    }

    fn node() -> FuseNode {
        FuseNode {
            filesystems: Some("nodev\tsysfs\nnodev\tfuse\n\tfuseblk\n".into()),
            device_mode: Some(0o666),
            device_access: true,
            uid: 1000,
            helper: Some(PathBuf::from("/usr/bin/fusermount3")),
        }
    }

    #[test]
    fn fuse_prerequisites_name_what_is_missing_and_its_package() {
        assert!(fuse_prerequisites(&node()).is_ok());
        // A kernel without FUSE, for root and users alike.
        for uid in [0, 1000] {
            let n = FuseNode {
                filesystems: Some("nodev\tsysfs\n\tfuseblk\n".into()),
                device_mode: None,
                uid,
                ..node()
            };
            let e = fuse_prerequisites(&n).unwrap_err().to_string();
            assert!(e.contains("this kernel offers no FUSE"), "{e}");
            assert!(e.contains("modprobe fuse"), "{e}");
        }
        let e = fuse_prerequisites(&FuseNode {
            device_mode: None,
            ..node()
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("there is no /dev/fuse"), "{e}");
        // An ordinary user without fusermount3; root needs none.
        let no_helper = FuseNode {
            helper: None,
            ..node()
        };
        let e = fuse_prerequisites(&no_helper).unwrap_err().to_string();
        assert!(
            e.contains("no fusermount3 found") && e.contains("apt-get install fuse3"),
            "{e}"
        );
        assert!(fuse_prerequisites(&FuseNode {
            uid: 0,
            ..no_helper
        })
        .is_ok());
        // A device reserved to root.
        let e = fuse_prerequisites(&FuseNode {
            device_mode: Some(0o600),
            device_access: false,
            ..node()
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("/dev/fuse (mode 600) cannot be opened"), "{e}");
    }

    #[test]
    fn fusermount_is_found_as_fuser_finds_it() {
        let d = tempfile::tempdir().unwrap();
        let helper = d.path().join("fusermount3");
        std::fs::write(&helper, b"#!/bin/sh\n").unwrap();
        let path = Some(d.path().as_os_str().to_owned());
        // Not executable: not a helper.
        std::fs::set_permissions(&helper, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        assert_ne!(find_fusermount(None, path.clone()), Some(helper.clone()));
        std::fs::set_permissions(&helper, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        assert_eq!(find_fusermount(None, path), Some(helper.clone()));
        // FUSERMOUNT_PATH wins, and a missing one is no helper at all.
        assert_eq!(
            find_fusermount(Some(helper.as_os_str().to_owned()), None),
            Some(helper.clone())
        );
        assert_eq!(
            find_fusermount(Some(d.path().join("missing").into_os_string()), None),
            None
        );
    }
}
