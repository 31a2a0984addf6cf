//! Building a catalog: samples pushed in any order, checked (paths, duplicates, a file where a
//! directory is needed), sorted, and interned into the compact [`Catalog`].

use super::{validate_rel_path, Catalog, Meta, MetaColumns, Owner, StrArena};
use std::collections::HashMap;

pub(super) fn intern(map: &mut HashMap<String, u32>, names: &mut Vec<String>, s: &str) -> u32 {
    if let Some(&id) = map.get(s) {
        return id;
    }
    let id = names.len() as u32;
    names.push(s.to_string());
    map.insert(s.to_string(), id);
    id
}

/// Why [`CatalogBuilder::finish`] (or [`CatalogBuilder::push`]) refused the samples. Entries are
/// named by their index in push order, so the caller can translate them to manifest lines or
/// listing keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BuildError {
    /// Entry `index` has a path that is not a clean relative path.
    BadPath {
        /// Push index of the entry.
        index: usize,
        /// The offending path.
        path: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Entries `first` and `second` (push order, `first < second`) have the same path.
    Duplicate {
        /// Push index of the earlier entry.
        first: usize,
        /// Push index of the later entry.
        second: usize,
        /// The shared path.
        path: String,
    },
    /// Entry `file` is also a directory of entry `inside`.
    FileDirConflict {
        /// Push index of the sample whose path is also a directory.
        file: usize,
        /// Push index of a sample inside that directory.
        inside: usize,
        /// The path that is both.
        path: String,
    },
    /// More entries than sample ids can address.
    TooMany {
        /// Number of entries pushed so far.
        count: usize,
    },
}

/// Builds a [`Catalog`] one sample at a time, without a `String` per sample: each path is split
/// into an interned directory and a file name appended to one arena as it arrives, so a
/// ten-million-line manifest never exists as ten million `CatalogEntry` values. [`finish`]
/// sorts by path, rejects duplicates and file/directory conflicts, and renumbers labels and
/// clusters in path order so that the same samples always get the same class ids, whatever
/// order they were pushed in.
///
/// [`finish`]: CatalogBuilder::finish
#[derive(Debug, Default)]
pub struct CatalogBuilder {
    dir_ids: HashMap<String, u32>,
    dir_list: Vec<String>,
    dir_of: Vec<u32>,
    names: StrArena,
    sizes: Vec<u64>,
    versions: StrArena,
    labels: Option<Vec<u32>>,
    label_ids: HashMap<String, u32>,
    label_names: Vec<String>,
    clusters: Option<Vec<u32>>,
    cluster_ids: HashMap<String, u32>,
    cluster_names: Vec<String>,
    /// Last directory interned: listings and manifests come directory by directory, so this
    /// spares hashing the directory of almost every sample.
    last_dir: Option<u32>,
    metas: Option<MetaColumns>,
    owner_ids: HashMap<Owner, u32>,
}

/// Appends the class id of `value` (`""` when absent) to `column`, creating the column (filled
/// with `""` for earlier entries) the first time a value appears.
pub(super) fn push_class(
    column: &mut Option<Vec<u32>>,
    ids: &mut HashMap<String, u32>,
    names: &mut Vec<String>,
    value: Option<&str>,
    before: usize,
) {
    match (column.as_mut(), value) {
        (Some(col), v) => {
            // Consecutive samples usually share a class (ImageFolder order): skip the hash.
            let v = v.unwrap_or("");
            let id = match col.last() {
                Some(&last) if names[last as usize] == v => last,
                _ => intern(ids, names, v),
            };
            col.push(id);
        }
        (None, Some(v)) => {
            let mut col = Vec::with_capacity(before + 1);
            if before > 0 {
                let empty = intern(ids, names, "");
                col.resize(before, empty);
            }
            col.push(intern(ids, names, v));
            *column = Some(col);
        }
        (None, None) => {}
    }
}

