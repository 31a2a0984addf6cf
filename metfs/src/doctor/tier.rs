//! The tier: reachable, and how fast it lists.
//!
//! A POSIX source is walked breadth-first for at most [`Options::list_entries`] entries on a
//! thread of its own, so a hung file system is a timeout, not a hung doctor. An `s3://` source
//! is asked for one page of its listing through the project's S3 tier (`S3Tier`, the same
//! presigned `ListObjectsV2`, error mapping and secret scrubbing as a mount), with its retries
//! and timeouts cut to the doctor's: `catalog_is_current` against an empty catalog of the
//! tier's own URL stops at the first key, which is one request.
//!
//! A mount from a catalog file (`catalog = FILE`) never lists the tier, so neither does its
//! check: on every node of a job it reads the file and asks what the mount asks (its format,
//! its source, one stat or HEAD for staleness), so a source whose directories the user cannot
//! list passes, and a thousand nodes do not undo the one listing per job.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use metfs_tier::catalog::Catalog;
use metfs_tier::s3::S3Tier;
use metfs_tier::{CapacityTier, TierError};

use super::{Check, Options};
use crate::config::MountConfig;

const NAME: &str = "tier";

/// The source's listing, timed.
pub(super) fn listing(cfg: &MountConfig, opts: &Options) -> Check {
    if let Some(file) = &cfg.catalog {
        return catalog_file(cfg, file, opts.timeout);
    }
    if cfg.source.starts_with("s3://") {
        s3(cfg, opts.timeout)
    } else {
        posix(Path::new(&cfg.source), opts.list_entries, opts.timeout)
    }
}

/// A bounded walk's outcome.
#[derive(Debug, Default)]
struct Walk {
    entries: usize,
    files: usize,
    /// Whether the walk saw every entry (it stopped before the bound).
    complete: bool,
    /// The first directory that could not be read, and why.
    error: Option<String>,
}

fn walk(root: &Path, limit: usize) -> Walk {
    let mut w = Walk::default();
    let mut todo = std::collections::VecDeque::from([root.to_path_buf()]);
    while let Some(dir) = todo.pop_front() {
        let rd = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) => {
                w.error
                    .get_or_insert_with(|| format!("{}: {e}", dir.display()));
                continue;
            }
        };
        for e in rd.flatten() {
            if w.entries == limit {
                return w;
            }
            w.entries += 1;
            match e.file_type() {
                Ok(t) if t.is_dir() => todo.push_back(e.path()),
                Ok(t) if t.is_file() || t.is_symlink() => w.files += 1,
                _ => {}
            }
        }
    }
    w.complete = true;
    w
}

fn posix(root: &Path, limit: usize, timeout: Duration) -> Check {
    let (tx, rx) = mpsc::channel();
    let owned: PathBuf = root.to_path_buf();
    let start = Instant::now();
    // Left behind if it hangs (a dead NFS server): the process exits without waiting for it.
    std::thread::spawn(move || {
        let _ = tx.send(walk(&owned, limit));
    });
    match rx.recv_timeout(timeout) {
        Ok(w) => judge_posix(root, &w, start.elapsed()),
        Err(_) => Check::fail(
            NAME,
            format!(
                "{}: the listing did not finish within {} s (a hung file system?)",
                root.display(),
                timeout.as_secs()
            ),
            "check the source's file system on this node (mounted? its server up?)",
        ),
    }
}

