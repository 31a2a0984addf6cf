//! Preprocessed mini-epochs: a transform run on each sample while it is staged (paper 001 §V).
//!
//! When preprocessing, not reading, limits training, the slot can hold each sample's
//! *transformed* bytes, so that the rf passes over a mini-epoch skip the work. The transform is
//! a user's program (`--transform CMD`) run as long-lived **workers**: each is started once and
//! then serves any number of samples over its stdin and stdout, so an interpreter (Python)
//! starts once per worker, not once per sample.
//!
//! # Worker protocol
//!
//! Length-prefixed frames, integers big-endian, one request answered by one reply, in order:
//!
//! * request: `u32` length of the sample's relative path, the path (UTF-8), `u64` length of the
//!   sample, the sample's bytes;
//! * reply: one status byte, `u64` length, then the payload: with status `0` the transformed
//!   bytes, with status `1` an error message (UTF-8) saying why this sample cannot be
//!   transformed.
//!
//! A worker reads requests until its stdin closes, then exits. What it writes to stderr goes
//! to the daemon's log. `metfs.transform.serve(fn)` in the Python package implements the
//! worker side.
//!
//! # Failures are per sample
//!
//! A sample is left out of its slot, with the reason, when the transform answers with an
//! error, when its worker exits (crashes) while transforming it, when the worker answers
//! garbage, when the output is larger than the sample's planned footprint (below), or when it
//! takes longer than [`TransformConfig::timeout_secs`]: the worker is then killed. A killed or
//! crashed worker is replaced by a fresh one for the next sample. A failure never fails the
//! slot, so the view always switches; the failures are counted ([`Transformer::failed`],
//! `transform_failed` in status) and listed with the other left-out samples.
//!
//! # Budget
//!
//! A transform may grow or shrink data (a JPEG decoded to an array grows). The plan cuts
//! mini-epochs before anything is transformed, so it plans each sample at
//! [`TransformConfig::growth`] times its source size, in whole blocks, at least one
//! ([`metfs_plan::budget::footprint`] of [`TransformConfig::staged`]); an output larger than
//! that is refused (the sample is left out, the reason says to raise `--transform-growth`), so
//! the cache never holds more than the budget whatever the transform writes. The view shows each file's actual transformed size.
//!
//! # Identity
//!
//! [`TransformConfig::identity`] names the transform: its command line, `--transform-version`,
//! and a CRC-32 of every word of the command that is a file (the program resolved on `PATH`,
//! a script given by path). It is part of the mount's fingerprint, so a changed transform
//! starts over with empty slots and never serves output of the old one. A module run with
//! `python3 -m mod` is not a path on the command line: bump `--transform-version` when it
//! changes.
//!
//! # Names
//!
//! The view shows a sample `a/img.jpg` as `a/img.jpg` followed by
//! [`TransformConfig::suffix`] (default `.npy`: `a/img.jpg.npy`). Modes and times mirror the
//! source sample; the size is the transformed one.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use metfs_plan::budget::{footprint, Staged};
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Errors of the transform.
#[derive(Debug, Error)]
pub enum TransformError {
    /// The command line cannot be used (empty, unbalanced quotes, program not found).
    #[error("transform `{command}`: {reason}")]
    BadCommand { command: String, reason: String },
    /// A worker could not be started.
    #[error("transform `{command}`: starting a worker: {source}")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    /// The worker broke the protocol or its pipe (it crashed, or wrote garbage).
    #[error("transform worker: {0}")]
    Protocol(String),
    /// The transform refused the sample (status 1) with this message.
    #[error("{0}")]
    Refused(String),
    /// The transform took too long on the sample; its worker was killed.
    #[error("timed out after {secs} s; the worker was killed")]
    Timeout { secs: u64 },
    /// The output is larger than the sample's planned footprint.
    #[error("output of {output} bytes exceeds the {limit} bytes planned for it ({growth} times the sample's size, in whole blocks; raise --transform-growth)")]
    TooLarge {
        output: u64,
        limit: u64,
        growth: f64,
    },
}