/// Byte order of full paths `dir/name` (`name` alone at the root), without building them.
pub(super) fn cmp_full(a_dir: &str, a_name: &str, b_dir: &str, b_name: &str) -> std::cmp::Ordering {
    pub(super) fn bytes<'a>(dir: &'a str, name: &'a str) -> impl Iterator<Item = u8> + 'a {
        let sep: &[u8] = if dir.is_empty() { b"" } else { b"/" };
        dir.bytes().chain(sep.iter().copied()).chain(name.bytes())
    }
    if a_dir == b_dir {
        return a_name.cmp(b_name);
    }
    bytes(a_dir, a_name).cmp(bytes(b_dir, b_name))
}

impl CatalogBuilder {
    /// An empty builder with room for `n` samples.
    pub fn with_capacity(n: usize) -> Self {
        Self {
            dir_of: Vec::with_capacity(n),
            sizes: Vec::with_capacity(n),
            ..Self::default()
        }
    }

    /// Number of samples pushed so far.
    pub fn len(&self) -> usize {
        self.sizes.len()
    }

    /// True when nothing was pushed.
    pub fn is_empty(&self) -> bool {
        self.sizes.is_empty()
    }

    /// Records the source metadata of the sample pushed last (call after [`CatalogBuilder::push`]).
    pub fn push_meta(&mut self, meta: Option<Meta>) {
        let n = self.sizes.len();
        if n == 0 {
            return;
        }
        if self.metas.is_none() {
            if meta.is_none() {
                return;
            }
            let mut cols = MetaColumns::default();
            for _ in 0..n - 1 {
                cols.push(&mut self.owner_ids, None);
            }
            self.metas = Some(cols);
        }
        let cols = self.metas.as_mut().expect("created above");
        while cols.owner_of.len() < n - 1 {
            cols.push(&mut self.owner_ids, None);
        }
        if cols.owner_of.len() == n - 1 {
            cols.push(&mut self.owner_ids, meta);
        }
    }

    /// Adds one sample. The path is checked here (see [`validate_rel_path`]); uniqueness is
    /// checked by [`CatalogBuilder::finish`]. Returns the sample's push index.
    pub fn push(
        &mut self,
        path: &str,
        size: u64,
        version: &str,
        label: Option<&str>,
        cluster: Option<&str>,
    ) -> Result<usize, BuildError> {
        let index = self.sizes.len();
        if index >= u32::MAX as usize {
            return Err(BuildError::TooMany { count: index + 1 });
        }
        validate_rel_path(path).map_err(|reason| BuildError::BadPath {
            index,
            path: path.to_string(),
            reason,
        })?;
        let (dir, name) = match path.rfind('/') {
            Some(i) => (&path[..i], &path[i + 1..]),
            None => ("", path),
        };
        let d = match self.last_dir {
            Some(last) if self.dir_list[last as usize] == dir => last,
            _ => intern(&mut self.dir_ids, &mut self.dir_list, dir),
        };
        self.last_dir = Some(d);
        self.dir_of.push(d);
        self.names.push(name);
        self.sizes.push(size);
        self.versions.push(version);
        push_class(
            &mut self.labels,
            &mut self.label_ids,
            &mut self.label_names,
            label,
            index,
        );
        push_class(
            &mut self.clusters,
            &mut self.cluster_ids,
            &mut self.cluster_names,
            cluster,
            index,
        );
        Ok(index)
    }

