//! Requests: what a client sends, one JSON object per line with an `"op"` field.
//!
//! A malformed, oversized or unknown request gets an error reply and the connection stays
//! open. Requests are parsed by hand, in steps, so that errors are precise: first as a JSON
//! object (else `bad_json`), then its `"v"` (a major version other than [`VERSION`] is
//! `unsupported_version`; a request without `"v"` is read as version 1, what clients sent
//! before the field existed), then `op` is looked up (else `unknown_op`), then the fields are
//! checked (else `bad_request` or `bad_metrics`, naming the field). serde's derived reader
//! would name neither the op nor the metric. The same [`Request`] type derives `Serialize`
//! and the schema, for clients and `docs/protocol.schema.json`; a test checks that the two
//! agree on every op.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use thiserror::Error;

pub use metfs_feedback::Metrics;

use super::{ErrorBody, ErrorReply, PolicyKind, Version, VERSION};

/// Longest request line the daemon accepts, in bytes. A `pass_end` with a few dozen metrics is
/// well under 4 KiB; 1 MiB leaves room for any honest client and bounds a hostile one.
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// Stable error codes of failed requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
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
    /// The message is of a protocol version the reader does not speak.
    UnsupportedVersion,
    /// Staging failed and the request cannot be carried out.
    StagingFailed,
    /// The daemon is shutting down.
    ShuttingDown,
    /// The daemon already serves its most concurrent connections; the connection is closed.
    TooManyConnections,
    /// The client may not read the cache directly (`files` with `direct` from a user other than
    /// the daemon's own or root): it reads through the mount.
    NotPermitted,
    /// `release` of a lease this connection does not hold.
    NoLease,
    /// Anything else.
    Internal,
    /// Said by a client, never by the daemon: a reply that does not fit the protocol.
    BadResponse,
}

impl ErrorCode {
    /// The protocol's name of the code (`bad_request`, ...).
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::BadJson => "bad_json",
            ErrorCode::LineTooLong => "line_too_long",
            ErrorCode::UnknownOp => "unknown_op",
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::BadMetrics => "bad_metrics",
            ErrorCode::UnsupportedVersion => "unsupported_version",
            ErrorCode::StagingFailed => "staging_failed",
            ErrorCode::ShuttingDown => "shutting_down",
            ErrorCode::TooManyConnections => "too_many_connections",
            ErrorCode::NotPermitted => "not_permitted",
            ErrorCode::NoLease => "no_lease",
            ErrorCode::Internal => "internal",
            ErrorCode::BadResponse => "bad_response",
        }
    }
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

    /// The reply for this error.
    pub fn to_reply(&self) -> ErrorReply {
        ErrorReply {
            v: Version,
            ok: false,
            error: ErrorBody {
                code: self.code,
                message: self.message.clone(),
            },
        }
    }
}

/// The part of the source a job of a shared mount reads: exactly one of `manifest`,
/// `labels` or `fraction`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Subset {
    /// A file on the node listing the samples' relative paths, one per line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub manifest: Option<String>,
    /// The samples of these labels (classes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub labels: Option<Vec<String>>,
    /// This fraction of the samples (0 < f <= 1), drawn with `seed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fraction: Option<f64>,
    /// Seed of the `fraction` draw (default 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

