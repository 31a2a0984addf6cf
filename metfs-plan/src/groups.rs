//! Sample groups: the unit the planner deals when a sample is several files.
//!
//! A catalog holds files; a *sample* is one or more of them that always travel together (an
//! image and its mask, a shard and its index file). [`SampleGroups`] maps the two: the planner
//! plans over samples ([`SampleGroups::sample_set`]: a sample's footprint is the sum of its
//! files', its label and cluster those of its first file as given), and [`SampleGroups::expand`] turns a plan
//! of samples back into the plan of files every other part of metfs stages, shows and counts.
//! Files in every view (*always* files) are added to every mini-epoch there; files that are
//! neither (excluded, a format's index) appear in no plan.
//!
//! # Invariants
//!
//! * Every catalog file is a member of at most one sample, or an always file, or neither; a
//!   sample has at least one file. [`SampleGroups::new`] refuses anything else.
//! * A mini-epoch of the expanded plan (or of a queue's batch, [`SampleGroups::files`]) holds
//!   every file of each of its samples and every always file, in ascending file id (the order
//!   staging walks the source), and its `bytes` are the footprints of those files: so a view
//!   that holds one file of a sample holds all of them, and the budget sees what is staged.
//! * The mapping is the same on every node for the same catalog and settings (it is built from
//!   the catalog's order alone).

use crate::planner::{EpochPlan, MiniEpoch, SampleSet};

/// Marks a file that is no sample's.
const NONE: u32 = u32::MAX;

/// Samples as groups of catalog files (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SampleGroups {
    /// Members of sample `s`: `members[offsets[s]..offsets[s + 1]]`, ascending file ids.
    offsets: Vec<u32>,
    members: Vec<u32>,
    /// Per file: its sample, or [`NONE`].
    sample_of: Vec<u32>,
    /// Files in every mini-epoch, ascending.
    always: Vec<u32>,
    /// Per sample: the sum of its files' footprints.
    sizes: Vec<u64>,
    labels: Option<Vec<u32>>,
    clusters: Option<Vec<u32>>,
    always_bytes: u64,
}

/// Samples and always files that do not describe a catalog.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GroupError {
    /// A file id past the catalog's end.
    #[error("file id {id} is past the catalog's {files} files")]
    OutOfRange { id: u32, files: usize },
    /// A file in two samples, or a sample and the always files.
    #[error("file id {id} is in two samples, or in a sample and in every view")]
    Twice { id: u32 },
    /// A sample of no file.
    #[error("sample {sample} has no file")]
    Empty { sample: usize },
    /// No sample at all.
    #[error("no file is a sample")]
    NoSamples,
    /// Bytes that are not [`SampleGroups::encode`]'s.
    #[error("not a groups file: {0}")]
    Corrupt(String),
}

impl SampleGroups {
    /// Groups of the catalog whose files have `footprints` (and, when it has them, `labels`
    /// and `clusters`): `samples`, each a list of file ids, and the `always` files.
    pub fn new(
        footprints: &[u64],
        labels: Option<&[u32]>,
        clusters: Option<&[u32]>,
        samples: Vec<Vec<u32>>,
        mut always: Vec<u32>,
    ) -> Result<Self, GroupError> {
        let files = footprints.len();
        if samples.is_empty() {
            return Err(GroupError::NoSamples);
        }
        let mut sample_of = vec![NONE; files];
        // A sample's label and cluster are its first file's as given (a template's first part,
        // the image of an image and its mask), not its lowest id's.
        let mut leads = Vec::with_capacity(samples.len());
        let mut offsets = Vec::with_capacity(samples.len() + 1);
        let mut members = Vec::with_capacity(files);
        let mut sizes = Vec::with_capacity(samples.len());
        let check = |id: u32, sample_of: &[u32]| {
            if id as usize >= files {
                Err(GroupError::OutOfRange { id, files })
            } else if sample_of[id as usize] != NONE {
                Err(GroupError::Twice { id })
            } else {
                Ok(())
            }
        };
        offsets.push(0);
        for (s, mut m) in samples.into_iter().enumerate() {
            if m.is_empty() {
                return Err(GroupError::Empty { sample: s });
            }
            leads.push(m[0]);
            m.sort_unstable();
            let mut bytes = 0u64;
            for &id in &m {
                check(id, &sample_of)?;
                sample_of[id as usize] = s as u32;
                bytes = bytes.saturating_add(footprints[id as usize]);
            }
            members.extend_from_slice(&m);
            offsets.push(members.len() as u32);
            sizes.push(bytes);
        }
        always.sort_unstable();
        always.dedup();
        let mut always_bytes = 0u64;
        for &id in &always {
            check(id, &sample_of)?;
            always_bytes = always_bytes.saturating_add(footprints[id as usize]);
        }
        let first =
            |col: &[u32]| -> Vec<u32> { leads.iter().map(|&id| col[id as usize]).collect() };
        Ok(Self {
            labels: labels.map(first),
            clusters: clusters.map(first),
            offsets,
            members,
            sample_of,
            always,
            sizes,
            always_bytes,
        })
    }

