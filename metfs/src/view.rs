//! The view index: what the mount shows for one generation.
//!
//! A [`View`] is an immutable in-memory tree of one slot: directories and files under the
//! samples' original relative paths, each node with an inode number that encodes the view's
//! generation (`generation << 32 | node`), so an inode handed to the kernel before a switch can
//! never be confused with one of the new view. The root is always inode 1 and always means the
//! *current* view.
//!
//! Lookup is a binary search over a directory's children (sorted by name) and readdir is a slice
//! walk: both answered from memory with no I/O. A view is built once per switch in
//! O(files · depth), then shared read-only by every FUSE thread.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use prefetcher::catalog::{Catalog, Meta};
use prefetcher::stager::CopyChecks;

use crate::protocol::reply::PackedBuilder;
use crate::protocol::PackedList;

/// Inode number of the root directory.
pub const ROOT_INO: u64 = 1;

/// What a node is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeKind {
    /// A directory with children sorted by name.
    Dir { children: Vec<u32> },
    /// A file backed by a staged sample.
    File { sample: u32, size: u64 },
}

/// One directory or file of a view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Index of the parent node (the root is its own parent).
    pub parent: u32,
    /// Name within the parent (`""` for the root).
    pub name: Box<str>,
    /// Directory or file.
    pub kind: NodeKind,
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
    nodes: Vec<Node>,
    /// Per node: what `stat` showed at the source (files from the catalog, directories from
    /// its directory stamps), when known.
    metas: Vec<Option<Meta>>,
    files: usize,
    bytes: u64,
    open_handles: AtomicUsize,
    /// Clients holding a lease on this view's slot files, read directly rather than through
    /// the mount (`files` with `direct`): each pins the slot as an open handle does.
    leases: AtomicUsize,
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
    /// (`prefetcher::stager::CopyChecks`); `None` when staging checked every copy.
    copy_checks: Option<Arc<CopyChecks>>,
}

/// Errors of view lookups, mapped to errno by the FUSE adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Miss {
    /// No such name.
    NotFound,
    /// A directory operation on a file or vice versa.
    NotDir,
}

