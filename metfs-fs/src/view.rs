//! The view index: what the mount shows for one generation.
//!
//! A [`View`] is an immutable in-memory tree of one slot: directories and files under the
//! samples' original relative paths, each node with an inode number that encodes the view's
//! generation (`generation << 32 | node`), so an inode handed to the kernel before a switch can
//! never be confused with one of the new view. The root is always inode 1 and always means the
//! *current* view.
//!
//! Layout. A view of millions of files must cost a few bytes per file (issue 31: the daemon
//! holds the current view and the next one beside the catalog), so it stores no path, name,
//! size or metadata of a file: those are the catalog's, which the view shares (`Arc<Catalog>`)
//! and which stores each name once. Nodes are numbered breadth first with each directory's
//! children consecutive and sorted by name, so a directory is a range of node indices rather
//! than a list of them; per node the view keeps its parent and one `u32` (a file's sample id,
//! or a directory's index into the few directory records, which hold the directory's own name
//! and what `stat` showed of it). With the kernel's lookup count and the first pass's bit,
//! that is 12 bytes and 2 bits a node.
//!
//! Lookup is a binary search over a directory's range (names read from the catalog's arena)
//! and readdir is a range walk: both answered from memory with no I/O. A view is built once per
//! switch in O(files · depth), then shared read-only by every FUSE thread.

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use metfs_prefetcher::stager::CopyChecks;
use metfs_tier::catalog::{Catalog, Meta};

use metfs_protocol::reply::PackedBuilder;
use metfs_protocol::PackedList;

/// Inode number of the root directory.
pub const ROOT_INO: u64 = 1;

/// What a node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    /// A directory; its children are [`View::children`].
    Dir,
    /// A file backed by a staged sample.
    File { sample: u32, size: u64 },
}

/// One directory of a view: a handful per view, so it may hold its name and metadata.
#[derive(Debug)]
struct DirRecord {
    /// The directory's name within its parent (`""` for the root), in `View::dir_names`.
    name: Range<u32>,
    /// Its children: nodes `first..first + len`, sorted by name.
    first: u32,
    len: u32,
    /// What `stat` showed of it at the source, when known.
    meta: Option<Meta>,
}

/// The current mini-epoch's files as a tree. Immutable once built.
#[derive(Debug)]
pub struct View {
    /// Generation of this view (>= 1).
    pub generation: u64,
    /// Epoch of the mini-epoch shown.
    pub epoch: u64,
    /// Index of the mini-epoch within its epoch.
    pub mini_epoch: u32,
    /// Slot directory holding the files.
    pub slot_dir: PathBuf,
    /// Slot name.
    pub slot: String,
    /// A job's view on a shared mount (`--share`): its root is the directory `MNT/<job>`, an
    /// inode of its own (`generation << 32`), not the mount's root.
    nested: bool,
    /// Where the files' names, sizes and metadata live (module doc).
    catalog: Arc<Catalog>,
    /// Per node: its parent (the root is its own parent).
    parents: Box<[u32]>,
    /// Per node: a file's sample id, or a directory's index into `dirs` (see `is_dir`).
    items: Box<[u32]>,
    /// One bit per node: a directory.
    is_dir: Box<[u64]>,
    dirs: Box<[DirRecord]>,
    dir_names: String,
    files: usize,
    bytes: u64,
    open_handles: AtomicUsize,
    /// Clients holding a lease on this view's slot files, read directly rather than through
    /// the mount (`files` with `direct`): each pins the slot as an open handle does.
    leases: AtomicUsize,
    /// Taken back from its readers ([`crate::fs::FsCore::revoke`]): its data is unreachable
    /// through the mount, so handles and kernel references no longer hold its slot.
    revoked: std::sync::atomic::AtomicBool,
    /// Per node: the kernel's lookup count (entries replied minus entries forgotten).
    refs: Box<[AtomicU32]>,
    /// Sum of `refs`: the kernel holds an inode of this view while it is above zero.
    kernel_refs: AtomicU64,
    /// Sum of `refs` over file nodes: what pins the view's slot on the cached read path (see
    /// [`View::file_refs`]).
    file_refs: AtomicU64,
    /// One bit per node: looked up at least once (the first pass's progress).
    touched: Box<[AtomicU64]>,
    touched_files: AtomicUsize,
    first_touch: OnceLock<Instant>,
    /// The slot's copies kept on the strength of its seal, checked at their first open
    /// (`metfs_prefetcher::stager::CopyChecks`); `None` when staging checked every copy.
    copy_checks: Option<Arc<CopyChecks>>,
}

