//! The FUSE side of the node: the kernel's file system, the mount helper, the device, and
//! whether this process may use passthrough.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use super::Check;
use crate::config::ReadPath;
use crate::mount::FuseNode;

/// The package that provides `fusermount3`, as each family names it.
const FUSE3_PACKAGE: &str =
    "install fuse3 (Debian and Ubuntu: apt-get install fuse3; RHEL and Fedora: dnf install fuse3)";

/// Whether `/proc/filesystems` lists `fuse` (its lines are `nodev\tfuse` or `\tfuseblk`).
pub(super) fn lists_fuse(filesystems: &str) -> bool {
    filesystems
        .lines()
        .any(|l| l.split_whitespace().last() == Some("fuse"))
}

/// FUSE in the kernel: `/proc/filesystems`, and `/sys/module/fuse` (a loaded module, or one
/// built in that has parameters).
pub(super) fn kernel() -> Check {
    judge_kernel(
        std::fs::read_to_string("/proc/filesystems").ok().as_deref(),
        Path::new("/sys/module/fuse").is_dir(),
    )
}

fn judge_kernel(filesystems: Option<&str>, module: bool) -> Check {
    const NAME: &str = "fuse-kernel";
    let module = if module {
        "/sys/module/fuse present"
    } else {
        "no /sys/module/fuse (built in without parameters)"
    };
    match filesystems {
        None => Check::warn(
            NAME,
            "/proc/filesystems cannot be read; FUSE not confirmed",
            "mount /proc (a container without it cannot be checked)",
        ),
        Some(f) if lists_fuse(f) => Check::ok(NAME, format!("fuse in /proc/filesystems, {module}")),
        Some(_) => Check::fail(
            NAME,
            "this kernel offers no FUSE: fuse is not in /proc/filesystems",
            "load the module: modprobe fuse (root; it ships with the kernel: Debian linux-image-*, \
             RHEL kernel-modules-core); in a container, the host must load it",
        ),
    }
}

/// The setuid `fusermount3` an ordinary user's mount goes through (root mounts with mount(2)
/// and needs none), found where fuser looks for it.
pub(super) fn fusermount(node: &FuseNode) -> Check {
    let owner_mode = node
        .helper
        .as_deref()
        .and_then(|p| std::fs::metadata(p).ok())
        .map(|m| (m.uid(), m.permissions().mode() & 0o7777));
    judge_fusermount(node.helper.as_deref(), owner_mode, node.uid)
}

fn judge_fusermount(helper: Option<&Path>, owner_mode: Option<(u32, u32)>, uid: u32) -> Check {
    const NAME: &str = "fusermount3";
    let setuid_root = matches!(owner_mode, Some((0, mode)) if mode & 0o4000 != 0);
    let found = match (helper, owner_mode) {
        (None, _) => {
            "none found (FUSERMOUNT_PATH unset or not executable; not on PATH, /sbin or /bin)"
                .to_string()
        }
        (Some(p), Some((owner, mode))) if !setuid_root => format!(
            "{} is not setuid root (mode {mode:04o}, owner uid {owner})",
            p.display()
        ),
        (Some(p), _) => format!("{}, setuid root", p.display()),
    };
    if uid == 0 {
        return Check::ok(
            NAME,
            format!("{found}; not needed: root mounts with mount(2) directly"),
        );
    }
    match helper {
        None => Check::fail(
            NAME,
            format!("{found}; uid {uid} is not root and mounts FUSE through it"),
            FUSE3_PACKAGE,
        ),
        Some(p) if !setuid_root => Check::fail(
            NAME,
            format!("{found}; an ordinary user's mount needs it setuid root"),
            format!(
                "as root: chown root {0} && chmod u+s {0} (reinstalling fuse3 restores it)",
                p.display()
            ),
        ),
        Some(_) => Check::ok(NAME, found),
    }
}

/// What `/dev/fuse` is and whether this process opens it for reading and writing.
struct Device {
    /// Permission bits and group, `None` when there is no device.
    mode_gid: Option<(u32, u32)>,
    /// The group's name.
    group: String,
    /// Why `open(O_RDWR)` failed.
    open_error: Option<String>,
}

