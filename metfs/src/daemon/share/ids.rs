//! What a shared mount's cohort draws, and how its ids become the files the store stages.
//!
//! The cohort draws **samples**: where the sample settings group files (`--group-by`, a
//! manifest's `group` column, a detected format's shards, `--always`), a cohort id is a
//! group's id and its footprint is the sum of its files' (the groups' own
//! [`metfs_plan::groups::SampleGroups::sample_set`]); where they do not, a cohort id is a
//! file's id, as it always was. [`CohortIds`] is the one place that translates between the
//! two: every cohort id handed to the store, the views or a job's schedule goes through
//! [`CohortIds::view_files`] or [`CohortIds::members`], and every file id compared with
//! cohort ids (a store's reference counts, a job's subset) through [`CohortIds::of_file`] or
//! [`CohortIds::of_files`].
//!
//! # Invariants
//!
//! * Without groups every method is the identity on ids (no copy of the catalog, no lookup
//!   per file beyond what was done before).
//! * A view's files hold every file of each of its samples and every always file, ascending:
//!   so a job's slot holds whole samples, the format's index of exactly its shards can be
//!   rewritten into it, and the always files are hard links of one staged copy.
//! * The cohort deals at most a view less the always files ([`CohortIds::dealt`], the
//!   jobs' `dealt_bytes`), so the view's files fit the job's view.

use std::sync::Arc;

use crate::daemon::samples::{dealt_slot_bytes, Samples, SamplesError};
use crate::daemon::schedule::DrawnView;
use crate::daemon::store::Store;
use metfs_plan::refcnt::cohort::View as CohortView;
use metfs_plan::refcnt::Ledger;
use metfs_tier::catalog::Catalog;

/// The translation between a shared mount's cohort ids and its catalog's file ids (module
/// docs). Fixed at setup.
#[derive(Clone, Default)]
pub(in crate::daemon) struct CohortIds {
    samples: Option<Arc<Samples>>,
}

impl CohortIds {
    /// The ids of a mount whose samples are `samples` (`None`: each file is one).
    pub(in crate::daemon) fn new(samples: Option<Arc<Samples>>) -> Self {
        Self { samples }
    }

    /// Whether cohort ids are groups of files (else they are file ids).
    pub(in crate::daemon) fn grouped(&self) -> bool {
        self.samples.is_some()
    }

    /// How many cohort ids there are, of `catalog`.
    pub(in crate::daemon) fn count(&self, catalog: &Catalog) -> u32 {
        match &self.samples {
            Some(s) => s.groups().len() as u32,
            None => catalog.len() as u32,
        }
    }

    /// Each cohort id's footprint, of files whose footprints are `footprints`.
    pub(in crate::daemon) fn sizes<'a>(&'a self, footprints: &'a [u64]) -> &'a [u64] {
        match &self.samples {
            Some(s) => s.groups().sample_set().sizes,
            None => footprints,
        }
    }

    /// Each cohort id's label (a group's is its first file's), if `catalog` has labels.
    pub(in crate::daemon) fn labels<'a>(&'a self, catalog: &'a Catalog) -> Option<&'a [u32]> {
        match &self.samples {
            Some(s) => s.groups().sample_set().labels,
            None => catalog.labels(),
        }
    }

    /// The bytes the cohort may deal into a view of `view_bytes` under a budget of `budget`
    /// (of `catalog`): less the always files, which every view holds besides its samples.
    /// Always files that leave no room are an error naming them.
    pub(in crate::daemon) fn dealt(
        &self,
        catalog: &Catalog,
        budget: u64,
        view_bytes: u64,
    ) -> Result<u64, SamplesError> {
        dealt_slot_bytes(self.samples.as_deref(), catalog, budget, view_bytes)
    }

    /// The files of a view of cohort ids `ids`: every file of each and the always files,
    /// ascending.
    pub(in crate::daemon) fn view_files(&self, ids: &[u32]) -> Vec<u32> {
        match &self.samples {
            Some(s) => s.groups().files(ids),
            None => ids.to_vec(),
        }
    }

