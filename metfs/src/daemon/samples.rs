//! What a sample is, applied to a mount's catalog: the files that are part of the dataset
//! (`include`, `exclude`), its format (detected or set), the sample groups, the files in every
//! view, and per view the format's rewritten index files.
//!
//! The rules themselves belong to `metfs_formats` (which files are which, how an index is
//! rewritten) and `metfs_plan::groups` (samples as groups of files); this module reads what
//! they need from the tier once, at mount, and holds the result for the store:
//!
//! 1. [`select`]: `include` and `exclude` make the catalog the daemon plans, stages and shows
//!    (the listing saved in the cache stays the whole source's).
//! 2. [`detect`]: the format's index files read from the tier into memory (through the cache's
//!    temporary directory, deleted at once) and the listing classified: a [`Layout`].
//! 3. [`Samples::new`]: the groups (a format's shards, or `group_by`'s), the always files (the
//!    format's and `always`'s), and the files of neither: a format's index files, and files
//!    outside the format that `always` does not name (reported by count at mount).
//!
//! # Invariants
//!
//! * A mount without any of these settings and without a detected format has no [`Samples`]:
//!   every file is a sample, exactly as before, at no cost per file.
//! * A view holds a sample's files all or none ([`Samples::whole`]); with a format it holds the
//!   rewritten index of exactly its shards ([`Samples::indexes`]), written into its slot when
//!   the view is built, so a handle on an older view's index keeps reading that view's.
//! * Every error names the setting or the file, at mount, before anything is staged.
//! * A dynamic-sharding queue deals the same samples on every node and in `metfs dds init`:
//!   both come here ([`apply`] is the mount's steps for a command without a mount), the
//!   queue's samples are the groups ([`queue_samples`]: a group's footprint is the sum of its
//!   files' [`metfs_plan::budget::footprint`]s) and its record names the settings, so a mount
//!   of other settings is refused.

use crate::config::{FormatChoice, MountConfig, SampleConfig};
use metfs_dds::OwnedSamples;
use metfs_formats::{Format, Layout};
use metfs_plan::budget::{footprints, Staged};
use metfs_plan::groups::{GroupError, SampleGroups};
use metfs_plan::size::format_bytes;
use metfs_tier::catalog::{Catalog, CatalogError};
use metfs_tier::pacer::Pacer;
use metfs_tier::{CapacityTier, SampleRef, TierError};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// The largest index file read at mount (an MDS index of a million shards is ~300 MB; one of
/// this size is already a dataset to split into streams).
const MAX_INDEX_BYTES: u64 = 64 << 20;

