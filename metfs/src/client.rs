//! A small blocking client of the control socket, for the CLI.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

use serde::de::DeserializeOwned;
use thiserror::Error;

use metfs_protocol::{read_reply, Envelope, ErrorCode, FilesForm, FilesView, Request};

/// Errors of the CLI client.
#[derive(Debug, Error)]
pub enum ClientError {
    /// The socket could not be reached.
    #[error("cannot reach the metfs daemon at {path}: {source} (is the mount up? check `metfs status --socket PATH` and the daemon log)")]
    Connect {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The connection broke.
    #[error("control socket {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The daemon answered with an error.
    #[error("{code}: {message}")]
    Daemon { code: String, message: String },
    /// The daemon answered something that is not a reply of this protocol version.
    #[error("control socket {path}: {line}")]
    Malformed { path: String, line: String },
}

/// Sends one request and reads the reply as `T` (the op's answer in [`metfs_protocol`]).
/// A reply of another protocol version, or one that does not fit `T`, is `Malformed` with the
/// reason; a failed request is `Daemon` with the daemon's code and message.
pub fn request<T: DeserializeOwned>(socket: &Path, req: &Request) -> Result<T, ClientError> {
    exchange(socket, req).map(|(reply, _)| reply)
}

/// The current view's files, asked for packed ([`metfs_protocol::PackedList`]) so that a large view costs no
/// JSON string per file; `files` is filled from the bytes after the reply's line.
pub fn files(socket: &Path, job: Option<String>) -> Result<FilesView, ClientError> {
    let req = Request::Files {
        job,
        known_generation: None,
        form: FilesForm::Packed,
        // A lease ends with this one-shot connection, so direct paths would be unguarded.
        direct: false,
    };
    let (mut view, mut rd): (FilesView, _) = exchange(socket, &req)?;
    let p = socket.display().to_string();
    if let Some(packed) = view.packed.take() {
        let len = usize::try_from(packed.bytes).map_err(|_| ClientError::Malformed {
            path: p.clone(),
            line: format!("packed list of {} bytes", packed.bytes),
        })?;
        let mut bytes = vec![0u8; len];
        rd.read_exact(&mut bytes)
            .map_err(|source| ClientError::Io {
                path: p.clone(),
                source,
            })?;
        view.files = packed
            .unpack(view.count, &bytes)
            .map_err(|line| ClientError::Malformed { path: p, line })?;
    }
    Ok(view)
}

fn exchange<T: DeserializeOwned>(
    socket: &Path,
    req: &Request,
) -> Result<(T, BufReader<UnixStream>), ClientError> {
    let p = socket.display().to_string();
    let mut s = UnixStream::connect(socket).map_err(|source| ClientError::Connect {
        path: p.clone(),
        source,
    })?;
    let mut line = serde_json::to_vec(&Envelope::new(req)).expect("requests serialize");
    line.push(b'\n');
    s.write_all(&line).map_err(|source| ClientError::Io {
        path: p.clone(),
        source,
    })?;
    let mut rd = BufReader::new(s);
    let mut resp = String::new();
    rd.read_line(&mut resp).map_err(|source| ClientError::Io {
        path: p.clone(),
        source,
    })?;
    let reply = read_reply(&resp).map_err(|e| match e.code {
        ErrorCode::BadResponse | ErrorCode::UnsupportedVersion => ClientError::Malformed {
            path: p,
            line: e.message,
        },
        code => ClientError::Daemon {
            code: code.name().to_string(),
            message: e.message,
        },
    })?;
    Ok((reply, rd))
}