    /// The files of cohort ids `ids` alone (no always file), ascending: what a job that drew
    /// them still needs of the store beyond what every view holds.
    pub(in crate::daemon) fn members(&self, ids: impl IntoIterator<Item = u32>) -> Vec<u32> {
        let mut out: Vec<u32> = match &self.samples {
            Some(s) => ids
                .into_iter()
                .flat_map(|k| s.groups().members(k).iter().copied())
                .collect(),
            None => ids.into_iter().collect(),
        };
        out.sort_unstable();
        out
    }

    /// The cohort id of file `file`: its group's, `None` for an always file or a file of no
    /// sample (a format's index).
    pub(in crate::daemon) fn of_file(&self, file: u32) -> Option<u32> {
        match &self.samples {
            Some(s) => s.groups().sample_of(file),
            None => Some(file),
        }
    }

    /// The cohort ids of `files`, ascending and each once: a group is in if **any** of its
    /// files is (a job's manifest may name an image alone for its image and mask); files of no
    /// sample add nothing (the always files are in every view anyway, and a format's index
    /// is rewritten for each view).
    pub(in crate::daemon) fn of_files(&self, files: &[u32]) -> Vec<u32> {
        let mut out: Vec<u32> = files.iter().filter_map(|&f| self.of_file(f)).collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// How many jobs still need file `file` this epoch, by the cohort's reference counts
    /// (`ledger`, by cohort id): an always file counts as needed by everyone, so a store
    /// making room trims it last.
    pub(in crate::daemon) fn refcount_of_file(&self, ledger: &Ledger, file: u32) -> u32 {
        self.of_file(file).map_or(u32::MAX, |k| ledger.refcount(k))
    }

    /// The view the cohort drew (`v`, of cohort ids) as a job's schedule takes it: its files
    /// and their footprint in `store`.
    pub(in crate::daemon) fn drawn(&self, store: &Store, v: &CohortView) -> DrawnView {
        if !self.grouped() {
            return DrawnView {
                epoch: v.epoch,
                samples: v.samples.clone(),
                bytes: v.bytes,
            };
        }
        let samples = self.view_files(&v.samples);
        DrawnView {
            epoch: v.epoch,
            bytes: store.footprint(&samples),
            samples,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SampleConfig;
    use crate::daemon::samples::{apply, SampleSource};
    use crate::daemon::share::join::subset_samples;
    use metfs_formats::select::{GroupBy, Patterns};
    use metfs_plan::budget::Staged;
    use metfs_plan::refcnt::cohort::Cohort;
    use metfs_protocol::Subset;
    use metfs_tier::{CapacityTier, PosixTier};

    /// A source of `pairs` images (5,000 bytes) and masks (1,000 bytes), and a class list,
    /// grouped as pairs with the class list in every view.
    async fn pairs(pairs: usize) -> (tempfile::TempDir, Catalog, Vec<u64>, CohortIds) {
        let dir = crate::daemon::samples::tests::source(pairs);
        let settings = SampleConfig {
            group_by: Some(GroupBy::parse("images/{}.png,masks/{}.png").unwrap()),
            always: Patterns::new("always", &["classes.txt"]).unwrap(),
            ..SampleConfig::default()
        };
        let tier = PosixTier::new(dir.path()).unwrap();
        let catalog = tier.catalog().await.unwrap().catalog;
        let on = SampleSource {
            settings: &settings,
            manifest: None,
            source: "the source",
        };
        let tmp = tempfile::tempdir().unwrap();
        let a = apply(&on, catalog, Some(&tier), tmp.path(), Staged::Copy)
            .await
            .unwrap();
        let ids = CohortIds::new(a.samples.map(Arc::new));
        (dir, a.catalog, a.footprints, ids)
    }

    fn id(catalog: &Catalog, path: &str) -> u32 {
        catalog.find(path).unwrap()
    }

    /// Groups: a cohort id is a pair, its size both files'; a view of it holds the pair and
    /// the class list, what a job drew ahead only the pair; each file maps back to its pair,
    /// the class list to none (needed by everyone when a store makes room).
    #[tokio::test]
    async fn cohort_ids_are_pairs_and_views_their_files_and_the_always_file() {
        let (_dir, catalog, footprints, ids) = pairs(4).await;
        assert!(ids.grouped());
        assert_eq!(ids.count(&catalog), 4);
        assert_eq!(ids.sizes(&footprints), [3 * 4096; 4]);
        assert_eq!(
            ids.dealt(&catalog, 1 << 20, 100_000).unwrap(),
            100_000 - 4096
        );
        let classes = id(&catalog, "classes.txt");
        let k = ids.of_file(id(&catalog, "images/2.png")).unwrap();
        assert_eq!(ids.of_file(id(&catalog, "masks/2.png")), Some(k));
        assert_eq!(ids.of_file(classes), None);
        let mut pair = vec![id(&catalog, "images/2.png"), id(&catalog, "masks/2.png")];
        pair.sort_unstable();
        assert_eq!(ids.members([k]), pair);
        let mut view = [pair.clone(), vec![classes]].concat();
        view.sort_unstable();
        assert_eq!(ids.view_files(&[k]), view);
        // A manifest naming the image alone takes its pair.
        assert_eq!(ids.of_files(&[pair[0], classes]), vec![k]);
        assert_eq!(ids.of_files(&pair), vec![k]);
        // The cohort's counts are of pairs; the store asks by file.
        let mut cohort = Cohort::external(1 << 20, ids.sizes(&footprints).to_vec(), 1);
        cohort.join("a", &[k], 100_000).unwrap();
        assert_eq!(ids.refcount_of_file(cohort.ledger(), pair[1]), 1);
        let other = ids.of_file(id(&catalog, "images/0.png")).unwrap();
        assert_eq!(
            ids.refcount_of_file(cohort.ledger(), ids.members([other])[0]),
            0
        );
        assert_eq!(ids.refcount_of_file(cohort.ledger(), classes), u32::MAX);
    }

    /// Without groups every translation is the identity on ids.
    #[tokio::test]
    async fn without_groups_ids_are_files() {
        let (_dir, catalog, footprints, _) = pairs(3).await;
        let ids = CohortIds::default();
        assert!(!ids.grouped());
        assert_eq!(ids.count(&catalog), catalog.len() as u32);
        assert_eq!(ids.sizes(&footprints), footprints);
        assert_eq!(ids.dealt(&catalog, 1 << 20, 100_000).unwrap(), 100_000);
        assert_eq!(ids.view_files(&[4, 1]), vec![4, 1]);
        assert_eq!(ids.members([4, 1]), vec![1, 4]);
        assert_eq!(ids.of_file(5), Some(5));
        assert_eq!(ids.of_files(&[5, 2, 5]), vec![2, 5]);
    }

    /// A job's subset is of pairs: a manifest of images takes their pairs, a fraction is of
    /// the pairs, and no subset is every pair.
    #[tokio::test]
    async fn a_subset_of_files_is_the_pairs_it_touches() {
        let (dir, catalog, _, ids) = pairs(6).await;
        let all = subset_samples(&catalog, &ids, "src", "a", None).unwrap();
        assert_eq!(all, (0..6).collect::<Vec<u32>>());
        let manifest = dir.path().join("manifest.txt");
        std::fs::write(
            &manifest,
            "images/1.png\n./masks/4.png\nimages/4.png\nclasses.txt\n",
        )
        .unwrap();
        let subset = Subset {
            manifest: Some(manifest.display().to_string()),
            labels: None,
            fraction: None,
            seed: None,
        };
        let got = subset_samples(&catalog, &ids, "src", "a", Some(&subset)).unwrap();
        let pair_of = |p: &str| ids.of_file(id(&catalog, p)).unwrap();
        let mut want = vec![pair_of("images/1.png"), pair_of("images/4.png")];
        want.sort_unstable();
        assert_eq!(got, want);
        let half = Subset {
            manifest: None,
            labels: None,
            fraction: Some(0.5),
            seed: Some(3),
        };
        let got = subset_samples(&catalog, &ids, "src", "a", Some(&half)).unwrap();
        assert_eq!(got.len(), 3);
        assert!(got.iter().all(|&k| k < 6));
    }
}