/// What went wrong applying the sample settings.
#[derive(Debug, thiserror::Error)]
pub enum SamplesError {
    /// A pattern that matches no file of the source.
    #[error("{setting} '{pattern}' matches no file of {source_url}")]
    Unmatched {
        setting: &'static str,
        pattern: String,
        source_url: String,
    },
    /// `include` and `exclude` leave no file.
    #[error("include and exclude leave no file of {0}")]
    NothingLeft(String),
    /// An index file too large to read at mount.
    #[error("{file}: {size} bytes, more than the {MAX_INDEX_BYTES} an index file may have")]
    IndexTooLarge { file: String, size: u64 },
    /// Reading an index file from the tier.
    #[error("reading {file} from the source: {source}")]
    Read {
        file: String,
        #[source]
        source: TierError,
    },
    /// A local file operation on the cache.
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The dataset is not the format the setting or its names say.
    #[error("format {setting}: {source}")]
    Format {
        setting: String,
        #[source]
        source: metfs_formats::Error,
    },
    /// Every file is an always file or no sample's.
    #[error(
        "no file of {0} is left to deal into mini-epochs (every file is in every view or in none)"
    )]
    NoSamples(String),
    /// An `always` pattern that names a shard of the dataset's format.
    #[error("always: {file} is a shard of the {format} dataset, dealt to mini-epochs; a shard cannot be in every view")]
    AlwaysShard { file: String, format: Format },
    /// A `DatasetDict` split that some view would hold no shard of.
    #[error("format hf-dataset-dict: {split} {reason}; show it whole in every view with --always '{split}/*'{compose}")]
    SplitNotInEveryView {
        split: String,
        reason: String,
        compose: &'static str,
    },
    /// Groups that do not describe the catalog (a bug, never a user's input).
    #[error("sample groups: {0}")]
    Groups(#[from] GroupError),
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// The manifest's `group` column beside `group_by`.
    #[error("group_by '{0}': the manifest groups the files itself (its `group` column); give one or the other")]
    TwoGroupings(String),
    #[error(transparent)]
    Manifest(#[from] metfs_prefetcher::manifest::ManifestError),
    /// A `group_by` under which no two files make one sample.
    #[error("group_by '{group_by}' groups no two files of {source_url}: every file would be a sample of its own (are the template's paths relative to the source's root?)")]
    GroupsNothing {
        group_by: String,
        source_url: String,
    },
    /// A format's index file to read without a source to read it from (`metfs dds init`
    /// with a manifest alone).
    #[error("{file}: a dataset format's index file, read from the source to know the format's samples; give --source too, or --format files")]
    NoSource { file: String },
    /// A source in a dataset format whose loader reads an index (or pairs a shard with its
    /// index file), on a mount that deals files one by one: its views would break silently.
    #[error("the source looks like a {format} dataset ({evidence}), whose loader needs each view's index rewritten or its shards kept with their index files; {mode} deals files one by one. Mount it plain, with --dds or with --share to have format-aware views, or give --format files to deal its files as they are")]
    FormatNotDealt {
        format: Format,
        evidence: String,
        mode: String,
    },
    /// Files in every view that leave no room in a slot.
    #[error("always: the files in every view ({files}) take {bytes}, more than a slot of budget {budget} holds with room for a sample ({slot} per slot)")]
    AlwaysTooLarge {
        files: String,
        bytes: String,
        budget: String,
        slot: String,
    },
}

/// What the sample settings are applied with: the settings, the manifest whose `group`
/// column may group files, and the source (named in errors). A mount's come from its
/// configuration ([`SampleSource::of`]); `metfs dds init` gives its own flags.
#[derive(Clone, Copy)]
pub struct SampleSource<'a> {
    pub settings: &'a SampleConfig,
    pub manifest: Option<&'a Path>,
    pub source: &'a str,
}

impl<'a> SampleSource<'a> {
    /// A mount's.
    pub fn of(cfg: &'a MountConfig) -> Self {
        Self {
            settings: &cfg.samples,
            manifest: cfg.manifest.as_deref(),
            source: &cfg.source,
        }
    }
}

/// Every file's path, by catalog id: built at most once per catalog at mount, and handed on
/// from [`detect`] to [`Samples::new`].
fn all_paths(catalog: &Catalog) -> Vec<String> {
    (0..catalog.len() as u32)
        .map(|id| catalog.path(id))
        .collect()
}

/// The catalog of the files `on.settings` makes part of the dataset: `catalog` itself when
/// neither `include` nor `exclude` is set. A pattern that matches nothing is an error.
pub(super) fn select(on: &SampleSource<'_>, catalog: Catalog) -> Result<Catalog, SamplesError> {
    let s = on.settings;
    if s.include.is_empty() && s.exclude.is_empty() && s.always.is_empty() {
        return Ok(catalog);
    }
    let paths = all_paths(&catalog);
    for (setting, p) in [
        ("include", &s.include),
        ("exclude", &s.exclude),
        ("always", &s.always),
    ] {
        if let Some(pattern) = p.unmatched(&paths).into_iter().next() {
            return Err(SamplesError::Unmatched {
                setting,
                pattern,
                source_url: on.source.to_string(),
            });
        }
    }
    if s.include.is_empty() && s.exclude.is_empty() {
        return Ok(catalog);
    }
    let keep = |id: u32| {
        let p = &paths[id as usize];
        (s.include.is_empty() || s.include.matches(p)) && !s.exclude.matches(p)
    };
    let kept = catalog.subset(keep)?;
    if kept.is_empty() {
        return Err(SamplesError::NothingLeft(on.source.to_string()));
    }
    tracing::info!(
        files = kept.len(),
        left_out = catalog.len() - kept.len(),
        "include and exclude applied"
    );
    Ok(kept)
}