    /// How many samples.
    pub fn len(&self) -> usize {
        self.sizes.len()
    }

    /// Whether there is no sample (never, once built).
    pub fn is_empty(&self) -> bool {
        self.sizes.is_empty()
    }

    /// The files of sample `s`, ascending.
    pub fn members(&self, s: u32) -> &[u32] {
        let (a, b) = (self.offsets[s as usize], self.offsets[s as usize + 1]);
        &self.members[a as usize..b as usize]
    }

    /// The sample file `id` belongs to, if any.
    pub fn sample_of(&self, id: u32) -> Option<u32> {
        self.sample_of
            .get(id as usize)
            .copied()
            .filter(|&s| s != NONE)
    }

    /// The files in every view, ascending.
    pub fn always(&self) -> &[u32] {
        &self.always
    }

    /// The footprint of the always files together.
    pub fn always_bytes(&self) -> u64 {
        self.always_bytes
    }

    /// The samples as the planner sees them.
    pub fn sample_set(&self) -> SampleSet<'_> {
        SampleSet {
            sizes: &self.sizes,
            labels: self.labels.as_deref(),
            clusters: self.clusters.as_deref(),
        }
    }

    /// The files of a mini-epoch of `samples`: every file of each and the always files,
    /// ascending (a plan's mini-epoch, or a batch of shards claimed from a queue).
    pub fn files(&self, samples: &[u32]) -> Vec<u32> {
        let mut out: Vec<u32> = samples
            .iter()
            .flat_map(|&s| self.members(s).iter().copied())
            .chain(self.always.iter().copied())
            .collect();
        out.sort_unstable();
        out
    }

    /// The plan of files of `plan`, a plan of samples: each mini-epoch's samples replaced by
    /// their files and the always files, its bytes by theirs (see the module docs).
    pub fn expand(&self, plan: EpochPlan, footprints: &[u64]) -> EpochPlan {
        let files = |samples: &[u32]| self.files(samples);
        let bytes = |ids: &[u32]| ids.iter().map(|&i| footprints[i as usize]).sum::<u64>();
        let copied = files(&plan.copied)
            .into_iter()
            .filter(|id| self.sample_of(*id).is_some())
            .collect::<Vec<u32>>();
        EpochPlan {
            epoch: plan.epoch,
            mini_epochs: plan
                .mini_epochs
                .into_iter()
                .map(|me| {
                    let samples = files(&me.samples);
                    let copied_bytes = if me.copied_bytes == 0 {
                        0
                    } else {
                        me.samples
                            .iter()
                            .filter(|s| plan.copied.binary_search(s).is_ok())
                            .flat_map(|&s| self.members(s))
                            .map(|&i| footprints[i as usize])
                            .sum()
                    };
                    MiniEpoch {
                        bytes: bytes(&samples),
                        samples,
                        copied_bytes,
                    }
                })
                .collect(),
            copied,
        }
    }

    /// `ids` (files of one view) less every sample of which some file is in `failed` or
    /// missing from `ids`; returns the kept files and the samples left out, each with its
    /// files. Always files and files of no sample are kept as they are.
    pub fn whole(&self, ids: &[u32], failed: &dyn Fn(u32) -> bool) -> (Vec<u32>, Vec<u32>) {
        let mut present: Vec<u32> = ids.to_vec();
        present.sort_unstable();
        present.dedup();
        let mut dropped: Vec<u32> = present
            .iter()
            .filter_map(|&id| self.sample_of(id))
            .filter(|&s| {
                self.members(s)
                    .iter()
                    .any(|&m| failed(m) || present.binary_search(&m).is_err())
            })
            .collect();
        dropped.sort_unstable();
        dropped.dedup();
        let kept = present
            .into_iter()
            .filter(|&id| {
                !failed(id)
                    && self
                        .sample_of(id)
                        .is_none_or(|s| dropped.binary_search(&s).is_err())
            })
            .collect();
        (kept, dropped)
    }
}

/// The first bytes of [`SampleGroups::encode`]'s output: the name and version 1.
const MAGIC: &[u8; 16] = b"metfs-groups v1\n";

