//! Reading the event log: every `events*.jsonl` file of a run directory in order, each line
//! parsed into the few fields the report needs. A malformed line is an error naming the file
//! and the line, never skipped silently.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use super::ReportError;

#[derive(Deserialize)]
pub(super) struct StartEv {
    pub(super) dataset_bytes: Option<u64>,
    pub(super) dataset_files: Option<u64>,
    pub(super) mini_epochs: Option<u32>,
    pub(super) rf_policy: Option<String>,
    pub(super) budget_bytes: Option<u64>,
    pub(super) node_rank: Option<u32>,
    pub(super) nodes: Option<u32>,
}

#[derive(Deserialize)]
pub(super) struct PassEndEv {
    pub(super) epoch: Option<u64>,
    pub(super) mini_epoch: Option<u32>,
    pub(super) sequence: Option<u64>,
    pub(super) pass: Option<u32>,
    pub(super) decision: Option<String>,
    pub(super) view_bytes: Option<u64>,
    pub(super) secs: Option<f64>,
}

#[derive(Deserialize)]
pub(super) struct StagedEv {
    pub(super) bytes_fetched: Option<u64>,
    pub(super) bytes: Option<u64>,
    pub(super) secs: Option<f64>,
}

#[derive(Deserialize)]
pub(super) struct SwitchEv {
    pub(super) sequence: Option<u64>,
    pub(super) prev_rf: u32,
    pub(super) prev_wanted_rf: Option<u32>,
}

#[derive(Deserialize)]
pub(super) struct TierEv {
    pub(super) tier_bytes_read: u64,
}

#[derive(Deserialize)]
pub(super) struct DecisionEv {
    pub(super) decision: Option<String>,
}

/// One event, typed; kinds the report does not use are dropped while reading.
pub(super) enum Event {
    Start(StartEv),
    PassEnd(PassEndEv),
    Staged(StagedEv),
    Switch(SwitchEv),
    Tier(TierEv),
    Decision(DecisionEv),
}

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

pub(super) fn typed<T: for<'de> Deserialize<'de>>(
    v: Value,
    kind: &str,
    path: &Path,
    line: u64,
) -> Result<T, ReportError> {
    serde_json::from_value(v).map_err(|e| malformed(path, line, format!("`{kind}` event: {e}")))
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
        let ev = match kind.as_str() {
            "start" => Event::Start(typed(v, &kind, path, line)?),
            "pass_end" => Event::PassEnd(typed(v, &kind, path, line)?),
            "staged" => Event::Staged(typed(v, &kind, path, line)?),
            "switch" => Event::Switch(typed(v, &kind, path, line)?),
            "tier" => Event::Tier(typed(v, &kind, path, line)?),
            "decision" => Event::Decision(typed(v, &kind, path, line)?),
            _ => continue,
        };
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