/// What [`detect`] found: the format's layout (`None` when the setting is `files`, or `auto`
/// found none), and the catalog's paths when it listed them, for [`Samples::new`].
#[derive(Default)]
pub(super) struct Detected {
    pub(super) layout: Option<Layout>,
    pub(super) paths: Option<Vec<String>>,
}

/// The format's layout of `catalog` (see [`Detected`]), its index files read from `tier`
/// (none: an error naming the file, should the format have any).
pub(super) async fn detect(
    cfg: &SampleConfig,
    catalog: &Catalog,
    tier: Option<&dyn CapacityTier>,
    tmp: &Path,
) -> Result<Detected, SamplesError> {
    let none = |paths| Detected {
        layout: None,
        paths,
    };
    let want = match cfg.format {
        FormatChoice::Files => return Ok(none(None)),
        FormatChoice::Auto => None,
        FormatChoice::Is(f) => Some(f),
    };
    if want.is_none() && !may_be_a_format(catalog) {
        return Ok(none(None));
    }
    let paths = all_paths(catalog);
    if want.is_none() && metfs_formats::guess(&paths).is_none() {
        return Ok(none(Some(paths)));
    }
    let mut indexes = BTreeMap::new();
    for file in metfs_formats::wanted(&paths) {
        let id = catalog.find(&file).expect("wanted names listed files");
        let Some(tier) = tier else {
            return Err(SamplesError::NoSource { file });
        };
        indexes.insert(file.clone(), read_small(catalog, id, tier, tmp).await?);
    }
    let setting = cfg.format.to_string();
    let err = |source| SamplesError::Format {
        setting: setting.clone(),
        source,
    };
    // A `DatasetDict` split whose `state.json` `always` names (`--always 'test/*'`) is shown
    // whole in every view; the others are dealt.
    let options = metfs_formats::Options {
        always_splits: indexes
            .keys()
            .filter_map(|f| f.strip_suffix("/state.json"))
            .filter(|split| cfg.always.matches(&format!("{split}/state.json")))
            .map(str::to_string)
            .collect(),
    };
    let layout = match want {
        Some(f) => metfs_formats::layout(f, &paths, &indexes, &options).map_err(err)?,
        None => match metfs_formats::detect(&paths, &indexes, &options).map_err(err)? {
            Some(l) => l,
            None => return Ok(none(Some(paths))),
        },
    };
    tracing::info!(
        format = %layout.format(),
        shards = layout.shards().len(),
        always = layout.always().len(),
        index_files = layout.index_files().len(),
        "dataset format"
    );
    Ok(Detected {
        layout: Some(layout),
        paths: Some(paths),
    })
}

/// Whether `catalog` may be one of the formats, without a string per file: an index file at
/// the root (four lookups), or every file below the root named as an unindexed format's shard
/// or companion (a scan that stops at the first other name, the first file of most datasets).
/// A mount of a million images pays next to nothing for `--format auto`.
/// Refuses a source that looks like a dataset format (from its names alone, nothing read) on
/// a mount that deals files one by one (`mode`: "a transform"), unless the format
/// setting says to deal files (`--format files`): such a mount would show each view an index
/// naming shards it does not hold, or a shard without its index file.
pub(super) fn refuse_format_not_dealt(
    cfg: &SampleConfig,
    catalog: &Catalog,
    mode: &str,
) -> Result<(), SamplesError> {
    if cfg.format == FormatChoice::Files || !may_be_a_format(catalog) {
        return Ok(());
    }
    let paths = all_paths(catalog);
    let Some(format) = metfs_formats::guess(&paths) else {
        return Ok(());
    };
    // The index file that tells the format: one the loader reads, else a shard's companion.
    let companion = |p: &&String| {
        metfs_formats::group::RULES
            .iter()
            .any(|r| r.companion_suffixes.iter().any(|x| p.ends_with(x)))
    };
    let evidence = match metfs_formats::wanted(&paths).into_iter().next() {
        Some(f) => f,
        // Shards without index files are samples of their own, dealt as files.
        None => match paths.iter().find(companion) {
            Some(f) => f.clone(),
            None => return Ok(()),
        },
    };
    Err(SamplesError::FormatNotDealt {
        format,
        evidence,
        mode: mode.to_string(),
    })
}

