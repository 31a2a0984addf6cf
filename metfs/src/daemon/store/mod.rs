//! The store: the staged samples of a node and their byte budget. It owns the cache
//! directory's slots (through the [`Stager`], which writes them), the catalog and the samples'
//! footprints, the [`Budget`], and the book of which slot takes how many bytes and which are
//! draining. Views are built over it ([`Store::view_for`]); sessions ask it to stage
//! ([`Store::stage`]), to retire slots ([`Store::retire_slot`]) and to delete them
//! ([`Store::evict_retired`]), and never touch the cache directory themselves.
//!
//! **Invariant:** the book's claims on a deletion (which generation's slot is being deleted,
//! which are draining) change only inside the store's methods: a caller cannot claim a
//! deletion and forget to end it.
//!
//! Budget. The cache holds at most two slots' bytes plus metadata: a current slot and either
//! the successor (staging or staged) or a *draining* slot (a previous view, still held by open
//! handles, or still being deleted). Staging starts only once no slot is draining
//! ([`Store::is_draining`]) unless the draining slot is held (below: then the three slots'
//! files, each once, fit the two slots' bytes), and a slot leaves `draining` only after its
//! files are deleted, so the bytes never exceed the budget, not even for an instant.
//!
//! Samples already on the node are never fetched again: [`Store::stage`] offers every slot it
//! holds (current, staging, draining) to the stager as a donor, which hard-links a sample it
//! finds there (see `metfs_prefetcher::stager`'s `reuse`). A link is one file with two names.
//! Admission stays per slot (each slot's footprint, links included, fits `slot_bytes`), so the
//! budget holds whatever is linked; the bytes the cache holds ([`Store::slot_bytes_except`],
//! `cache_bytes` in status) count each file once: a linked sample carries the *origin* of its
//! donor's copy (the slot whose fetch made the file), and every name of one sample with one
//! origin is one file, whether the origin slot still exists or not: never twice, never zero
//! times. (After a restart, slots resumed from their journals are counted as separate files
//! even where they are links: an overcount, never an undercount.)
//!
//! A draining slot is normally deleted before the next staging starts. While the budget allows
//! (the current slot, the kept slots and what the successor adds, each file once, within the two
//! slots' bytes) a retired slot is *held* instead: kept on the node as a donor for the stagings
//! to come, and let go, oldest first, only when a successor needs its room
//! ([`Store::retire_slot`], `Store::wait_unheld`). A dataset that fits the budget but not one
//! slot is then read from the tier in its first epoch only.
//!
//! On a shared mount every retired slot is held (up to a count), and each staging makes its own
//! room ([`Store::room_for`]): it deletes single samples of held slots no view reads any more,
//! in RefCnt's order (paper 004: the fewest jobs still need it this epoch, then the oldest
//! slot's), and lets whole slots go only when that is not enough. A trimmed sample leaves the
//! book at once but counts as taking space until its files are deleted ([`Trim`]), so the
//! budget holds at every instant; a held slot's journal may then list files it no longer
//! has, which the stager's donor check passes over.
//!
//! Locking. The book is behind the store's own lock, taken only inside these methods and
//! never while waiting for anything; the daemon may hold its sessions' lock when it calls
//! them (sessions lock, then store lock; never the other way).

use metfs_fs::lock_order::{Level, OrderedMutex};
use std::collections::BTreeSet;

use metfs_plan::budget::BLOCK;

use crate::daemon::samples::Samples;
use crate::daemon::CachePaths;
use metfs_plan::budget::{round_up, Budget};
use metfs_plan::planner::{self as planner, EpochPlan, PlanConfig, PlanError, SampleSet};
use metfs_prefetcher::hdf5::Containers;
use metfs_prefetcher::stager::{Progress, SlotSpec, StageReport, Stager};
use metfs_protocol::FailedSample;
use metfs_tier::catalog::Catalog;
use std::collections::BTreeMap;
use std::sync::Arc;

mod evict;
mod origins;
mod room;
mod views;

use origins::Origins;

pub(super) use room::{Room, Trim};

/// Most retired slots kept on the node as donors at once (of a plain mount; a shared one
/// keeps up to two per job share).
const MAX_HELD: usize = 2;

/// Whether a long deletion must stop now (the daemon is shutting down).
pub(super) type Stop = Arc<dyn Fn() -> bool + Send + Sync>;

