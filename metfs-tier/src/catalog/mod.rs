//! The catalog: every sample of the dataset, with its size, content version and optional label
//! and cluster.
//!
//! Layout. Sample ids are dense `u32` indices in path order, so the planner and stager pass
//! integers around instead of strings. Each sample's relative path is split into an interned
//! directory (`dirs`) and a file name stored in one shared string arena, so ten million samples
//! cost about their names' bytes plus ~30 bytes each instead of a `String` (24 bytes of header
//! plus an allocation) per path. Labels and clusters are interned to `u32` class ids, numbered
//! by first appearance in path order, so the same samples get the same class ids on every node
//! whatever order the listing or manifest delivered them in (the planner depends on that).
//!
//! Building. [`CatalogBuilder`] takes samples one at a time straight into those arenas; a
//! manifest of ten million lines is never held as ten million [`CatalogEntry`] values.
//! [`Catalog::from_entries`] is a thin wrapper over it.
//!
//! Invariants (checked by [`CatalogBuilder::finish`]):
//! * every path is a clean relative path (see [`validate_rel_path`]): no `..`, no `.`, no empty
//!   segment, not absolute, valid UTF-8, no NUL;
//! * paths are unique and sorted, so sample ids do not depend on listing order;
//! * no path is also a directory prefix of another path (`a` and `a/b` cannot both be samples).
//!
//! The catalog is saved in the cache directory (postcard, compact) together with the source URL
//! and the modification times of the source's directories, so a later mount can reuse it without
//! listing millions of files again (see [`Catalog::dir_stamps`]).
//!
//! Metadata. Where the tier reports it, each sample (and each listed directory) carries what
//! `stat` shows at the source ([`Meta`]: permission bits, owner, mtime, ctime), so that the
//! view mirrors it. Owner and mode are interned (a dataset has few distinct ones) and times are
//! two `i64`s, so metadata costs 20 bytes a sample. Format version 2 (`METFSCA2`) added it; a
//! catalog of version 1 fails to load and the source is simply catalogued again.
//!
//! Catalog files. [`CatalogFile`] wraps the same encoding in a versioned header (source URL,
//! what identifies the source's version, length and digest): a catalog written once per dataset
//! version (`metfs catalog`) and shared by every node of a job, so that none of them lists the
//! tier (see `file.rs` for the layout and its checks).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use thiserror::Error;

mod builder;
mod file;
mod persist;

pub use builder::*;
pub use file::*;