fn parse_subset(obj: &Map<String, Value>) -> Result<Option<Subset>, ProtocolError> {
    let bad = |m: String| ProtocolError::new(ErrorCode::BadRequest, m);
    let Some(v) = field(obj, "subset") else {
        return Ok(None);
    };
    let Value::Object(o) = v else {
        return Err(bad(format!(
            "field `subset` must be an object with one of `manifest`, `labels` or `fraction`, got {v}"
        )));
    };
    for k in o.keys() {
        if !["manifest", "labels", "fraction", "seed"].contains(&k.as_str()) {
            return Err(bad(format!(
                "field `subset.{k}` is not known; a subset has one of `manifest`, `labels` or `fraction` (with `seed`)"
            )));
        }
    }
    let manifest = opt_string(o, "manifest").map_err(|e| bad(format!("subset: {e}")))?;
    let labels = match field(o, "labels") {
        None => None,
        Some(Value::Array(a)) if !a.is_empty() && a.len() <= 100_000 => Some(
            a.iter()
                .map(|x| match x {
                    Value::String(s) if !s.is_empty() => Ok(s.clone()),
                    other => Err(bad(format!(
                        "field `subset.labels` must hold non-empty strings, got {other}"
                    ))),
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
        Some(other) => {
            return Err(bad(format!(
                "field `subset.labels` must be a non-empty list of label names, got {other}"
            )))
        }
    };
    let fraction = match field(o, "fraction") {
        None => None,
        Some(x) => match x.as_f64() {
            Some(f) if f > 0.0 && f <= 1.0 => Some(f),
            _ => {
                return Err(bad(format!(
                    "field `subset.fraction` must be a number above 0 and at most 1, got {x}"
                )))
            }
        },
    };
    let seed = match field(o, "seed") {
        None => None,
        Some(x) => Some(x.as_u64().ok_or_else(|| {
            bad(format!(
                "field `subset.seed` must be a non-negative integer, got {x}"
            ))
        })?),
    };
    let given = [manifest.is_some(), labels.is_some(), fraction.is_some()]
        .iter()
        .filter(|b| **b)
        .count();
    if given != 1 {
        return Err(bad(format!(
            "field `subset` must have exactly one of `manifest`, `labels` or `fraction`, got {given}"
        )));
    }
    Ok(Some(Subset {
        manifest,
        labels,
        fraction,
        seed,
    }))
}

fn opt_u32(obj: &Map<String, Value>, name: &str) -> Result<Option<u32>, ProtocolError> {
    match field(obj, name) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|x| u32::try_from(x).ok())
            .filter(|x| *x >= 1)
            .map(Some)
            .ok_or_else(|| {
                ProtocolError::new(
                    ErrorCode::BadRequest,
                    format!("field `{name}` must be a positive integer, got {v}"),
                )
            }),
    }
}

/// How a `files` reply carries the view's list.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FilesForm {
    /// In the reply's JSON line, as `files`: simple, and what every client understands.
    #[default]
    List,
    /// As raw bytes after the reply's line ([`PackedList`](crate::PackedList)): no JSON to build
    /// or parse, and a client can keep it as one buffer instead of a string per file.
    Packed,
}

impl FilesForm {
    fn is_list(&self) -> bool {
        *self == FilesForm::List
    }
}