fn may_be_a_format(catalog: &Catalog) -> bool {
    if [
        "state.json",
        "dataset_info.json",
        "dataset_dict.json",
        "index.json",
    ]
    .iter()
    .any(|f| catalog.find(f).is_some())
    {
        return true;
    }
    let suffixes: Vec<&str> = metfs_formats::group::RULES
        .iter()
        .flat_map(|r| r.shard_suffixes.iter().chain(r.companion_suffixes))
        .copied()
        .collect();
    (0..catalog.len() as u32)
        .filter(|&id| !catalog.dir_path(catalog.dir_index(id)).is_empty())
        .all(|id| {
            let name = catalog.name(id);
            suffixes.iter().any(|s| name.ends_with(s))
        })
}

/// The bytes of catalog file `id`, fetched through a temporary file under `tmp`.
async fn read_small(
    catalog: &Catalog,
    id: u32,
    tier: &dyn CapacityTier,
    tmp: &Path,
) -> Result<Vec<u8>, SamplesError> {
    let file = catalog.path(id);
    let size = catalog.size(id);
    if size > MAX_INDEX_BYTES {
        return Err(SamplesError::IndexTooLarge { file, size });
    }
    let at = tmp.join(format!("index-{id}.tmp"));
    let io = |source| SamplesError::Io {
        path: at.display().to_string(),
        source,
    };
    let dest = Arc::new(std::fs::File::create(&at).map_err(io)?);
    let sample = SampleRef {
        path: file.clone(),
        size,
        version: catalog.version(id).to_string(),
        durable: false,
    };
    let fetched = tier.fetch(&sample, dest, &Pacer::with_rate(None)).await;
    let bytes = std::fs::read(&at);
    let _ = std::fs::remove_file(&at);
    fetched.map_err(|source| SamplesError::Read { file, source })?;
    bytes.map_err(io)
}

/// The samples of a mount whose files are not each one sample (see the module docs).
#[derive(Debug)]
pub struct Samples {
    groups: SampleGroups,
    layout: Option<Layout>,
    /// Whether the manifest's `group` column made the groups.
    by_manifest: bool,
    /// Samples left out because files are missing: (the files present, the files missing).
    incomplete: Vec<(Vec<String>, Vec<String>)>,
}

