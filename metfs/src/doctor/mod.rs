//! `metfs doctor`: whether this node can run a mount of these settings, for the user who asks,
//! and for each thing that would stop it, what fixes it.
//!
//! A mount fails late and one reason at a time: the kernel's FUSE, `fusermount3`, `/dev/fuse`'s
//! mode, the cache's free space and the tier all show only when the mount reaches them, some
//! in the daemon's log. The doctor looks at all of them at once, before anything is mounted,
//! staged or written, and says which read path the user will get.
//!
//! # Design
//!
//! * **The same input as a mount.** The settings are the mount's own (`MountSettings` through
//!   `Layers` and [`MountConfig::resolve`], in the binary), and [`Target::new`] refuses what a
//!   mount refuses before it touches FUSE, with the mount's own functions
//!   ([`daemon::check_places`], [`daemon::open_tier`]): bad input reads the same either way,
//!   and the doctor never passes a layout the mount would refuse.
//! * **Facts, then judgement.** Each check reads its facts from the system (`/proc`,
//!   `statfs`, an `open`, a listing, a child Python) and hands them to a pure function that
//!   says ok, warn or fail, what was found and what fixes it; the unit tests drive the pure
//!   parts (parsing `/proc`, naming file systems, comparing versions, each verdict's text).
//! * **Read-only and bounded.** Nothing is created, changed or mounted: `/dev/fuse` is opened
//!   and closed, the cache's lock is tested with a shared lock that is dropped at once, the
//!   tier lists a bounded number of entries (a POSIX source) or one page (S3) under a timeout,
//!   and the Python child is killed at the same timeout.
//! * **One verdict.** A failing check means a mount would fail ([`Report::exit_code`] 1); a
//!   warning (a network cache, no passthrough, no Python package) is a mount that works less
//!   well. Bad input is the caller's exit status 2.
//!
//! Layout: `fuse` (the kernel's FUSE, `fusermount3`, `/dev/fuse`, passthrough), `cache` (the
//! cache directory, its file system and free space), `tier` (the source's listing), `python`
//! (the package's version against the binary's).

mod cache;
mod fuse;
mod python;
mod tier;

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;
use thiserror::Error;

use crate::config::MountConfig;
use crate::daemon::{self, DaemonError};

/// The binary's version, which the Python package must match.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Why the doctor cannot check these settings: the same input a mount would refuse.
#[derive(Debug, Error)]
pub enum DoctorError {
    /// The cache, the source or their layout, as the mount reports it.
    #[error(transparent)]
    Input(Box<DaemonError>),
}

impl From<DaemonError> for DoctorError {
    fn from(e: DaemonError) -> Self {
        Self::Input(Box::new(e))
    }
}

/// A check's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Nothing to do.
    Ok,
    /// A mount works, less well than it could.
    Warn,
    /// A mount would fail.
    Fail,
}

impl Status {
    /// How the text report prints it.
    pub fn label(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
        }
    }
}

/// One check: its name, verdict, what it found and (when not ok) what fixes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// Short and stable (`fuse-kernel`, `cache-space`, ...), for scripts reading `--json`.
    pub name: &'static str,
    /// The verdict.
    pub status: Status,
    /// What was found, in a sentence.
    pub found: String,
    /// What to do about it.
    pub fix: Option<String>,
}

impl Check {
    fn ok(name: &'static str, found: impl Into<String>) -> Self {
        Self {
            name,
            status: Status::Ok,
            found: found.into(),
            fix: None,
        }
    }

    fn warn(name: &'static str, found: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            name,
            status: Status::Warn,
            found: found.into(),
            fix: Some(fix.into()),
        }
    }

    fn fail(name: &'static str, found: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            name,
            status: Status::Fail,
            found: found.into(),
            fix: Some(fix.into()),
        }
    }
}

/// What the doctor checks: a mount's resolved settings, checked as the mount checks them.
#[derive(Debug, Clone)]
pub struct Target {
    cfg: MountConfig,
}

impl Target {
    /// Refuses what a mount refuses before it starts: a cache that is not a directory,
    /// overlapping places, a source that cannot be opened (a missing directory, an unknown
    /// scheme, a malformed `s3://` address). Sends no request to a tier.
    pub fn new(cfg: MountConfig) -> Result<Self, DoctorError> {
        // No mountpoint: the empty path resolves to nothing and is left out of the overlaps.
        daemon::check_places(&cfg, std::path::Path::new(""))?;
        daemon::open_tier(&cfg.source, &cfg.s3, cfg.stager.timeout_secs)?;
        Ok(Self { cfg })
    }
}