impl View {
    /// Builds the view of `samples` staged in `slot_dir`. `samples` need not be sorted.
    pub fn build(
        catalog: &Catalog,
        samples: &[u32],
        generation: u64,
        epoch: u64,
        mini_epoch: u32,
        slot: &str,
        slot_dir: &Path,
    ) -> Self {
        let mut sorted: Vec<u32> = samples.to_vec();
        // Catalog ids are in path order, so sorting ids sorts paths.
        sorted.sort_unstable();
        sorted.dedup();
        let mut nodes = vec![Node {
            parent: 0,
            name: "".into(),
            kind: NodeKind::Dir {
                children: Vec::new(),
            },
        }];
        let mut dirs: HashMap<String, u32> = HashMap::new();
        let mut bytes = 0;
        for &id in &sorted {
            let (dir, name) = catalog.dir_and_name(id);
            let parent = ensure_dir(&mut nodes, &mut dirs, dir);
            let idx = nodes.len() as u32;
            let size = catalog.size(id);
            bytes += size;
            nodes.push(Node {
                parent,
                name: name.into(),
                kind: NodeKind::File { sample: id, size },
            });
            if let NodeKind::Dir { children } = &mut nodes[parent as usize].kind {
                children.push(idx);
            }
        }
        // Children were appended in path order, which is not name order within a directory
        // ("a b/x" sorts before "a/x"), so sort each directory's children by name.
        let names: Vec<Box<str>> = nodes.iter().map(|n| n.name.clone()).collect();
        for n in &mut nodes {
            if let NodeKind::Dir { children } = &mut n.kind {
                children.sort_unstable_by(|a, b| names[*a as usize].cmp(&names[*b as usize]));
            }
        }
        let dir_meta: HashMap<&str, Meta> = catalog
            .dir_stamps()
            .iter()
            .filter_map(|d| Some((d.dir.as_str(), d.meta?)))
            .collect();
        let mut dir_paths: Vec<Option<&str>> = vec![None; nodes.len()];
        dir_paths[0] = Some("");
        for (path, &i) in &dirs {
            dir_paths[i as usize] = Some(path.as_str());
        }
        let metas = nodes
            .iter()
            .zip(&dir_paths)
            .map(|(n, dir)| match n.kind {
                NodeKind::File { sample, .. } => catalog.meta(sample),
                NodeKind::Dir { .. } => dir.and_then(|d| dir_meta.get(d).copied()),
            })
            .collect();
        let refs = (0..nodes.len()).map(|_| AtomicU32::new(0)).collect();
        let touched = (0..nodes.len().div_ceil(64))
            .map(|_| AtomicU64::new(0))
            .collect();
        View {
            generation,
            epoch,
            mini_epoch,
            slot_dir: slot_dir.to_path_buf(),
            slot: slot.to_string(),
            nested: false,
            nodes,
            metas,
            files: sorted.len(),
            bytes,
            open_handles: AtomicUsize::new(0),
            leases: AtomicUsize::new(0),
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
    /// container).
    pub fn from_files(
        files: &[(String, u64, Option<Meta>)],
        generation: u64,
        epoch: u64,
        mini_epoch: u32,
        slot: &str,
        slot_dir: &Path,
    ) -> Self {
        let entries: Vec<prefetcher::catalog::CatalogEntry> = files
            .iter()
            .map(|(p, n, m)| {
                let mut e = prefetcher::catalog::CatalogEntry::new(p.clone(), *n);
                e.meta = *m;
                e
            })
            .collect();
        match Catalog::from_entries(slot, entries) {
            Ok(cat) => {
                let all: Vec<u32> = (0..cat.len() as u32).collect();
                Self::build(&cat, &all, generation, epoch, mini_epoch, slot, slot_dir)
            }
            // Container paths come from a validated listing; an invalid set yields an empty view
            // rather than a panic in the serving path.
            Err(_) => Self::build(
                &Catalog::from_entries(slot, Vec::new()).expect("empty catalog"),
                &[],
                generation,
                epoch,
                mini_epoch,
                slot,
                slot_dir,
            ),
        }
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
            && (idx as usize) < self.nodes.len()
            && (idx != 0 || self.nested))
            .then_some(idx)
    }
    /// What `stat` showed of node `idx` at the source, when known.
    pub fn meta(&self, idx: u32) -> Option<Meta> {
        self.metas[idx as usize]
    }
    /// The node at `idx`.
    pub fn node(&self, idx: u32) -> &Node {
        &self.nodes[idx as usize]
    }
    /// The size of file `idx` (0 for a directory).
    pub fn file_size(&self, idx: u32) -> u64 {
        match self.nodes[idx as usize].kind {
            NodeKind::File { size, .. } => size,
            NodeKind::Dir { .. } => 0,
        }
    }
    /// Looks `name` up in directory `dir`.
    pub fn lookup(&self, dir: u32, name: &str) -> Result<u32, Miss> {
        match &self.nodes[dir as usize].kind {
            NodeKind::Dir { children } => children
                .binary_search_by(|c| (*self.nodes[*c as usize].name).cmp(name))
                .map(|i| children[i])
                .map_err(|_| Miss::NotFound),
            NodeKind::File { .. } => Err(Miss::NotDir),
        }
    }
    /// Children of directory `dir`, sorted by name.
    pub fn children(&self, dir: u32) -> Result<&[u32], Miss> {
        match &self.nodes[dir as usize].kind {
            NodeKind::Dir { children } => Ok(children),
            NodeKind::File { .. } => Err(Miss::NotDir),
        }
    }
    /// Relative path of node `idx`.
    pub fn rel_path(&self, idx: u32) -> String {
        let mut parts = Vec::new();
        let mut i = idx;
        while i != 0 {
            parts.push(&*self.nodes[i as usize].name);
            i = self.nodes[i as usize].parent;
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
        (0..self.nodes.len() as u32)
            .filter(|&i| matches!(self.nodes[i as usize].kind, NodeKind::File { .. }))
    }
    /// Relative paths of every file, in path order.
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
        if let NodeKind::Dir { children } = &self.nodes[dir as usize].kind {
            for &c in children {
                let n = &self.nodes[c as usize];
                let len = prefix.len();
                if !prefix.is_empty() {
                    prefix.push('/');
                }
                prefix.push_str(&n.name);
                match n.kind {
                    NodeKind::Dir { .. } => self.walk_files(c, prefix, out),
                    NodeKind::File { .. } => out(prefix),
                }
                prefix.truncate(len);
            }
        }
    }
    /// Names of the root's children (what the kernel may have cached under the root).
    pub fn root_names(&self) -> Vec<String> {
        self.children(0)
            .map(|c| {
                c.iter()
                    .map(|&i| self.nodes[i as usize].name.to_string())
                    .collect()
            })
            .unwrap_or_default()
    }
    /// Records that file `idx` was looked up. A job's first pass over a view looks up each file
    /// once (the kernel then caches the entry for the view's life), so the share of files
    /// looked up, and when the first was, tell how far the first pass has come before it ends:
    /// what just-in-time pacing needs when no pass has been timed yet.
    pub fn touch(&self, idx: u32) {
        if !matches!(self.nodes[idx as usize].kind, NodeKind::File { .. }) {
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
        if self.is_file(idx) {
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
                    if self.is_file(idx) {
                        return self.file_refs.fetch_sub(take as u64, Ordering::AcqRel)
                            - take as u64;
                    }
                    return left;
                }
                Err(now) => cur = now,
            }
        }
    }
    fn is_file(&self, idx: u32) -> bool {
        matches!(self.nodes[idx as usize].kind, NodeKind::File { .. })
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
                i = self.nodes[i as usize].parent;
                d += 1;
            }
            d
        };
        let mut out: Vec<(u32, u32)> = (1..self.nodes.len() as u32)
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
}

fn ensure_dir(nodes: &mut Vec<Node>, dirs: &mut HashMap<String, u32>, dir: &str) -> u32 {
    if dir.is_empty() {
        return 0;
    }
    if let Some(&i) = dirs.get(dir) {
        return i;
    }
    let (parent_path, name) = match dir.rfind('/') {
        Some(i) => (&dir[..i], &dir[i + 1..]),
        None => ("", dir),
    };
    let parent = ensure_dir(nodes, dirs, parent_path);
    let idx = nodes.len() as u32;
    nodes.push(Node {
        parent,
        name: name.into(),
        kind: NodeKind::Dir {
            children: Vec::new(),
        },
    });
    if let NodeKind::Dir { children } = &mut nodes[parent as usize].kind {
        children.push(idx);
    }
    dirs.insert(dir.to_string(), idx);
    idx
}

#[cfg(test)]
mod tests {
    use super::*;
    use prefetcher::catalog::CatalogEntry;

    fn cat() -> Catalog {
        Catalog::from_entries(
            "t",
            ["a/x", "a b/y", "a/c/z", "top", "é/ü"]
                .iter()
                .enumerate()
                .map(|(i, p)| CatalogEntry::new(*p, i as u64 * 10)),
        )
        .unwrap()
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
