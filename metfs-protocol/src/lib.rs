//! What crosses the control socket and the event log, defined once: requests ([`request`]),
//! replies ([`reply`]: [`Hello`], [`Status`], [`FilesView`], [`Decision`], errors), event
//! records ([`event`]: [`Record`], [`Event`]) and the closed sets of values they carry
//! ([`values`]: the read path, the composition, the rf policy, ...).
//!
//! The daemon writes these types and every Rust reader (`metfs status`, the CLI client,
//! `metfs report`, the metrics file) reads them; nothing builds or picks apart these messages
//! by key elsewhere. The JSON schema `docs/protocol.schema.json` is generated from them
//! ([`schema`]); a test fails when the checked-in file differs, and the Python client's types
//! and a real daemon's replies are tested against that file, so a renamed field fails a test
//! on both sides.
//!
//! Framing: newline-delimited JSON over a Unix socket, one request object per line with an
//! `"op"`, one reply object per line with `"ok"`; a failure carries `"error": {"code",
//! "message"}` with a stable [`ErrorCode`]. The event log is one [`Record`] per line. One
//! exception to "one line": a `files` request with `"form": "packed"` gets its list as raw bytes
//! right after the reply's line, as many as the reply's `packed.bytes` says ([`PackedList`]), so
//! a view of a million files costs neither side a JSON string per file. A client that sends
//! `known_generation` and still holds that generation's list gets `"unchanged": true` and no
//! list: a pass over an unchanged view costs one short round trip.
//!
//! Versioning: every message carries `"v"`, the protocol's major version ([`VERSION`]). Fields
//! may be added within a version (readers ignore fields they do not know); renaming or
//! removing one, or changing its meaning, is a new major version. A reader that meets a major
//! version it does not speak fails with an error naming the version seen and the one it speaks
//! ([`check_version`]), in both directions: the daemon reading a request, a client reading a
//! reply, `metfs report` reading an event log. A message without `"v"` was written before the
//! field existed and is read as version 1.
//!
//! Jobs: today a daemon serves one job (one session); the types carry the job's name where a
//! message is per job (`Status::job`, `Hello::job`) and nothing in them assumes there is only
//! one, so that per-job parts can be added as new fields.

pub mod event;
pub mod reply;
pub mod request;
pub mod values;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use event::{Event, Record};
pub use reply::{
    Choice, Decision, Draining, FilesView, Hello, JobShare, JobStatus, Left, NotResumed,
    PackedList, Released, ShuttingDown, Staging, Status,
};
pub use request::{
    parse_metrics, parse_request, ErrorCode, FilesForm, Metrics, ProtocolError, Request, Subset,
    MAX_LINE_BYTES,
};
pub use values::{Compose, FailedSample, PolicyKind, ReadPath, Reason, ShardDone, ShuffleCode};

/// The protocol's major version, spoken by this build: the `"v"` of every message.
pub const VERSION: u32 = 1;

/// The `"v"` of a message: always [`VERSION`] when written; reading another value fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Version;

impl Serialize for Version {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u32(VERSION)
    }
}

impl<'de> Deserialize<'de> for Version {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = u64::deserialize(d)?;
        if v == u64::from(VERSION) {
            Ok(Version)
        } else {
            Err(serde::de::Error::custom(unsupported(&v.to_string())))
        }
    }
}

impl JsonSchema for Version {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Version".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "The protocol's major version. A reader refuses any other.",
            "type": "integer",
            "const": VERSION,
        })
    }
}

fn unsupported(seen: &str) -> String {
    format!("protocol version {seen} is not supported: this build speaks version {VERSION}")
}

/// Checks a message's `"v"` before its fields are read, so that a message of another major
/// version fails with that reason rather than with whatever field it renamed. A missing `"v"`
/// is version 1 (written before the field existed).
pub fn check_version(message: &Value) -> Result<(), ProtocolError> {
    match message.get("v") {
        None => Ok(()),
        Some(v) if v.as_u64() == Some(u64::from(VERSION)) => Ok(()),
        Some(v) => Err(ProtocolError::new(
            ErrorCode::UnsupportedVersion,
            unsupported(&v.to_string()),
        )),
    }
}

/// A message with its version: what a client sends (`Envelope<Request>`).
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[schemars(rename = "{T}Line")]
pub struct Envelope<T> {
    /// Always [`VERSION`].
    pub v: Version,
    /// The message.
    #[serde(flatten)]
    pub body: T,
}

impl<T> Envelope<T> {
    /// Wraps a message.
    pub fn new(body: T) -> Self {
        Self { v: Version, body }
    }
}

/// A successful reply: `{"v": 1, "ok": true, ...body}`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "{T}Reply")]
pub struct Reply<T> {
    /// The protocol version.
    #[serde(default)]
    pub v: Version,
    /// Always true.
    pub ok: bool,
    /// The op's answer.
    #[serde(flatten)]
    pub body: T,
}