/// `/dev/fuse`: there, its mode and group, and whether this user can open it read-write (it
/// is opened and closed; an open without a mount starts nothing).
pub(super) fn device(uid: u32, user: &str) -> Check {
    let md = std::fs::metadata("/dev/fuse").ok();
    let mode_gid = md
        .as_ref()
        .map(|m| (m.permissions().mode() & 0o7777, m.gid()));
    let dev = Device {
        mode_gid,
        group: mode_gid.map_or(String::new(), |(_, gid)| group_name(gid)),
        open_error: std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .err()
            .map(|e| e.to_string()),
    };
    judge_device(&dev, uid, user)
}

fn judge_device(dev: &Device, uid: u32, user: &str) -> Check {
    const NAME: &str = "dev-fuse";
    let Some((mode, _)) = dev.mode_gid else {
        return Check::fail(
            NAME,
            "there is no /dev/fuse",
            "modprobe fuse (root) creates it; in a container, pass the host's device into it \
             (docker run --device /dev/fuse)",
        );
    };
    let what = format!("/dev/fuse mode {mode:04o}, group {}", dev.group);
    let Some(err) = &dev.open_error else {
        return Check::ok(NAME, format!("{what}; {user} opens it read-write"));
    };
    let found = format!(
        "{what}; {user} (uid {uid}) cannot open it read-write ({err}), and fusermount3 opens it as \
         the user too"
    );
    let fix = if dev.group != "root" && mode & 0o060 == 0o060 {
        format!(
            "add the user to the device's group (root): usermod -aG {} {user}, then log in again",
            dev.group
        )
    } else {
        format!(
            "as root: groupadd -r fuse; chgrp fuse /dev/fuse; chmod 0660 /dev/fuse; usermod -aG \
             fuse {user} (a udev rule KERNEL==\"fuse\", GROUP=\"fuse\", MODE=\"0660\" keeps it \
             after a reboot); or make it 0666, as most distributions do"
        )
    };
    Check::fail(NAME, found, fix)
}

/// A group's name, or its gid as text.
fn group_name(gid: u32) -> String {
    let mut buf = vec![0 as libc::c_char; 16 << 10];
    // SAFETY: a zeroed `group` is a valid out-parameter.
    let mut gr: libc::group = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::group = std::ptr::null_mut();
    // SAFETY: getgrgid_r writes into `gr` and `buf`, both ours; `out` is null or `&gr`.
    let rc = unsafe { libc::getgrgid_r(gid, &mut gr, buf.as_mut_ptr(), buf.len(), &mut out) };
    if rc != 0 || out.is_null() {
        return gid.to_string();
    }
    // SAFETY: on success `gr_name` points into `buf`, NUL-terminated.
    unsafe { std::ffi::CStr::from_ptr(gr.gr_name) }
        .to_string_lossy()
        .into_owned()
}

/// A kernel release's major and minor version (`6.18.44-fc-v1300` is 6.18).
pub(super) fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// The kernel's release (`uname -r`).
fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Whether this process could use passthrough: kernel 6.9 or later, and `CAP_SYS_ADMIN` in
/// its effective set. Never a failure: it says which read path the user gets, and why.
pub(super) fn passthrough(read_path: ReadPath) -> Check {
    judge_passthrough(&kernel_release(), crate::runas::has_sys_admin(), read_path)
}

