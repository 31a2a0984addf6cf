//! The catalog: every sample of the dataset, with its size, content version and optional label
//! and cluster.
//!
//! Layout. Sample ids are dense `u32` indices in path order, so the planner and stager pass
//! integers around instead of strings. Each sample's relative path is split into an interned
//! directory (`dirs`) and a file name stored in one shared string arena, so ten million samples
//! cost about their names' bytes plus ~30 bytes each instead of a `String` (24 bytes of header
//! plus an allocation) per path. Labels and clusters are interned to `u32` class ids.
//!
//! Invariants (checked by [`Catalog::from_entries`]):
//! * every path is a clean relative path (see [`validate_rel_path`]): no `..`, no `.`, no empty
//!   segment, not absolute, valid UTF-8, no NUL;
//! * paths are unique and sorted, so sample ids do not depend on listing order;
//! * no path is also a directory prefix of another path (`a` and `a/b` cannot both be samples).
//!
//! The catalog is saved in the cache directory (postcard, compact) together with the source URL
//! and the modification times of the source's directories, so a later mount can reuse it without
//! listing millions of files again (see [`Catalog::dir_stamps`]).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};
use thiserror::Error;

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
    /// The saved catalog could not be decoded (corrupt or from another metfs version).
    #[error("catalog file {path} is corrupt or from another version: {reason}")]
    Corrupt { path: String, reason: String },
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
}

/// Modification time of one source directory when the catalog was made.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DirStamp {
    /// Directory path relative to the source root (`""` for the root).
    pub dir: String,
    /// Modification time in nanoseconds since the epoch.
    pub mtime_ns: i128,
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
}

const MAGIC: &[u8; 8] = b"METFSCA1";

fn intern(map: &mut HashMap<String, u32>, names: &mut Vec<String>, s: &str) -> u32 {
    if let Some(&id) = map.get(s) {
        return id;
    }
    let id = names.len() as u32;
    names.push(s.to_string());
    map.insert(s.to_string(), id);
    id
}