/// Errors of view lookups, mapped to errno by the FUSE adapter (through
/// [`crate::fs::FsError`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Miss {
    /// No such name.
    #[error("no such file or directory")]
    NotFound,
    /// A directory operation on a file or vice versa.
    #[error("not a directory")]
    NotDir,
}

/// A directory while the view is built: its subdirectories and files, before numbering.
struct Building<'a> {
    name: &'a str,
    subdirs: Vec<u32>,
    /// Sample ids, ascending, which within one directory is name order.
    files: Vec<u32>,
}

/// The directory tree of a view under construction, its directories found by path.
struct Tree<'a> {
    dirs: Vec<Building<'a>>,
    by_path: HashMap<&'a str, u32>,
}

impl<'a> Tree<'a> {
    /// The directory at `path` (`""` is the root), made with its parents where missing.
    fn dir(&mut self, path: &'a str) -> u32 {
        if let Some(&i) = self.by_path.get(path) {
            return i;
        }
        let (parent_path, name) = match path.rfind('/') {
            Some(i) => (&path[..i], &path[i + 1..]),
            None => ("", path),
        };
        let parent = self.dir(parent_path);
        let i = self.dirs.len() as u32;
        self.dirs.push(Building {
            name,
            subdirs: Vec::new(),
            files: Vec::new(),
        });
        self.dirs[parent as usize].subdirs.push(i);
        self.by_path.insert(path, i);
        i
    }
}

/// A view's nodes numbered (see [`number`]).
struct Numbered {
    parents: Vec<u32>,
    items: Vec<u32>,
    is_dir: Vec<u64>,
    dirs: Vec<DirRecord>,
    dir_names: String,
}

/// [`View::build`]'s second step: the `nodes` nodes of `tree` (directories of `cat`'s
/// samples, with their metadata `meta_of`) numbered, each directory's children consecutive.
fn number(
    cat: &Catalog,
    mut tree: Vec<Building<'_>>,
    meta_of: &[Option<Meta>],
    nodes: usize,
) -> Numbered {
    // Number the nodes breadth first: the root is node 0, and each directory's children,
    // its subdirectories and files merged by name, get the next consecutive indices when
    // the directory is reached. A name is never both (the catalog refuses it).
    let mut parents = Vec::with_capacity(nodes);
    let mut items = Vec::with_capacity(nodes);
    let mut is_dir = vec![0u64; nodes.div_ceil(64)];
    let mut dirs = Vec::with_capacity(tree.len());
    let mut dir_names = String::new();
    let record = |dirs: &mut Vec<DirRecord>, names: &mut String, name: &str, meta| {
        let start = names.len() as u32;
        names.push_str(name);
        dirs.push(DirRecord {
            name: start..names.len() as u32,
            first: 0,
            len: 0,
            meta,
        });
        dirs.len() as u32 - 1
    };
    let root = record(&mut dirs, &mut dir_names, "", meta_of[0]);
    parents.push(0u32);
    items.push(root);
    is_dir[0] |= 1;
    // Node index and tree index of each directory, in the order they were numbered.
    let mut queue: std::collections::VecDeque<(u32, u32)> = [(0u32, 0u32)].into();
    while let Some((node, t)) = queue.pop_front() {
        let first = parents.len() as u32;
        let b = &tree[t as usize];
        let (mut s, mut f) = (0, 0);
        while s < b.subdirs.len() || f < b.files.len() {
            let take_dir = match (b.subdirs.get(s), b.files.get(f)) {
                (Some(&d), Some(&id)) => tree[d as usize].name < cat.name(id),
                (Some(_), None) => true,
                _ => false,
            };
            let idx = parents.len() as u32;
            parents.push(node);
            if take_dir {
                let d = b.subdirs[s];
                s += 1;
                let name = tree[d as usize].name;
                items.push(record(&mut dirs, &mut dir_names, name, meta_of[d as usize]));
                is_dir[(idx / 64) as usize] |= 1 << (idx % 64);
                queue.push_back((idx, d));
            } else {
                items.push(b.files[f]);
                f += 1;
            }
        }
        let r = items[node as usize] as usize;
        dirs[r].first = first;
        dirs[r].len = parents.len() as u32 - first;
        // The files are numbered; drop the directory's list now rather than at the end.
        tree[t as usize].files = Vec::new();
    }
    Numbered {
        parents,
        items,
        is_dir,
        dirs,
        dir_names,
    }
}