/// Errors of the catalog module.
#[derive(Debug, Error)]
pub enum CatalogError {
    /// A path that would escape the view or is otherwise not a clean relative path.
    #[error("{origin}: path `{path}` is not allowed: {reason}")]
    BadPath {
        origin: String,
        path: String,
        reason: &'static str,
    },
    /// The same path appears twice.
    #[error("{origin}: duplicate path `{path}`")]
    Duplicate { origin: String, path: String },
    /// A path is both a sample and a directory of other samples.
    #[error("{origin}: `{path}` is both a file and a directory of other samples")]
    FileDirConflict { origin: String, path: String },
    /// The catalog holds more samples than sample ids can address.
    #[error("{origin}: {count} samples is more than the 4,294,967,295 a catalog can hold")]
    TooMany { origin: String, count: usize },
    /// Reading or writing the saved catalog failed.
    #[error("catalog file {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The catalog could not be saved (the error names the file and the step).
    #[error("catalog file {0}")]
    Save(#[source] metfs_durable::DurableError),
    /// The saved catalog could not be decoded (corrupt or from another metfs version).
    #[error("catalog file {path} is corrupt or from another version: {reason}")]
    Corrupt { path: String, reason: String },
    /// A catalog file (`metfs catalog`) that cannot be used: truncated, of another format
    /// version, damaged, or not a catalog file.
    #[error("catalog file {path} refused: {reason}")]
    FileRefused { path: String, reason: String },
    /// A catalog file of another source than the mount's.
    #[error("catalog file {path} refused: it lists {catalogued}, not this mount's source {mount_source}; make one of {mount_source} with `metfs catalog`")]
    OtherSource {
        path: String,
        catalogued: String,
        mount_source: String,
    },
    /// A catalog file whose source has changed since it was made, as far as a cheap check
    /// tells (a stat of the root, a request for one sample).
    #[error("catalog file {path} refused: it is stale, {mount_source} changed since it was made ({what}); make it again with `metfs catalog`")]
    Stale {
        path: String,
        mount_source: String,
        what: String,
    },
}

impl CatalogError {
    /// The error of a [`CatalogBuilder`] refusing samples from `origin` (the source URL or the
    /// manifest file).
    pub fn from_build(origin: &str, e: BuildError) -> Self {
        let origin = origin.to_string();
        match e {
            BuildError::BadPath { path, reason, .. } => Self::BadPath {
                origin,
                path,
                reason,
            },
            BuildError::Duplicate { path, .. } => Self::Duplicate { origin, path },
            BuildError::FileDirConflict { path, .. } => Self::FileDirConflict { origin, path },
            BuildError::TooMany { count } => Self::TooMany { origin, count },
        }
    }
}

/// One sample as a tier listing or a manifest reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogEntry {
    /// Path relative to the source root, `/`-separated.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// Content identity: the ETag for object stores, `mtime_ns` for POSIX; empty when unknown.
    pub version: String,
    /// Class label used by stratified composition.
    pub label: Option<String>,
    /// Cluster id used by clustered composition.
    pub cluster: Option<String>,
    /// What `stat` shows at the source, when the tier reports it.
    pub meta: Option<Meta>,
}

impl CatalogEntry {
    /// An entry with only a path and a size.
    pub fn new(path: impl Into<String>, size: u64) -> Self {
        Self {
            path: path.into(),
            size,
            version: String::new(),
            label: None,
            cluster: None,
            meta: None,
        }
    }
}

/// What `stat` shows of a sample or directory at the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    /// Owner, or [`Meta::NO_OWNER`] where the source has none (object stores).
    pub uid: u32,
    /// Group, or [`Meta::NO_OWNER`].
    pub gid: u32,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i64,
    /// Status change time, nanoseconds since the epoch.
    pub ctime_ns: i64,
}

impl Meta {
    /// Owner of a sample whose source has no owners: the view shows the mounting user.
    pub const NO_OWNER: u32 = u32::MAX;

    /// The metadata of a POSIX file.
    pub fn from_metadata(md: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self {
            mode: md.mode() & 0o7777,
            uid: md.uid(),
            gid: md.gid(),
            mtime_ns: md.mtime().saturating_mul(1_000_000_000) + md.mtime_nsec(),
            ctime_ns: md.ctime().saturating_mul(1_000_000_000) + md.ctime_nsec(),
        }
    }
}

/// Owner and mode of samples, interned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
struct Owner {
    mode: u32,
    uid: u32,
    gid: u32,
}

/// Per-sample metadata, a column set present when any sample has metadata.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct MetaColumns {
    /// Index into `owners` per sample, `u32::MAX` for a sample without metadata.
    owner_of: Vec<u32>,
    owners: Vec<Owner>,
    /// (mtime, ctime) in nanoseconds per sample.
    times: Vec<(i64, i64)>,
}

impl MetaColumns {
    fn push(&mut self, ids: &mut HashMap<Owner, u32>, meta: Option<Meta>) {
        match meta {
            Some(m) => {
                let o = Owner {
                    mode: m.mode,
                    uid: m.uid,
                    gid: m.gid,
                };
                let id = *ids.entry(o).or_insert_with(|| {
                    self.owners.push(o);
                    self.owners.len() as u32 - 1
                });
                self.owner_of.push(id);
                self.times.push((m.mtime_ns, m.ctime_ns));
            }
            None => {
                self.owner_of.push(u32::MAX);
                self.times.push((0, 0));
            }
        }
    }