fn judge_passthrough(release: &str, sys_admin: bool, read_path: ReadPath) -> Check {
    const NAME: &str = "passthrough";
    let new_enough = kernel_version(release).is_some_and(|v| v >= (6, 9));
    let mut why = Vec::new();
    if !new_enough {
        why.push(format!("kernel {release} is older than 6.9"));
    }
    if !sys_admin {
        why.push("this process has no CAP_SYS_ADMIN".to_string());
    }
    if why.is_empty() {
        let gets = match read_path {
            ReadPath::Auto => "read path auto gives large samples passthrough, small ones cached",
            ReadPath::Passthrough => "reads take passthrough",
            ReadPath::Cached => "but the read path is cached",
            ReadPath::Pread => "but the read path is pread",
        };
        return Check::ok(
            NAME,
            format!("possible (kernel {release}, 6.9 or later, and CAP_SYS_ADMIN): {gets}"),
        );
    }
    let why = why.join(" and ");
    match read_path {
        ReadPath::Cached | ReadPath::Pread => Check::ok(
            NAME,
            format!(
                "not possible ({why}); not needed: the read path is {}",
                read_path.name()
            ),
        ),
        _ => {
            let gets = if read_path == ReadPath::Passthrough {
                "pread (passthrough is asked for, and falls back)"
            } else {
                "the cached path for small samples and pread otherwise"
            };
            let fix = if new_enough {
                "for passthrough, the daemon needs CAP_SYS_ADMIN: root mounts for the user with \
                 `metfs mount --run-as USER` (deploy/slurm/prolog.sh)"
            } else {
                "for passthrough, a kernel 6.9 or later (with CONFIG_FUSE_PASSTHROUGH)"
            };
            Check::warn(
                NAME,
                format!("not possible ({why}): reads take {gets}"),
                fix,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Status;

    #[test]
    fn fuse_is_read_from_proc_filesystems() {
        let text = "nodev\tsysfs\nnodev\ttmpfs\n\tfuseblk\nnodev\tfuse\nnodev\tfusectl\n\text4\n";
        assert!(lists_fuse(text));
        assert!(!lists_fuse("nodev\tfusectl\n\tfuseblk\n\text4\n"));
        assert_eq!(judge_kernel(Some(text), true).status, Status::Ok);
        let c = judge_kernel(Some("\text4\n"), false);
        assert_eq!(c.status, Status::Fail);
        assert!(c.fix.unwrap().contains("modprobe fuse"));
        assert_eq!(judge_kernel(None, true).status, Status::Warn);
    }

    #[test]
    fn kernel_versions_are_major_and_minor() {
        assert_eq!(kernel_version("6.18.44-fc-v1300"), Some((6, 18)));
        assert_eq!(kernel_version("6.9.0"), Some((6, 9)));
        assert_eq!(kernel_version("5.14.0-427.el9.x86_64"), Some((5, 14)));
        assert_eq!(kernel_version("6"), None);
        assert_eq!(kernel_version(""), None);
        assert!(kernel_version("6.10").unwrap() > (6, 9));
    }

    #[test]
    fn passthrough_says_which_read_path_the_user_gets() {
        let c = judge_passthrough("6.18.1", true, ReadPath::Auto);
        assert_eq!(c.status, Status::Ok);
        let c = judge_passthrough("6.18.1", false, ReadPath::Auto);
        assert_eq!(c.status, Status::Warn);
        assert!(
            c.found.contains("no CAP_SYS_ADMIN") && c.found.contains("cached"),
            "{c:?}"
        );
        assert!(c.fix.unwrap().contains("--run-as"));
        let c = judge_passthrough("5.14.0", true, ReadPath::Passthrough);
        assert!(
            c.found.contains("older than 6.9") && c.found.contains("pread"),
            "{c:?}"
        );
        assert_eq!(
            judge_passthrough("5.14.0", false, ReadPath::Pread).status,
            Status::Ok
        );
    }

    #[test]
    fn fusermount3_matters_to_ordinary_users_only() {
        let p = Path::new("/usr/bin/fusermount3");
        assert_eq!(judge_fusermount(None, None, 0).status, Status::Ok);
        let c = judge_fusermount(None, None, 1000);
        assert_eq!(c.status, Status::Fail);
        assert!(c.fix.unwrap().contains("apt-get install fuse3"));
        let c = judge_fusermount(Some(p), Some((0, 0o755)), 1000);
        assert_eq!(c.status, Status::Fail);
        assert!(c.found.contains("not setuid root"), "{c:?}");
        assert!(c.fix.unwrap().contains("chmod u+s /usr/bin/fusermount3"));
        assert_eq!(
            judge_fusermount(Some(p), Some((0, 0o4755)), 1000).status,
            Status::Ok
        );
    }

    #[test]
    fn an_unopenable_device_names_the_group_fix() {
        let dev = |mode, group: &str, err: Option<&str>| Device {
            mode_gid: Some((mode, 0)),
            group: group.into(),
            open_error: err.map(String::from),
        };
        assert_eq!(
            judge_device(&dev(0o666, "root", None), 1000, "ann").status,
            Status::Ok
        );
        let c = judge_device(&dev(0o600, "root", Some("Permission denied")), 1000, "ann");
        assert_eq!(c.status, Status::Fail);
        let fix = c.fix.unwrap();
        assert!(
            fix.contains("chgrp fuse /dev/fuse; chmod 0660")
                && fix.contains("usermod -aG fuse ann"),
            "{fix}"
        );
        let c = judge_device(&dev(0o660, "fuse", Some("Permission denied")), 1000, "ann");
        assert!(c
            .fix
            .unwrap()
            .starts_with("add the user to the device's group"));
        let none = Device {
            mode_gid: None,
            group: String::new(),
            open_error: Some("x".into()),
        };
        assert!(judge_device(&none, 0, "root")
            .found
            .contains("no /dev/fuse"));
    }
}