/// Transform settings (the `[transform]` table of a mount's config file; with the `clap`
/// feature, the `--transform*` flags). No command: samples are staged as they are.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
#[serde(default, deny_unknown_fields)]
pub struct TransformConfig {
    /// Program that transforms each sample while it is staged, run as long-lived workers
    /// speaking the worker protocol on stdin/stdout (docs/TRANSFORM.md), e.g.
    /// `python3 -m mypkg.prep`; split like a shell would, without running a shell
    /// [default: (none)].
    #[cfg_attr(feature = "clap", arg(id = "transform.command", long = "transform"))]
    pub command: Option<String>,
    /// Appended to each sample's name in the view: `img.jpg` is shown as `img.jpg.npy`.
    #[cfg_attr(feature = "clap", arg(id = "transform.suffix", long = "transform-suffix",
        default_value_t = TransformConfig::default().suffix))]
    pub suffix: String,
    /// Seconds a worker may spend on one sample before it is killed and the sample left out
    /// (a fresh worker takes the next). 60 s is far above any per-sample decode, and short
    /// enough that a hang never delays a view switch by much.
    #[cfg_attr(feature = "clap", arg(id = "transform.timeout_secs", long = "transform-timeout-secs",
        default_value_t = TransformConfig::default().timeout_secs))]
    pub timeout_secs: u64,
    /// Workers run at once (each transforms one sample at a time, within the stager's
    /// concurrency) [default: the node's CPUs].
    #[cfg_attr(
        feature = "clap",
        arg(id = "transform.workers", long = "transform-workers")
    )]
    pub workers: Option<usize>,
    /// Most bytes a transformed sample may take, as a multiple of its source size: the plan
    /// budgets each sample at this size, and a larger output is refused.
    #[cfg_attr(feature = "clap", arg(id = "transform.growth", long = "transform-growth",
        default_value_t = TransformConfig::default().growth))]
    pub growth: f64,
    /// Free-form version of the transform, part of its identity: change it to re-stage when
    /// the transform's code changed somewhere its command line does not show (a module run
    /// with `-m`) [default: (none)].
    #[cfg_attr(
        feature = "clap",
        arg(id = "transform.version", long = "transform-version")
    )]
    pub version: Option<String>,
}

impl Default for TransformConfig {
    fn default() -> Self {
        Self {
            command: None,
            suffix: ".npy".into(),
            timeout_secs: 60,
            workers: None,
            growth: 1.0,
            version: None,
        }
    }
}

impl TransformConfig {
    /// The command's words (shell-like splitting, no shell), checked: not empty, and its
    /// program exists (on `PATH` when it has no `/`).
    pub fn argv(&self) -> Result<Option<Vec<String>>, TransformError> {
        let Some(cmd) = &self.command else {
            return Ok(None);
        };
        let bad = |reason: String| TransformError::BadCommand {
            command: cmd.clone(),
            reason,
        };
        let words = shlex::split(cmd).ok_or_else(|| bad("unbalanced quotes".into()))?;
        let Some(prog) = words.first() else {
            return Err(bad("the command is empty".into()));
        };
        if resolve_program(prog).is_none() {
            return Err(bad(format!(
                "command `{prog}` not found{}",
                if prog.contains('/') {
                    " (or not executable)"
                } else {
                    " on PATH"
                }
            )));
        }
        Ok(Some(words))
    }

    /// How a sample is kept in a slot under these settings, for its footprint
    /// ([`metfs_plan::budget::footprint`]): transformed with [`TransformConfig::growth`], or
    /// without a command copied.
    pub fn staged(&self) -> Staged {
        match self.command {
            Some(_) => Staged::Transformed {
                growth: self.growth,
            },
            None => Staged::Copy,
        }
    }

