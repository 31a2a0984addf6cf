//! Control-socket protocol: newline-delimited JSON over a Unix socket.
//!
//! Every request is one JSON object on one line with an `"op"` field; every response is one JSON
//! object on one line with `"ok"`. Failures carry `"error": {"code", "message"}` with a stable
//! machine-readable `code` (see [`ErrorCode`]). A malformed, oversized or unknown request gets an
//! error response and the connection stays open. `hello` returns [`PROTOCOL_VERSION`]; a client
//! that sends `"version"` in `hello` newer than the daemon's gets `unsupported_version`.
//!
//! Requests are parsed in two steps so that errors are precise: first as a JSON object (else
//! `bad_json`), then `op` is looked up (else `unknown_op`), then the fields are checked (else
//! `bad_request` or `bad_metrics`, naming the field).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use thiserror::Error;

/// Version of the protocol spoken by this build. Bumped on incompatible changes.
pub const PROTOCOL_VERSION: u32 = 1;

/// Longest request line the daemon accepts, in bytes. A `pass_end` with a few dozen metrics is
/// well under 4 KiB; 1 MiB leaves room for any honest client and bounds a hostile one.
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// Metrics of one pass, by name. Values are finite numbers.
pub type Metrics = BTreeMap<String, f64>;

/// Stable error codes of failed requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The line is not a JSON object.
    BadJson,
    /// The line is longer than [`MAX_LINE_BYTES`].
    LineTooLong,
    /// The `op` is missing or not known.
    UnknownOp,
    /// A field is missing, has the wrong type or an invalid value.
    BadRequest,
    /// A metric is not a finite number, or a metric the policy needs is missing.
    BadMetrics,
    /// The client speaks a newer protocol than the daemon.
    UnsupportedVersion,
    /// Staging failed and the request cannot be carried out.
    StagingFailed,
    /// The daemon is shutting down.
    ShuttingDown,
    /// The daemon already serves its most concurrent connections; the connection is closed.
    TooManyConnections,
    /// Anything else.
    Internal,
}

/// A request that could not be understood.
#[derive(Debug, Error, Clone, PartialEq)]
#[error("{message}")]
pub struct ProtocolError {
    /// Machine-readable kind.
    pub code: ErrorCode,
    /// Human-readable explanation naming the offending input.
    pub message: String,
}

impl ProtocolError {
    /// Builds an error.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// The response line for this error.
    pub fn to_response(&self) -> Value {
        serde_json::json!({
            "ok": false,
            "error": {"code": self.code, "message": self.message},
        })
    }
}

/// A decision made elsewhere (by rank 0's daemon) that a follower applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Run another pass over the current mini-epoch.
    Repeat,
    /// The view moved (or is to move) to the next mini-epoch.
    Advance,
    /// The policy wants to advance but the next mini-epoch is not staged yet: repeat meanwhile.
    Wait,
}

/// A parsed request.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// Handshake: returns the protocol version and the mount's identity.
    Hello {
        /// Protocol version the client speaks, if it says.
        version: Option<u32>,
        /// Job identity (e.g. model name) used for rf history and per-job state.
        job: Option<String>,
    },
    /// The daemon's state (see the status object in the README).
    Status,
    /// The current view's relative paths and its generation.
    Files,
    /// The end of one pass over the current mini-epoch.
    PassEnd {
        /// Job identity.
        job: Option<String>,
        /// Metrics of the pass.
        metrics: Metrics,
        /// Block until the next mini-epoch is staged when the policy wants to advance.
        block: bool,
    },
    /// Force an advance.
    Advance {
        /// Block until the next mini-epoch is staged and the view has switched.
        wait: bool,
    },
    /// Apply a decision made elsewhere (followers in multi-node jobs): advance to exactly
    /// `mini_epoch` of `epoch`, waiting for staging when `wait`.
    Apply {
        /// Target epoch.
        epoch: u64,
        /// Target mini-epoch index within the epoch.
        mini_epoch: u32,
        /// Block until staged.
        wait: bool,
    },
    /// Unmount and stop the daemon, keeping the cache for a later resume.
    Shutdown,
}

fn field<'a>(obj: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    obj.get(name).filter(|v| !v.is_null())
}

fn opt_bool(obj: &Map<String, Value>, name: &str) -> Result<bool, ProtocolError> {
    match field(obj, name) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(ProtocolError::new(
            ErrorCode::BadRequest,
            format!("field `{name}` must be true or false, got {other}"),
        )),
    }
}

