//! A small blocking client of the control socket, for the CLI.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

use serde_json::Value;
use thiserror::Error;

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
    /// The daemon answered something that is not a response.
    #[error("control socket {path}: malformed response: {line}")]
    Malformed { path: String, line: String },
}

/// Sends one request and returns the response body (with `ok` removed).
pub fn request(socket: &Path, req: &Value) -> Result<Value, ClientError> {
    let p = socket.display().to_string();
    let mut s = UnixStream::connect(socket).map_err(|source| ClientError::Connect {
        path: p.clone(),
        source,
    })?;
    let mut line = serde_json::to_vec(req).expect("requests serialize");
    line.push(b'\n');
    s.write_all(&line).map_err(|source| ClientError::Io {
        path: p.clone(),
        source,
    })?;
    let mut resp = String::new();
    BufReader::new(&s)
        .read_line(&mut resp)
        .map_err(|source| ClientError::Io {
            path: p.clone(),
            source,
        })?;
    let mut v: Value = serde_json::from_str(&resp).map_err(|_| ClientError::Malformed {
        path: p.clone(),
        line: resp.trim().to_string(),
    })?;
    match v.get("ok").and_then(Value::as_bool) {
        Some(true) => {
            if let Value::Object(o) = &mut v {
                o.remove("ok");
            }
            Ok(v)
        }
        Some(false) => Err(ClientError::Daemon {
            code: v["error"]["code"]
                .as_str()
                .unwrap_or("internal")
                .to_string(),
            message: v["error"]["message"].as_str().unwrap_or("").to_string(),
        }),
        None => Err(ClientError::Malformed {
            path: p,
            line: resp.trim().to_string(),
        }),
    }
}