    fn get(&self, i: usize) -> Option<Meta> {
        let o = *self.owners.get(*self.owner_of.get(i)? as usize)?;
        let (mtime_ns, ctime_ns) = self.times[i];
        Some(Meta {
            mode: o.mode,
            uid: o.uid,
            gid: o.gid,
            mtime_ns,
            ctime_ns,
        })
    }

    fn permuted(&self, order: &[u32]) -> Self {
        Self {
            owner_of: order.iter().map(|&i| self.owner_of[i as usize]).collect(),
            owners: self.owners.clone(),
            times: order.iter().map(|&i| self.times[i as usize]).collect(),
        }
    }
}

/// Checks that `path` is a clean relative path: the only kind that may appear in a view.
pub fn validate_rel_path(path: &str) -> Result<(), &'static str> {
    if path.is_empty() {
        return Err("empty path");
    }
    if path.starts_with('/') {
        return Err("absolute path");
    }
    if path.contains('\0') {
        return Err("contains a NUL byte");
    }
    for seg in path.split('/') {
        match seg {
            "" => return Err("empty path segment (`//` or trailing `/`)"),
            "." => return Err("`.` segment"),
            ".." => return Err("`..` segment escapes the source"),
            _ => {}
        }
    }
    Ok(())
}

/// Strings packed end to end in one buffer; entry `i` is `buf[ends[i-1]..ends[i]]`.
#[derive(Debug, Default, Clone, Serialize, Deserialize, PartialEq, Eq)]
struct StrArena {
    buf: String,
    ends: Vec<u64>,
}

impl StrArena {
    fn push(&mut self, s: &str) {
        self.buf.push_str(s);
        self.ends.push(self.buf.len() as u64);
    }
    fn get(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.buf[start..self.ends[i] as usize]
    }
    fn len(&self) -> usize {
        self.ends.len()
    }
    /// Checks what [`StrArena::get`] relies on, for an arena read back from a file: ends that
    /// never decrease, fall on character boundaries and stop at the end of the buffer.
    fn check(&self) -> Result<(), String> {
        let mut prev = 0u64;
        for (i, &end) in self.ends.iter().enumerate() {
            if end < prev || end > self.buf.len() as u64 || !self.buf.is_char_boundary(end as usize)
            {
                return Err(format!("string {i} ends at {end}, outside its buffer"));
            }
            prev = end;
        }
        if prev != self.buf.len() as u64 {
            return Err("string buffer longer than its strings".into());
        }
        Ok(())
    }
    /// A new arena holding entry `order[i]` at position `i`.
    fn permuted(&self, order: &[u32]) -> StrArena {
        if self.buf.is_empty() {
            // All entries empty (no versions, say): every end is 0 whatever the order.
            return self.clone();
        }
        let mut out = StrArena {
            buf: String::with_capacity(self.buf.len()),
            ends: Vec::with_capacity(order.len()),
        };
        for &i in order {
            out.push(self.get(i as usize));
        }
        out
    }
}

/// Modification time of one source directory when the catalog was made.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DirStamp {
    /// Directory path relative to the source root (`""` for the root).
    pub dir: String,
    /// Modification time in nanoseconds since the epoch.
    pub mtime_ns: i128,
    /// What `stat` showed of the directory, when the tier reports it.
    pub meta: Option<Meta>,
}

/// Every sample of the dataset. See the module docs for the layout and invariants.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Catalog {
    source: String,
    dirs: StrArena,
    dir_of: Vec<u32>,
    names: StrArena,
    sizes: Vec<u64>,
    versions: StrArena,
    labels: Option<Vec<u32>>,
    label_names: Vec<String>,
    clusters: Option<Vec<u32>>,
    cluster_names: Vec<String>,
    dir_stamps: Vec<DirStamp>,
    metas: Option<MetaColumns>,
}

