//! A shared mount's save file (`CACHE/share.json`): each job's place, so that a restarted
//! shared daemon resumes every job that joins again with its name and token (the `share`
//! module's doc says what a restart keeps). Written atomically with `metfs-durable`; read back as
//! untrusted input and checked field by field ([`SavedShare::from_json`]); a file that fails
//! stops the mount with an error naming it, the field and `--reset`.

use crate::daemon::share::check_job_name;
use crate::daemon::state::{GENERATION_LIMIT, POSITION_LIMIT};
use crate::daemon::{slot_name, DaemonError};
use metfs_feedback::history::RunId;
use metfs_feedback::policy::PolicyState;
use metfs_plan::refcnt::cohort::MemberState;
use metfs_protocol::{PolicyKind, Subset};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The save file's layout version: a file of another version is not resumed (a log line, not
/// an error), as a file of other settings.
pub const SHARE_STATE_VERSION: u32 = 1;

/// What the views of a shared mount depend on: a save file made under other settings starts
/// over (not an error).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ShareSettings {
    /// The source URL.
    pub source: String,
    /// The catalog's digest (sizes and content identity of every sample).
    pub catalog: String,
    /// Bytes of each of the two slots the budget is cut into.
    pub slot_bytes: u64,
    /// `share.jobs`: the shares the budget is cut into.
    pub jobs: u32,
    /// The mount's seed.
    pub seed: u64,
    /// The transform's identity, if any.
    #[serde(default)]
    pub transform: Option<String>,
    /// The sample settings and the detected format, if any (`None`: every file is a sample):
    /// the cohort's ids are samples of these, so a save of others means other samples.
    #[serde(default)]
    pub samples: Option<String>,
}

/// The settings that differ between `old` and `new`, named as the mount's options.
pub fn changed_settings(old: &ShareSettings, new: &ShareSettings) -> String {
    let changed: Vec<&str> = [
        ("source", old.source != new.source),
        ("catalog (the source's files)", old.catalog != new.catalog),
        ("budget", old.slot_bytes != new.slot_bytes),
        ("share.jobs", old.jobs != new.jobs),
        ("seed", old.seed != new.seed),
        ("transform", old.transform != new.transform),
        (
            "sample settings (format, group_by, always, include, exclude)",
            old.samples != new.samples,
        ),
    ]
    .into_iter()
    .filter_map(|(name, differs)| differs.then_some(name))
    .collect();
    changed.join(", ")
}

/// One job's place on a shared mount.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SavedJob {
    /// Its name (its directory under the mount).
    pub name: String,
    /// The token its `hello` got; a `hello` of the same name must give it back.
    pub token: String,
    /// Its subset, as `hello` gave it (the dataset is made from it again and checked
    /// against `dataset`).
    #[serde(default)]
    pub subset: Option<Subset>,
    /// `hello`'s rf policy and rf, if it chose them.
    #[serde(default)]
    pub rf_policy: Option<PolicyKind>,
    #[serde(default)]
    pub rf: Option<u32>,
    /// Its dataset's key (source, count and digest of its samples), as in the rf history.
    pub dataset: String,
    /// Its epoch.
    pub epoch: u64,
    /// Its view's sequence number (`mini_epoch` in status).
    pub mini_epoch: u32,
    /// Views served so far.
    pub sequence: u64,
    /// Its view's generation.
    pub generation: u64,
    /// Passes completed over its view.
    pub passes: u32,
    /// Its run in the rf history.
    #[serde(default)]
    pub run: Option<RunId>,
    /// What its rf policy has learned.
    pub policy: PolicyState,
    /// What its slots' names begin with (`NAME.jGEN`, unique to its join). Absent in save
    /// files of earlier versions, whose jobs' slots began with the job's name.
    #[serde(default)]
    pub slots: Option<String>,
    /// Its place in the cohort: views, undrawn samples, owed reads.
    pub cohort: MemberState,
}

/// The save file (module doc).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SavedShare {
    /// [`SHARE_STATE_VERSION`].
    pub version: u32,
    /// What the views depend on.
    pub settings: ShareSettings,
    /// The last generation handed out (generations are unique across jobs).
    pub generation: u64,
    /// Restarts so far: the cohort's sampler draws from a stream of its own after each.
    #[serde(default)]
    pub restarts: u64,
    /// Every job with a view, by name.
    pub jobs: Vec<SavedJob>,
}