/// The staged samples of a node and their budget (see the module doc).
pub struct Store {
    pub(super) paths: CachePaths,
    pub(super) catalog: Arc<Catalog>,
    /// Each sample's bytes in the cache (sizes rounded up to blocks, or packed rows).
    pub(super) footprints: Vec<u64>,
    pub(super) containers: Option<Arc<Containers>>,
    pub(super) budget: Budget,
    pub(super) stager: Stager,
    book: OrderedMutex<Book>,
    /// Most retired slots kept as donors at once.
    pub(super) max_held: usize,
    /// A shared mount: a retired slot is kept whatever its bytes, and each staging makes its
    /// own room ([`Store::room_for`], in RefCnt's order) instead of [`Store::retire_slot`]
    /// letting the oldest go.
    pub(super) room_on_demand: bool,
    /// Woken when held slots are released.
    released: tokio::sync::Notify,
    /// The samples, when files are not each one (groups, always files, a format's indexes).
    pub(super) samples: Option<Arc<Samples>>,
}

/// Samples left out that `status` lists (`failed_samples`).
const FAILED_LISTED: usize = 100;

/// Which slots take how many bytes, which are draining, and what went wrong.
#[derive(Default)]
struct Book {
    /// Footprint of each slot on disk (staged or staging).
    footprints: BTreeMap<String, u64>,
    /// The samples of each slot in `footprints`.
    samples: BTreeMap<String, Arc<Vec<u32>>>,
    /// Draining slots kept on the node as donors while the budget allows (module doc).
    held: std::collections::BTreeSet<String>,
    /// Slots of retired views, by generation, until their files are deleted.
    draining: BTreeMap<u64, String>,
    /// Generations of `draining` whose slot is being deleted now.
    evicting: std::collections::BTreeSet<u64>,
    last_error: Option<String>,
    /// The last [`FAILED_LISTED`] samples left out of a slot, each once, with why.
    failed_samples: Vec<FailedSample>,
    /// The samples of each slot that are hard links, with the slot whose fetch made the file
    /// (their *origin*): every name of one sample with one origin is one file on disk.
    origins: BTreeMap<String, Origins>,
    /// Bytes of samples trimmed from held slots whose files are being deleted now: gone from
    /// `samples`, still on disk, so still counted.
    trimming: u64,
    /// Trims whose deletion failed for some file: their bytes count until every slot they
    /// named is deleted whole.
    stuck: Vec<(BTreeSet<String>, u64)>,
    /// Samples trimmed since the mount.
    trimmed_samples: u64,
}

impl Book {
    /// Sample `path` was left out of a slot for `why`: listed once, with its latest reason,
    /// among the last [`FAILED_LISTED`] samples left out. A sample that fails at every
    /// staging (deleted from the tier, unreadable) was listed once per attempt before, and
    /// pushed every other sample out of the list.
    fn note_failed(&mut self, path: &str, why: String) {
        self.failed_samples.retain(|f| f.path != path);
        self.failed_samples.push(FailedSample {
            path: path.to_string(),
            reason: why.clone(),
        });
        if self.failed_samples.len() > FAILED_LISTED {
            let cut = self.failed_samples.len() - FAILED_LISTED;
            self.failed_samples.drain(..cut);
        }
        self.last_error = Some(why);
    }