/// A request. Serialized with its `op`; read by [`parse_request`].
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Handshake: returns the protocol version and the mount's identity.
    Hello {
        /// Protocol version the client speaks, if it says.
        #[serde(skip_serializing_if = "Option::is_none")]
        version: Option<u32>,
        /// Job identity (e.g. model name) used for rf history and per-job state. On a shared
        /// mount (`--share`) the job joins under this name.
        #[serde(skip_serializing_if = "Option::is_none")]
        job: Option<String>,
        /// Shared mount: the part of the source the job reads (default: all of it).
        #[serde(skip_serializing_if = "Option::is_none")]
        subset: Option<Subset>,
        /// Shared mount: the job's rf policy (`fixed`, `score`, `bollinger`), instead of the
        /// mount's.
        #[serde(skip_serializing_if = "Option::is_none")]
        rf_policy: Option<PolicyKind>,
        /// Shared mount: the job's rf (the fixed rf, or the adaptive policies' start).
        #[serde(skip_serializing_if = "Option::is_none")]
        rf: Option<u32>,
        /// Shared mount: the token of an earlier `hello` of this job (a reconnection).
        #[serde(skip_serializing_if = "Option::is_none")]
        token: Option<String>,
    },
    /// A job leaves a shared mount: its view goes and its share is released.
    Leave {
        /// The job.
        job: String,
    },
    /// The daemon's state (see the status object in the README).
    Status {
        /// Shared mount: the job whose position to report.
        #[serde(skip_serializing_if = "Option::is_none")]
        job: Option<String>,
    },
    /// The current view's relative paths and its generation.
    Files {
        /// Shared mount: the job whose view to list.
        #[serde(skip_serializing_if = "Option::is_none")]
        job: Option<String>,
        /// The generation of the list the client already holds: when it is still the view's,
        /// the reply says `unchanged` and carries no list, so a pass over an unchanged view
        /// costs one short round trip whatever the view's size.
        #[serde(skip_serializing_if = "Option::is_none")]
        known_generation: Option<u64>,
        /// How the list travels: in the JSON line (`list`, the default) or as raw bytes after
        /// it (`packed`, see [`PackedList`](crate::PackedList)).
        #[serde(default, skip_serializing_if = "FilesForm::is_list")]
        form: FilesForm,
        /// Also say where the view's files lie in the cache (`direct_root` in the reply), so
        /// the client can read the slot's files directly, bypassing FUSE, and take a lease on
        /// the view: until the lease ends its slot is not evicted. The lease is this
        /// connection's and ends at its next `files` (which takes one on the view it names),
        /// at `release`, or when the connection closes (the daemon also closes a connection
        /// silent for `control.idle_timeout_secs`). Only for a client of the daemon's own user
        /// or root: the cache is theirs.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        direct: bool,
    },
    /// Ends this connection's lease (taken by `files` with `direct`): the client reads no
    /// more slot files directly.
    Release {
        /// The leased generation the client means to release; when given, a lease on another
        /// generation (or none) is an error and nothing is released.
        #[serde(skip_serializing_if = "Option::is_none")]
        generation: Option<u64>,
    },
    /// The end of one pass over the current mini-epoch.
    PassEnd {
        /// Job identity.
        #[serde(skip_serializing_if = "Option::is_none")]
        job: Option<String>,
        /// Metrics of the pass.
        metrics: Metrics,
        /// Block until the next mini-epoch is staged when the policy wants to advance.
        block: bool,
        /// The elapsed fraction of the job's budget (passes, samples or epochs, as the job
        /// counts it), in [0, 1]: lets a policy grow rf as training progresses.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(with = "f64", range(min = 0.0, max = 1.0))]
        progress: Option<f64>,
        /// The fresh-data loss: the loss of the first batches of this mini-epoch's first pass,
        /// computed before they were trained on (a held-out signal; sent with a first pass). A
        /// finite number; the validation loss travels as the metric `val_loss`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(with = "f64")]
        fresh_loss: Option<f64>,
    },
    /// Force an advance.
    Advance {
        /// Block until the next mini-epoch is staged and the view has switched.
        wait: bool,
        /// Shared mount: the job.
        #[serde(skip_serializing_if = "Option::is_none")]
        job: Option<String>,
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
        /// Shared mount: the job.
        #[serde(skip_serializing_if = "Option::is_none")]
        job: Option<String>,
    },
    /// Unmount and stop the daemon, keeping the cache for a later resume.
    Shutdown,
}

fn field<'a>(obj: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    obj.get(name).filter(|v| !v.is_null())
}

fn opt_generation(obj: &Map<String, Value>, name: &str) -> Result<Option<u64>, ProtocolError> {
    match field(obj, name) {
        None => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| {
            ProtocolError::new(
                ErrorCode::BadRequest,
                format!("field `{name}` must be a non-negative integer, got {v}"),
            )
        }),
    }
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

