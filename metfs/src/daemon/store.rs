//! The store: the staged samples of a node and their byte budget. It owns the cache
//! directory's slots (through the [`Stager`], which writes them), the catalog and the samples'
//! footprints, the [`Budget`], and the book of which slot takes how many bytes and which are
//! draining. Views are built over it ([`Store::view_for`]); sessions ask it to stage and to
//! retire slots, and never touch the cache directory themselves.
//!
//! Budget. The cache holds at most two slots plus metadata: a current slot and either the
//! successor (staging or staged) or a *draining* slot (a previous view, still held by open
//! handles, or still being deleted). Staging starts only once no slot is draining
//! ([`Store::is_draining`]), and a slot leaves `draining` only after its files are deleted, so
//! a third slot never exists, not even for an instant.
//!
//! Samples already on the node are never fetched again: [`Store::stage`] offers every slot it
//! holds (current, staging, draining) to the stager as a donor, which hard-links a sample it
//! finds there (see `prefetcher::stager`'s `reuse`). A link is one file with two names.
//! Admission stays per slot (each slot's footprint, links included, fits `slot_bytes`), so the
//! budget holds whatever is linked; the bytes the cache holds ([`Store::slot_bytes_except`],
//! `cache_bytes` in status) count a linked file once while both slots exist, and after the
//! donor is deleted in the slot that still names it: never twice, never zero times.
//!
//! Locking. The book is behind the store's own lock, taken only inside these methods and
//! never while waiting for anything; the daemon may hold its sessions' lock when it calls
//! them (sessions lock, then store lock; never the other way).

use super::*;

/// The staged samples of a node and their budget (see the module doc).
pub struct Store {
    pub(super) paths: CachePaths,
    pub(super) catalog: Arc<Catalog>,
    /// Each sample's bytes in the cache (sizes rounded up to blocks, or packed rows).
    pub(super) footprints: Vec<u64>,
    pub(super) containers: Option<Arc<Containers>>,
    pub(super) budget: Budget,
    pub(super) stager: Stager,
    book: Mutex<Book>,
}

/// Which slots take how many bytes, which are draining, and what went wrong.
#[derive(Default)]
struct Book {
    /// Footprint of each slot on disk (staged or staging).
    footprints: BTreeMap<String, u64>,
    /// Slots of retired views, by generation, until their files are deleted.
    draining: BTreeMap<u64, String>,
    /// Generations of `draining` whose slot is being deleted now.
    evicting: std::collections::BTreeSet<u64>,
    last_error: Option<String>,
    /// The last 100 samples left out of a slot, with why.
    failed_samples: Vec<String>,
    /// Footprint bytes a slot (key) shares with a donor slot by hard links (slot -> donor ->
    /// bytes): in both slots' footprints, on disk once while both exist.
    links: BTreeMap<String, BTreeMap<String, u64>>,
}

impl Book {
    /// Bytes counted twice in `footprints`: hard-linked samples whose donor slot is still
    /// there. A link whose donor is gone is its slot's alone, counted once already.
    fn shared_bytes(&self) -> u64 {
        self.links
            .iter()
            .filter(|(slot, _)| self.footprints.contains_key(*slot))
            .flat_map(|(_, donors)| donors.iter())
            .filter(|(donor, _)| self.footprints.contains_key(*donor))
            .map(|(_, b)| *b)
            .sum()
    }
}

impl Store {
    pub(super) fn new(
        paths: CachePaths,
        catalog: Arc<Catalog>,
        footprints: Vec<u64>,
        containers: Option<Arc<Containers>>,
        budget: Budget,
        stager: Stager,
    ) -> Self {
        Self {
            paths,
            catalog,
            footprints,
            containers,
            budget,
            stager,
            book: Mutex::default(),
        }
    }