fn judge_posix(root: &Path, w: &Walk, took: Duration) -> Check {
    let at = root.display();
    if w.entries == 0 {
        if let Some(e) = &w.error {
            return Check::fail(
                NAME,
                format!("cannot list the source: {e}"),
                "the source directory must be readable and searchable (r-x) by the user",
            );
        }
    }
    if w.complete && w.files == 0 {
        return Check::fail(
            NAME,
            format!("{at} has no files to serve"),
            "--source: the directory that holds the dataset",
        );
    }
    let ms = took.as_secs_f64() * 1e3;
    let rate = w.entries as f64 / took.as_secs_f64().max(1e-6);
    let what = if w.complete {
        format!("all {} entries", w.entries)
    } else {
        format!("the first {} entries", w.entries)
    };
    let found = format!(
        "POSIX {at}: listed {what} ({} files) in {ms:.1} ms ({rate:.0} entries/s)",
        w.files
    );
    match &w.error {
        Some(e) => Check::warn(
            NAME,
            format!("{found}; a directory cannot be read: {e}"),
            "make the dataset's directories readable by the user (its files there are not served)",
        ),
        None => Check::ok(NAME, found),
    }
}

/// The S3 settings with the doctor's bound: two retries, and no timeout beyond the doctor's.
fn bounded(cfg: &MountConfig, timeout: Duration) -> metfs_tier::s3::S3Config {
    let ms = timeout.as_millis().max(1) as u64;
    let mut s3 = cfg.s3.clone();
    s3.retry.max_retries = s3.retry.max_retries.min(2);
    s3.retry.retry_timeout_ms = s3.retry.retry_timeout_ms.min(ms);
    s3.retry.max_backoff_ms = s3.retry.max_backoff_ms.min(500);
    s3.connect_timeout_ms = s3.connect_timeout_ms.min(ms);
    s3.request_timeout_ms = s3.request_timeout_ms.min(ms);
    s3
}

fn s3(cfg: &MountConfig, timeout: Duration) -> Check {
    let tier = match S3Tier::new(&cfg.source, bounded(cfg, timeout)) {
        Ok(t) => t,
        Err(e) => return Check::fail(NAME, e.to_string(), "--source s3://BUCKET/PREFIX"),
    };
    let at = format!(
        "{} at {} (region {})",
        tier.url(),
        tier.endpoint(),
        tier.region()
    );
    let empty = match Catalog::from_entries(tier.url(), std::iter::empty()) {
        Ok(c) => c,
        Err(e) => return Check::fail(NAME, e.to_string(), "report this as a bug"),
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return Check::warn(NAME, format!("{at}: not checked: {e}"), "run it again"),
    };
    let start = Instant::now();
    // One second over the requests' own bound, so their error (which names the cause) wins.
    let outcome = rt.block_on(async {
        tokio::time::timeout(
            timeout + Duration::from_secs(1),
            tier.catalog_is_current(&empty),
        )
        .await
    });
    judge_s3(tier.url(), &at, outcome.ok(), start.elapsed(), timeout)
}

/// What fixes an S3 source that does not answer as it should.
const ENDPOINT_FIX: &str = "check the endpoint (--endpoint, `[s3] endpoint`, METFS_ENDPOINT or \
                            AWS_ENDPOINT_URL), that its server runs and that this node reaches it";

fn judge_s3(
    url: &str,
    at: &str,
    outcome: Option<Result<bool, TierError>>,
    took: Duration,
    timeout: Duration,
) -> Check {
    let ms = took.as_secs_f64() * 1e3;
    // The tier's errors begin with its URL, which `at` already names.
    let said = |e: &TierError| {
        let e = e.to_string();
        e.strip_prefix(&format!("{url}: "))
            .map_or(e.clone(), str::to_string)
    };
    match outcome {
        None => Check::fail(
            NAME,
            format!("{at}: no answer within {} s", timeout.as_secs()),
            ENDPOINT_FIX,
        ),
        Some(Ok(false)) => Check::ok(
            NAME,
            format!("S3 {at}: the first listing page in {ms:.0} ms; the prefix holds objects"),
        ),
        Some(Ok(true)) => Check::fail(
            NAME,
            format!("S3 {at}: no objects under the prefix"),
            "--source: the bucket and prefix that hold the dataset",
        ),
        Some(Err(e @ TierError::Unreachable { .. })) => {
            Check::fail(NAME, format!("{at}: {}", said(&e)), ENDPOINT_FIX)
        }
        Some(Err(e @ TierError::Auth { .. })) => Check::fail(
            NAME,
            format!("{at}: {}", said(&e)),
            "give credentials that may list the bucket (AWS_ACCESS_KEY_ID and \
             AWS_SECRET_ACCESS_KEY, or `[s3]` access_key_id and secret_access_key), and the \
             server's region (--region)",
        ),
        Some(Err(e)) => Check::fail(
            NAME,
            format!("{at}: {}", said(&e)),
            "check --source and the `[s3]` settings (`metfs config --defaults` lists them)",
        ),
    }
}