impl Catalog {
    /// Builds a catalog from entries in any order. `origin` names where the entries came from
    /// (the source URL or the manifest file) for error messages.
    pub fn from_entries(
        origin: &str,
        entries: impl IntoIterator<Item = CatalogEntry>,
    ) -> Result<Self, CatalogError> {
        let entries = entries.into_iter();
        let mut b = CatalogBuilder::with_capacity(entries.size_hint().0);
        let to_err = |e: BuildError| CatalogError::from_build(origin, e);
        for e in entries {
            b.push(
                &e.path,
                e.size,
                &e.version,
                e.label.as_deref(),
                e.cluster.as_deref(),
            )
            .map_err(to_err)?;
            b.push_meta(e.meta);
        }
        b.finish(origin).map_err(to_err)
    }

    /// Where the catalog came from (source URL or manifest path).
    pub fn source(&self) -> &str {
        &self.source
    }
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.sizes.len()
    }
    /// True when the dataset has no samples.
    pub fn is_empty(&self) -> bool {
        self.sizes.is_empty()
    }
    /// Relative path of sample `id`.
    pub fn path(&self, id: u32) -> String {
        let d = self.dirs.get(self.dir_of[id as usize] as usize);
        let n = self.names.get(id as usize);
        if d.is_empty() {
            n.to_string()
        } else {
            format!("{d}/{n}")
        }
    }
    /// Directory part (`""` at the root) and file name of sample `id`, without allocating.
    pub fn dir_and_name(&self, id: u32) -> (&str, &str) {
        (
            self.dirs.get(self.dir_of[id as usize] as usize),
            self.names.get(id as usize),
        )
    }
    /// File name of sample `id`, without allocating.
    pub fn name(&self, id: u32) -> &str {
        self.names.get(id as usize)
    }
    /// Index of sample `id`'s directory among [`Catalog::dir_path`]'s, so that a caller
    /// grouping samples by directory compares integers rather than strings.
    pub fn dir_index(&self, id: u32) -> u32 {
        self.dir_of[id as usize]
    }
    /// Path of directory `dir` (a [`Catalog::dir_index`]), `""` for the root.
    pub fn dir_path(&self, dir: u32) -> &str {
        self.dirs.get(dir as usize)
    }
    /// Size in bytes of sample `id`.
    pub fn size(&self, id: u32) -> u64 {
        self.sizes[id as usize]
    }
    /// Sizes of all samples, indexed by sample id.
    pub fn sizes(&self) -> &[u64] {
        &self.sizes
    }
    /// Content version (ETag or mtime) of sample `id`.
    pub fn version(&self, id: u32) -> &str {
        self.versions.get(id as usize)
    }
    /// Class ids of all samples, when the catalog has labels.
    pub fn labels(&self) -> Option<&[u32]> {
        self.labels.as_deref()
    }
    /// Name of class id `label`.
    pub fn label_name(&self, label: u32) -> &str {
        &self.label_names[label as usize]
    }
    /// Number of distinct labels.
    pub fn label_count(&self) -> usize {
        self.label_names.len()
    }
    /// Names of all labels, indexed by class id.
    pub fn label_names(&self) -> &[String] {
        &self.label_names
    }
    /// Cluster ids of all samples, when the catalog has clusters.
    pub fn clusters(&self) -> Option<&[u32]> {
        self.clusters.as_deref()
    }
    /// Name of cluster id `cluster`.
    pub fn cluster_name(&self, cluster: u32) -> &str {
        &self.cluster_names[cluster as usize]
    }
    /// Names of all clusters, indexed by cluster id.
    pub fn cluster_names(&self) -> &[String] {
        &self.cluster_names
    }
    /// Total bytes of all samples.
    pub fn total_bytes(&self) -> u64 {
        // Saturating: a listing is not checked like a manifest, and a total is only reported.
        self.sizes.iter().fold(0, |a, &b| a.saturating_add(b))
    }
    /// Number of distinct directories holding samples.
    pub fn dir_count(&self) -> usize {
        self.dirs.len()
    }
    /// Replaces the labels with ones derived from each sample's first directory level
    /// (the ImageFolder layout); samples at the root get the label `""`.
    pub fn label_by_first_dir(&mut self) {
        let mut ids: HashMap<String, u32> = HashMap::new();
        let mut names = Vec::new();
        let mut labels = Vec::with_capacity(self.len());
        for id in 0..self.len() as u32 {
            let (dir, _) = self.dir_and_name(id);
            let first = dir.split('/').next().unwrap_or("");
            labels.push(intern(&mut ids, &mut names, first));
        }
        self.labels = Some(labels);
        self.label_names = names;
    }
    /// Replaces the labels with the given per-sample class names.
    pub fn set_labels(&mut self, per_sample: Vec<String>) {
        let mut ids: HashMap<String, u32> = HashMap::new();
        let mut names = Vec::new();
        let labels = per_sample
            .iter()
            .map(|l| intern(&mut ids, &mut names, l))
            .collect();
        self.labels = Some(labels);
        self.label_names = names;
    }
    /// Directory modification times recorded when the catalog was made (POSIX sources).
    pub fn dir_stamps(&self) -> &[DirStamp] {
        &self.dir_stamps
    }
    /// What `stat` showed of sample `id` at the source, when the tier reported it.
    pub fn meta(&self, id: u32) -> Option<Meta> {
        self.metas.as_ref()?.get(id as usize)
    }
    /// Records directory modification times (see [`Catalog::dir_stamps`]).
    pub fn set_dir_stamps(&mut self, stamps: Vec<DirStamp>) {
        self.dir_stamps = stamps;
    }
    /// The catalog of the samples `keep` says yes to, with their labels, clusters and what
    /// `stat` showed, in the same order, and this catalog's directory stamps (a source's
    /// `--include` and `--exclude` applied after listing, so the listing saved for the next
    /// mount is the whole source's).
    pub fn subset(&self, keep: impl Fn(u32) -> bool) -> Result<Catalog, CatalogError> {
        let mut b = CatalogBuilder::with_capacity(self.len());
        let to_err = |e: BuildError| CatalogError::from_build(&self.source, e);
        for id in (0..self.len() as u32).filter(|&id| keep(id)) {
            let label = self
                .labels
                .as_ref()
                .map(|l| self.label_name(l[id as usize]));
            let cluster = self
                .clusters
                .as_ref()
                .map(|c| self.cluster_name(c[id as usize]));
            b.push(
                &self.path(id),
                self.size(id),
                self.version(id),
                label,
                cluster,
            )
            .map_err(to_err)?;
            b.push_meta(self.meta(id));
        }
        let mut cat = b.finish(&self.source).map_err(to_err)?;
        cat.dir_stamps = self.dir_stamps.clone();
        Ok(cat)
    }
    /// Sample id of `path`, by binary search over the sorted paths.
    pub fn find(&self, path: &str) -> Option<u32> {
        let (mut lo, mut hi) = (0usize, self.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            match self.path(mid as u32).as_str().cmp(path) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(mid as u32),
            }
        }
        None
    }
}

