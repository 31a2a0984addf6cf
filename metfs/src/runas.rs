//! `metfs mount --run-as USER`: a daemon started by root (a Slurm Prolog, the node service) that
//! runs as the job's user and keeps of root only `CAP_SYS_ADMIN`, which FUSE passthrough needs
//! to register a backing file (`fs/fuse/backing.c` refuses everyone else).
//!
//! Why this shape: the daemon must read the tier with the user's rights, so that a file the
//! user may not read at the source is never staged, listed or served; ACLs on Lustre are not
//! mirrored into the view, so the kernel's check at the source is the only complete one.
//! Switching the whole process to the user does that for every tier access, the catalog's
//! walk and the cache's writes alike, with no per-call `setfsuid` to forget. The one right
//! kept, `CAP_SYS_ADMIN`, is what mount(2) and the backing-file ioctl need; the DAC overrides
//! (`CAP_DAC_OVERRIDE`, `CAP_DAC_READ_SEARCH`) go with everything else.
//!
//! Invariants:
//! * [`become_user`] runs while the process has one thread (before the runtime, the logger
//!   or any pool starts): the capability calls act on the calling thread only, and every
//!   later thread inherits its credentials;
//! * the background daemon is started by `exec`, which keeps a non-root process's capability
//!   only through the ambient set; [`become_user`] raises it there for that one `exec`, and
//!   [`drop_ambient`] clears it in the daemon before it starts anything, so a transform worker
//!   or any other child runs with no capability at all;
//! * a process changed from root to another user is not dumpable, so the user cannot ptrace
//!   it or read its memory; the user can signal it, as they can any daemon of theirs.

use std::ffi::CString;

use thiserror::Error;

/// Why the process could not become the user.
#[derive(Debug, Error)]
pub enum RunAsError {
    /// `--run-as` is for root.
    #[error("--run-as {user}: only root can start a daemon for another user (uid {uid} is not root); an ordinary user runs `metfs mount` without it")]
    NotRoot {
        /// The user asked for.
        user: String,
        /// This process's effective uid.
        uid: u32,
    },
    /// No such user in the password database.
    #[error("--run-as {0}: no such user")]
    UnknownUser(String),
    /// The user asked for is root.
    #[error("--run-as {0}: the user is root; a root daemon needs no --run-as")]
    Root(String),
    /// A call that changes credentials failed.
    #[error("--run-as {user}: {call} failed: {source}")]
    Call {
        /// The user asked for.
        user: String,
        /// The failing call.
        call: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Started as `--run-as` but the process runs as somebody else (the background daemon
    /// checks what its parent set up).
    #[error("--run-as {user}: the daemon runs as uid {uid}, not as the user's uid {want}")]
    WrongUser {
        /// The user asked for.
        user: String,
        /// This process's uid.
        uid: u32,
        /// The user's uid.
        want: u32,
    },
}

/// A user from the password database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// Login name.
    pub name: String,
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Home directory.
    pub home: String,
}

/// Looks `name` up (a name, or a numeric uid).
pub fn lookup(name: &str) -> Result<User, RunAsError> {
    let unknown = || RunAsError::UnknownUser(name.to_string());
    let mut buf = vec![0 as libc::c_char; 16 << 10];
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: getpwnam_r/getpwuid_r write into `pw` and `buf`, both ours and large enough
    // (ERANGE otherwise, reported as unknown); `out` is null or points at `pw`.
    let rc = match name.parse::<u32>() {
        Ok(uid) => unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut out) },
        Err(_) => {
            let c = CString::new(name).map_err(|_| unknown())?;
            unsafe { libc::getpwnam_r(c.as_ptr(), &mut pw, buf.as_mut_ptr(), buf.len(), &mut out) }
        }
    };
    if rc != 0 || out.is_null() {
        return Err(unknown());
    }
    // SAFETY: on success the strings point into `buf`, NUL-terminated.
    let s = |p: *const libc::c_char| {
        unsafe { std::ffi::CStr::from_ptr(p) }
            .to_string_lossy()
            .into_owned()
    };
    Ok(User {
        name: s(pw.pw_name),
        uid: pw.pw_uid,
        gid: pw.pw_gid,
        home: s(pw.pw_dir),
    })
}

const CAP_SYS_ADMIN: u32 = 21;
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Sets this thread's capability sets to exactly `CAP_SYS_ADMIN` in effective and permitted,
/// and in inheritable when `inheritable` (which an ambient capability requires).
fn set_caps(inheritable: bool) -> std::io::Result<()> {
    let bit = 1u32 << CAP_SYS_ADMIN;
    let mut hdr = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [
        CapData {
            effective: bit,
            permitted: bit,
            inheritable: if inheritable { bit } else { 0 },
        },
        CapData::default(),
    ];
    // SAFETY: capset reads one header and two data structs of the v3 layout.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut hdr, data.as_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Whether this thread has `CAP_SYS_ADMIN` in its effective set.
pub fn has_sys_admin() -> bool {
    let mut hdr = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget writes two data structs of the v3 layout.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &mut hdr, data.as_mut_ptr()) };
    rc == 0 && data[0].effective & (1 << CAP_SYS_ADMIN) != 0
}