    /// Push indices in path order. Fast path: when no directory holding samples is an ancestor
    /// of another (the usual ImageFolder layout), path order is directory order then name
    /// order, so a counting sort by directory plus a sort of names inside each directory
    /// replaces ten million full-path comparisons.
    /// Also finds duplicates, while the names being compared are still at hand.
    pub(super) fn path_order(&self) -> Result<Vec<u32>, BuildError> {
        let n = self.len();
        let mut dir_rank: Vec<u32> = (0..self.dir_list.len() as u32).collect();
        // "d/" is the prefix every path under d starts with; "" for the root.
        let key = |d: u32| -> String {
            let s = &self.dir_list[d as usize];
            if s.is_empty() {
                String::new()
            } else {
                format!("{s}/")
            }
        };
        let keys: Vec<String> = (0..self.dir_list.len() as u32).map(key).collect();
        dir_rank.sort_unstable_by(|&a, &b| keys[a as usize].cmp(&keys[b as usize]));
        let nested = dir_rank
            .windows(2)
            .any(|w| keys[w[1] as usize].starts_with(keys[w[0] as usize].as_str()));
        let name = |i: u32| self.names.get(i as usize);
        let dir = |i: u32| self.dir_list[self.dir_of[i as usize] as usize].as_str();
        if nested {
            let mut order: Vec<u32> = (0..n as u32).collect();
            let sorted = order
                .windows(2)
                .all(|w| cmp_full(dir(w[0]), name(w[0]), dir(w[1]), name(w[1])).is_le());
            if !sorted {
                order.sort_unstable_by(|&a, &b| cmp_full(dir(a), name(a), dir(b), name(b)));
            }
            for w in order.windows(2) {
                if self.dir_of[w[0] as usize] == self.dir_of[w[1] as usize]
                    && name(w[0]) == name(w[1])
                {
                    return Err(self.duplicate(w[0], w[1]));
                }
            }
            return Ok(order);
        }
        let mut pos_of_dir = vec![0u32; self.dir_list.len()];
        for (rank, &d) in dir_rank.iter().enumerate() {
            pos_of_dir[d as usize] = rank as u32;
        }
        let mut starts = vec![0usize; self.dir_list.len() + 1];
        for &d in &self.dir_of {
            starts[pos_of_dir[d as usize] as usize + 1] += 1;
        }
        for i in 1..starts.len() {
            starts[i] += starts[i - 1];
        }
        let mut fill = starts.clone();
        let mut order = vec![0u32; n];
        for (i, &d) in self.dir_of.iter().enumerate() {
            let slot = &mut fill[pos_of_dir[d as usize] as usize];
            order[*slot] = i as u32;
            *slot += 1;
        }
        // Names of one directory are copied next to each other before sorting: in a shuffled
        // manifest they are scattered over the whole arena, and every comparison would miss
        // the cache.
        let mut local = String::new();
        let mut spans: Vec<(u32, u32, u32)> = Vec::new();
        for w in starts.windows(2) {
            let group = &mut order[w[0]..w[1]];
            if group.windows(2).all(|p| name(p[0]) < name(p[1])) {
                continue;
            }
            local.clear();
            spans.clear();
            for &i in group.iter() {
                let start = local.len() as u32;
                local.push_str(name(i));
                spans.push((start, local.len() as u32, i));
            }
            let text = |s: &(u32, u32, u32)| &local[s.0 as usize..s.1 as usize];
            spans.sort_unstable_by(|a, b| text(a).cmp(text(b)));
            if let Some(p) = spans.windows(2).find(|p| text(&p[0]) == text(&p[1])) {
                return Err(self.duplicate(p[0].2, p[1].2));
            }
            for (dst, s) in group.iter_mut().zip(&spans) {
                *dst = s.2;
            }
        }
        Ok(order)
    }

