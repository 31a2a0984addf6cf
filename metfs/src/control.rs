//! The control socket: newline-delimited JSON requests, one response line each.
//!
//! The socket is created with mode 0600 (umask set around `bind`), so only the mounting user
//! can steer the mount. Each connection is served by its own task; a request that blocks
//! (`pass_end` with `block`, `advance` with `wait`) blocks only its connection.
//!
//! Lines are read with a hand-rolled bounded reader rather than `tokio_util`'s `LinesCodec`:
//! a framed codec ends the stream after its first error, and the protocol requires that an
//! oversized or non-UTF-8 line gets an error response while the connection stays open. An
//! oversized line is answered once and then skipped up to its newline without buffering it.
//!
//! Limits ([`ControlConfig`](crate::config::ControlConfig), declared with the other settings):
//! at most `max_connections` connections are served at once (a connection beyond them is
//! answered with one `too_many_connections` error line and closed, so a flood of clients costs
//! the daemon neither its file descriptors nor memory), and a connection that sends no complete
//! request line for `idle_timeout_secs` is closed (a client reconnects; the Python client does
//! so by itself). The time a request takes to answer (a
//! blocking `pass_end` or `advance`) is not idle time.

use std::path::Path;
use std::sync::Arc;

use metfs_fs::fs::ViewLease;
use metfs_protocol::{
    parse_request, Answer, Decision, ErrorCode, Left, ProtocolError, Released, Reply, Request,
    ShuttingDown, MAX_LINE_BYTES, VERSION as PROTOCOL_VERSION,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

use crate::daemon::Daemon;
use metfs_feedback::policy::JobSignals;

/// Binds the control socket with mode 0600, replacing a stale socket file.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    if let Ok(md) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if md.file_type().is_socket() {
            // A live daemon holds the cache lock, so a socket here is a dead daemon's.
            std::fs::remove_file(path)?;
        } else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ));
        }
    }
    // SAFETY: umask is process-wide; the daemon binds before it starts other threads that
    // create files, and restores the previous mask right after.
    let old = unsafe { libc::umask(0o177) };
    let l = std::os::unix::net::UnixListener::bind(path);
    unsafe { libc::umask(old) };
    let l = l?;
    l.set_nonblocking(true)?;
    UnixListener::from_std(l)
}