impl View {
    /// Builds the view of `samples` of `catalog` staged in `slot_dir`. `samples` need not be
    /// sorted.
    pub fn build(
        catalog: &Arc<Catalog>,
        samples: &[u32],
        generation: u64,
        epoch: u64,
        mini_epoch: u32,
        slot: &str,
        slot_dir: &Path,
    ) -> Self {
        let mut sorted: Vec<u32> = samples.to_vec();
        // Catalog ids are in path order, so sorting ids sorts paths, and a directory's files
        // come out in name order.
        sorted.sort_unstable();
        sorted.dedup();
        let cat: &Catalog = catalog;
        let mut tree = Tree {
            dirs: vec![Building {
                name: "",
                subdirs: Vec::new(),
                files: Vec::new(),
            }],
            by_path: HashMap::from([("", 0)]),
        };
        // The catalog's directory of each sample to the tree's, found by path once per
        // directory met rather than once per file.
        let mut of_cat_dir: HashMap<u32, u32> = HashMap::new();
        let mut bytes = 0;
        for &id in &sorted {
            let cd = cat.dir_index(id);
            let d = match of_cat_dir.get(&cd) {
                Some(&d) => d,
                None => {
                    let d = tree.dir(cat.dir_path(cd));
                    of_cat_dir.insert(cd, d);
                    d
                }
            };
            tree.dirs[d as usize].files.push(id);
            bytes += cat.size(id);
        }
        let dir_meta: HashMap<&str, Meta> = cat
            .dir_stamps()
            .iter()
            .filter_map(|d| Some((d.dir.as_str(), d.meta?)))
            .collect();
        let mut meta_of = vec![None; tree.dirs.len()];
        for (path, &i) in &tree.by_path {
            meta_of[i as usize] = dir_meta.get(path).copied();
        }
        drop(of_cat_dir);
        let Tree { dirs: mut tree, .. } = tree;
        for i in 0..tree.len() {
            let mut subdirs = std::mem::take(&mut tree[i].subdirs);
            subdirs.sort_unstable_by(|a, b| tree[*a as usize].name.cmp(tree[*b as usize].name));
            tree[i].subdirs = subdirs;
        }

        let nodes = sorted.len() + tree.len();
        let Numbered {
            parents,
            items,
            is_dir,
            dirs,
            dir_names,
        } = number(cat, tree, &meta_of, nodes);
        let refs = (0..nodes).map(|_| AtomicU32::new(0)).collect();
        let touched = (0..nodes.div_ceil(64)).map(|_| AtomicU64::new(0)).collect();
        View {
            generation,
            epoch,
            mini_epoch,
            slot_dir: slot_dir.to_path_buf(),
            slot: slot.to_string(),
            nested: false,
            catalog: catalog.clone(),
            parents: parents.into(),
            items: items.into(),
            is_dir: is_dir.into(),
            dirs: dirs.into(),
            dir_names,
            files: sorted.len(),
            bytes,
            open_handles: AtomicUsize::new(0),
            leases: AtomicUsize::new(0),
            revoked: std::sync::atomic::AtomicBool::new(false),
            refs,
            kernel_refs: AtomicU64::new(0),
            file_refs: AtomicU64::new(0),
            touched,
            touched_files: AtomicUsize::new(0),
            first_touch: OnceLock::new(),
            copy_checks: None,
        }
    }