fn opt_string(obj: &Map<String, Value>, name: &str) -> Result<Option<String>, ProtocolError> {
    match field(obj, name) {
        None => Ok(None),
        Some(Value::String(s)) if !s.is_empty() && s.len() <= 256 => Ok(Some(s.clone())),
        Some(other) => Err(ProtocolError::new(
            ErrorCode::BadRequest,
            format!("field `{name}` must be a non-empty string of at most 256 bytes, got {other}"),
        )),
    }
}

fn req_u64(obj: &Map<String, Value>, name: &str) -> Result<u64, ProtocolError> {
    field(obj, name).and_then(Value::as_u64).ok_or_else(|| {
        ProtocolError::new(
            ErrorCode::BadRequest,
            format!("field `{name}` must be a non-negative integer"),
        )
    })
}

/// Checks a metrics object: every value a finite number.
pub fn parse_metrics(value: Option<&Value>) -> Result<Metrics, ProtocolError> {
    let mut out = Metrics::new();
    let obj = match value {
        None | Some(Value::Null) => return Ok(out),
        Some(Value::Object(o)) => o,
        Some(other) => {
            return Err(ProtocolError::new(
                ErrorCode::BadMetrics,
                format!("`metrics` must be an object of name: number, got {other}"),
            ))
        }
    };
    for (k, v) in obj {
        if k.trim().is_empty() {
            return Err(ProtocolError::new(
                ErrorCode::BadMetrics,
                format!("a metric has an empty name (value {v}); every metric needs a name"),
            ));
        }
        match v.as_f64() {
            Some(x) if x.is_finite() => {
                out.insert(k.clone(), x);
            }
            // Serializers write NaN and infinities as null (JSON has no such numbers).
            _ if v.is_null() => {
                return Err(ProtocolError::new(
                    ErrorCode::BadMetrics,
                    format!("metric `{k}` is null: metrics must be finite numbers (a NaN or infinite value is written as null by many JSON encoders, and is not accepted)"),
                ))
            }
            _ => {
                return Err(ProtocolError::new(
                    ErrorCode::BadMetrics,
                    format!("metric `{k}` must be a finite number, got {v}"),
                ))
            }
        }
    }
    Ok(out)
}

/// Parses one request line.
pub fn parse_request(line: &str) -> Result<Request, ProtocolError> {
    let value: Value = serde_json::from_str(line).map_err(|e| {
        ProtocolError::new(
            ErrorCode::BadJson,
            format!("request is not valid JSON: {e}"),
        )
    })?;
    let Value::Object(obj) = value else {
        return Err(ProtocolError::new(
            ErrorCode::BadJson,
            "request must be a JSON object with an `op` field",
        ));
    };
    let op = match obj.get("op") {
        Some(Value::String(s)) => s.as_str(),
        Some(other) => {
            return Err(ProtocolError::new(
                ErrorCode::UnknownOp,
                format!("`op` must be a string, got {other}"),
            ))
        }
        None => {
            return Err(ProtocolError::new(
                ErrorCode::UnknownOp,
                "request has no `op` field",
            ))
        }
    };
    Ok(match op {
        "hello" => Request::Hello {
            version: match field(&obj, "version") {
                None => None,
                Some(v) => Some(v.as_u64().and_then(|v| u32::try_from(v).ok()).ok_or_else(
                    || {
                        ProtocolError::new(
                            ErrorCode::BadRequest,
                            format!("field `version` must be a protocol version number, got {v}"),
                        )
                    },
                )?),
            },
            job: opt_string(&obj, "job")?,
        },
        "status" => Request::Status,
        "files" => Request::Files,
        "pass_end" => Request::PassEnd {
            job: opt_string(&obj, "job")?,
            metrics: parse_metrics(obj.get("metrics"))?,
            block: opt_bool(&obj, "block")?,
        },
        "advance" => Request::Advance {
            wait: opt_bool(&obj, "wait")?,
        },
        "apply" => Request::Apply {
            epoch: req_u64(&obj, "epoch")?,
            mini_epoch: u32::try_from(req_u64(&obj, "mini_epoch")?).map_err(|_| {
                ProtocolError::new(ErrorCode::BadRequest, "field `mini_epoch` is too large")
            })?,
            wait: opt_bool(&obj, "wait")?,
        },
        "shutdown" => Request::Shutdown,
        other => {
            return Err(ProtocolError::new(
                ErrorCode::UnknownOp,
                format!(
                    "unknown op `{}`; known ops: hello, status, files, pass_end, advance, apply, shutdown",
                    other.chars().take(64).collect::<String>()
                ),
            ))
        }
    })
}