/// An optional rf policy `name`, spelled as `--rf-policy` spells it.
fn opt_policy(obj: &Map<String, Value>, name: &str) -> Result<Option<PolicyKind>, ProtocolError> {
    match field(obj, name) {
        None => Ok(None),
        Some(v) => PolicyKind::deserialize(v).map(Some).map_err(|_| {
            ProtocolError::new(
                ErrorCode::BadRequest,
                format!(
                    "field `{name}` must be one of fixed, score, bollinger, learned, paced; got {}",
                    v.to_string().chars().take(64).collect::<String>()
                ),
            )
        }),
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

/// An optional finite number `name`, within `range` when given. An explicit `null` is refused:
/// it is how many JSON encoders write NaN or an infinity.
fn opt_finite(
    obj: &Map<String, Value>,
    name: &str,
    range: Option<std::ops::RangeInclusive<f64>>,
) -> Result<Option<f64>, ProtocolError> {
    let bad = |why: String| {
        Err(ProtocolError::new(
            ErrorCode::BadMetrics,
            format!("field `{name}` {why}"),
        ))
    };
    match obj.get(name) {
        None => Ok(None),
        Some(Value::Null) => bad("is null: it must be a finite number (NaN and infinities are written as null by many JSON encoders)".into()),
        Some(v) => match v.as_f64() {
            Some(x) if !x.is_finite() => bad(format!("must be a finite number, got {v}")),
            Some(x) => match range {
                Some(r) if !r.contains(&x) => {
                    bad(format!("must lie in [{}, {}], got {x}", r.start(), r.end()))
                }
                _ => Ok(Some(x)),
            },
            None => bad(format!("must be a finite number, got {v}")),
        },
    }
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

/// A request line as a JSON object of this protocol's version.
fn request_object(line: &str) -> Result<serde_json::Map<String, Value>, ProtocolError> {
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
    if let Some(v) = obj.get("v") {
        if v.as_u64() != Some(u64::from(VERSION)) {
            return Err(ProtocolError::new(
                ErrorCode::UnsupportedVersion,
                format!("request is protocol version {v}; this daemon speaks version {VERSION}"),
            ));
        }
    }
    Ok(obj)
}

/// A request's `op`.
fn op_of(obj: &serde_json::Map<String, Value>) -> Result<&str, ProtocolError> {
    match obj.get("op") {
        Some(Value::String(s)) => Ok(s.as_str()),
        Some(other) => Err(ProtocolError::new(
            ErrorCode::UnknownOp,
            format!("`op` must be a string, got {other}"),
        )),
        None => Err(ProtocolError::new(
            ErrorCode::UnknownOp,
            "request has no `op` field",
        )),
    }
}

/// Parses one request line.
pub fn parse_request(line: &str) -> Result<Request, ProtocolError> {
    let obj = request_object(line)?;
    let op = op_of(&obj)?;
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
            subset: parse_subset(&obj)?,
            rf_policy: opt_policy(&obj, "rf_policy")?,
            rf: opt_u32(&obj, "rf")?,
            token: opt_string(&obj, "token")?,
        },
        "leave" => Request::Leave {
            job: opt_string(&obj, "job")?.ok_or_else(|| {
                ProtocolError::new(ErrorCode::BadRequest, "`leave` needs the field `job`")
            })?,
        },
        "status" => Request::Status {
            job: opt_string(&obj, "job")?,
        },
        "files" => Request::Files {
            job: opt_string(&obj, "job")?,
            known_generation: opt_generation(&obj, "known_generation")?,
            form: match field(&obj, "form") {
                None => FilesForm::List,
                Some(Value::String(s)) if s == "list" => FilesForm::List,
                Some(Value::String(s)) if s == "packed" => FilesForm::Packed,
                Some(other) => {
                    return Err(ProtocolError::new(
                        ErrorCode::BadRequest,
                        format!("field `form` must be \"list\" or \"packed\", got {other}"),
                    ))
                }
            },
            direct: opt_bool(&obj, "direct")?,
        },
        "release" => Request::Release {
            generation: opt_generation(&obj, "generation")?,
        },
        "pass_end" => Request::PassEnd {
            job: opt_string(&obj, "job")?,
            metrics: parse_metrics(obj.get("metrics"))?,
            block: opt_bool(&obj, "block")?,
            progress: opt_finite(&obj, "progress", Some(0.0..=1.0))?,
            fresh_loss: opt_finite(&obj, "fresh_loss", None)?,
        },
        "advance" => Request::Advance {
            wait: opt_bool(&obj, "wait")?,
            job: opt_string(&obj, "job")?,
        },
        "apply" => Request::Apply {
            epoch: req_u64(&obj, "epoch")?,
            mini_epoch: u32::try_from(req_u64(&obj, "mini_epoch")?).map_err(|_| {
                ProtocolError::new(ErrorCode::BadRequest, "field `mini_epoch` is too large")
            })?,
            wait: opt_bool(&obj, "wait")?,
            job: opt_string(&obj, "job")?,
        },
        "shutdown" => Request::Shutdown,
        other => {
            return Err(ProtocolError::new(
                ErrorCode::UnknownOp,
                format!(
                    "unknown op `{}`; known ops: hello, leave, status, files, release, pass_end, advance, apply, shutdown",
                    other.chars().take(64).collect::<String>()
                ),
            ))
        }
    })
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

    /// `hello`'s rf policy is one of the policies, spelled as `--rf-policy` spells it; any
    /// other value is refused naming the field.
    #[test]
    fn an_unknown_rf_policy_is_refused_naming_the_field() {
        let r = parse_request(r#"{"op":"hello","job":"j","rf_policy":"paced"}"#).unwrap();
        assert!(
            matches!(
                r,
                Request::Hello {
                    rf_policy: Some(PolicyKind::Paced),
                    ..
                }
            ),
            "{r:?}"
        );
        for bad in [r#""lstm""#, "3", r#""""#, r#""Fixed""#] {
            let line = format!(r#"{{"op":"hello","rf_policy":{bad}}}"#);
            let e = parse_request(&line).unwrap_err();
            assert_eq!(e.code, ErrorCode::BadRequest, "{line}");
            assert!(
                e.message.contains("`rf_policy`") && e.message.contains("fixed, score"),
                "{line}: {}",
                e.message
            );
        }
    }

    #[test]
    fn parses_known_ops() {
        assert_eq!(
            parse_request(r#"{"op":"status"}"#).unwrap(),
            Request::Status { job: None }
        );
        assert_eq!(
            parse_request(r#"{"op":"pass_end","metrics":{"loss":0.5},"block":true}"#).unwrap(),
            Request::PassEnd {
                job: None,
                metrics: [("loss".to_string(), 0.5)].into_iter().collect(),
                block: true,
                progress: None,
                fresh_loss: None,
            }
        );
        assert_eq!(
            parse_request(r#"{"op":"hello","version":1,"job":"resnet"}"#).unwrap(),
            Request::Hello {
                version: Some(1),
                job: Some("resnet".into()),
                subset: None,
                rf_policy: None,
                rf: None,
                token: None,
            }
        );
        assert_eq!(
            parse_request(r#"{"op":"advance","wait":true}"#).unwrap(),
            Request::Advance {
                wait: true,
                job: None
            }
        );
    }

    #[test]
    fn subsets_are_checked() {
        let ok = parse_request(r#"{"op":"hello","job":"a","subset":{"fraction":0.5,"seed":3}}"#)
            .unwrap();
        let Request::Hello {
            subset: Some(s), ..
        } = ok
        else {
            panic!("{ok:?}")
        };
        assert_eq!((s.fraction, s.seed), (Some(0.5), Some(3)));
        for (line, says) in [
            (r#"{"op":"hello","subset":{"fraction":0}}"#, "fraction"),
            (r#"{"op":"hello","subset":{"fraction":1.5}}"#, "fraction"),
            (r#"{"op":"hello","subset":{}}"#, "exactly one"),
            (
                r#"{"op":"hello","subset":{"labels":["a"],"fraction":0.5}}"#,
                "exactly one",
            ),
            (r#"{"op":"hello","subset":{"labels":[]}}"#, "labels"),
            (r#"{"op":"hello","subset":{"labels":[""]}}"#, "labels"),
            (r#"{"op":"hello","subset":{"rows":3}}"#, "subset.rows"),
            (r#"{"op":"hello","subset":"all"}"#, "subset"),
            (r#"{"op":"hello","rf":0}"#, "rf"),
            (r#"{"op":"leave"}"#, "job"),
        ] {
            let e = parse_request(line).unwrap_err();
            assert_eq!(e.code, ErrorCode::BadRequest, "{line}");
            assert!(e.message.contains(says), "{line}: {}", e.message);
        }
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
    fn error_code_names_are_the_serialized_ones() {
        use ErrorCode::*;
        for c in [
            BadJson,
            LineTooLong,
            UnknownOp,
            BadRequest,
            BadMetrics,
            UnsupportedVersion,
            StagingFailed,
            ShuttingDown,
            TooManyConnections,
            Internal,
            BadResponse,
        ] {
            assert_eq!(serde_json::to_value(c).unwrap(), c.name());
        }
    }

    #[test]
    fn error_reply_shape() {
        let r = serde_json::to_value(ProtocolError::new(ErrorCode::UnknownOp, "nope").to_reply())
            .unwrap();
        assert_eq!(r["v"], 1);
        assert_eq!(r["ok"], false);
        assert_eq!(r["error"]["code"], "unknown_op");
        assert_eq!(r["error"]["message"], "nope");
    }

    #[test]
    fn an_unknown_major_version_is_refused_naming_both() {
        let e = parse_request(r#"{"v":2,"op":"status"}"#).unwrap_err();
        assert_eq!(e.code, ErrorCode::UnsupportedVersion);
        assert!(
            e.message.contains("version 2") && e.message.contains("version 1"),
            "{}",
            e.message
        );
        assert_eq!(
            parse_request(r#"{"v":1,"op":"status"}"#).unwrap(),
            Request::Status { job: None }
        );
    }

    /// The hand-written reader and the serde type (the schema's source) agree on every op.
    #[test]
    fn every_serialized_request_parses_back() {
        let all = [
            Request::Hello {
                version: Some(1),
                job: Some("j".into()),
                subset: None,
                rf_policy: None,
                rf: None,
                token: None,
            },
            Request::Hello {
                version: None,
                job: Some("j".into()),
                subset: Some(Subset {
                    manifest: None,
                    labels: Some(vec!["cat".into()]),
                    fraction: None,
                    seed: None,
                }),
                rf_policy: Some(PolicyKind::Score),
                rf: Some(4),
                token: Some("00ff".into()),
            },
            Request::Leave { job: "j".into() },
            Request::Status { job: None },
            Request::Status {
                job: Some("j".into()),
            },
            Request::Files {
                job: None,
                known_generation: None,
                form: FilesForm::List,
                direct: false,
            },
            Request::Files {
                job: Some("j".into()),
                known_generation: Some(7),
                form: FilesForm::Packed,
                direct: true,
            },
            Request::Release { generation: None },
            Request::Release {
                generation: Some(3),
            },
            Request::PassEnd {
                job: Some("j".into()),
                metrics: [("loss".to_string(), 0.25)].into_iter().collect(),
                block: true,
                progress: Some(0.5),
                fresh_loss: Some(1.25),
            },
            Request::Advance {
                wait: true,
                job: None,
            },
            Request::Apply {
                epoch: 3,
                mini_epoch: 1,
                wait: false,
                job: Some("j".into()),
            },
            Request::Shutdown,
        ];
        for r in all {
            let line = serde_json::to_string(&super::super::Envelope::new(&r)).unwrap();
            assert_eq!(parse_request(&line).unwrap(), r, "{line}");
        }
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