    /// Builds a view of explicit files (relative path, size, metadata) staged in `slot_dir`:
    /// used where view files are not catalog samples (HDF5 container mode: one file per
    /// container). They become a catalog of their own, which the view keeps.
    pub fn from_files(
        files: &[(String, u64, Option<Meta>)],
        generation: u64,
        epoch: u64,
        mini_epoch: u32,
        slot: &str,
        slot_dir: &Path,
    ) -> Self {
        let entries: Vec<metfs_tier::catalog::CatalogEntry> = files
            .iter()
            .map(|(p, n, m)| {
                let mut e = metfs_tier::catalog::CatalogEntry::new(p.clone(), *n);
                e.meta = *m;
                e
            })
            .collect();
        // Container paths come from a validated listing; an invalid set yields an empty view
        // rather than a panic in the serving path.
        let cat =
            Arc::new(Catalog::from_entries(slot, entries).unwrap_or_else(|_| {
                Catalog::from_entries(slot, Vec::new()).expect("empty catalog")
            }));
        let all: Vec<u32> = (0..cat.len() as u32).collect();
        Self::build(&cat, &all, generation, epoch, mini_epoch, slot, slot_dir)
    }

    /// This view with its files' copies checked at their first open against `checks` (the
    /// slot was resumed from its seal). Only for a view built from the stager's catalog, whose
    /// sample ids `checks` uses.
    pub fn with_copy_checks(mut self, checks: Option<Arc<CopyChecks>>) -> Self {
        self.copy_checks = checks;
        self
    }

    /// The copies to check at their first open, if the slot was resumed from its seal.
    pub fn copy_checks(&self) -> Option<&Arc<CopyChecks>> {
        self.copy_checks.as_ref()
    }

    /// This view as a job's directory on a shared mount: its root gets an inode of its own.
    pub fn nested(mut self) -> Self {
        self.nested = true;
        self
    }

    /// Whether the root of this view is a job's directory, not the mount's root.
    pub fn is_nested(&self) -> bool {
        self.nested
    }