impl SavedJob {
    /// What its slots' names begin with.
    pub fn slots(&self) -> &str {
        self.slots.as_deref().unwrap_or(&self.name)
    }

    /// The slot of its current view.
    pub fn slot(&self) -> String {
        format!(
            "{}.{}",
            self.slots(),
            slot_name((self.epoch, self.mini_epoch))
        )
    }

    /// The slot of its prepared next view, if it has one.
    pub fn next_slot(&self) -> Option<String> {
        let next = self.cohort.next.as_ref()?;
        Some(format!(
            "{}.{}",
            self.slots(),
            slot_name((next.epoch, self.mini_epoch.wrapping_add(1)))
        ))
    }
}

impl SavedShare {
    /// Parses and checks a save file; the error names the bad field (with the job's name).
    /// The samples of each job's place are checked against its dataset when it is restored.
    pub fn from_json(bytes: &[u8]) -> Result<Self, DaemonError> {
        let bad = |reason: String| DaemonError::CorruptState {
            path: "share.json".into(),
            reason,
        };
        let s: SavedShare = serde_json::from_slice(bytes).map_err(|e| {
            bad(if e.is_eof() {
                format!("truncated ({e})")
            } else {
                format!("not a shared mount's save file ({e})")
            })
        })?;
        let generation = |g: u64| (2..GENERATION_LIMIT).contains(&g);
        if !generation(s.generation) {
            return Err(bad(format!(
                "generation {} is out of range (2 to {})",
                s.generation,
                GENERATION_LIMIT - 1
            )));
        }
        let mut names = std::collections::HashSet::new();
        for j in &s.jobs {
            let field = |f: &str, reason: String| bad(format!("job {:?}: {f} {reason}", j.name));
            check_job_name(&j.name).map_err(|e| field("name", e.message))?;
            if !names.insert(j.name.as_str()) {
                return Err(field("name", "appears twice".into()));
            }
            if j.token.is_empty() || j.token.len() > 64 {
                return Err(field("token", "is empty or too long".into()));
            }
            if !generation(j.generation) {
                return Err(field(
                    "generation",
                    format!(
                        "{} is out of range (2 to {})",
                        j.generation,
                        GENERATION_LIMIT - 1
                    ),
                ));
            }
            for (f, v) in [("epoch", j.epoch), ("sequence", j.sequence)] {
                if v >= POSITION_LIMIT {
                    return Err(field(
                        f,
                        format!("{v} is out of range (below {POSITION_LIMIT})"),
                    ));
                }
            }
            // The prefix names directories in the cache: only what `admit` writes is taken.
            if let Some(p) = &j.slots {
                let ok = p
                    .strip_prefix(j.name.as_str())
                    .and_then(|r| r.strip_prefix(".j"))
                    .is_some_and(|g| !g.is_empty() && g.bytes().all(|b| b.is_ascii_digit()));
                if !ok {
                    return Err(field(
                        "slots",
                        format!("{p:?} is not the job's name followed by .j and a generation"),
                    ));
                }
            }
            if j.mini_epoch == u32::MAX {
                return Err(field("mini_epoch", "is not a view's sequence".into()));
            }
            match &j.cohort.current {
                Some(v) if v.epoch == j.epoch => {}
                Some(v) => {
                    return Err(field(
                        "cohort.current",
                        format!("is of epoch {}, the job's is {}", v.epoch, j.epoch),
                    ))
                }
                None => return Err(field("cohort.current", "is missing".into())),
            }
        }
        Ok(s)
    }
}

/// Reads `path` (`share.json`): `None` when there is none or `reset` is asked for; a file that
/// cannot be read or fails its checks is an error naming it.
pub(in crate::daemon) fn load_share_state(
    path: &Path,
    reset: bool,
) -> Result<Option<SavedShare>, DaemonError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if reset => {
            tracing::warn!(path = %path.display(), error = %e, "--reset: ignoring an unreadable shared mount's save file");
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
        tracing::warn!(path = %path.display(), "--reset: the jobs' saved places are discarded; every job starts over");
        return Ok(None);
    }
    SavedShare::from_json(&bytes)
        .map(Some)
        .map_err(|e| match e {
            DaemonError::CorruptState { reason, .. } => DaemonError::CorruptState {
                path: path.display().to_string(),
                reason,
            },
            e => e,
        })
}