impl Samples {
    /// The samples of `catalog` (files with `footprints`) under `on` and what [`detect`]
    /// found; `None` when every file is a sample of its own.
    pub(super) fn new(
        on: &SampleSource<'_>,
        catalog: &Catalog,
        footprints: &[u64],
        detected: Detected,
    ) -> Result<Option<Samples>, SamplesError> {
        let Detected { layout, paths } = detected;
        let s = on.settings;
        let explicit = match on.manifest {
            Some(m) => metfs_prefetcher::manifest::read_groups(m)?,
            None => Vec::new(),
        };
        if let (Some(g), false) = (&s.group_by, explicit.is_empty()) {
            return Err(SamplesError::TwoGroupings(g.to_string()));
        }
        if layout.is_none() && s.group_by.is_none() && s.always.is_empty() && explicit.is_empty() {
            return Ok(None);
        }
        let paths = paths.unwrap_or_else(|| all_paths(catalog));
        let id_of = |p: &str| catalog.find(p).expect("the layout names listed files");
        let mut always: Vec<u32> = (0..catalog.len() as u32)
            .filter(|&id| s.always.matches(&paths[id as usize]))
            .collect();
        let mut incomplete = Vec::new();
        let samples: Vec<Vec<u32>> = if let Some(l) = &layout {
            if let Some(&id) = always
                .iter()
                .find(|&&id| l.shard_of(&paths[id as usize]).is_some())
            {
                return Err(SamplesError::AlwaysShard {
                    file: paths[id as usize].clone(),
                    format: l.format(),
                });
            }
            always.extend(l.always().iter().map(|p| id_of(p)));
            let other = l.other().iter().filter(|p| !s.always.matches(p)).count();
            if other > 0 {
                tracing::warn!(
                    files = other,
                    format = %l.format(),
                    "files outside the format are in no view (name them with --always to show them)"
                );
            }
            l.shards()
                .iter()
                .map(|sh| sh.files.iter().map(|f| id_of(f)).collect())
                .collect()
        } else {
            let rest: Vec<u32> = (0..catalog.len() as u32)
                .filter(|id| always.binary_search(id).is_err())
                .collect();
            let names: Vec<&str> = rest.iter().map(|&id| paths[id as usize].as_str()).collect();
            match &s.group_by {
                None if !explicit.is_empty() => by_manifest(catalog, &rest, &explicit),
                Some(rule) => {
                    let g = rule.group(&names);
                    if g.incomplete.is_empty() && g.groups.iter().all(|grp| grp.len() < 2) {
                        return Err(SamplesError::GroupsNothing {
                            group_by: rule.to_string(),
                            source_url: on.source.to_string(),
                        });
                    }
                    for (present, missing) in g.incomplete {
                        let present: Vec<String> =
                            present.iter().map(|&i| names[i].to_string()).collect();
                        incomplete.push((present, missing));
                    }
                    g.groups
                        .into_iter()
                        .map(|grp| grp.into_iter().map(|i| rest[i]).collect())
                        .collect()
                }
                None => rest.into_iter().map(|id| vec![id]).collect(),
            }
        };
        always.sort_unstable();
        always.dedup();
        if samples.is_empty() {
            return Err(SamplesError::NoSamples(on.source.to_string()));
        }
        let by_manifest = layout.is_none() && s.group_by.is_none() && !explicit.is_empty();
        for (present, missing) in incomplete.iter().take(10) {
            tracing::warn!(present = %present.join(", "), missing = %missing.join(", "), "sample left out: a file of its group is missing");
        }
        let groups = SampleGroups::new(
            footprints,
            catalog.labels(),
            catalog.clusters(),
            samples,
            always,
        )?;
        Ok(Some(Samples {
            groups,
            layout,
            by_manifest,
            incomplete,
        }))
    }

    /// Refuses a `DatasetDict` some view of which would hold no shard of a dealt split (its
    /// loader refuses a split of no file). A plan of mini-epochs needs a shard of each dealt
    /// split per mini-epoch, and with two dealt splits or more, stratified composition by split
    /// (the first directory), which gives each mini-epoch its share of every split. A shared
    /// mount's cohort draws views of any samples, so it deals one split at most.
    pub(super) fn check_splits(&self, dealing: Dealing) -> Result<(), SamplesError> {
        let Some(layout) = &self.layout else {
            return Ok(());
        };
        if layout.format() != Format::HfDatasetDict {
            return Ok(());
        }
        let splits: Vec<&str> = layout
            .index_files()
            .into_iter()
            .filter_map(|f| f.strip_suffix("/state.json"))
            .collect();
        for split in &splits {
            let shards = layout
                .shards()
                .iter()
                .filter(|sh| sh.name.starts_with(&format!("{split}/")))
                .count();
            let (reason, compose) = match dealing {
                Dealing::Planned { mini_epochs, .. } if (shards as u64) < u64::from(mini_epochs) => (
                    format!("has {shards} arrow files for {mini_epochs} mini-epochs"),
                    "",
                ),
                Dealing::Planned {
                    stratified: false, ..
                } if splits.len() > 1 => (
                    "is dealt beside other splits without stratified composition".to_string(),
                    ", or deal every split with --compose stratified",
                ),
                Dealing::Drawn if splits.len() > 1 => (
                    "is dealt beside other splits on a shared mount, whose views are drawn without regard to splits".to_string(),
                    "",
                ),
                Dealing::Partitioned { nodes } if (shards as u64) < u64::from(nodes) => (
                    format!("has {shards} arrow files for {nodes} nodes' shares"),
                    "",
                ),
                Dealing::Partitioned { .. } if splits.len() > 1 => (
                    "is dealt beside other splits on an aggregate mount, whose shares are drawn without regard to splits".to_string(),
                    "",
                ),
                _ => continue,
            };
            return Err(SamplesError::SplitNotInEveryView {
                split: split.to_string(),
                reason,
                compose,
            });
        }
        Ok(())
    }