/// The planner's view of a catalog: what the budget's reserve and the catalog's digest read.
impl metfs_plan::CatalogSamples for Catalog {
    fn len(&self) -> usize {
        Catalog::len(self)
    }
    fn dir_count(&self) -> usize {
        Catalog::dir_count(self)
    }
    fn dir_and_name(&self, id: u32) -> (&str, &str) {
        Catalog::dir_and_name(self, id)
    }
    fn size(&self, id: u32) -> u64 {
        Catalog::size(self, id)
    }
    fn version(&self, id: u32) -> &str {
        Catalog::version(self, id)
    }
    fn label(&self, id: u32) -> Option<&str> {
        self.labels().map(|l| self.label_name(l[id as usize]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_refuses_a_damaged_catalog() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog.bin");
        let good = Catalog::from_entries(
            "src",
            vec![
                CatalogEntry::new("a/x.bin", 1),
                CatalogEntry::new("b/y.bin", 2),
            ],
        )
        .unwrap();
        good.save(&path).unwrap();
        assert_eq!(Catalog::load(&path).unwrap(), good);
        type Damage = Box<dyn Fn(&mut Catalog)>;
        let damaged: Vec<(&str, Damage)> = vec![
            ("past its buffer", Box::new(|c| c.names.ends[1] = 99)),
            ("decreasing", Box::new(|c| c.names.ends = vec![6, 3])),
            (
                "mid-character",
                Box::new(|c| {
                    c.names.buf = "é.bin".into();
                    c.names.ends = vec![1, 6];
                }),
            ),
            (
                "label without a name",
                Box::new(|c| c.labels = Some(vec![0, 3])),
            ),
            (
                "cluster without a name",
                Box::new(|c| {
                    c.clusters = Some(vec![0, 0]);
                    c.cluster_names = vec![];
                }),
            ),
            (
                "escaping directory",
                Box::new(|c| {
                    c.dirs.buf = "..b".into();
                    c.dirs.ends = vec![2, 3];
                }),
            ),
            (
                "name with a slash",
                Box::new(|c| {
                    c.names.buf = "x/binyy".into();
                }),
            ),
        ];
        for (what, damage) in damaged {
            let mut c = good.clone();
            damage(&mut c);
            c.save(&path).unwrap();
            match Catalog::load(&path) {
                Err(CatalogError::Corrupt { .. }) => {}
                other => panic!("{what}: loaded {other:?}"),
            }
        }
    }

    fn e(p: &str, s: u64) -> CatalogEntry {
        CatalogEntry::new(p, s)
    }

    #[test]
    fn metadata_follows_its_sample_through_sorting_and_saving() {
        let m = |mode, t| Meta {
            mode,
            uid: 7,
            gid: 8,
            mtime_ns: t,
            ctime_ns: t + 1,
        };
        let mut b = e("b", 1);
        b.meta = Some(m(0o640, 10));
        let mut a = e("a", 2);
        a.meta = Some(m(0o600, 20));
        let cat = Catalog::from_entries("s", vec![b, e("c", 3), a]).unwrap();
        assert_eq!(cat.meta(0), Some(m(0o600, 20)));
        assert_eq!(cat.meta(1), Some(m(0o640, 10)));
        assert_eq!(cat.meta(2), None);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("catalog.bin");
        cat.save(&p).unwrap();
        assert_eq!(Catalog::load(&p).unwrap(), cat);
        // A catalog of the previous format is refused, so the source is catalogued again.
        let mut old = std::fs::read(&p).unwrap();
        old[..8].copy_from_slice(b"METFSCA1");
        std::fs::write(&p, old).unwrap();
        assert!(Catalog::load(&p).is_err());
        let plain = Catalog::from_entries("s", vec![e("x", 1)]).unwrap();
        assert_eq!(plain.meta(0), None);
    }

    #[test]
    fn builds_sorted_and_interned() {
        let cat = Catalog::from_entries(
            "src",
            vec![e("b/2", 2), e("a/1", 1), e("a/x y é", 3), e("top", 4)],
        )
        .unwrap();
        assert_eq!(cat.len(), 4);
        assert_eq!(cat.path(0), "a/1");
        assert_eq!(cat.path(1), "a/x y é");
        assert_eq!(cat.path(2), "b/2");
        assert_eq!(cat.path(3), "top");
        assert_eq!(cat.dir_count(), 3);
        assert_eq!(cat.find("b/2"), Some(2));
        assert_eq!(cat.find("nope"), None);
        assert_eq!(cat.total_bytes(), 10);
    }

    #[test]
    fn rejects_bad_paths() {
        for p in ["../x", "/abs", "a//b", "a/./b", "a/../b", "a/", ""] {
            let err = Catalog::from_entries("m.csv", vec![e(p, 1)]).unwrap_err();
            assert!(err.to_string().contains("m.csv"), "{err}");
        }
    }

    #[test]
    fn rejects_duplicates_and_conflicts() {
        let err = Catalog::from_entries("m", vec![e("a", 1), e("a", 2)]).unwrap_err();
        assert!(matches!(err, CatalogError::Duplicate { .. }));
        let err = Catalog::from_entries("m", vec![e("a", 1), e("a/b/c", 2)]).unwrap_err();
        assert!(matches!(err, CatalogError::FileDirConflict { .. }), "{err}");
    }

    #[test]
    fn labels_by_first_dir() {
        let mut cat =
            Catalog::from_entries("s", vec![e("cat/1", 1), e("dog/x/2", 1), e("cat/3", 1)])
                .unwrap();
        cat.label_by_first_dir();
        let l = cat.labels().unwrap();
        assert_eq!(l[0], l[1]);
        assert_ne!(l[0], l[2]);
        assert_eq!(cat.label_name(l[2]), "dog");
    }

    #[test]
    fn save_load_roundtrip_and_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("catalog.bin");
        let mut cat = Catalog::from_entries("s", vec![e("a/1", 1), e("b", 2)]).unwrap();
        cat.set_dir_stamps(vec![DirStamp {
            dir: String::new(),
            mtime_ns: 5,
            meta: None,
        }]);
        cat.save(&p).unwrap();
        assert_eq!(Catalog::load(&p).unwrap(), cat);
        std::fs::write(&p, b"garbage").unwrap();
        assert!(matches!(
            Catalog::load(&p),
            Err(CatalogError::Corrupt { .. })
        ));
    }

    #[test]
    fn builder_sorts_nested_and_flat_layouts_like_full_paths() {
        // Nested directories interleave with files: "a/b.txt" < "a/c/1" < "a/z" and
        // "a-b/x" < "a/..." because '-' sorts before '/'.
        let paths = ["a/z", "a-b/x", "a/c/1", "a/b.txt", "top", "a/c/0"];
        let mut b = CatalogBuilder::default();
        for p in paths {
            b.push(p, 1, "", None, None).unwrap();
        }
        let cat = b.finish("s").unwrap();
        let got: Vec<String> = (0..cat.len() as u32).map(|i| cat.path(i)).collect();
        let mut want: Vec<String> = paths.iter().map(|s| s.to_string()).collect();
        want.sort();
        assert_eq!(got, want);
        for (i, p) in want.iter().enumerate() {
            assert_eq!(cat.find(p), Some(i as u32));
        }
        // Flat layout, unsorted, with labels arriving late.
        let mut b = CatalogBuilder::default();
        b.push("d2/b", 1, "", None, None).unwrap();
        b.push("d1/b", 2, "v", Some("x"), None).unwrap();
        b.push("d1/a", 3, "", Some("y"), Some("c")).unwrap();
        let cat = b.finish("s").unwrap();
        assert_eq!(cat.path(0), "d1/a");
        assert_eq!(cat.version(1), "v");
        assert_eq!(cat.labels().unwrap(), &[0, 1, 2]);
        assert_eq!(cat.label_names(), &["y", "x", ""]);
        assert_eq!(cat.cluster_names(), &["c", ""]);
    }

    #[test]
    fn builder_errors_name_push_indices() {
        let mut b = CatalogBuilder::default();
        b.push("x", 1, "", None, None).unwrap();
        assert!(matches!(
            b.push("../y", 1, "", None, None),
            Err(BuildError::BadPath { index: 1, .. })
        ));
        let mut b = CatalogBuilder::default();
        for p in ["q", "a/b", "r", "a/b"] {
            b.push(p, 1, "", None, None).unwrap();
        }
        assert_eq!(
            b.finish("s").unwrap_err(),
            BuildError::Duplicate {
                first: 1,
                second: 3,
                path: "a/b".into()
            }
        );
        let mut b = CatalogBuilder::default();
        for p in ["a/b/c", "q", "a"] {
            b.push(p, 1, "", None, None).unwrap();
        }
        assert_eq!(
            b.finish("s").unwrap_err(),
            BuildError::FileDirConflict {
                file: 2,
                inside: 0,
                path: "a".into()
            }
        );
    }
}