/// Wraps a successful response body: adds `"ok": true`.
pub fn ok_response(mut body: Value) -> Value {
    if let Value::Object(ref mut o) = body {
        o.insert("ok".into(), Value::Bool(true));
        body
    } else {
        serde_json::json!({"ok": true, "value": body})
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn metrics_need_a_name_and_a_finite_value() {
        let e = parse_request(r#"{"op":"pass_end","metrics":{"":5}}"#).unwrap_err();
        assert_eq!(e.code, ErrorCode::BadMetrics);
        assert!(e.message.contains("empty name"), "{}", e.message);
        let e = parse_request(r#"{"op":"pass_end","metrics":{"loss":null}}"#).unwrap_err();
        assert_eq!(e.code, ErrorCode::BadMetrics);
        assert!(
            e.message.contains("`loss`") && e.message.contains("NaN"),
            "{}",
            e.message
        );
    }

    #[test]
    fn parses_known_ops() {
        assert_eq!(
            parse_request(r#"{"op":"status"}"#).unwrap(),
            Request::Status
        );
        assert_eq!(
            parse_request(r#"{"op":"pass_end","metrics":{"loss":0.5},"block":true}"#).unwrap(),
            Request::PassEnd {
                job: None,
                metrics: [("loss".to_string(), 0.5)].into_iter().collect(),
                block: true
            }
        );
        assert_eq!(
            parse_request(r#"{"op":"hello","version":1,"job":"resnet"}"#).unwrap(),
            Request::Hello {
                version: Some(1),
                job: Some("resnet".into())
            }
        );
        assert_eq!(
            parse_request(r#"{"op":"advance","wait":true}"#).unwrap(),
            Request::Advance { wait: true }
        );
    }

    #[test]
    fn errors_are_precise() {
        let code = |l: &str| parse_request(l).unwrap_err().code;
        assert_eq!(code("not json"), ErrorCode::BadJson);
        assert_eq!(code("[1,2]"), ErrorCode::BadJson);
        assert_eq!(code(r#"{"x":1}"#), ErrorCode::UnknownOp);
        assert_eq!(code(r#"{"op":"format_disk"}"#), ErrorCode::UnknownOp);
        assert_eq!(
            code(r#"{"op":"advance","wait":"yes"}"#),
            ErrorCode::BadRequest
        );
        let e = parse_request(r#"{"op":"pass_end","metrics":{"loss":"low"}}"#).unwrap_err();
        assert_eq!(e.code, ErrorCode::BadMetrics);
        assert!(e.message.contains("loss"), "{}", e.message);
        assert_eq!(
            code(r#"{"op":"pass_end","metrics":[1]}"#),
            ErrorCode::BadMetrics
        );
        assert_eq!(code(r#"{"op":"apply","epoch":-1}"#), ErrorCode::BadRequest);
    }

    #[test]
    fn error_response_shape() {
        let r = ProtocolError::new(ErrorCode::UnknownOp, "nope").to_response();
        assert_eq!(r["ok"], false);
        assert_eq!(r["error"]["code"], "unknown_op");
        assert_eq!(r["error"]["message"], "nope");
        assert_eq!(ok_response(serde_json::json!({"a": 1}))["ok"], true);
    }

    proptest! {
        /// No input line makes the parser panic, and every failure has a message.
        #[test]
        fn never_panics(line in ".{0,200}") {
            if let Err(e) = parse_request(&line) {
                prop_assert!(!e.message.is_empty());
            }
        }

        /// Any finite metrics map round-trips through JSON.
        #[test]
        fn metrics_roundtrip(m in proptest::collection::btree_map("[a-z_]{1,12}", -1e9f64..1e9, 0..8)) {
            let line = serde_json::json!({"op": "pass_end", "metrics": m}).to_string();
            match parse_request(&line).unwrap() {
                Request::PassEnd { metrics, .. } => prop_assert_eq!(metrics, m),
                other => prop_assert!(false, "parsed as {:?}", other),
            }
        }
    }
}