    /// The transform's identity, for the mount's fingerprint (module doc); empty without one.
    pub fn identity(&self) -> String {
        let Ok(Some(words)) = self.argv() else {
            return String::new();
        };
        let mut h = crc32fast::Hasher::new();
        for (i, w) in words.iter().enumerate() {
            let file = if i == 0 {
                resolve_program(w)
            } else {
                Some(PathBuf::from(w)).filter(|p| p.is_file())
            };
            if let Some(bytes) = file.and_then(|p| std::fs::read(p).ok()) {
                h.update(w.as_bytes());
                h.update(&bytes);
            }
        }
        format!(
            "transform:{:?}:{:?}:{:?}:{}:{:08x}",
            words,
            self.suffix,
            self.version,
            self.growth,
            h.finalize()
        )
    }
}

/// Where `prog` is: itself when it holds a `/`, else the first executable of that name on
/// `PATH`.
fn resolve_program(prog: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let exec = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if prog.contains('/') {
        return exec(Path::new(prog)).then(|| PathBuf::from(prog));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(prog))
        .find(|p| exec(p))
}

/// Longest relative path a request carries (the kernel's `PATH_MAX`).
const MAX_PATH: usize = 4096;

/// Writes one request frame.
pub async fn write_request<W: AsyncWrite + Unpin>(
    w: &mut W,
    path: &str,
    data: &[u8],
) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(12 + path.len());
    head.extend_from_slice(&(path.len() as u32).to_be_bytes());
    head.extend_from_slice(path.as_bytes());
    head.extend_from_slice(&(data.len() as u64).to_be_bytes());
    w.write_all(&head).await?;
    w.write_all(data).await?;
    w.flush().await
}

/// Reads one request frame: `None` at a clean end of input (no byte of a new frame).
pub async fn read_request<R: AsyncRead + Unpin>(
    r: &mut R,
) -> Result<Option<(String, Vec<u8>)>, TransformError> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(TransformError::Protocol(e.to_string())),
    }
    let n = u32::from_be_bytes(len) as usize;
    if n > MAX_PATH {
        return Err(TransformError::Protocol(format!(
            "a request's path of {n} bytes is longer than {MAX_PATH}"
        )));
    }
    let mut path = vec![0u8; n];
    read_all(r, &mut path).await?;
    let path = String::from_utf8(path)
        .map_err(|_| TransformError::Protocol("a request's path is not UTF-8".into()))?;
    let data = read_sized(r, u64::MAX).await?;
    Ok(Some((path, data)))
}

/// Writes one reply frame: the output, or an error message.
pub async fn write_reply<W: AsyncWrite + Unpin>(
    w: &mut W,
    reply: Result<&[u8], &str>,
) -> std::io::Result<()> {
    let (status, payload) = match reply {
        Ok(b) => (0u8, b),
        Err(m) => (1u8, m.as_bytes()),
    };
    let mut head = [0u8; 9];
    head[0] = status;
    head[1..].copy_from_slice(&(payload.len() as u64).to_be_bytes());
    w.write_all(&head).await?;
    w.write_all(payload).await?;
    w.flush().await
}

/// Reads one reply frame; an output longer than `limit` bytes is refused before it is read.
pub async fn read_reply<R: AsyncRead + Unpin>(
    r: &mut R,
    limit: u64,
) -> Result<Result<Vec<u8>, String>, TransformError> {
    let mut status = [0u8; 1];
    read_all(r, &mut status).await?;
    match status[0] {
        0 => Ok(Ok(read_sized(r, limit).await?)),
        // Error messages are short; a longer one is cut, not refused.
        1 => {
            let msg = read_sized(r, 1 << 20).await?;
            Ok(Err(String::from_utf8_lossy(&msg).into_owned()))
        }
        s => Err(TransformError::Protocol(format!(
            "reply status {s} (expected 0 or 1)"
        ))),
    }
}