/// A mount from catalog file `file`: the mount's own reading and checks, no listing.
fn catalog_file(cfg: &MountConfig, file: &Path, timeout: Duration) -> Check {
    let fix = format!(
        "make it again: metfs catalog {} -o {}",
        cfg.source,
        file.display()
    );
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return Check::warn(NAME, format!("not checked: {e}"), "run it again"),
    };
    let start = Instant::now();
    let outcome = rt.block_on(async {
        let tier =
            crate::daemon::open_tier(&cfg.source, &bounded(cfg, timeout), timeout.as_secs())?;
        crate::daemon::mountable_catalog_file(tier.as_ref(), file, cfg).await
    });
    let ms = start.elapsed().as_secs_f64() * 1e3;
    match outcome {
        Ok(n) => Check::ok(
            NAME,
            format!(
                "catalog file {}: {n} samples of {}, current (checked in {ms:.1} ms); the source \
                 is not listed",
                file.display(),
                cfg.source
            ),
        ),
        Err(e) => Check::fail(NAME, e.to_string(), fix),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Status;

    #[test]
    fn a_posix_listing_is_bounded_and_timed() {
        let d = tempfile::tempdir().unwrap();
        for i in 0..5 {
            std::fs::create_dir_all(d.path().join(format!("c{i}"))).unwrap();
            for j in 0..4 {
                std::fs::write(d.path().join(format!("c{i}/f{j}")), b"x").unwrap();
            }
        }
        let w = walk(d.path(), 1000);
        assert!(w.complete && w.entries == 25 && w.files == 20, "{w:?}");
        let w = walk(d.path(), 7);
        assert!(!w.complete && w.entries == 7, "{w:?}");
        let c = judge_posix(d.path(), &w, Duration::from_millis(2));
        assert_eq!(c.status, Status::Ok);
        assert!(c.found.contains("the first 7 entries"), "{c:?}");
        let empty = tempfile::tempdir().unwrap();
        let c = posix(empty.path(), 10, Duration::from_secs(5));
        assert_eq!(c.status, Status::Fail);
        assert!(c.found.contains("no files"), "{c:?}");
    }

    #[test]
    fn s3_outcomes_name_the_endpoint_and_the_fix() {
        let at = "s3://b/p at http://127.0.0.1:9 (region garage)";
        let t = Duration::from_secs(3);
        let c = judge_s3("s3://b/p", at, None, t, t);
        assert_eq!(c.status, Status::Fail);
        assert!(c.found.contains("http://127.0.0.1:9") && c.fix.unwrap().contains("--endpoint"));
        let down = TierError::Unreachable {
            url: "s3://b/p".into(),
            reason: "Connect failure".into(),
        };
        let c = judge_s3("s3://b/p", at, Some(Err(down)), t, t);
        assert!(
            c.found.contains("unreachable") && c.found.contains("127.0.0.1:9"),
            "{c:?}"
        );
        assert_eq!(c.found.matches("s3://b/p").count(), 1, "{c:?}");
        assert_eq!(
            judge_s3("s3://b/p", at, Some(Ok(false)), t, t).status,
            Status::Ok
        );
        assert_eq!(
            judge_s3("s3://b/p", at, Some(Ok(true)), t, t).status,
            Status::Fail
        );
    }
}