    /// Number of files in the view.
    pub fn file_count(&self) -> usize {
        self.files
    }
    /// Bytes of the files in the view.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
    /// Inode number of node `idx`.
    pub fn ino(&self, idx: u32) -> u64 {
        if idx == 0 && !self.nested {
            ROOT_INO
        } else {
            (self.generation << 32) | idx as u64
        }
    }
    /// Node index of `ino` if it belongs to this view (the root belongs to every view).
    pub fn index_of(&self, ino: u64) -> Option<u32> {
        if ino == ROOT_INO {
            return (!self.nested).then_some(0);
        }
        let idx = (ino & 0xffff_ffff) as u32;
        (ino >> 32 == self.generation
            && (idx as usize) < self.parents.len()
            && (idx != 0 || self.nested))
            .then_some(idx)
    }
    fn is_dir(&self, idx: u32) -> bool {
        self.is_dir[(idx / 64) as usize] & (1 << (idx % 64)) != 0
    }
    fn dir(&self, idx: u32) -> Option<&DirRecord> {
        self.is_dir(idx)
            .then(|| &self.dirs[self.items[idx as usize] as usize])
    }
    /// What `stat` showed of node `idx` at the source, when known.
    pub fn meta(&self, idx: u32) -> Option<Meta> {
        match self.dir(idx) {
            Some(d) => d.meta,
            None => self.catalog.meta(self.items[idx as usize]),
        }
    }
    /// What node `idx` is.
    pub fn kind(&self, idx: u32) -> NodeKind {
        if self.is_dir(idx) {
            NodeKind::Dir
        } else {
            let sample = self.items[idx as usize];
            NodeKind::File {
                sample,
                size: self.catalog.size(sample),
            }
        }
    }
    /// The parent of node `idx` (the root is its own parent).
    pub fn parent(&self, idx: u32) -> u32 {
        self.parents[idx as usize]
    }
    /// The name of node `idx` within its parent (`""` for the root).
    pub fn name(&self, idx: u32) -> &str {
        match self.dir(idx) {
            Some(d) => &self.dir_names[d.name.start as usize..d.name.end as usize],
            None => self.catalog.name(self.items[idx as usize]),
        }
    }
    /// The size of file `idx` (0 for a directory).
    pub fn file_size(&self, idx: u32) -> u64 {
        match self.kind(idx) {
            NodeKind::File { size, .. } => size,
            NodeKind::Dir => 0,
        }
    }
    /// Looks `name` up in directory `dir`.
    pub fn lookup(&self, dir: u32, name: &str) -> Result<u32, Miss> {
        let range = self.children(dir)?;
        let (mut lo, mut hi) = (range.start, range.end);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.name(mid).cmp(name) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Ok(mid),
            }
        }
        Err(Miss::NotFound)
    }
    /// Children of directory `dir`, sorted by name: consecutive node indices.
    pub fn children(&self, dir: u32) -> Result<Range<u32>, Miss> {
        match self.dir(dir) {
            Some(d) => Ok(d.first..d.first + d.len),
            None => Err(Miss::NotDir),
        }
    }
    /// Relative path of node `idx`.
    pub fn rel_path(&self, idx: u32) -> String {
        if !self.is_dir(idx) {
            // A file shows its sample under the sample's own path.
            return self.catalog.path(self.items[idx as usize]);
        }
        let mut parts = Vec::new();
        let mut i = idx;
        while i != 0 {
            parts.push(self.name(i));
            i = self.parents[i as usize];
        }
        parts.reverse();
        parts.join("/")
    }
    /// Backing file path of node `idx` in the slot.
    pub fn backing_path(&self, idx: u32) -> PathBuf {
        self.slot_dir.join(self.rel_path(idx))
    }
    /// Node indices of every file.
    pub fn file_nodes(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.parents.len() as u32).filter(|&i| !self.is_dir(i))
    }
    /// Relative paths of every file, in tree order (each directory's names sorted).
    pub fn file_paths(&self) -> Vec<String> {
        let mut out = Vec::with_capacity(self.files);
        self.walk_files(0, &mut String::new(), &mut |p| out.push(p.to_string()));
        out
    }
    /// The same paths packed for the socket ([`PackedList`]), without a string per file.
    pub fn packed_paths(&self) -> (PackedList, Vec<u8>) {
        let mut b = PackedBuilder::with_count(self.files);
        self.walk_files(0, &mut String::new(), &mut |p| b.push(p));
        b.finish()
    }
    fn walk_files(&self, dir: u32, prefix: &mut String, out: &mut impl FnMut(&str)) {
        let Ok(children) = self.children(dir) else {
            return;
        };
        for c in children {
            let len = prefix.len();
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(self.name(c));
            if self.is_dir(c) {
                self.walk_files(c, prefix, out);
            } else {
                out(prefix);
            }
            prefix.truncate(len);
        }
    }
    /// Names of the root's children (what the kernel may have cached under the root).
    pub fn root_names(&self) -> Vec<String> {
        self.children(0)
            .map(|c| c.map(|i| self.name(i).to_string()).collect())
            .unwrap_or_default()
    }

    /// Records that file `idx` was looked up. A job's first pass over a view looks up each file
    /// once (the kernel then caches the entry for the view's life), so the share of files
    /// looked up, and when the first was, tell how far the first pass has come before it ends:
    /// what just-in-time pacing needs when no pass has been timed yet.
    pub fn touch(&self, idx: u32) {
        if self.is_dir(idx) {
            return;
        }
        let bit = 1u64 << (idx % 64);
        let old = self.touched[(idx / 64) as usize].fetch_or(bit, Ordering::Relaxed);
        if old & bit == 0 {
            self.first_touch.get_or_init(Instant::now);
            self.touched_files.fetch_add(1, Ordering::Relaxed);
        }
    }
    /// Files of the view looked up at least once.
    pub fn touched_files(&self) -> usize {
        self.touched_files.load(Ordering::Relaxed)
    }
    /// When the first file of the view was looked up.
    pub fn first_touch(&self) -> Option<Instant> {
        self.first_touch.get().copied()
    }
    /// Records that the kernel got an entry for node `idx` (one more lookup to forget).
    pub fn kernel_ref(&self, idx: u32) {
        self.refs[idx as usize].fetch_add(1, Ordering::AcqRel);
        if !self.is_dir(idx) {
            self.file_refs.fetch_add(1, Ordering::AcqRel);
        }
        self.kernel_refs.fetch_add(1, Ordering::AcqRel);
    }
    /// Records that the kernel forgot `n` lookups of node `idx`; returns the lookups of the
    /// view's files still held if `idx` is a file, else those of the whole view. A count never
    /// goes below zero, whatever the kernel says.
    pub fn kernel_unref(&self, idx: u32, n: u64) -> u64 {
        let n32 = n.min(u32::MAX as u64) as u32;
        let node = &self.refs[idx as usize];
        let mut cur = node.load(Ordering::Acquire);
        loop {
            let take = cur.min(n32);
            match node.compare_exchange_weak(cur, cur - take, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    let left =
                        self.kernel_refs.fetch_sub(take as u64, Ordering::AcqRel) - take as u64;
                    if !self.is_dir(idx) {
                        return self.file_refs.fetch_sub(take as u64, Ordering::AcqRel)
                            - take as u64;
                    }
                    return left;
                }
                Err(now) => cur = now,
            }
        }
    }
    /// Lookups of this view's nodes the kernel still holds.
    pub fn kernel_refs(&self) -> u64 {
        self.kernel_refs.load(Ordering::Acquire)
    }
    /// Lookups of this view's *files* the kernel still holds. Only these pin the slot: a file
    /// inode can be read (by inode, on the cached path) for as long as the kernel holds it,
    /// while a directory inode of a retired view gives access to nothing once its files are
    /// forgotten (a lookup under it answers ESTALE, and a listing needs a handle, which is
    /// counted apart). The kernel may keep a retired directory's dentry alive for reasons it
    /// alone controls (a negative child entry, an entry still in use during a prune), so
    /// counting directories would let one stray dentry pin a whole slot.
    pub fn file_refs(&self) -> u64 {
        self.file_refs.load(Ordering::Acquire)
    }
    /// Nodes the kernel still holds, deepest first (so that invalidating their entries in
    /// this order never finds a child below an entry already dropped).
    pub fn referenced_nodes(&self) -> Vec<u32> {
        let depth = |mut i: u32| {
            let mut d = 0;
            while i != 0 {
                i = self.parents[i as usize];
                d += 1;
            }
            d
        };
        let mut out: Vec<(u32, u32)> = (1..self.parents.len() as u32)
            .filter(|&i| self.refs[i as usize].load(Ordering::Acquire) > 0)
            .map(|i| (depth(i), i))
            .collect();
        out.sort_unstable_by(|a, b| b.cmp(a));
        out.into_iter().map(|(_, i)| i).collect()
    }
    /// Records an open handle on this view.
    pub fn handle_opened(&self) {
        self.open_handles.fetch_add(1, Ordering::AcqRel);
    }
    /// Records a closed handle; returns the number still open.
    pub fn handle_closed(&self) -> usize {
        self.open_handles.fetch_sub(1, Ordering::AcqRel) - 1
    }
    /// Handles open on this view.
    pub fn open_handles(&self) -> usize {
        self.open_handles.load(Ordering::Acquire)
    }
    /// Records a lease taken on this view (see [`crate::fs::ViewLease`]).
    pub(crate) fn lease_taken(&self) {
        self.leases.fetch_add(1, Ordering::AcqRel);
    }
    /// Records a lease ended; returns the number still held.
    pub(crate) fn lease_ended(&self) -> usize {
        self.leases.fetch_sub(1, Ordering::AcqRel) - 1
    }
    /// Leases held on this view.
    pub fn leases(&self) -> usize {
        self.leases.load(Ordering::Acquire)
    }
    /// Whether the view was taken back from its readers.
    pub fn revoked(&self) -> bool {
        self.revoked.load(Ordering::Acquire)
    }
    /// Marks the view taken back (see [`View::revoked`]).
    pub(crate) fn revoke(&self) {
        self.revoked.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metfs_tier::catalog::CatalogEntry;

    fn cat() -> Arc<Catalog> {
        Arc::new(
            Catalog::from_entries(
                "t",
                ["a/x", "a b/y", "a/c/z", "top", "é/ü"]
                    .iter()
                    .enumerate()
                    .map(|(i, p)| CatalogEntry::new(*p, i as u64 * 10)),
            )
            .unwrap(),
        )
    }

    #[test]
    fn builds_tree_and_looks_up() {
        let c = cat();
        let all: Vec<u32> = (0..c.len() as u32).collect();
        let v = View::build(&c, &all, 3, 0, 0, "s", Path::new("/slot"));
        assert_eq!(v.file_count(), 5);
        let a = v.lookup(0, "a").unwrap();
        let x = v.lookup(a, "x").unwrap();
        assert_eq!(v.rel_path(x), "a/x");
        assert_eq!(v.backing_path(x), Path::new("/slot/a/x"));
        let cdir = v.lookup(a, "c").unwrap();
        assert_eq!(v.rel_path(v.lookup(cdir, "z").unwrap()), "a/c/z");
        assert_eq!(v.lookup(0, "nope"), Err(Miss::NotFound));
        assert_eq!(v.lookup(x, "y"), Err(Miss::NotDir));
        assert_eq!(v.root_names(), vec!["a", "a b", "top", "é"]);
        let mut paths = v.file_paths();
        let mut expect: Vec<String> = (0..c.len() as u32).map(|i| c.path(i)).collect();
        paths.sort();
        expect.sort();
        assert_eq!(paths, expect);
    }

    #[test]
    fn each_directory_is_a_range_of_its_children_in_name_order() {
        let c = Arc::new(
            Catalog::from_entries(
                "t",
                [
                    "a/b/c/f", "a/b/g", "a/b0", "a/ba/h", "z", "a/b/c/e", "a.x/y",
                ]
                .iter()
                .map(|p| CatalogEntry::new(*p, 1)),
            )
            .unwrap(),
        );
        let all: Vec<u32> = (0..c.len() as u32).collect();
        let v = View::build(&c, &all, 1, 0, 0, "s", Path::new("/s"));
        let mut seen = 1; // the root
        let mut stack = vec![0u32];
        while let Some(d) = stack.pop() {
            let kids = v.children(d).unwrap();
            seen += kids.len();
            let names: Vec<&str> = kids.clone().map(|k| v.name(k)).collect();
            assert!(names.windows(2).all(|w| w[0] < w[1]), "{names:?}");
            for k in kids {
                assert_eq!(v.parent(k), d);
                assert_eq!(v.index_of(v.ino(k)), Some(k));
                match v.kind(k) {
                    NodeKind::Dir => stack.push(k),
                    NodeKind::File { sample, size } => {
                        assert_eq!((v.rel_path(k), size), (c.path(sample), 1));
                    }
                }
            }
        }
        assert_eq!(seen, 7 + 6, "seven files, six directories with the root");
        let b = v.lookup(v.lookup(0, "a").unwrap(), "b").unwrap();
        assert_eq!(v.rel_path(b), "a/b");
        assert_eq!(v.children(v.lookup(b, "g").unwrap()), Err(Miss::NotDir));
        // Tree order: a directory's names sorted, so "a/..." before "a.x/y" (not path order).
        let mut paths = v.file_paths();
        assert_eq!(paths[..2], ["a/b/c/e", "a/b/c/f"]);
        paths.sort();
        assert_eq!(paths, all.iter().map(|&i| c.path(i)).collect::<Vec<_>>());
    }

    #[test]
    fn inodes_carry_the_generation() {
        let c = cat();
        let v1 = View::build(&c, &[0, 1], 1, 0, 0, "s1", Path::new("/1"));
        let v2 = View::build(&c, &[0, 1], 2, 0, 1, "s2", Path::new("/2"));
        let i1 = v1.ino(2);
        assert_eq!(v1.index_of(i1), Some(2));
        assert_eq!(v2.index_of(i1), None);
        assert_eq!(v1.index_of(ROOT_INO), Some(0));
        assert_eq!(v2.index_of(ROOT_INO), Some(0));
        assert_ne!(v1.ino(2), v2.ino(2));
    }

    #[test]
    fn subset_only() {
        let c = cat();
        let v = View::build(&c, &[3], 1, 0, 0, "s", Path::new("/s"));
        assert_eq!(v.file_paths(), vec!["top"]);
        assert_eq!(v.lookup(0, "a"), Err(Miss::NotFound));
    }

    #[test]
    fn touch_counts_distinct_files_only() {
        let c = cat();
        let all: Vec<u32> = (0..c.len() as u32).collect();
        let v = View::build(&c, &all, 1, 0, 0, "s", Path::new("/s"));
        assert_eq!((v.touched_files(), v.first_touch()), (0, None));
        let a = v.lookup(0, "a").unwrap();
        v.touch(a); // a directory: not progress
        assert_eq!(v.touched_files(), 0);
        let x = v.lookup(a, "x").unwrap();
        v.touch(x);
        let first = v.first_touch().unwrap();
        v.touch(x);
        v.touch(v.lookup(0, "top").unwrap());
        assert_eq!(v.touched_files(), 2);
        assert_eq!(v.first_touch(), Some(first));
    }

    #[test]
    fn kernel_refs_count_and_never_underflow() {
        let c = cat();
        let all: Vec<u32> = (0..c.len() as u32).collect();
        let v = View::build(&c, &all, 1, 0, 0, "s", Path::new("/s"));
        let a = v.lookup(0, "a").unwrap();
        let cdir = v.lookup(a, "c").unwrap();
        let z = v.lookup(cdir, "z").unwrap();
        v.kernel_ref(a);
        v.kernel_ref(z);
        v.kernel_ref(z);
        assert_eq!(v.kernel_refs(), 3);
        assert_eq!(v.file_refs(), 2, "a is a directory");
        assert_eq!(v.referenced_nodes(), vec![z, a], "deepest first");
        // A file's forget answers the files' count, a directory's the whole view's.
        assert_eq!(v.kernel_unref(z, 5), 0, "only what was held is taken");
        assert_eq!(v.kernel_refs(), 1);
        assert_eq!(v.kernel_unref(a, 1), 0);
        assert!(v.referenced_nodes().is_empty());
    }
}