impl SampleGroups {
    /// The samples and always files as bytes another process reads back with
    /// [`SampleGroups::decode`] (an aggregate mount's exchange plans over the same groups as
    /// its daemon): the magic, then little-endian `u32`s: the sample count, the always count,
    /// each sample's file count and files, the always files. Labels and clusters are not kept
    /// (the exchange's planner does not compose).
    pub fn encode(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(16 + 4 * (2 + self.len() + self.members.len() + self.always.len()));
        out.extend_from_slice(MAGIC);
        let mut put = |x: u32| out.extend_from_slice(&x.to_le_bytes());
        put(self.len() as u32);
        put(self.always.len() as u32);
        for s in 0..self.len() as u32 {
            let m = self.members(s);
            put(m.len() as u32);
            m.iter().for_each(|&id| put(id));
        }
        self.always.iter().for_each(|&id| put(id));
        out
    }

    /// The groups [`SampleGroups::encode`] wrote, over files of `footprints`; refuses bytes
    /// cut short, with bytes past the end, or that do not describe the catalog
    /// ([`SampleGroups::new`]'s checks).
    pub fn decode(bytes: &[u8], footprints: &[u64]) -> Result<Self, GroupError> {
        let body = bytes.strip_prefix(&MAGIC[..]).ok_or_else(|| {
            GroupError::Corrupt("it does not start with `metfs-groups v1`".into())
        })?;
        let mut words = body.chunks(4);
        let mut next = |what: &str| -> Result<u32, GroupError> {
            match words.next() {
                Some(w) if w.len() == 4 => Ok(u32::from_le_bytes(w.try_into().expect("4 bytes"))),
                _ => Err(GroupError::Corrupt(format!("cut short before {what}"))),
            }
        };
        let samples = next("the sample count")?;
        let always_n = next("the always count")?;
        // Every count is checked against the bytes left before anything is allocated by it.
        let left = |used: usize| (body.len() / 4).saturating_sub(used);
        if samples as usize > left(2) {
            return Err(GroupError::Corrupt(format!(
                "{samples} samples in {} bytes",
                body.len()
            )));
        }
        let mut list = Vec::with_capacity(samples as usize);
        let mut used = 2usize;
        for s in 0..samples {
            let n = next("a sample's file count")? as usize;
            used += 1;
            if n > left(used) {
                return Err(GroupError::Corrupt(format!(
                    "sample {s} has {n} files past the end"
                )));
            }
            list.push(
                (0..n)
                    .map(|_| next("a sample's files"))
                    .collect::<Result<Vec<u32>, _>>()?,
            );
            used += n;
        }
        if always_n as usize != left(used) || body.len() % 4 != 0 {
            return Err(GroupError::Corrupt(format!(
                "{always_n} always files, but {} bytes are left",
                body.len() - 4 * used
            )));
        }
        let always = (0..always_n)
            .map(|_| next("the always files"))
            .collect::<Result<Vec<u32>, _>>()?;
        Self::new(footprints, None, None, list, always)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::{plan_epoch, PlanConfig, Strategy};

    #[test]
    fn encoded_groups_decode_to_the_same_and_anything_else_is_refused() {
        let f = [1u64, 2, 3, 4, 5, 6];
        let g = SampleGroups::new(
            &f,
            None,
            None,
            vec![vec![4, 0], vec![1], vec![2, 3]],
            vec![5],
        )
        .unwrap();
        let bytes = g.encode();
        assert_eq!(SampleGroups::decode(&bytes, &f).unwrap(), g);
        for cut in [0, 10, 16, 20, bytes.len() - 1] {
            assert!(
                matches!(
                    SampleGroups::decode(&bytes[..cut], &f),
                    Err(GroupError::Corrupt(_))
                ),
                "cut at {cut}"
            );
        }
        let mut longer = bytes.clone();
        longer.extend_from_slice(&[0; 4]);
        assert!(matches!(
            SampleGroups::decode(&longer, &f),
            Err(GroupError::Corrupt(_))
        ));
        // A huge count is refused before it is allocated.
        let mut huge = bytes.clone();
        huge[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            SampleGroups::decode(&huge, &f),
            Err(GroupError::Corrupt(_))
        ));
        // Bytes of another catalog: a file past its end.
        assert_eq!(
            SampleGroups::decode(&bytes, &f[..4]),
            Err(GroupError::OutOfRange { id: 4, files: 4 })
        );
    }

    fn cfg(slot: u64) -> PlanConfig {
        PlanConfig {
            strategy: Strategy::Random,
            seed: 7,
            slot_bytes: slot,
            mini_epochs: None,
            node_rank: 0,
            nodes: 1,
            cluster_copies: Default::default(),
        }
    }

