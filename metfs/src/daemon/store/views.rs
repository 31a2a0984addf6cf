//! The views the store builds over its slots: a mini-epoch's samples less those its journal
//! left out (whole samples only, where samples are groups), in container mode the staged
//! container files, with a transform the transformed copies, and with a format the slot's
//! copies beside the index rewritten to exactly their shards.

use super::Store;
use metfs_fs::view::View;
use metfs_prefetcher::stager::SlotJournal;

impl Store {
    /// Builds the view of mini-epoch `target` over its slot, at `generation`: its `members`
    /// (the samples the plan or the queue gave it) less those the slot's journal shows as left
    /// out (in container mode, the staged container files).
    pub(in crate::daemon) fn view_for(
        &self,
        members: &[u32],
        target: (u64, u32),
        generation: u64,
        name: &str,
    ) -> View {
        let name = name.to_string();
        if let Some(c) = &self.containers {
            let dir = self.stager.slot_path(&name);
            // A container's bytes change with every mini-epoch: its times are those of the
            // staged copy, so `make`, `rsync` and caches see each generation's new content.
            // Its mode and owners are the source file's, as for every other sample: the staged
            // copy's (0400, the daemon's user) would refuse, under `--allow-other`, users the
            // source lets read it.
            let files: Vec<(String, u64, Option<metfs_tier::catalog::Meta>)> = c
                .files()
                .iter()
                .filter_map(|f| {
                    std::fs::metadata(dir.join(&f.path)).ok().map(|m| {
                        let staged = metfs_tier::catalog::Meta::from_metadata(&m);
                        let meta = metfs_tier::catalog::Meta {
                            mtime_ns: staged.mtime_ns,
                            ctime_ns: staged.ctime_ns,
                            ..f.source_meta
                        };
                        (f.path.clone(), m.len(), Some(meta))
                    })
                })
                .collect();
            return View::from_files(&files, generation, target.0, target.1, &name, &dir);
        }
        let failed = SlotJournal::of(&self.paths.slots, &name).failures();
        let samples: Vec<u32> = match &self.samples {
            Some(s) => s.whole(&self.catalog, members, &|id| failed.contains(&id)),
            None => members
                .iter()
                .copied()
                .filter(|s| !failed.contains(s))
                .collect(),
        };
        if let Some(view) = self.format_view(&samples, target, generation, &name) {
            return view;
        }
        if self.stager.transform().is_some() {
            // Transformed copies: named with the transform's suffix, sized as written; modes
            // and times mirror the source sample.
            let dir = self.stager.slot_path(&name);
            let files: Vec<(String, u64, Option<metfs_tier::catalog::Meta>)> = samples
                .iter()
                .filter_map(|&id| {
                    let rel = self.stager.staged_path(id);
                    let len = std::fs::metadata(dir.join(&rel)).ok()?.len();
                    Some((rel, len, self.catalog.meta(id)))
                })
                .collect();
            return View::from_files(&files, generation, target.0, target.1, &name, &dir);
        }
        View::build(
            &self.catalog,
            &samples,
            generation,
            target.0,
            target.1,
            &name,
            &self.stager.slot_path(&name),
        )
        .with_copy_checks(self.stager.copy_checks(&name))
    }

    /// The view of `samples` of a dataset whose format has an index: the slot's copies and the
    /// index rewritten to exactly their shards, written into the slot beside them (replacing a
    /// rename's target atomically, so an open handle keeps the bytes it opened). `None` without
    /// such a format. A view whose index cannot be written shows the copies alone, and says why.
    fn format_view(
        &self,
        samples: &[u32],
        target: (u64, u32),
        generation: u64,
        name: &str,
    ) -> Option<View> {
        let s = self.samples.as_ref()?;
        s.format()?;
        let dir = self.stager.slot_path(name);
        let indexes = match s.indexes(&self.catalog, samples) {
            Ok(i) => i,
            Err(e) => {
                tracing::error!(slot = %name, error = %e, "the view's index cannot be rewritten; its loader will not open it");
                Vec::new()
            }
        };
        if indexes.is_empty() {
            return None;
        }
        let mut files: Vec<(String, u64, Option<metfs_tier::catalog::Meta>)> = samples
            .iter()
            .map(|&id| {
                (
                    self.catalog.path(id),
                    self.catalog.size(id),
                    self.catalog.meta(id),
                )
            })
            .collect();
        for (path, bytes) in &indexes {
            if let Err(e) = write_index(&dir, path, bytes) {
                tracing::error!(slot = %name, file = %path, error = %e, "cannot write the view's index");
                continue;
            }
            let meta = self.catalog.find(path).and_then(|id| self.catalog.meta(id));
            files.push((path.clone(), bytes.len() as u64, meta));
        }
        Some(View::from_files(
            &files, generation, target.0, target.1, name, &dir,
        ))
    }
}

/// Writes a view's index file `rel` under the slot `dir` unless it holds those bytes already
/// (a view built again over the same slot): a temporary name, then a rename.
fn write_index(dir: &std::path::Path, rel: &str, bytes: &[u8]) -> std::io::Result<()> {
    let at = dir.join(rel);
    if std::fs::read(&at).is_ok_and(|b| b == bytes) {
        return Ok(());
    }
    if let Some(parent) = at.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let tmp = at.with_extension("metfs-index.tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, &at)
}