/// How the checks run.
#[derive(Debug, Clone)]
pub struct Options {
    /// The Python whose `metfs` package is compared (a name looked up on `PATH`, or a path).
    pub python: PathBuf,
    /// The longest the tier's listing and the Python child may take, each.
    pub timeout: Duration,
    /// Entries a POSIX source's timed listing reads at most.
    pub list_entries: usize,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            python: PathBuf::from("python3"),
            timeout: Duration::from_secs(10),
            list_entries: 1000,
        }
    }
}

/// Every check's verdict, and who asked.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The binary's version.
    pub version: &'static str,
    /// The effective uid the checks ran as.
    pub uid: u32,
    /// Its user's name (the uid where it has none).
    pub user: String,
    /// Whether a mount would work (no check failed).
    pub ok: bool,
    /// The checks, in the order they ran.
    pub checks: Vec<Check>,
}

impl Report {
    /// 0 when a mount would work (warnings allowed), 1 when a check failed.
    pub fn exit_code(&self) -> i32 {
        i32::from(!self.ok)
    }

    /// One line per check (status, name, what was found, the fix) and a last line with the
    /// verdict.
    pub fn text(&self) -> String {
        let mut out = format!(
            "metfs {} doctor, as {} (uid {})\n",
            self.version, self.user, self.uid
        );
        for c in &self.checks {
            out.push_str(&format!("{:<4} {}: {}", c.status.label(), c.name, c.found));
            if let Some(fix) = &c.fix {
                out.push_str(&format!(" -- fix: {fix}"));
            }
            out.push('\n');
        }
        let count = |s| self.checks.iter().filter(|c| c.status == s).count();
        let (fails, warns) = (count(Status::Fail), count(Status::Warn));
        out.push_str(&if fails > 0 {
            format!("a mount would fail: {fails} check(s) failed, {warns} warning(s)\n")
        } else {
            format!("a mount would work: {warns} warning(s)\n")
        });
        out
    }
}

/// Runs every check as this process's user.
pub fn run(target: &Target, opts: &Options) -> Report {
    let cfg = &target.cfg;
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let user = user_name(uid);
    let node = crate::mount::FuseNode::probe();
    let checks = vec![
        fuse::kernel(),
        fuse::fusermount(&node),
        fuse::device(uid, &user),
        fuse::passthrough(cfg.read_path),
        cache::directory(&cfg.cache),
        cache::file_system(&cfg.cache),
        cache::space(&cfg.cache, cfg.budget),
        tier::listing(cfg, opts),
        python::package(opts),
    ];
    Report {
        version: VERSION,
        uid,
        user,
        ok: checks.iter().all(|c| c.status != Status::Fail),
        checks,
    }
}

/// The user's name, or the uid as text where it has none.
fn user_name(uid: u32) -> String {
    crate::runas::lookup(&uid.to_string())
        .map(|u| u.name)
        .unwrap_or_else(|_| uid.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_has_one_line_per_check_and_the_verdict() {
        let r = Report {
            version: VERSION,
            uid: 1000,
            user: "ann".into(),
            ok: false,
            checks: vec![
                Check::ok("fuse-kernel", "fuse in /proc/filesystems"),
                Check::warn("passthrough", "no CAP_SYS_ADMIN", "run as root"),
                Check::fail("cache-space", "1 MiB free", "lower --budget"),
            ],
        };
        let t = r.text();
        assert_eq!(t.lines().count(), 5, "{t}");
        assert!(
            t.contains("\nok   fuse-kernel: fuse in /proc/filesystems\n"),
            "{t}"
        );
        assert!(
            t.contains("\nFAIL cache-space: 1 MiB free -- fix: lower --budget\n"),
            "{t}"
        );
        assert!(
            t.ends_with("a mount would fail: 1 check(s) failed, 1 warning(s)\n"),
            "{t}"
        );
        assert_eq!(r.exit_code(), 1);
        let j = serde_json::to_value(&r).unwrap();
        assert_eq!(j["checks"][1]["status"], "warn");
        assert_eq!(j["checks"][0]["fix"], serde_json::Value::Null);
        assert_eq!(j["ok"], false);
    }
}