async fn read_all<R: AsyncRead + Unpin>(r: &mut R, buf: &mut [u8]) -> Result<(), TransformError> {
    r.read_exact(buf).await.map(drop).map_err(|e| {
        TransformError::Protocol(if e.kind() == std::io::ErrorKind::UnexpectedEof {
            "its output ended in the middle of a frame (it exited?)".into()
        } else {
            e.to_string()
        })
    })
}

/// Reads a `u64` length and that many bytes, refusing a length above `limit`.
async fn read_sized<R: AsyncRead + Unpin>(
    r: &mut R,
    limit: u64,
) -> Result<Vec<u8>, TransformError> {
    let mut len = [0u8; 8];
    read_all(r, &mut len).await?;
    let n = u64::from_be_bytes(len);
    if n > limit {
        return Err(TransformError::TooLarge {
            output: n,
            limit,
            growth: 0.0,
        });
    }
    // Read in pieces: a length is a claim, not an allocation to trust up front.
    let mut out = Vec::with_capacity(n.min(1 << 20) as usize);
    (&mut *r)
        .take(n)
        .read_to_end(&mut out)
        .await
        .map_err(|e| TransformError::Protocol(e.to_string()))?;
    if out.len() as u64 != n {
        return Err(TransformError::Protocol(
            "its output ended in the middle of a frame (it exited?)".into(),
        ));
    }
    Ok(out)
}

/// One running worker process.
struct Worker {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    stdout: tokio::io::BufReader<tokio::process::ChildStdout>,
}

/// Runs a transform's workers: at most [`TransformConfig::workers`] at once, each started on
/// first need and kept for the next sample. Cheap to clone.
#[derive(Clone)]
pub struct Transformer {
    cfg: TransformConfig,
    argv: Arc<Vec<String>>,
    idle: Arc<Mutex<VecDeque<Worker>>>,
    permits: Arc<tokio::sync::Semaphore>,
    failed: Arc<AtomicU64>,
    transformed: Arc<AtomicU64>,
    restarts: Arc<AtomicU64>,
}

impl Transformer {
    /// A transformer for `cfg`, or `None` when it names no command. Checks the command.
    pub fn new(cfg: &TransformConfig) -> Result<Option<Self>, TransformError> {
        let Some(argv) = cfg.argv()? else {
            return Ok(None);
        };
        let workers = cfg
            .workers
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .max(1);
        Ok(Some(Self {
            cfg: cfg.clone(),
            argv: Arc::new(argv),
            idle: Arc::default(),
            permits: Arc::new(tokio::sync::Semaphore::new(workers)),
            failed: Arc::default(),
            transformed: Arc::default(),
            restarts: Arc::default(),
        }))
    }

    /// The settings.
    pub fn config(&self) -> &TransformConfig {
        &self.cfg
    }

    /// Samples left out because of the transform since it was made.
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    /// Samples transformed since it was made.
    pub fn transformed(&self) -> u64 {
        self.transformed.load(Ordering::Relaxed)
    }

