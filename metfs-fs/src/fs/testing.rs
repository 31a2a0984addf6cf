//! What the core's tests share: two slots of one small catalog and views over them.

use std::sync::Arc;

use metfs_tier::catalog::{Catalog, CatalogEntry};

use super::{FsCore, FsSettings, View, ROOT_INO};

/// Slots `s1` and `s2` of a catalog of `d/f` (100 bytes) and `g` (10 bytes), every byte of a
/// slot's files the slot's number.
pub(super) fn setup() -> (tempfile::TempDir, Arc<Catalog>) {
    let d = tempfile::tempdir().unwrap();
    for (slot, byte) in [("s1", 1u8), ("s2", 2u8)] {
        std::fs::create_dir_all(d.path().join(slot).join("d")).unwrap();
        std::fs::write(d.path().join(slot).join("d/f"), vec![byte; 100]).unwrap();
        std::fs::write(d.path().join(slot).join("g"), vec![byte; 10]).unwrap();
    }
    let c = Catalog::from_entries(
        "t",
        vec![CatalogEntry::new("d/f", 100), CatalogEntry::new("g", 10)],
    )
    .unwrap();
    (d, Arc::new(c))
}

/// The view of `samples` staged in slot `slot` of `d`.
pub(super) fn view(
    d: &tempfile::TempDir,
    c: &Arc<Catalog>,
    samples: &[u32],
    generation: u64,
    mini_epoch: u32,
    slot: &str,
) -> Arc<View> {
    Arc::new(View::build(
        c,
        samples,
        generation,
        0,
        mini_epoch,
        slot,
        &d.path().join(slot),
    ))
}

/// The names a listing of the root through handle `fh` gives from `offset`.
pub(super) fn list(core: &FsCore, fh: u64, offset: u64) -> Vec<String> {
    let mut names = Vec::new();
    core.readdir(ROOT_INO, fh, offset, false, |e| {
        names.push(e.name.to_string());
        false
    })
    .unwrap();
    names
}

/// Small caches; handles (not kernel references) pin views.
pub(super) fn settings() -> FsSettings {
    FsSettings {
        max_open_files: 16,
        max_backing_ids: 16,
        track_kernel_refs: false,
    }
}