    #[test]
    fn refuses_what_is_not_a_grouping() {
        let f = [1, 1, 1];
        let g = |s: Vec<Vec<u32>>, a: Vec<u32>| SampleGroups::new(&f, None, None, s, a);
        assert_eq!(
            g(vec![vec![0, 3]], vec![]),
            Err(GroupError::OutOfRange { id: 3, files: 3 })
        );
        assert_eq!(
            g(vec![vec![0], vec![0]], vec![]),
            Err(GroupError::Twice { id: 0 })
        );
        assert_eq!(g(vec![vec![0]], vec![0]), Err(GroupError::Twice { id: 0 }));
        assert_eq!(
            g(vec![vec![0], vec![]], vec![]),
            Err(GroupError::Empty { sample: 1 })
        );
        assert_eq!(g(vec![], vec![0]), Err(GroupError::NoSamples));
    }

    #[test]
    fn labels_are_the_first_files() {
        let g = SampleGroups::new(
            &[1, 2, 3, 4],
            Some(&[5, 6, 7, 8]),
            None,
            vec![vec![3, 1], vec![0]],
            vec![2],
        )
        .unwrap();
        assert_eq!(g.sample_set().labels, Some(&[8, 5][..]));
        assert_eq!(g.sample_set().sizes, &[6, 1]);
        assert_eq!(g.always_bytes(), 3);
        assert_eq!(g.sample_of(2), None);
    }

    #[test]
    fn whole_leaves_out_a_sample_with_a_failed_file() {
        let g =
            SampleGroups::new(&[1; 6], None, None, vec![vec![0, 1], vec![2, 3]], vec![5]).unwrap();
        let (kept, dropped) = g.whole(&[0, 1, 2, 3, 5], &|id| id == 3);
        assert_eq!((kept, dropped), (vec![0, 1, 5], vec![1]));
        let (kept, dropped) = g.whole(&[0, 2, 3], &|_| false);
        assert_eq!((kept, dropped), (vec![2, 3], vec![0]));
    }

    /// A batch of samples (a queue's claim) is every file of each and the always files.
    #[test]
    fn files_of_samples_hold_every_member_and_the_always_files() {
        let g = SampleGroups::new(
            &[1; 7],
            None,
            None,
            vec![vec![4, 0], vec![1, 5], vec![2]],
            vec![6],
        )
        .unwrap();
        assert_eq!(g.files(&[2, 0]), vec![0, 2, 4, 6]);
        assert_eq!(g.files(&[1]), vec![1, 5, 6]);
        assert_eq!(g.files(&[]), vec![6]);
    }

    proptest::proptest! {
        /// An expanded epoch holds each sample's files together, once, and the always files in
        /// every mini-epoch; its bytes are its files'.
        #[test]
        fn expand_keeps_groups_whole(
            sizes in proptest::collection::vec(1u64..50, 2..60),
            cut in proptest::collection::vec(proptest::bool::ANY, 60),
            always_n in 0usize..3,
            epoch in 0u64..4,
        ) {
            let n = sizes.len();
            let always: Vec<u32> = (0..always_n.min(n - 1)).map(|i| (n - 1 - i) as u32).collect();
            let mut samples: Vec<Vec<u32>> = vec![];
            for id in 0..(n - always.len()) as u32 {
                if samples.is_empty() || cut[id as usize] {
                    samples.push(vec![id]);
                } else {
                    samples.last_mut().unwrap().push(id);
                }
            }
            let g = SampleGroups::new(&sizes, None, None, samples, always.clone()).unwrap();
            let largest = g.sample_set().sizes.iter().max().copied().unwrap();
            let c = cfg(largest * 3);
            let plan = plan_epoch(&g.sample_set(), &c, epoch).unwrap();
            let files = g.expand(plan, &sizes);
            let mut seen = vec![0u32; n];
            for me in &files.mini_epochs {
                proptest::prop_assert!(me.samples.windows(2).all(|w| w[0] < w[1]));
                proptest::prop_assert_eq!(me.bytes, me.samples.iter().map(|&i| sizes[i as usize]).sum::<u64>());
                for a in &always {
                    proptest::prop_assert!(me.samples.contains(a));
                }
                for &id in &me.samples {
                    seen[id as usize] += 1;
                    if let Some(s) = g.sample_of(id) {
                        for m in g.members(s) {
                            proptest::prop_assert!(me.samples.contains(m));
                        }
                    }
                }
            }
            for id in 0..n as u32 {
                let want = if always.contains(&id) { files.mini_epochs.len() as u32 } else { 1 };
                proptest::prop_assert_eq!(seen[id as usize], want);
            }
        }
    }
}