impl Catalog {
    /// Builds a catalog from entries in any order. `origin` names where the entries came from
    /// (the source URL or the manifest file) for error messages.
    pub fn from_entries(
        origin: &str,
        entries: impl IntoIterator<Item = CatalogEntry>,
    ) -> Result<Self, CatalogError> {
        let mut entries: Vec<CatalogEntry> = entries.into_iter().collect();
        if entries.len() > u32::MAX as usize {
            return Err(CatalogError::TooMany {
                origin: origin.to_string(),
                count: entries.len(),
            });
        }
        for e in &entries {
            validate_rel_path(&e.path).map_err(|reason| CatalogError::BadPath {
                origin: origin.to_string(),
                path: e.path.clone(),
                reason,
            })?;
        }
        entries.sort_unstable_by(|a, b| a.path.cmp(&b.path));
        for w in entries.windows(2) {
            if w[0].path == w[1].path {
                return Err(CatalogError::Duplicate {
                    origin: origin.to_string(),
                    path: w[0].path.clone(),
                });
            }
            // Sorted order puts "a" right before "a/..." only if no sibling such as "a-b" sits in
            // between, so check against every directory prefix below instead of neighbours only.
        }
        let mut cat = Catalog {
            source: origin.to_string(),
            dirs: StrArena::default(),
            dir_of: Vec::with_capacity(entries.len()),
            names: StrArena::default(),
            sizes: Vec::with_capacity(entries.len()),
            versions: StrArena::default(),
            labels: None,
            label_names: Vec::new(),
            clusters: None,
            cluster_names: Vec::new(),
            dir_stamps: Vec::new(),
        };
        let mut dir_ids: HashMap<String, u32> = HashMap::new();
        let mut dir_list: Vec<String> = Vec::new();
        let mut label_ids: HashMap<String, u32> = HashMap::new();
        let mut cluster_ids: HashMap<String, u32> = HashMap::new();
        let any_label = entries.iter().any(|e| e.label.is_some());
        let any_cluster = entries.iter().any(|e| e.cluster.is_some());
        let mut labels = Vec::new();
        let mut clusters = Vec::new();
        for e in &entries {
            let (dir, name) = match e.path.rfind('/') {
                Some(i) => (&e.path[..i], &e.path[i + 1..]),
                None => ("", e.path.as_str()),
            };
            let d = intern(&mut dir_ids, &mut dir_list, dir);
            cat.dir_of.push(d);
            cat.names.push(name);
            cat.sizes.push(e.size);
            cat.versions.push(&e.version);
            if any_label {
                let l = e.label.as_deref().unwrap_or("");
                labels.push(intern(&mut label_ids, &mut cat.label_names, l));
            }
            if any_cluster {
                let c = e.cluster.as_deref().unwrap_or("");
                clusters.push(intern(&mut cluster_ids, &mut cat.cluster_names, c));
            }
        }
        // A sample path must not also be a directory of other samples.
        for e in &entries {
            if dir_ids.contains_key(&e.path) {
                return Err(CatalogError::FileDirConflict {
                    origin: origin.to_string(),
                    path: e.path.clone(),
                });
            }
        }
        // Also every ancestor of a directory is a directory; check those against samples.
        let sample_set: std::collections::HashSet<&str> =
            entries.iter().map(|e| e.path.as_str()).collect();
        for d in &dir_list {
            let mut p = d.as_str();
            while let Some(i) = p.rfind('/') {
                p = &p[..i];
                if sample_set.contains(p) {
                    return Err(CatalogError::FileDirConflict {
                        origin: origin.to_string(),
                        path: p.to_string(),
                    });
                }
            }
        }
        for d in &dir_list {
            cat.dirs.push(d);
        }
        if any_label {
            cat.labels = Some(labels);
        }
        if any_cluster {
            cat.clusters = Some(clusters);
        }
        Ok(cat)
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
    /// Cluster ids of all samples, when the catalog has clusters.
    pub fn clusters(&self) -> Option<&[u32]> {
        self.clusters.as_deref()
    }
    /// Name of cluster id `cluster`.
    pub fn cluster_name(&self, cluster: u32) -> &str {
        &self.cluster_names[cluster as usize]
    }
    /// Total bytes of all samples.
    pub fn total_bytes(&self) -> u64 {
        self.sizes.iter().sum()
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
    /// Records directory modification times (see [`Catalog::dir_stamps`]).
    pub fn set_dir_stamps(&mut self, stamps: Vec<DirStamp>) {
        self.dir_stamps = stamps;
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

    /// Writes the catalog atomically (temporary file, fsync, rename).
    pub fn save(&self, path: &Path) -> Result<u64, CatalogError> {
        let io = |source| CatalogError::Io {
            path: path.display().to_string(),
            source,
        };
        let body = postcard::to_stdvec(self).map_err(|e| CatalogError::Corrupt {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        let tmp = path.with_extension("tmp");
        {
            let mut f = std::fs::File::create(&tmp).map_err(io)?;
            f.write_all(MAGIC).map_err(io)?;
            f.write_all(&body).map_err(io)?;
            f.sync_all().map_err(io)?;
        }
        std::fs::rename(&tmp, path).map_err(io)?;
        Ok((MAGIC.len() + body.len()) as u64)
    }

    /// Reads a catalog written by [`Catalog::save`].
    pub fn load(path: &Path) -> Result<Self, CatalogError> {
        let mut buf = Vec::new();
        std::fs::File::open(path)
            .and_then(|mut f| f.read_to_end(&mut buf))
            .map_err(|source| CatalogError::Io {
                path: path.display().to_string(),
                source,
            })?;
        let corrupt = |reason: String| CatalogError::Corrupt {
            path: path.display().to_string(),
            reason,
        };
        if buf.len() < MAGIC.len() || &buf[..MAGIC.len()] != MAGIC {
            return Err(corrupt("bad magic".into()));
        }
        let cat: Catalog =
            postcard::from_bytes(&buf[MAGIC.len()..]).map_err(|e| corrupt(e.to_string()))?;
        let n = cat.sizes.len();
        if cat.dir_of.len() != n
            || cat.names.len() != n
            || cat.versions.len() != n
            || cat.labels.as_ref().is_some_and(|l| l.len() != n)
            || cat.clusters.as_ref().is_some_and(|c| c.len() != n)
            || cat.dir_of.iter().any(|&d| d as usize >= cat.dirs.len())
        {
            return Err(corrupt("inconsistent lengths".into()));
        }
        Ok(cat)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(p: &str, s: u64) -> CatalogEntry {
        CatalogEntry::new(p, s)
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
        }]);
        cat.save(&p).unwrap();
        assert_eq!(Catalog::load(&p).unwrap(), cat);
        std::fs::write(&p, b"garbage").unwrap();
        assert!(matches!(
            Catalog::load(&p),
            Err(CatalogError::Corrupt { .. })
        ));
    }
}