/// Writes the save file atomically (the file fsynced, as `state.json`).
pub(super) fn write_share_state(
    path: &Path,
    saved: &SavedShare,
) -> Result<(), metfs_durable::DurableError> {
    metfs_durable::write(
        path,
        &serde_json::to_vec(saved).expect("the save file serializes"),
        metfs_durable::Durability::File,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use metfs_plan::refcnt::cohort::View as CohortView;

    fn job(name: &str) -> SavedJob {
        let view = |epoch, samples: Vec<u32>| CohortView {
            epoch,
            bytes: 0,
            samples,
        };
        SavedJob {
            name: name.into(),
            token: "00ff".into(),
            subset: None,
            rf_policy: None,
            rf: None,
            dataset: "d".into(),
            epoch: 1,
            mini_epoch: 7,
            sequence: 8,
            generation: 12,
            passes: 2,
            run: Some(RunId(3)),
            policy: PolicyState::named("fixed"),
            slots: Some(format!("{name}.j5")),
            cohort: MemberState {
                drawing: 1,
                undrawn: Some(vec![4, 5]),
                open: view(1, vec![]),
                queue: vec![],
                current: Some(view(1, vec![1, 2])),
                next: Some(view(1, vec![3])),
                reading: 1,
                needs: vec![(3, 1), (4, 1), (5, 1)],
            },
        }
    }

    fn file(jobs: Vec<SavedJob>) -> SavedShare {
        SavedShare {
            version: SHARE_STATE_VERSION,
            settings: ShareSettings {
                source: "/src".into(),
                catalog: "c".into(),
                slot_bytes: 1 << 20,
                jobs: 4,
                seed: 0,
                transform: None,
                samples: None,
            },
            generation: 20,
            restarts: 0,
            jobs,
        }
    }

    fn reason(bytes: &[u8]) -> String {
        match SavedShare::from_json(bytes) {
            Err(DaemonError::CorruptState { reason, .. }) => reason,
            other => panic!("expected a corrupt file, got {other:?}"),
        }
    }

    #[test]
    fn a_saved_share_reads_back_and_each_field_is_checked() {
        let ok = file(vec![job("a"), job("b")]);
        let bytes = serde_json::to_vec(&ok).unwrap();
        assert_eq!(SavedShare::from_json(&bytes).unwrap(), ok);
        assert_eq!(ok.jobs[0].slot(), "a.j5.e000001-m00007");
        assert_eq!(
            ok.jobs[0].next_slot().as_deref(),
            Some("a.j5.e000001-m00008")
        );
        // A file of an earlier version names no prefix: its slots began with the job's name.
        let mut old = job("a");
        old.slots = None;
        assert_eq!(old.slot(), "a.e000001-m00007");
        for bad in ["b.j5", "a.j", "a.j5/../x", "a.x5", "../a.j5"] {
            let mut f = file(vec![job("a")]);
            f.jobs[0].slots = Some(bad.into());
            let bytes = serde_json::to_vec(&f).unwrap();
            assert!(
                reason(&bytes).contains("slots"),
                "{bad}: {}",
                reason(&bytes)
            );
        }
        assert!(reason(&bytes[..bytes.len() / 2]).contains("truncated"));
        assert!(reason(b"\x00garbage").contains("not a shared mount's save file"));
        let bad = |f: fn(&mut SavedShare), want: &str| {
            let mut s = ok.clone();
            f(&mut s);
            let r = reason(&serde_json::to_vec(&s).unwrap());
            assert!(r.contains(want), "{want}: {r}");
        };
        bad(|s| s.generation = 1, "generation 1");
        bad(|s| s.jobs[1].name = "a".into(), "appears twice");
        bad(|s| s.jobs[0].name = "../x".into(), "job \"../x\": name");
        bad(|s| s.jobs[0].token.clear(), "token");
        bad(|s| s.jobs[0].generation = GENERATION_LIMIT, "generation");
        bad(|s| s.jobs[0].epoch = POSITION_LIMIT, "epoch");
        bad(|s| s.jobs[0].sequence = u64::MAX, "sequence");
        bad(|s| s.jobs[0].mini_epoch = u32::MAX, "mini_epoch");
        bad(
            |s| s.jobs[0].cohort.current = None,
            "cohort.current is missing",
        );
        bad(|s| s.jobs[0].epoch = 0, "cohort.current is of epoch 1");
        // The fuzz target's seed is a valid file.
        let seed = include_bytes!("../../../../fuzz/corpus/share_state/valid.json");
        assert_eq!(
            SavedShare::from_json(seed).unwrap().jobs[0]
                .policy
                .recent_rf,
            [2, 2, 3]
        );
        // A negative number is a type error, never a wrap.
        let text = String::from_utf8(bytes)
            .unwrap()
            .replace("\"passes\":2", "\"passes\":-2");
        assert!(reason(text.as_bytes()).contains("not a shared mount's save file"));
    }

    /// A save of other sample settings is of other samples: the change is named; a save
    /// written before the settings were recorded reads as none (every file a sample).
    #[test]
    fn other_sample_settings_are_a_change_of_settings() {
        let old = file(vec![]).settings;
        let mut new = old.clone();
        new.samples = Some("format=auto;group_by=stem;always=;include=;exclude=".into());
        assert_eq!(
            changed_settings(&old, &new),
            "sample settings (format, group_by, always, include, exclude)"
        );
        let mut bytes = serde_json::to_value(file(vec![job("a")])).unwrap();
        bytes["settings"].as_object_mut().unwrap().remove("samples");
        let read = SavedShare::from_json(&serde_json::to_vec(&bytes).unwrap()).unwrap();
        assert_eq!(read.settings, old);
    }

    /// What a save at every `pass_end` costs: the places of four jobs over `samples` samples
    /// (each a few views along, so every place has views, undrawn samples and owed reads),
    /// taken from the cohort and written atomically as the daemon does. Median of `reps`.
    fn save_cost(samples: u32, reps: usize) -> (std::time::Duration, usize) {
        use metfs_plan::refcnt::cohort::Cohort;
        let sizes = vec![4096u64; samples as usize];
        let dataset: Vec<u32> = (0..samples).collect();
        // 16 views an epoch, as a mount of that many mini-epochs.
        let view = 4096 * u64::from(samples.div_ceil(16));
        let mut c = Cohort::external(8 * view, sizes, 1);
        let names = ["a", "b", "c", "d"];
        for n in names {
            c.join(n, &dataset, view).unwrap();
        }
        for (i, n) in names.iter().enumerate() {
            for _ in 0..=i {
                c.prepare(n).unwrap();
                c.advance(n).unwrap();
            }
            c.prepare(n).unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("share.json");
        let mut times = Vec::new();
        let mut bytes = 0;
        for _ in 0..reps {
            let t = std::time::Instant::now();
            let mut f = file(Vec::new());
            for n in names {
                let mut j = job(n);
                j.cohort = c.saved(n).unwrap();
                f.jobs.push(j);
            }
            write_share_state(&path, &f).unwrap();
            times.push(t.elapsed());
            bytes = std::fs::metadata(&path).unwrap().len() as usize;
        }
        times.sort();
        (times[reps / 2], bytes)
    }

    /// The cost of a save per pass at the sizes the tests use (larger datasets: the ignored
    /// `refcnt::cohort::tests::the_cost_of_saving_every_place` in `metfs-plan`, and
    /// docs/RELIABILITY.md).
    #[test]
    fn a_save_per_pass_costs_little_at_test_sizes() {
        for samples in [240, 10_000] {
            let (t, bytes) = save_cost(samples, 9);
            eprintln!(
                "save per pass: 4 jobs over {samples} samples: {:.2} ms, {bytes} bytes",
                t.as_secs_f64() * 1e3
            );
        }
    }

    #[test]
    fn load_names_the_file_and_reset_discards_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("share.json");
        assert!(load_share_state(&path, false).unwrap().is_none());
        std::fs::write(&path, b"{\"version\":1").unwrap();
        let e = load_share_state(&path, false).unwrap_err().to_string();
        assert!(
            e.contains(&path.display().to_string())
                && e.contains("truncated")
                && e.contains("--reset"),
            "{e}"
        );
        assert!(load_share_state(&path, true).unwrap().is_none());
        write_share_state(&path, &file(vec![job("a")])).unwrap();
        assert_eq!(
            load_share_state(&path, false).unwrap().unwrap().jobs.len(),
            1
        );
    }
}