/// Serves connections until the daemon shuts down.
pub async fn serve(listener: UnixListener, daemon: Arc<Daemon>) {
    let limits = daemon.cfg.control.clone();
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let idle = std::time::Duration::from_secs(limits.idle_timeout_secs);
    let mut last_warned: Option<std::time::Instant> = None;
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let Ok(permit) = slots.clone().try_acquire_owned() else {
                    refuse(stream, limits.max_connections);
                    continue;
                };
                let d = daemon.clone();
                tokio::spawn(async move {
                    if let Err(e) = connection(stream, d, idle).await {
                        tracing::debug!(error = %e, "control connection ended");
                    }
                    drop(permit);
                });
            }
            Err(e) => {
                // EMFILE/ENFILE among them: the pending connection waits in the backlog. Said
                // at most once a minute, so that a descriptor shortage does not flood the log.
                if last_warned.is_none_or(|t| t.elapsed() >= std::time::Duration::from_secs(60)) {
                    last_warned = Some(std::time::Instant::now());
                    tracing::warn!(error = %e, "accept failed; retrying every 100 ms");
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

/// Answers a connection over the cap with one error line and closes it. The line goes into a
/// fresh socket's empty send buffer, so the write does not wait; if it cannot be written the
/// client still sees the close.
fn refuse(stream: UnixStream, max: usize) {
    let e = ProtocolError::new(
        ErrorCode::TooManyConnections,
        format!("the daemon already serves {max} connections (control.max_connections); close one or retry later"),
    );
    let mut bytes = serde_json::to_vec(&e.to_reply()).unwrap_or_default();
    bytes.push(b'\n');
    let _ = stream.try_write(&bytes);
    tracing::debug!(max, "control connection refused: too many connections");
}

enum Line {
    Text(String),
    TooLong,
    NotUtf8,
}

/// Reads newline-terminated lines of at most `max` bytes.
struct LineReader {
    buf: Vec<u8>,
    discarding: bool,
    max: usize,
}

impl LineReader {
    async fn next(&mut self, s: &mut (impl AsyncReadExt + Unpin)) -> std::io::Result<Option<Line>> {
        loop {
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                let mut line: Vec<u8> = self.buf.drain(..=i).collect();
                line.pop();
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                if self.discarding {
                    self.discarding = false;
                    continue;
                }
                if line.len() > self.max {
                    return Ok(Some(Line::TooLong));
                }
                return Ok(Some(match String::from_utf8(line) {
                    Ok(t) => Line::Text(t),
                    Err(_) => Line::NotUtf8,
                }));
            }
            if self.buf.len() > self.max {
                self.buf.clear();
                if !self.discarding {
                    self.discarding = true;
                    return Ok(Some(Line::TooLong));
                }
            }
            let mut chunk = [0u8; 8192];
            let n = s.read(&mut chunk).await?;
            if n == 0 {
                return Ok(None);
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

async fn connection(
    stream: UnixStream,
    daemon: Arc<Daemon>,
    idle: std::time::Duration,
) -> std::io::Result<()> {
    let mut conn = Conn {
        lease: None,
        peer_uid: stream.peer_cred().ok().map(|c| c.uid()),
    };
    let (mut rd, mut wr) = stream.into_split();
    let mut reader = LineReader {
        buf: Vec::new(),
        discarding: false,
        max: MAX_LINE_BYTES,
    };
    loop {
        let Ok(line) = tokio::time::timeout(idle, reader.next(&mut rd)).await else {
            tracing::debug!(secs = idle.as_secs(), "control connection idle; closed");
            return Ok(());
        };
        let Some(line) = line? else {
            return Ok(());
        };
        let mut payload = None;
        let response = match line {
            Line::TooLong => ProtocolError::new(
                ErrorCode::LineTooLong,
                format!("request line longer than {MAX_LINE_BYTES} bytes; it was skipped"),
            )
            .into(),
            Line::NotUtf8 => ProtocolError::new(ErrorCode::BadJson, "request is not UTF-8").into(),
            Line::Text(t) if t.trim().is_empty() => continue,
            Line::Text(t) => match parse_request(&t) {
                Err(e) => e.into(),
                Ok(req) => {
                    let shutdown = matches!(req, Request::Shutdown);
                    let (out, after) = match handle(&daemon, req, &mut conn).await {
                        Ok(a) => a,
                        Err(e) => (e.into(), None),
                    };
                    if shutdown {
                        let mut bytes = serde_json::to_vec(&out).unwrap();
                        bytes.push(b'\n');
                        wr.write_all(&bytes).await?;
                        daemon.life().begin_shutdown();
                        return Ok(());
                    }
                    payload = after;
                    out
                }
            },
        };
        let mut bytes = serde_json::to_vec(&response).unwrap();
        bytes.push(b'\n');
        wr.write_all(&bytes).await?;
        if let Some(p) = payload.take() {
            wr.write_all(&p).await?;
        }
    }
}

/// What one connection holds between its requests.
struct Conn {
    /// The lease taken by its last `files` with `direct`; dropped (ending the lease) by
    /// `release`, by a `files` that takes another, or with the connection.
    lease: Option<ViewLease>,
    /// The connecting process's user (`SO_PEERCRED`), when the kernel says.
    peer_uid: Option<u32>,
}

impl Conn {
    /// `release`: ends the lease this connection holds (of `generation`, if it names one).
    fn release(&mut self, generation: Option<u64>) -> Result<Answer, ProtocolError> {
        match (&self.lease, generation) {
            (None, _) => Err(ProtocolError::new(
                ErrorCode::NoLease,
                match generation {
                    Some(g) => format!("`release` of generation {g}: this connection holds no lease (a lease is taken by `files` with `direct`, on the same connection)"),
                    None => "`release`: this connection holds no lease (a lease is taken by `files` with `direct`, on the same connection)".to_string(),
                },
            )),
            (Some(l), Some(g)) if l.view().generation != g => Err(ProtocolError::new(
                ErrorCode::NoLease,
                format!(
                    "`release` of generation {g}: this connection's lease is on generation {}; nothing was released",
                    l.view().generation
                ),
            )),
            (Some(l), _) => {
                let released = l.view().generation;
                // Dropping it ends the lease (and tells the daemon if that drains the view).
                self.lease = None;
                Ok(Answer::Released(Reply::new(Released { released })))
            }
        }
    }

    /// Refuses direct reads to a client that cannot read the cache: another user than the
    /// daemon's own (the cache is private to it) or root. The socket is 0600, so today only
    /// such clients connect at all; the check keeps that true if the socket is ever shared.
    fn may_read_cache(&self, mountpoint: &Path) -> Result<(), ProtocolError> {
        // SAFETY: geteuid has no failure mode and touches no memory.
        let me = unsafe { libc::geteuid() };
        match self.peer_uid {
            Some(uid) if uid == me || uid == 0 => Ok(()),
            uid => Err(ProtocolError::new(
                ErrorCode::NotPermitted,
                format!(
                    "direct reads of the cache are for the daemon's user (uid {me}) or root, not uid {}: read the files through the mount at {}",
                    uid.map_or_else(|| "unknown".to_string(), |u| u.to_string()),
                    mountpoint.display()
                ),
            )),
        }
    }
}

/// Answers one request: the reply, and for a packed `files` list the bytes that follow its line.
/// The daemon answers for its mode (which session a request acts on, whether `hello` joins a
/// shared mount); this shell only parses, dispatches and holds the connection's lease.
async fn handle(
    daemon: &Daemon,
    req: Request,
    conn: &mut Conn,
) -> Result<(Answer, Option<Vec<u8>>), ProtocolError> {
    // Saving the position and unmounting take a while (an fsync on a busy disk: seconds);
    // meanwhile a job must learn at once that this daemon is going, not train on.
    if daemon.life().is_shutting_down() && !matches!(req, Request::Shutdown) {
        return Err(ProtocolError::new(
            ErrorCode::ShuttingDown,
            "the metfs daemon is shutting down",
        ));
    }
    let answer = match req {
        Request::Files {
            job,
            known_generation,
            form,
            direct,
        } => {
            let (view, packed) = if direct {
                conn.may_read_cache(&daemon.surface().mountpoint())?;
                daemon
                    .files_direct(job.as_deref(), known_generation, form, &mut conn.lease)
                    .await?
            } else {
                daemon.files(job.as_deref(), known_generation, form)?
            };
            return Ok((Answer::Files(Reply::new(view)), packed));
        }
        Request::Release { generation } => conn.release(generation),
        Request::Hello {
            version,
            job,
            subset,
            rf_policy,
            rf,
            token,
        } => {
            check_version(version)?;
            let hello = daemon.greet(job, subset, rf_policy, rf, token).await?;
            Ok(Answer::Hello(Reply::new(hello)))
        }
        Request::Leave { job } => {
            daemon.leave(&job).await?;
            Ok(Answer::Left(Reply::new(Left { left: job })))
        }
        Request::Status { job } => Ok(Answer::Status(Box::new(Reply::new(
            daemon.status_for(job.as_deref())?,
        )))),
        Request::PassEnd {
            job,
            metrics,
            block,
            progress,
            fresh_loss,
        } => {
            let name = daemon.session_for(job.as_deref())?;
            let signals = JobSignals {
                progress,
                fresh_loss,
            };
            decision(daemon.pass_end(&name, job, metrics, signals, block).await)
        }
        Request::Advance { wait, job } => {
            let name = daemon.session_for(job.as_deref())?;
            decision(daemon.advance(&name, wait).await)
        }
        Request::Apply {
            epoch,
            mini_epoch,
            wait,
            job,
        } => {
            let name = daemon.session_for(job.as_deref())?;
            decision(daemon.apply(&name, epoch, mini_epoch, wait).await)
        }
        Request::Shutdown => Ok(Answer::ShuttingDown(Reply::new(ShuttingDown {
            shutting_down: true,
        }))),
    };
    answer.map(|a| (a, None))
}

/// Refuses a client that speaks a newer protocol than this daemon.
fn check_version(version: Option<u32>) -> Result<(), ProtocolError> {
    match version {
        Some(v) if v > PROTOCOL_VERSION => Err(ProtocolError::new(
            ErrorCode::UnsupportedVersion,
            format!("client speaks protocol {v}, this daemon speaks {PROTOCOL_VERSION}"),
        )),
        _ => Ok(()),
    }
}

fn decision(d: Result<Decision, ProtocolError>) -> Result<Answer, ProtocolError> {
    d.map(|d| Answer::Decision(Reply::new(d)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn line_reader_bounds_and_recovers() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let long = vec![b'x'; 300];
        tokio::spawn(async move {
            a.write_all(b"{\"op\":\"status\"}\n").await.unwrap();
            a.write_all(&long).await.unwrap();
            a.write_all(b"\n\xff\xfe\nnext\r\n").await.unwrap();
        });
        let mut r = LineReader {
            buf: Vec::new(),
            discarding: false,
            max: 100,
        };
        assert!(
            matches!(r.next(&mut b).await.unwrap(), Some(Line::Text(t)) if t.contains("status"))
        );
        assert!(matches!(r.next(&mut b).await.unwrap(), Some(Line::TooLong)));
        assert!(matches!(r.next(&mut b).await.unwrap(), Some(Line::NotUtf8)));
        assert!(matches!(r.next(&mut b).await.unwrap(), Some(Line::Text(t)) if t == "next"));
        assert!(r.next(&mut b).await.unwrap().is_none());
    }
}