    /// The groups.
    pub fn groups(&self) -> &SampleGroups {
        &self.groups
    }

    /// The format, when the dataset is one.
    pub fn format(&self) -> Option<Format> {
        self.layout.as_ref().map(Layout::format)
    }

    /// The samples left out at mount because a file of theirs is missing: (a file present,
    /// why: the files missing).
    pub fn incomplete(&self) -> Vec<(String, String)> {
        self.incomplete
            .iter()
            .map(|(present, missing)| {
                let why = format!(
                    "its sample is left out whole: missing {}",
                    missing.join(", ")
                );
                (present.join(", "), why)
            })
            .collect()
    }

    /// The files of `ids` that a view may show: whole samples only (see
    /// [`SampleGroups::whole`]); the samples left out are logged.
    pub fn whole(&self, catalog: &Catalog, ids: &[u32], failed: &dyn Fn(u32) -> bool) -> Vec<u32> {
        let (kept, dropped) = self.groups.whole(ids, failed);
        if !dropped.is_empty() {
            let first = self.groups.members(dropped[0]);
            tracing::warn!(
                samples = dropped.len(),
                first = %catalog.path(first[0]),
                "samples left out of the view whole: a file of theirs was not staged"
            );
        }
        kept
    }

    /// The rewritten index files of the view of `ids` (files of `catalog`): (path, bytes).
    /// None without a format whose index is rewritten.
    pub fn indexes(
        &self,
        catalog: &Catalog,
        ids: &[u32],
    ) -> Result<Vec<(String, Vec<u8>)>, metfs_formats::Error> {
        let Some(layout) = &self.layout else {
            return Ok(Vec::new());
        };
        if layout.index_files().is_empty() {
            return Ok(Vec::new());
        }
        let names: Vec<String> = ids
            .iter()
            .filter(|&&id| self.groups.sample_of(id).is_some())
            .map(|&id| catalog.path(id))
            .collect();
        Ok(layout.view(&names)?.indexes)
    }
}

/// How a mount deals samples into views, for [`Samples::check_splits`].
#[derive(Clone, Copy, Debug)]
pub(super) enum Dealing {
    /// By a plan of `mini_epochs` per epoch, each of every split's share if `stratified`.
    Planned { mini_epochs: u32, stratified: bool },
    /// By a shared mount's cohort: views of samples drawn at random, any number of them.
    Drawn,
    /// By an aggregate mount: each epoch a random partition of the samples into `nodes`
    /// shares of about equal bytes, one per node's view.
    Partitioned { nodes: u32 },
}

