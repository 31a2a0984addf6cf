//! Reading the event log: every `events*.jsonl` file of a run directory in order, each line
//! read as the protocol's [`Record`](metfs_protocol::Record). A malformed line (not JSON, no
//! `t` or `event`, a field of the wrong type or missing, another protocol version) is an
//! error naming the file and the line, never skipped silently.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::ReportError;
pub(super) use metfs_protocol::event::Start;
pub(super) use metfs_protocol::Event;
use metfs_protocol::{check_version, Record};

pub(super) struct Timed {
    pub(super) t: f64,
    pub(super) ev: Event,
}

pub(super) struct EventLog {
    pub(super) files: Vec<PathBuf>,
    pub(super) events: Vec<Timed>,
    pub(super) lines: u64,
    pub(super) warnings: Vec<String>,
}

pub(super) fn malformed(path: &Path, line: u64, message: String) -> ReportError {
    ReportError::Malformed {
        path: path.to_path_buf(),
        line,
        message,
    }
}

/// Parses one event file's text. `tolerate_torn_tail`: a last line without a newline that is
/// not JSON is reported as a warning instead of an error.
pub(super) fn parse_events(
    text: &str,
    path: &Path,
    tolerate_torn_tail: bool,
    out: &mut EventLog,
) -> Result<(), ReportError> {
    let torn_candidate = !text.is_empty() && !text.ends_with('\n');
    let n_lines = text.lines().count();
    for (i, raw) in text.lines().enumerate() {
        let line = i as u64 + 1;
        let raw = raw.trim();
        if raw.is_empty() {
            continue;
        }
        let v: Value = match serde_json::from_str(raw) {
            Ok(v) => v,
            Err(e) => {
                if tolerate_torn_tail && torn_candidate && i + 1 == n_lines {
                    out.warnings.push(format!(
                        "{}, line {line}: skipped a torn last line (the daemon stopped mid-write)",
                        path.display()
                    ));
                    continue;
                }
                return Err(malformed(path, line, format!("not a JSON object: {e}")));
            }
        };
        let Value::Object(obj) = &v else {
            return Err(malformed(path, line, "not a JSON object".into()));
        };
        let t = obj
            .get("t")
            .and_then(Value::as_f64)
            .filter(|t| t.is_finite())
            .ok_or_else(|| {
                malformed(path, line, "missing `t` (Unix seconds as a number)".into())
            })?;
        let kind = obj
            .get("event")
            .and_then(Value::as_str)
            .ok_or_else(|| malformed(path, line, "missing `event` (a string)".into()))?
            .to_string();
        out.lines += 1;
        check_version(&v).map_err(|e| malformed(path, line, e.message))?;
        let ev = match serde_json::from_value::<Record>(v) {
            Ok(r) => r.event,
            Err(e) => return Err(malformed(path, line, format!("`{kind}` event: {e}"))),
        };
        if ev == Event::Other {
            continue;
        }
        if let Event::PassEnd(p) = &ev {
            if let Some(s) = p.secs {
                if !(s.is_finite() && s >= 0.0) {
                    return Err(malformed(
                        path,
                        line,
                        format!("`pass_end` event: `secs` must be 0 or more, got {s}"),
                    ));
                }
            }
        }
        out.events.push(Timed { t, ev });
    }
    Ok(())
}

pub(super) fn read_log(run_dir: &Path) -> Result<EventLog, ReportError> {
    let current = run_dir.join("events.jsonl");
    let older = run_dir.join("events.1.jsonl");
    let mut log = EventLog {
        files: Vec::new(),
        events: Vec::new(),
        lines: 0,
        warnings: Vec::new(),
    };
    let read = |p: &Path| -> Result<Option<String>, ReportError> {
        match std::fs::read_to_string(p) {
            Ok(s) => Ok(Some(s)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(ReportError::Io {
                path: p.to_path_buf(),
                source,
            }),
        }
    };
    let older_text = read(&older)?;
    let current_text = read(&current)?;
    if older_text.is_none() && current_text.is_none() {
        return Err(ReportError::NoEvents {
            run_dir: run_dir.to_path_buf(),
        });
    }
    if let Some(text) = older_text {
        parse_events(&text, &older, false, &mut log)?;
        log.files.push(older);
    }
    if let Some(text) = current_text {
        parse_events(&text, &current, true, &mut log)?;
        log.files.push(current);
    }
    Ok(log)
}