fn check(user: &str, call: &'static str, rc: libc::c_int) -> Result<(), RunAsError> {
    if rc == 0 {
        return Ok(());
    }
    Err(RunAsError::Call {
        user: user.to_string(),
        call,
        source: std::io::Error::last_os_error(),
    })
}

/// Makes this (single-threaded) root process `name`: its groups, gid and uid, keeping only
/// `CAP_SYS_ADMIN`; with `for_exec`, raised in the ambient set too, so that the daemon this
/// process starts by `exec` keeps it. Sets `HOME`, `USER` and `LOGNAME` to the user's.
pub fn become_user(name: &str, for_exec: bool) -> Result<User, RunAsError> {
    // SAFETY: geteuid has no failure mode.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        return Err(RunAsError::NotRoot {
            user: name.to_string(),
            uid: euid,
        });
    }
    let u = lookup(name)?;
    if u.uid == 0 {
        return Err(RunAsError::Root(name.to_string()));
    }
    let cname =
        CString::new(u.name.clone()).map_err(|_| RunAsError::UnknownUser(u.name.clone()))?;
    let mut groups = vec![0 as libc::gid_t; 1024];
    let mut n = groups.len() as libc::c_int;
    // SAFETY: getgrouplist writes at most `n` gids into `groups` and the count into `n`.
    let rc = unsafe { libc::getgrouplist(cname.as_ptr(), u.gid, groups.as_mut_ptr(), &mut n) };
    if rc < 0 {
        return Err(RunAsError::Call {
            user: name.to_string(),
            call: "getgrouplist (more than 1024 groups)",
            source: std::io::Error::from_raw_os_error(libc::ERANGE),
        });
    }
    groups.truncate(n.max(0) as usize);
    // SAFETY: plain credential calls on this process; it has one thread (see the module docs).
    unsafe {
        check(
            name,
            "setgroups",
            libc::setgroups(groups.len(), groups.as_ptr()),
        )?;
        check(
            name,
            "prctl(PR_SET_KEEPCAPS)",
            libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0),
        )?;
        check(name, "setresgid", libc::setresgid(u.gid, u.gid, u.gid))?;
        check(name, "setresuid", libc::setresuid(u.uid, u.uid, u.uid))?;
    }
    set_caps(for_exec).map_err(|source| RunAsError::Call {
        user: name.to_string(),
        call: "capset",
        source,
    })?;
    // SAFETY: as above.
    unsafe {
        check(
            name,
            "prctl(PR_SET_KEEPCAPS)",
            libc::prctl(libc::PR_SET_KEEPCAPS, 0, 0, 0, 0),
        )?;
        if for_exec {
            check(
                name,
                "prctl(PR_CAP_AMBIENT_RAISE)",
                libc::prctl(
                    libc::PR_CAP_AMBIENT,
                    libc::PR_CAP_AMBIENT_RAISE,
                    CAP_SYS_ADMIN as libc::c_ulong,
                    0,
                    0,
                ),
            )?;
        }
    }
    // SAFETY: one thread, so no other thread reads the environment meanwhile.
    unsafe {
        std::env::set_var("HOME", &u.home);
        std::env::set_var("USER", &u.name);
        std::env::set_var("LOGNAME", &u.name);
    }
    Ok(u)
}

/// In the background daemon of a `--run-as` mount: checks that it runs as `name`, then clears
/// the ambient and inheritable capabilities its parent raised for the `exec`, so that nothing
/// it starts inherits `CAP_SYS_ADMIN`. Call while the process has one thread.
pub fn drop_ambient(name: &str) -> Result<User, RunAsError> {
    let u = lookup(name)?;
    // SAFETY: getuid has no failure mode.
    let uid = unsafe { libc::getuid() };
    if uid != u.uid {
        return Err(RunAsError::WrongUser {
            user: name.to_string(),
            uid,
            want: u.uid,
        });
    }
    // SAFETY: a prctl on this thread.
    unsafe {
        check(
            name,
            "prctl(PR_CAP_AMBIENT_CLEAR_ALL)",
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL,
                0,
                0,
                0,
            ),
        )?;
    }
    if has_sys_admin() {
        set_caps(false).map_err(|source| RunAsError::Call {
            user: name.to_string(),
            call: "capset",
            source,
        })?;
    }
    Ok(u)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_are_looked_up_by_name_and_uid() {
        let root = lookup("root").unwrap();
        assert_eq!((root.uid, root.gid), (0, 0));
        assert_eq!(lookup("0").unwrap().name, "root");
        let e = lookup("no-such-user-metfs-xyz").unwrap_err();
        assert!(e.to_string().contains("no-such-user-metfs-xyz"), "{e}");
        assert!(matches!(lookup("a\0b"), Err(RunAsError::UnknownUser(_))));
    }

    #[test]
    fn root_is_refused_as_the_user_and_non_root_callers_are_refused() {
        // SAFETY: geteuid has no failure mode.
        if unsafe { libc::geteuid() } == 0 {
            let e = become_user("root", false).unwrap_err();
            assert!(matches!(e, RunAsError::Root(_)), "{e}");
        } else {
            let e = become_user("root", false).unwrap_err();
            assert!(matches!(e, RunAsError::NotRoot { .. }), "{e}");
        }
    }
}