    /// Sorts, checks and packs the samples into a catalog. `origin` names the source for
    /// [`Catalog::source`].
    pub fn finish(self, origin: &str) -> Result<Catalog, BuildError> {
        let n = self.len();
        let order = self.path_order()?;
        self.check_file_dir_conflicts()?;

        let identity = order.iter().enumerate().all(|(i, &o)| i as u32 == o);
        let mut cat = Catalog {
            source: origin.to_string(),
            dirs: StrArena::default(),
            dir_of: Vec::new(),
            names: StrArena::default(),
            sizes: Vec::new(),
            versions: StrArena::default(),
            labels: None,
            label_names: Vec::new(),
            clusters: None,
            cluster_names: Vec::new(),
            dir_stamps: Vec::new(),
            metas: None,
        };
        let mut metas = self.metas;
        if let Some(m) = metas.as_mut() {
            // Samples pushed after the last `push_meta` have none.
            let mut ids = HashMap::new();
            while m.owner_of.len() < n {
                m.push(&mut ids, None);
            }
        }
        for d in &self.dir_list {
            cat.dirs.push(d);
        }
        if identity {
            cat.dir_of = self.dir_of;
            cat.names = self.names;
            cat.sizes = self.sizes;
            cat.versions = self.versions;
            cat.metas = metas;
        } else {
            cat.metas = metas.map(|m| m.permuted(&order));
            cat.dir_of = order.iter().map(|&i| self.dir_of[i as usize]).collect();
            cat.sizes = order.iter().map(|&i| self.sizes[i as usize]).collect();
            cat.names = self.names.permuted(&order);
            cat.versions = self.versions.permuted(&order);
        }
        // Class ids in order of first appearance along the sorted paths: the planner keys its
        // random choices on class ids, so every node must number classes the same way.
        if let Some(col) = self.labels {
            let (ids, names) = renumber(&col, &self.label_names, &order);
            cat.labels = Some(ids);
            cat.label_names = names;
        }
        if let Some(col) = self.clusters {
            let (ids, names) = renumber(&col, &self.cluster_names, &order);
            cat.clusters = Some(ids);
            cat.cluster_names = names;
        }
        debug_assert_eq!(cat.sizes.len(), n);
        Ok(cat)
    }

    pub(super) fn duplicate(&self, a: u32, b: u32) -> BuildError {
        BuildError::Duplicate {
            first: a.min(b) as usize,
            second: a.max(b) as usize,
            path: self.full_path(a),
        }
    }

    pub(super) fn full_path(&self, i: u32) -> String {
        let d = &self.dir_list[self.dir_of[i as usize] as usize];
        let n = self.names.get(i as usize);
        if d.is_empty() {
            n.to_string()
        } else {
            format!("{d}/{n}")
        }
    }

    /// A sample path must not also be a directory (or an ancestor of one) of other samples.
    pub(super) fn check_file_dir_conflicts(&self) -> Result<(), BuildError> {
        let mut first_in_dir = vec![u32::MAX; self.dir_list.len()];
        for (i, &d) in self.dir_of.iter().enumerate() {
            if first_in_dir[d as usize] == u32::MAX {
                first_in_dir[d as usize] = i as u32;
            }
        }
        // Every directory that holds samples or is an ancestor of one, keyed by (the sample
        // directory it sits in, its last segment). Only samples in a directory that has such
        // a child need a lookup; in an ImageFolder tree none do, so ten million samples cost
        // no hashing at all.
        let mut children: HashMap<(u32, &str), u32> = HashMap::new();
        let mut has_child = vec![false; self.dir_list.len()];
        for (d, path) in self.dir_list.iter().enumerate() {
            let mut p = path.as_str();
            while !p.is_empty() {
                let (parent, last) = match p.rfind('/') {
                    Some(i) => (&p[..i], &p[i + 1..]),
                    None => ("", p),
                };
                if let Some(&pd) = self.dir_ids.get(parent) {
                    has_child[pd as usize] = true;
                    children.entry((pd, last)).or_insert(first_in_dir[d]);
                }
                p = parent;
            }
        }
        for (i, &d) in self.dir_of.iter().enumerate() {
            if !has_child[d as usize] {
                continue;
            }
            if let Some(&inside) = children.get(&(d, self.names.get(i))) {
                return Err(BuildError::FileDirConflict {
                    file: i,
                    inside: inside as usize,
                    path: self.full_path(i as u32),
                });
            }
        }
        Ok(())
    }
}

/// Class ids renumbered by first appearance along `order`, and their names in the new order.
pub(super) fn renumber(col: &[u32], names: &[String], order: &[u32]) -> (Vec<u32>, Vec<String>) {
    let mut new_id = vec![u32::MAX; names.len()];
    let mut new_names = Vec::with_capacity(names.len());
    let mut ids = Vec::with_capacity(col.len());
    for &i in order {
        let old = col[i as usize] as usize;
        if new_id[old] == u32::MAX {
            new_id[old] = new_names.len() as u32;
            new_names.push(names[old].clone());
        }
        ids.push(new_id[old]);
    }
    (ids, new_names)
}