    /// Workers started again after one was killed or crashed.
    pub fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }

    /// The name a sample's transformed copy has in its slot and in the view.
    pub fn staged_name(&self, rel: &str) -> String {
        format!("{rel}{}", self.cfg.suffix)
    }

    fn spawn(&self) -> Result<Worker, TransformError> {
        let mut child = tokio::process::Command::new(&self.argv[0])
            .args(&self.argv[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            // A worker never outlives the request that owns it (a dropped staging run).
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| TransformError::Spawn {
                command: self.cfg.command.clone().unwrap_or_default(),
                source,
            })?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = tokio::io::BufReader::new(child.stdout.take().expect("piped stdout"));
        Ok(Worker {
            child,
            stdin,
            stdout,
        })
    }

    /// Transforms one sample (`rel`, its source size `size` for the output limit): the output,
    /// or why the sample is left out. Never fails the caller otherwise.
    pub async fn apply(&self, rel: &str, data: &[u8]) -> Result<Vec<u8>, TransformError> {
        let r = self.apply_inner(rel, data).await;
        match &r {
            Ok(_) => self.transformed.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.failed.fetch_add(1, Ordering::Relaxed),
        };
        r
    }

    async fn apply_inner(&self, rel: &str, data: &[u8]) -> Result<Vec<u8>, TransformError> {
        let _permit = self.permits.acquire().await.expect("never closed");
        let popped = self.idle.lock().unwrap().pop_front();
        let mut w = match popped {
            Some(w) => w,
            None => self.spawn()?,
        };
        let limit = footprint(data.len() as u64, self.cfg.staged());
        let secs = self.cfg.timeout_secs.max(1);
        let exchange = async {
            write_request(&mut w.stdin, rel, data)
                .await
                .map_err(|e| TransformError::Protocol(format!("writing the sample: {e}")))?;
            read_reply(&mut w.stdout, limit).await
        };
        let r = tokio::time::timeout(Duration::from_secs(secs), exchange).await;
        match r {
            Ok(Ok(Ok(out))) => {
                self.idle.lock().unwrap().push_back(w);
                Ok(out)
            }
            Ok(Ok(Err(msg))) => {
                self.idle.lock().unwrap().push_back(w);
                Err(TransformError::Refused(msg))
            }
            Ok(Err(e)) => {
                // The stream is out of step (or the worker is gone): this worker is done.
                let status = self.retire(w).await;
                Err(match e {
                    TransformError::TooLarge { output, limit, .. } => TransformError::TooLarge {
                        output,
                        limit,
                        growth: self.cfg.growth,
                    },
                    TransformError::Protocol(m) => {
                        TransformError::Protocol(format!("{m}; {status}"))
                    }
                    e => e,
                })
            }
            Err(_) => {
                self.retire(w).await;
                Err(TransformError::Timeout { secs })
            }
        }
    }

    /// Kills a worker and reaps it; says how it ended.
    async fn retire(&self, mut w: Worker) -> String {
        self.restarts.fetch_add(1, Ordering::Relaxed);
        let ended = match w.child.try_wait() {
            Ok(Some(s)) => Some(s),
            _ => {
                // It may be exiting right now: give it a moment before killing it.
                match tokio::time::timeout(Duration::from_millis(100), w.child.wait()).await {
                    Ok(Ok(s)) => Some(s),
                    _ => None,
                }
            }
        };
        match ended {
            Some(s) => format!("the worker exited ({s}); a new one takes the next sample"),
            None => {
                let _ = w.child.kill().await;
                "the worker was killed; a new one takes the next sample".into()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let data: Vec<u8> = (0..70_000u32).map(|i| i as u8).collect();
        let w = {
            let data = data.clone();
            tokio::spawn(async move {
                write_request(&mut a, "d/ü x.jpg", &data).await.unwrap();
                write_request(&mut a, "", b"").await.unwrap();
            })
        };
        let (p, d) = read_request(&mut b).await.unwrap().unwrap();
        assert_eq!((p.as_str(), d.len()), ("d/ü x.jpg", data.len()));
        assert_eq!(d, data);
        assert_eq!(
            read_request(&mut b).await.unwrap().unwrap(),
            (String::new(), vec![])
        );
        w.await.unwrap();
        assert!(read_request(&mut b).await.unwrap().is_none(), "clean end");

        let mut buf = Vec::new();
        write_reply(&mut buf, Ok(b"out")).await.unwrap();
        write_reply(&mut buf, Err("bad jpeg")).await.unwrap();
        assert_eq!(&buf[..9], &[0, 0, 0, 0, 0, 0, 0, 0, 3]);
        let mut r = &buf[..];
        assert_eq!(read_reply(&mut r, 10).await.unwrap(), Ok(b"out".to_vec()));
        assert_eq!(
            read_reply(&mut r, 10).await.unwrap(),
            Err("bad jpeg".to_string())
        );
    }

    #[tokio::test]
    async fn bad_frames_are_errors_not_allocations() {
        // A reply claiming more than the limit is refused before anything is read.
        let mut buf = vec![0u8];
        buf.extend_from_slice(&u64::MAX.to_be_bytes());
        let err = read_reply(&mut &buf[..], 100).await.unwrap_err();
        assert!(
            matches!(err, TransformError::TooLarge { limit: 100, .. }),
            "{err}"
        );
        // An unknown status, a truncated payload, a truncated header.
        let err = read_reply(&mut &[7u8, 0][..], 100).await.unwrap_err();
        assert!(err.to_string().contains("status 7"), "{err}");
        let mut short = vec![0u8];
        short.extend_from_slice(&5u64.to_be_bytes());
        short.extend_from_slice(b"ab");
        let err = read_reply(&mut &short[..], 100).await.unwrap_err();
        assert!(err.to_string().contains("middle of a frame"), "{err}");
        let err = read_reply(&mut &[0u8, 0, 0][..], 100).await.unwrap_err();
        assert!(err.to_string().contains("middle of a frame"), "{err}");
        // A request whose path is too long, and one cut inside its path.
        let err = read_request(&mut &(1u32 << 20).to_be_bytes()[..])
            .await
            .unwrap_err();
        assert!(err.to_string().contains("longer than"), "{err}");
        let mut cut = 4u32.to_be_bytes().to_vec();
        cut.extend_from_slice(b"ab");
        assert!(read_request(&mut &cut[..]).await.is_err());
    }

    #[test]
    fn a_missing_program_is_named() {
        let cfg = TransformConfig {
            command: Some("no-such-transform-xyz --fast".into()),
            ..Default::default()
        };
        let err = cfg.argv().unwrap_err().to_string();
        assert!(err.contains("`no-such-transform-xyz` not found"), "{err}");
        let cfg = TransformConfig {
            command: Some("'unbalanced".into()),
            ..Default::default()
        };
        assert!(cfg.argv().unwrap_err().to_string().contains("quotes"));
    }

    #[test]
    fn identity_follows_the_script_and_the_version() {
        let d = tempfile::tempdir().unwrap();
        let script = d.path().join("t.py");
        std::fs::write(&script, "a").unwrap();
        let cfg = TransformConfig {
            command: Some(format!("sh {}", script.display())),
            ..Default::default()
        };
        let a = cfg.identity();
        std::fs::write(&script, "b").unwrap();
        let b = cfg.identity();
        assert_ne!(a, b, "a changed script is a changed transform");
        let v = TransformConfig {
            version: Some("2".into()),
            ..cfg.clone()
        };
        assert_ne!(b, v.identity());
        assert_eq!(TransformConfig::default().identity(), "");
    }

    #[tokio::test]
    async fn a_worker_serves_many_samples_and_one_that_hangs_is_killed() {
        // A worker that never answers: killed after the timeout.
        let cfg = TransformConfig {
            command: Some("sleep 30".into()),
            timeout_secs: 1,
            workers: Some(1),
            ..Default::default()
        };
        let t = Transformer::new(&cfg).unwrap().unwrap();
        let start = std::time::Instant::now();
        let err = t.apply("x", b"abc").await.unwrap_err();
        assert!(matches!(err, TransformError::Timeout { secs: 1 }), "{err}");
        assert!(start.elapsed() < Duration::from_secs(10));
        assert_eq!((t.failed(), t.restarts()), (1, 1));
        // A worker that exits at once: the sample fails naming the exit, and the next
        // sample gets a fresh worker.
        let cfg = TransformConfig {
            command: Some("true".into()),
            ..cfg
        };
        let t = Transformer::new(&cfg).unwrap().unwrap();
        for _ in 0..2 {
            let err = t.apply("x", b"abc").await.unwrap_err().to_string();
            assert!(err.contains("exited") || err.contains("writing"), "{err}");
        }
        assert_eq!(t.restarts(), 2);
    }
}