impl<T> Reply<T> {
    /// Wraps an answer.
    pub fn new(body: T) -> Self {
        Self {
            v: Version,
            ok: true,
            body,
        }
    }
}

/// A failed request's reply: `{"v": 1, "ok": false, "error": {"code", "message"}}`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ErrorReply {
    /// The protocol version.
    #[serde(default)]
    pub v: Version,
    /// Always false.
    pub ok: bool,
    /// What failed.
    pub error: ErrorBody,
}

/// The error of an [`ErrorReply`].
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ErrorBody {
    /// Machine-readable kind.
    pub code: ErrorCode,
    /// Human-readable explanation naming the offending input.
    pub message: String,
}

/// Any answer of the daemon, as written on the socket.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Answer {
    /// To `hello`.
    Hello(Reply<Hello>),
    /// To `status`.
    Status(Box<Reply<Status>>),
    /// To `files`.
    Files(Reply<FilesView>),
    /// To `pass_end`, `advance`, `apply`.
    Decision(Reply<Decision>),
    /// To `leave`.
    Left(Reply<Left>),
    /// To `release`.
    Released(Reply<Released>),
    /// To `shutdown`.
    ShuttingDown(Reply<ShuttingDown>),
    /// A failure.
    Error(ErrorReply),
}

impl From<ProtocolError> for Answer {
    fn from(e: ProtocolError) -> Self {
        Answer::Error(e.to_reply())
    }
}

/// Reads one reply line into `T`: the version first ([`check_version`]), then `"ok"`; a
/// failure becomes the daemon's [`ProtocolError`]. `bad_response` names what did not fit.
pub fn read_reply<T: serde::de::DeserializeOwned>(line: &str) -> Result<T, ProtocolError> {
    let bad = |why: String| {
        ProtocolError::new(
            ErrorCode::BadResponse,
            format!(
                "{why}: {}",
                line.trim().chars().take(500).collect::<String>()
            ),
        )
    };
    let value: Value =
        serde_json::from_str(line).map_err(|e| bad(format!("reply is not JSON ({e})")))?;
    check_version(&value)?;
    match value.get("ok").and_then(Value::as_bool) {
        Some(true) => serde_json::from_value::<Reply<T>>(value)
            .map(|r| r.body)
            .map_err(|e| bad(format!("reply does not fit the protocol ({e})"))),
        Some(false) => {
            let r: ErrorReply = serde_json::from_value(value)
                .map_err(|e| bad(format!("error reply does not fit the protocol ({e})")))?;
            Err(ProtocolError::new(r.error.code, r.error.message))
        }
        None => Err(bad("reply has no boolean `ok`".into())),
    }
}

/// Where the schema is checked in, from the workspace root.
pub const SCHEMA_PATH: &str = "docs/protocol.schema.json";

/// The protocol's JSON schema (draft 2020-12), as checked in at [`SCHEMA_PATH`]: every
/// message under `$defs` (`RequestLine`, `HelloReply`, `StatusReply`, `FilesViewReply`,
/// `DecisionReply`, `ShuttingDownReply`, `LeftReply`, `ReleasedReply`, `ErrorReply`, `Record` for an event-log line, and the
/// parts they use). It describes what the daemon writes: a field that may be unknown is
/// present as `null`, never left out.
pub fn schema() -> Value {
    use schemars::generate::SchemaSettings;
    let mut g = SchemaSettings::draft2020_12()
        .for_serialize()
        .into_generator();
    g.subschema_for::<Envelope<Request>>();
    g.subschema_for::<Reply<Hello>>();
    g.subschema_for::<Reply<Status>>();
    g.subschema_for::<Reply<FilesView>>();
    g.subschema_for::<Reply<Decision>>();
    g.subschema_for::<Reply<ShuttingDown>>();
    g.subschema_for::<Reply<Left>>();
    g.subschema_for::<Reply<Released>>();
    g.subschema_for::<ErrorReply>();
    g.subschema_for::<Record>();
    let mut root = serde_json::Map::new();
    let mut put = |k: &str, v: Value| root.insert(k.to_string(), v);
    put(
        "$schema",
        "https://json-schema.org/draft/2020-12/schema".into(),
    );
    put("title", "metfs protocol".into());
    put(
        "description",
        format!(
            "The messages of the metfs control socket and event log, version {VERSION} (\"v\"). \
             Generated from the metfs-protocol crate (metfs-protocol/src); regenerate with \
             `METFS_WRITE_SCHEMA=1 cargo test -p metfs-protocol --lib tests::schema_is_checked_in`."
        )
        .into(),
    );
    put("version", VERSION.into());
    put("$defs", Value::Object(g.take_definitions(true)));
    Value::Object(root)
}

#[cfg(test)]
mod tests;
