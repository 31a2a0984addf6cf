//! The saved position (`state.json`): parsed and checked field by field on load, written
//! atomically.

use crate::daemon::deferred::Deferred;
use crate::daemon::fingerprint::SavedFingerprint;
use crate::daemon::DaemonError;
use metfs_feedback::history::RunId;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Generations are below this: inode numbers carry the generation in their high 32 bits
/// (`generation << 32 | node`). After `GENERATION_LIMIT - 1` the generation wraps to 1 (see
/// [`next_generation`]).
pub const GENERATION_LIMIT: u64 = 1 << 32;
/// Epochs and sequence numbers in `state.json` are below this: a run of 2^48 mini-epochs is not
/// one metfs will see, and the bound leaves every `+ 1` of a long run room to grow.
pub const POSITION_LIMIT: u64 = 1 << 48;

/// The generation after `g`: one more, or 1 after the last one that fits an inode number. A
/// wrapped generation cannot meet a view still held from before the wrap (that would take
/// four billion switches while one handle stays open), and clients only compare generations
/// for inequality.
pub fn next_generation(g: u64) -> u64 {
    if g + 1 >= GENERATION_LIMIT {
        1
    } else {
        g + 1
    }
}

/// The position saved in `CACHE/state.json`.
///
/// The file is metfs's own, but it is read back as untrusted input: [`SavedState::from_json`]
/// checks every field, and a file that fails is refused with an error naming it, the field,
/// and how to start over (delete it, or mount with `--reset`); it is never silently replaced,
/// since that would restart a long run at epoch 0.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SavedState {
    /// Everything the plan depends on; a different fingerprint starts over (not an error).
    pub fingerprint: SavedFingerprint,
    /// Current epoch.
    pub epoch: u64,
    /// Current mini-epoch within the epoch.
    pub mini_epoch: u32,
    /// Generation of the current view (1 ..= `GENERATION_LIMIT - 1`).
    pub generation: u64,
    /// Mini-epochs served so far in the run.
    pub sequence: u64,
    /// The rf history's run.
    #[serde(default)]
    pub run: Option<RunId>,
    /// The job key of the rf history.
    #[serde(default)]
    pub job: Option<String>,
    /// The samples a lasting fault deferred and the session carries on (`deferred.rs`); absent
    /// while none ever was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deferred: Option<Deferred>,
}

impl SavedState {
    /// Parses and checks a saved position (every field but the mini-epoch, which
    /// [`SavedState::check_plan`] checks against the plan). The error names the bad field.
    pub fn from_json(bytes: &[u8]) -> Result<Self, DaemonError> {
        let bad = |reason: String| DaemonError::CorruptState {
            path: "state.json".into(),
            reason,
        };
        let s: SavedState = serde_json::from_slice(bytes).map_err(|e| {
            bad(if e.is_eof() {
                format!("truncated ({e})")
            } else {
                format!("not a saved position ({e})")
            })
        })?;
        if s.generation == 0 || s.generation >= GENERATION_LIMIT {
            return Err(bad(format!(
                "generation {} is out of range (1 to {})",
                s.generation,
                GENERATION_LIMIT - 1
            )));
        }
        if s.epoch >= POSITION_LIMIT {
            return Err(bad(format!(
                "epoch {} is out of range (below {POSITION_LIMIT})",
                s.epoch
            )));
        }
        if s.sequence >= POSITION_LIMIT {
            return Err(bad(format!(
                "sequence {} is out of range (below {POSITION_LIMIT})",
                s.sequence
            )));
        }
        if s.fingerprint == SavedFingerprint::Legacy(String::new()) {
            return Err(bad("fingerprint is empty".into()));
        }
        Ok(s)
    }

    /// Checks the mini-epoch against a plan of `nm` mini-epochs per epoch (same fingerprint).
    pub fn check_plan(&self, nm: u32) -> Result<(), DaemonError> {
        if self.mini_epoch >= nm {
            return Err(DaemonError::CorruptState {
                path: "state.json".into(),
                reason: format!(
                    "mini_epoch {} is out of range: the plan has {nm} mini-epochs per epoch",
                    self.mini_epoch
                ),
            });
        }
        Ok(())
    }
}

/// Reads `path` (`state.json`): `None` when there is none or `reset` is asked for.
pub(super) fn load_state(path: &Path, reset: bool) -> Result<Option<SavedState>, DaemonError> {
    let named = |e: DaemonError| match e {
        DaemonError::CorruptState { reason, .. } => DaemonError::CorruptState {
            path: path.display().to_string(),
            reason,
        },
        e => e,
    };
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if reset => {
            tracing::warn!(path = %path.display(), error = %e, "--reset: ignoring an unreadable saved position");
            return Ok(None);
        }
        Err(e) => {
            return Err(DaemonError::CorruptState {
                path: path.display().to_string(),
                reason: format!("cannot be read ({e})"),
            })
        }
    };
    if reset {
        let what = match SavedState::from_json(&bytes) {
            Ok(s) => format!("epoch {} mini-epoch {}", s.epoch, s.mini_epoch),
            Err(e) => e.to_string(),
        };
        tracing::warn!(path = %path.display(), discarded = %what, "--reset: the saved position is discarded; starting at epoch 0");
        return Ok(None);
    }
    SavedState::from_json(&bytes).map(Some).map_err(named)
}