/// The samples of `rest` (file ids, ascending) by the manifest's `group` column: the files of
/// one group value are one sample, in the order of the group's first file; a file with no
/// group (or not in `rest`: an always file, or left out by `include`/`exclude`) is its own.
fn by_manifest(catalog: &Catalog, rest: &[u32], explicit: &[(String, String)]) -> Vec<Vec<u32>> {
    let mut group_of: std::collections::HashMap<u32, &str> = std::collections::HashMap::new();
    for (path, group) in explicit {
        if let Some(id) = catalog.find(path) {
            group_of.insert(id, group.as_str());
        }
    }
    let mut index: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    let mut out: Vec<Vec<u32>> = Vec::new();
    for &id in rest {
        match group_of.get(&id) {
            Some(g) => match index.get(g) {
                Some(&i) => out[i].push(id),
                None => {
                    index.insert(g, out.len());
                    out.push(vec![id]);
                }
            },
            None => out.push(vec![id]),
        }
    }
    out
}

/// The bytes the planner (or a queue's claim) may deal into one slot of `slot_bytes` under a
/// budget of `budget`: the slot less the files every view holds (each slot holds them, as
/// hard links of one copy). Always files of more than half the budget, or that leave no room
/// in a slot, are an error naming them.
pub fn dealt_slot_bytes(
    samples: Option<&Samples>,
    catalog: &Catalog,
    budget: u64,
    slot_bytes: u64,
) -> Result<u64, SamplesError> {
    let Some(s) = samples else {
        return Ok(slot_bytes);
    };
    let always = s.groups().always_bytes();
    if always > 0 && (always > budget / 2 || always >= slot_bytes) {
        let list = s.groups().always();
        let mut files: Vec<String> = list.iter().take(3).map(|&id| catalog.path(id)).collect();
        if list.len() > 3 {
            files.push("...".into());
        }
        return Err(SamplesError::AlwaysTooLarge {
            files: files.join(", "),
            bytes: format_bytes(always),
            budget: format_bytes(budget),
            slot: format_bytes(slot_bytes),
        });
    }
    Ok(slot_bytes - always)
}

/// A dataset's samples as a mount makes them, for a command without a mount
/// (`metfs dds init`): see [`apply`].
pub struct Applied {
    /// The files that are part of the dataset (`include`, `exclude`).
    pub catalog: Catalog,
    /// Each file's footprint in the budget.
    pub footprints: Vec<u64>,
    /// The samples, when files are not each one.
    pub samples: Option<Samples>,
}

/// `catalog` under `on`, by a mount's steps in a mount's order: [`select`], [`detect`] (the
/// format's index files read from `tier` through the directory `tmp`), each file's footprint
/// as staged by `staged` ([`metfs_plan::budget::footprints`], the one rule), [`Samples::new`].
pub async fn apply(
    on: &SampleSource<'_>,
    catalog: Catalog,
    tier: Option<&dyn CapacityTier>,
    tmp: &Path,
    staged: Staged,
) -> Result<Applied, SamplesError> {
    let catalog = select(on, catalog)?;
    let detected = detect(on.settings, &catalog, tier, tmp).await?;
    let footprints = footprints(catalog.sizes(), staged);
    let samples = Samples::new(on, &catalog, &footprints, detected)?;
    Ok(Applied {
        catalog,
        footprints,
        samples,
    })
}

/// What a dynamic-sharding queue deals of `catalog` (files of `footprints`): one entry per
/// sample, a group's footprint the sum of its files' and its label and cluster its first
/// file's (the groups' own [`SampleGroups::sample_set`]), or each file where files are
/// samples; and the record of the settings that made them ([`SampleConfig::record`]).
pub fn queue_samples(
    settings: &SampleConfig,
    catalog: &Catalog,
    footprints: &[u64],
    samples: Option<&Samples>,
) -> (OwnedSamples, Option<String>) {
    let record = settings.record(
        samples.and_then(Samples::format),
        samples.is_some_and(|s| s.by_manifest),
    );
    let owned = match samples {
        Some(s) => {
            let set = s.groups().sample_set();
            OwnedSamples {
                sizes: set.sizes.to_vec(),
                labels: set.labels.map(<[u32]>::to_vec),
                clusters: set.clusters.map(<[u32]>::to_vec),
            }
        }
        None => metfs_dds::dataset::samples(catalog, footprints.to_vec()),
    };
    (owned, record)
}

#[cfg(test)]
pub(super) mod tests;