    /// The samples as the planner sees them.
    pub(super) fn sample_set(&self) -> SampleSet<'_> {
        SampleSet {
            sizes: &self.footprints,
            labels: self.catalog.labels(),
            clusters: self.catalog.clusters(),
        }
    }

    /// The footprint of `samples` in a slot.
    pub(super) fn footprint(&self, samples: &[u32]) -> u64 {
        samples.iter().map(|&x| self.footprints[x as usize]).sum()
    }

    /// The budget's split.
    pub fn budget(&self) -> Budget {
        self.budget
    }

    /// Stages `spec` into its slot (resuming what its journal holds), taking samples that
    /// another slot of the store holds from it instead of the tier, and records the links.
    pub(super) async fn stage(
        &self,
        spec: &SlotSpec,
        progress: Arc<Progress>,
    ) -> Result<StageReport, prefetcher::stager::StageError> {
        let mut spec = spec.clone();
        for slot in self.book.lock().unwrap().footprints.keys() {
            if *slot != spec.name && !spec.reuse_from.contains(slot) {
                spec.reuse_from.push(slot.clone());
            }
        }
        let report = match &self.containers {
            Some(c) => {
                self.stager
                    .stage_containers(&spec, c.clone(), progress)
                    .await
            }
            None => self.stager.stage(&spec, progress).await,
        }?;
        self.note_links(&spec.name, &report);
        Ok(report)
    }

    /// Records the samples a staging run of `slot` hard-linked from other slots.
    pub(super) fn note_links(&self, slot: &str, report: &StageReport) {
        let links: BTreeMap<String, u64> = report
            .linked
            .iter()
            .map(|(donor, ids)| (donor.clone(), self.footprint(ids)))
            .collect();
        let mut b = self.book.lock().unwrap();
        let mine = b.links.entry(slot.to_string()).or_default();
        for (donor, bytes) in links {
            *mine.entry(donor).or_default() += bytes;
        }
    }

    /// Counts `slot` as taking `footprint` bytes (from the moment its staging starts).
    pub(super) fn begin_slot(&self, slot: &str, footprint: u64) {
        self.book
            .lock()
            .unwrap()
            .footprints
            .insert(slot.to_string(), footprint);
    }

    /// Records the slot of a view retired at generation `gen`: it drains until deleted.
    pub(super) fn retire_slot(&self, gen: u64, slot: &str) {
        self.book
            .lock()
            .unwrap()
            .draining
            .insert(gen, slot.to_string());
    }

    /// Whether a retired slot still takes space (staging waits for it).
    pub(super) fn is_draining(&self) -> bool {
        !self.book.lock().unwrap().draining.is_empty()
    }

    /// How many retired slots still take space.
    pub(super) fn draining_count(&self) -> usize {
        self.book.lock().unwrap().draining.len()
    }

    /// Claims the deletion of generation `gen`'s slot: its name, unless it is not draining or
    /// a deletion of it runs already.
    pub(super) fn claim_eviction(&self, gen: u64) -> Option<String> {
        let mut b = self.book.lock().unwrap();
        let slot = b.draining.get(&gen).cloned()?;
        b.evicting.insert(gen).then_some(slot)
    }

    /// Gives up a claimed deletion (the daemon is shutting down); the slot stays draining.
    pub(super) fn abandon_eviction(&self, gen: u64) {
        self.book.lock().unwrap().evicting.remove(&gen);
    }

    /// The slot of generation `gen` is deleted: its bytes are free.
    pub(super) fn evicted(&self, gen: u64, slot: &str) {
        let mut b = self.book.lock().unwrap();
        b.evicting.remove(&gen);
        b.draining.remove(&gen);
        b.footprints.remove(slot);
        b.links.remove(slot);
        for donors in b.links.values_mut() {
            donors.remove(slot);
        }
    }

    /// Records an error for `status`.
    pub(super) fn note_error(&self, error: String) {
        self.book.lock().unwrap().last_error = Some(error);
    }

    /// Records samples left out of a slot, `(path: why)`, keeping the last 100.
    pub(super) fn note_failed(&self, failed: impl IntoIterator<Item = (String, String)>) {
        let mut b = self.book.lock().unwrap();
        for (path, why) in failed {
            b.failed_samples.push(format!("{path}: {why}"));
            b.last_error = Some(why);
        }
        if b.failed_samples.len() > 100 {
            let cut = b.failed_samples.len() - 100;
            b.failed_samples.drain(..cut);
        }
    }

    /// The last error, and the samples recently left out.
    pub(super) fn errors(&self) -> (Option<String>, Vec<String>) {
        let b = self.book.lock().unwrap();
        (b.last_error.clone(), b.failed_samples.clone())
    }

    /// Bytes of the slots on disk, without those being staged now (`staging`), whose bytes so
    /// far the caller counts itself (less what they linked). A hard-linked file counts once.
    pub(super) fn slot_bytes_except(&self, staging: &[&str]) -> u64 {
        let b = self.book.lock().unwrap();
        b.footprints
            .iter()
            .filter(|(name, _)| !staging.contains(&name.as_str()))
            .map(|(_, b)| *b)
            .sum::<u64>()
            .saturating_sub(b.shared_bytes())
    }

    /// Builds the view of mini-epoch `target` of `plan` over its slot, at `generation`: the
    /// plan's samples less those the slot's journal shows as left out (in container mode, the
    /// staged container files).
    pub(super) fn view_for(&self, plan: &EpochPlan, target: (u64, u32), generation: u64) -> View {
        let name = slot_name(target);
        if let Some(c) = &self.containers {
            let dir = self.stager.slot_path(&name);
            // A container's bytes change with every mini-epoch: its times are those of the
            // staged copy, so `make`, `rsync` and caches see each generation's new content.
            let files: Vec<(String, u64, Option<prefetcher::catalog::Meta>)> = c
                .files()
                .iter()
                .filter_map(|f| {
                    std::fs::metadata(dir.join(&f.path)).ok().map(|m| {
                        let meta = prefetcher::catalog::Meta::from_metadata(&m);
                        (f.path.clone(), m.len(), Some(meta))
                    })
                })
                .collect();
            return View::from_files(&files, generation, target.0, target.1, &name, &dir);
        }
        let failed = journal_failures(&self.paths.slots, &name);
        let samples: Vec<u32> = plan.mini_epochs[target.1 as usize]
            .samples
            .iter()
            .copied()
            .filter(|s| !failed.contains(s))
            .collect();
        View::build(
            &self.catalog,
            &samples,
            generation,
            target.0,
            target.1,
            &name,
            &self.stager.slot_path(&name),
        )
    }
}