    /// Bytes the files of the slots take on disk, each file once (a sample's copies with one
    /// origin are one file), leaving out the slots in `except`.
    ///
    /// Runs inside a view switch over every sample on the node (tens of thousands), so it is
    /// kept to flat arrays: a bit per origin slot and sample rather than a set of pairs.
    fn distinct_bytes(&self, footprints: &[u64], except: &[&str]) -> u64 {
        // Origins are slots (a handful, including deleted ones whose files live on as links):
        // one flag per origin and sample, in flat arrays made as origins are met. A slot's
        // linked samples are found by walking its origin map once (no lookup per sample), and
        // the rest are its own files.
        fn index<'a>(
            names: &mut Vec<&'a str>,
            seen: &mut Vec<Vec<bool>>,
            n: usize,
            origin: &'a str,
        ) -> usize {
            names.iter().position(|x| *x == origin).unwrap_or_else(|| {
                names.push(origin);
                seen.push(vec![false; n]);
                names.len() - 1
            })
        }
        let n = footprints.len();
        let mut names: Vec<&str> = Vec::new();
        let mut seen: Vec<Vec<bool>> = Vec::new();
        // Per slot, cleared after it: which samples it holds, and which of those are links.
        let mut member = vec![false; n];
        let mut linked = vec![false; n];
        let mut total = 0;
        let mut count = |seen: &mut Vec<Vec<bool>>, i: usize, id: u32| {
            let flag = &mut seen[i][id as usize];
            if !*flag {
                *flag = true;
                total += footprints[id as usize];
            }
        };
        for (slot, samples) in &self.samples {
            if except.contains(&slot.as_str()) {
                continue;
            }
            let origins = self.origins.get(slot).filter(|o| !o.is_empty());
            if let Some(o) = origins {
                for &id in samples.iter() {
                    member[id as usize] = true;
                }
                let mut last: Option<(&str, usize)> = None;
                for (id, origin) in o.iter() {
                    if !member[id as usize] {
                        continue;
                    }
                    linked[id as usize] = true;
                    let i = match last {
                        Some((name, i)) if std::ptr::eq(name, &**origin) => i,
                        _ => index(&mut names, &mut seen, n, origin),
                    };
                    last = Some((origin, i));
                    count(&mut seen, i, id);
                }
            }
            let own = index(&mut names, &mut seen, n, slot);
            for &id in samples.iter() {
                if !linked[id as usize] {
                    count(&mut seen, own, id);
                }
            }
            if origins.is_some() {
                for &id in samples.iter() {
                    member[id as usize] = false;
                    linked[id as usize] = false;
                }
            }
        }
        total
    }

    /// Bytes of trimmed samples still on disk: those whose deletion failed, and with
    /// `pending` those being deleted now.
    fn trimmed_not_freed(&self, pending: bool) -> u64 {
        let stuck: u64 = self.stuck.iter().map(|x| x.1).sum();
        stuck + if pending { self.trimming } else { 0 }
    }

    /// Which samples some slot outside `except` holds, indexed by sample id.
    fn on_node(&self, samples_in_catalog: usize, except: &[&str]) -> Vec<bool> {
        let mut on = vec![false; samples_in_catalog];
        for (slot, samples) in &self.samples {
            if !except.contains(&slot.as_str()) {
                for &id in samples.iter() {
                    on[id as usize] = true;
                }
            }
        }
        on
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
            book: OrderedMutex::new(Level::Book, Book::default()),
            max_held: MAX_HELD,
            room_on_demand: false,
            released: tokio::sync::Notify::new(),
            samples: None,
        }
    }

    /// This store with `samples` as its samples (`None`: each file is one); the samples left
    /// out for a missing file are listed among `status`'s failed samples.
    pub(super) fn with_samples(mut self, samples: Option<Arc<Samples>>) -> Self {
        if let Some(s) = &samples {
            let b = self.book.get_mut().unwrap();
            for (path, why) in s.incomplete() {
                b.note_failed(&path, why);
            }
            // Not an error of staging: the listing is what it is.
            b.last_error = None;
        }
        self.samples = samples;
        self
    }

    /// The plan of files of `epoch`: the planner's over the samples, expanded to their files
    /// and the always files where samples are groups ([`SampleGroups::expand`]).
    pub(super) fn plan_epoch(&self, cfg: &PlanConfig, epoch: u64) -> Result<EpochPlan, PlanError> {
        match &self.samples {
            Some(s) => {
                let plan = planner::plan_epoch(&s.groups().sample_set(), cfg, epoch)?;
                Ok(s.groups().expand(plan, &self.footprints))
            }
            None => planner::plan_epoch(
                &SampleSet {
                    sizes: &self.footprints,
                    labels: self.catalog.labels(),
                    clusters: self.catalog.clusters(),
                },
                cfg,
                epoch,
            ),
        }
    }

    /// `ids` with every file of their samples (where samples are groups: a deferred file takes
    /// its sample's other files with it), ascending.
    pub(super) fn whole_samples(&self, ids: &[u32]) -> Vec<u32> {
        let mut out: Vec<u32> = match &self.samples {
            Some(s) => ids
                .iter()
                .flat_map(|&id| match s.groups().sample_of(id) {
                    Some(k) => s.groups().members(k).to_vec(),
                    None => vec![id],
                })
                .collect(),
            None => ids.to_vec(),
        };
        out.sort_unstable();
        out.dedup();
        out
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
    ) -> Result<StageReport, metfs_prefetcher::stager::StageError> {
        let mut spec = spec.clone();
        {
            // Only slots holding some sample of this one: each donor's journal is read.
            let b = self.book.lock().unwrap();
            let mut wanted = vec![false; self.footprints.len()];
            for &id in &spec.samples {
                wanted[id as usize] = true;
            }
            for (slot, held) in &b.samples {
                if *slot != spec.name
                    && !spec.reuse_from.contains(slot)
                    && held.iter().any(|&id| wanted[id as usize])
                {
                    spec.reuse_from.push(slot.clone());
                }
            }
        }
        let report = match &self.containers {
            Some(c) => {
                self.stager
                    .stage_containers(&spec, c.clone(), progress)
                    .await
            }
            None => self.stager.stage(&spec, progress).await,
        };
        if let Ok(r) = &report {
            self.note_links(&spec.name, r);
        }
        report
    }

    /// Records the samples a staging run of `slot` hard-linked from other slots: each is the
    /// same file as its donor's copy, so it takes the donor's origin.
    pub(super) fn note_links(&self, slot: &str, report: &StageReport) {
        let mut b = self.book.lock().unwrap();
        let mut mine: Vec<(u32, Arc<str>)> = Vec::new();
        for (donor, ids) in &report.linked {
            let theirs = b.origins.get(donor);
            let donor: Arc<str> = Arc::from(donor.as_str());
            for &id in ids {
                let origin = theirs.and_then(|o| o.get(id)).cloned();
                mine.push((id, origin.unwrap_or_else(|| donor.clone())));
            }
        }
        b.origins.entry(slot.to_string()).or_default().extend(mine);
    }

    /// Counts `slot` as holding `samples` (their footprint, from the moment its staging starts).
    pub(super) fn begin_slot(&self, slot: &str, samples: &[u32]) {
        let footprint = self.footprint(samples);
        let mut b = self.book.lock().unwrap();
        b.footprints.insert(slot.to_string(), footprint);
        b.samples
            .insert(slot.to_string(), Arc::new(samples.to_vec()));
    }

    /// Records the slot of a view retired at generation `gen`: it drains until deleted. It
    /// is *held* (kept on the node as a donor for the stagings to come) as long as the held
    /// slots, the current one and what `next` (the samples staged next) adds, each file once,
    /// fit the two slots' bytes; when they do not, the oldest held slots are let go first.
    /// On a shared mount (`room_on_demand`) only their count is bounded here: the bytes are
    /// already on the node, and the next staging makes its room in RefCnt's order.
    pub(super) fn retire_slot(&self, gen: u64, slot: &str, next: &[u32]) {
        let mut b = self.book.lock().unwrap();
        b.draining.insert(gen, slot.to_string());
        b.held.insert(slot.to_string());
        loop {
            // Slots let go are deleted before staging starts: they do not count.
            let gone: Vec<String> = b
                .draining
                .values()
                .filter(|s| !b.held.contains(*s))
                .cloned()
                .collect();
            let gone: Vec<&str> = gone.iter().map(String::as_str).collect();
            if b.held.len() <= self.max_held
                && (self.room_on_demand
                    || self.bytes_with(&b, &gone, next, true) <= 2 * self.budget.slot_bytes)
            {
                break;
            }
            // Draining slots by generation: the oldest held one goes first.
            let oldest = b.draining.values().find(|s| b.held.contains(*s)).cloned();
            match oldest {
                Some(s) => b.held.remove(&s),
                None => break,
            };
        }
        drop(b);
        self.released.notify_waiters();
    }

    /// Whether every one of `samples` is in a live slot (shown, staging or staged) other
    /// than `slot`. Held slots do not count: a staging may let them go at any time.
    pub(super) fn elsewhere(&self, slot: &str, samples: &[u32]) -> bool {
        let b = self.book.lock().unwrap();
        let mut except: Vec<&str> = b.draining.values().map(String::as_str).collect();
        except.push(slot);
        let on = b.on_node(self.footprints.len(), &except);
        samples.iter().all(|&x| on[x as usize])
    }

    /// A slot deleted without having been shown (its job left): its bytes are free.
    pub(super) fn forget_slot(&self, slot: &str) {
        let mut b = self.book.lock().unwrap();
        b.footprints.remove(slot);
        b.samples.remove(slot);
        b.origins.remove(slot);
        drop(b);
        self.released.notify_waiters();
    }

    /// Bytes on the node once `next` is staged: the files of every slot but those in `gone`
    /// (each file once), what `next` adds (its samples no such slot holds), the held
    /// slots' journals and directories (the reserve covers two slots' own; at most
    /// `max_held` are kept), and trimmed samples not deleted: those whose deletion failed, and
    /// with `pending` those being deleted now.
    fn bytes_with(&self, b: &Book, gone: &[&str], next: &[u32], pending: bool) -> u64 {
        let on_node = b.on_node(self.footprints.len(), gone);
        let new: u64 = next
            .iter()
            .filter(|&&id| !on_node[id as usize])
            .map(|&id| self.footprints[id as usize])
            .sum();
        let meta: u64 = b
            .held
            .iter()
            .map(|s| self.slot_meta(b.samples.get(s).map_or(0, |x| x.len())))
            .sum();
        b.distinct_bytes(&self.footprints, gone) + new + meta + b.trimmed_not_freed(pending)
    }

    /// Bytes a slot of `n` samples takes besides its files: its journal (<= 18 bytes a line)
    /// and its directories (a block each, and an entry per sample of up to 40 bytes).
    fn slot_meta(&self, n: usize) -> u64 {
        round_up(18 * n as u64 + BLOCK)
            + round_up(40 * n as u64)
            + (self.catalog.dir_count() as u64 + 1) * BLOCK
    }

    /// Whether a retired slot still takes space and is not held for the next staging (staging
    /// waits for it to be deleted).
    pub(super) fn is_draining(&self) -> bool {
        let b = self.book.lock().unwrap();
        b.draining.values().any(|s| !b.held.contains(s))
    }

    /// How many retired slots still take space.
    pub(super) fn draining_count(&self) -> usize {
        let b = self.book.lock().unwrap();
        b.draining.values().filter(|s| !b.held.contains(*s)).count()
    }

    /// How many samples were trimmed from held slots since the mount.
    pub(super) fn trimmed_count(&self) -> u64 {
        self.book.lock().unwrap().trimmed_samples
    }

    /// How many retired slots are kept on the node as donors (held).
    pub(super) fn kept_count(&self) -> usize {
        self.book.lock().unwrap().held.len()
    }

    /// Records an error for `status`.
    pub(super) fn note_error(&self, error: String) {
        self.book.lock().unwrap().last_error = Some(error);
    }

    /// Records samples left out of a slot, `(path: why)`, keeping the last 100.
    pub(super) fn note_failed(&self, failed: impl IntoIterator<Item = (String, String)>) {
        let mut b = self.book.lock().unwrap();
        for (path, why) in failed {
            b.note_failed(&path, why);
        }
    }

    /// Deferred samples no view was to show (an aggregate node's extras): not carried, so
    /// not listed as deferred either; a peer that asks the exchange for one takes it from the
    /// tier.
    pub(super) fn left_out_extras(&self, extras: &[u32]) {
        if extras.is_empty() {
            return;
        }
        tracing::info!(
            samples = extras.len(),
            first = %self.catalog.path(extras[0]),
            "extras the tier kept failing on are left out of the cache (a peer that asks for one takes it from the tier)"
        );
        self.forget_failed(extras.iter().map(|&id| self.catalog.path(id)));
    }

    /// Takes `paths` off the failed samples `status` lists: deferred samples a later staging
    /// gave.
    pub(super) fn forget_failed(&self, paths: impl IntoIterator<Item = String>) {
        let mut b = self.book.lock().unwrap();
        for p in paths {
            b.failed_samples.retain(|f| f.path != p);
        }
    }

    /// The last error, and the samples recently left out.
    pub(super) fn errors(&self) -> (Option<String>, Vec<FailedSample>) {
        let b = self.book.lock().unwrap();
        (b.last_error.clone(), b.failed_samples.clone())
    }

    /// Seals every complete slot for a quick resume (`metfs_prefetcher::stager`'s `seal` module), at
    /// a clean shutdown. Returns how many were sealed. Container slots are not sealed (their
    /// staging checks every file at each start). On a shared mount the next start keeps only
    /// the slots its save file names and deletes the others with their seals. Blocking.
    pub fn seal_slots(&self) -> usize {
        if self.containers.is_some() {
            return 0;
        }
        let t = std::time::Instant::now();
        let mut sealed = 0;
        for name in self.stager.present_slots() {
            match self.stager.seal(&name) {
                Ok(true) => sealed += 1,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(slot = %name, error = %e, "cannot seal the slot; the next start checks every copy")
                }
            }
        }
        if sealed > 0 {
            tracing::info!(
                slots = sealed,
                secs = t.elapsed().as_secs_f64(),
                "slots sealed for a quick resume"
            );
        }
        sealed
    }

    /// Bytes of the slots on disk, without those being staged now (`staging`), whose bytes so
    /// far the caller counts itself (less what they linked). A hard-linked file counts once.
    pub(super) fn slot_bytes_except(&self, staging: &[&str]) -> u64 {
        let b = self.book.lock().unwrap();
        b.distinct_bytes(&self.footprints, staging) + b.trimmed_not_freed(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// The plain count: a set of (sample, origin) pairs.
    fn distinct_bytes_by_set(b: &Book, footprints: &[u64], except: &[&str]) -> u64 {
        let mut seen: HashSet<(u32, &str)> = HashSet::new();
        let mut total = 0;
        for (slot, samples) in &b.samples {
            if except.contains(&slot.as_str()) {
                continue;
            }
            let origins = b.origins.get(slot);
            for &id in samples.iter() {
                let origin = origins.and_then(|o| o.get(id)).map_or(slot.as_str(), |o| o);
                if seen.insert((id, origin)) {
                    total += footprints[id as usize];
                }
            }
        }
        total
    }

    /// A sample that fails again is listed once, with its latest reason, at the end; the list
    /// keeps the last 100.
    #[test]
    fn failed_samples_are_listed_once_each_latest_last() {
        let mut b = Book::default();
        b.note_failed("d/a", "gone".into());
        b.note_failed("d/ab", "changed".into());
        b.note_failed("d/a", "gone again".into());
        let listed = |b: &Book| -> Vec<String> {
            b.failed_samples
                .iter()
                .map(|f| format!("{}: {}", f.path, f.reason))
                .collect()
        };
        assert_eq!(listed(&b), ["d/ab: changed", "d/a: gone again"]);
        assert_eq!(b.last_error.as_deref(), Some("gone again"));
        for i in 0..150 {
            b.note_failed(&format!("x/{i}"), "io".into());
            b.note_failed("d/a", "gone".into());
        }
        assert_eq!(b.failed_samples.len(), FAILED_LISTED);
        assert_eq!(listed(&b).last().unwrap(), "d/a: gone");
        assert_eq!(
            b.failed_samples.iter().filter(|f| f.path == "d/a").count(),
            1
        );
        assert_eq!(listed(&b)[0], "x/51: io");
    }

    /// The flat count agrees with the plain set of (sample, origin) pairs, links to live and
    /// to deleted origins included.
    #[test]
    fn distinct_bytes_counts_each_file_once() {
        let footprints: Vec<u64> = (0..1000u64).map(|i| 4096 * (1 + i % 7)).collect();
        let mut b = Book::default();
        let slot = |r: std::ops::Range<u32>| Arc::new(r.collect::<Vec<u32>>());
        b.samples.insert("a".into(), slot(0..400));
        b.samples.insert("b".into(), slot(200..700));
        b.samples.insert("c".into(), slot(600..1000));
        // b's 200..400 are links to a's files; c's 600..650 links to b's, 650..700 links to a
        // slot already deleted (its files live on), and 700..720 to another deleted one.
        let gone: Arc<str> = Arc::from("gone");
        let gone2: Arc<str> = Arc::from("gone2");
        let a: Arc<str> = Arc::from("a");
        let bb: Arc<str> = Arc::from("b");
        b.origins
            .insert("b".into(), (200..400).map(|i| (i, a.clone())).collect());
        let mut oc: Origins = (600..650).map(|i| (i, bb.clone())).collect();
        oc.extend((650..700).map(|i| (i, gone.clone())));
        oc.extend((700..720).map(|i| (i, gone2.clone())));
        // An origin of a sample the slot does not hold counts for nothing.
        oc.extend([(100, a.clone())]);
        b.origins.insert("c".into(), oc);
        for except in [&[][..], &["a"][..], &["b"][..], &["a", "c"][..]] {
            assert_eq!(
                b.distinct_bytes(&footprints, except),
                distinct_bytes_by_set(&b, &footprints, except),
                "except {except:?}"
            );
        }
        let all: u64 = footprints.iter().sum();
        // Every sample once, plus c's 650..700 (a second file: origin gone, b's copy is b's own).
        let extra: u64 = (650..700).map(|i| footprints[i]).sum();
        assert_eq!(b.distinct_bytes(&footprints, &[]), all + extra);
        let on = b.on_node(footprints.len(), &["b"]);
        assert!(on[0] && !on[450] && on[650]);
    }
}
