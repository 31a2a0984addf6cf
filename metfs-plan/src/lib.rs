//! The pure half of metfs: what a node plans, before any byte moves.
//!
//! * [`planner`]: a pure function from (samples, seed, epoch, node rank, node count, budget,
//!   strategy) to that epoch's mini-epochs (sequential, random, stratified, clustered); the
//!   shards of a dynamic-sharding queue; `planner::dependent_views`, several jobs over
//!   overlapping datasets planned together (dependent sampling, paper 004).
//! * [`budget`]: how a node's cache budget splits into two slots and a metadata reserve, and
//!   [`budget::footprint`], the one rule of what a sample takes of it.
//! * [`refcnt`]: several jobs on one store: the book (reference counts, pins, fixed shares of
//!   the budget) and its eviction order, each job's views with what to fetch, evict or wait
//!   for (`refcnt::cohort`), and a simulation of both (`refcnt::sim`, for its tests and the
//!   `share_sim` example).
//! * [`digest`]: stable digests (FNV-1a, and the catalog's) for values that are stored or
//!   compared between nodes.
//! * [`model`]: the paper's analytical model (stall-free rf, the tier's bandwidth, Eq. 1).
//! * [`size`]: `512MiB`-style byte sizes and `SIZE/s` rates.
//!
//! **Invariant:** pure. No I/O, no clock, no async runtime, no randomness but `metfs-planrng`'s
//! seeded streams: the same inputs give the same plan on every node, in a restarted daemon and
//! in `metfs plan`. The catalog is read through [`CatalogSamples`], which `metfs-tier`'s
//! `Catalog` implements, so this crate never builds a tier.

pub mod budget;
pub mod digest;
pub mod groups;
pub mod model;
pub mod planner;
pub mod refcnt;
pub mod size;

/// What the budget's reserve and the catalog's digest read of a dataset's catalog: sample ids
/// are `0..len()`. `metfs-tier`'s `Catalog` implements it (this crate depends on no tier).
pub trait CatalogSamples {
    /// How many samples.
    fn len(&self) -> usize;
    /// Whether there is none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// How many distinct directories hold them.
    fn dir_count(&self) -> usize;
    /// Sample `id`'s directory (relative, `""` at the root) and file name.
    fn dir_and_name(&self, id: u32) -> (&str, &str);
    /// Sample `id`'s size in bytes on the tier.
    fn size(&self, id: u32) -> u64;
    /// Sample `id`'s content version (mtime or ETag).
    fn version(&self, id: u32) -> &str;
    /// Sample `id`'s class name; `None` in an unlabelled catalog.
    fn label(&self, id: u32) -> Option<&str>;
}

/// A catalog of plain vectors for this crate's tests.
#[cfg(test)]
pub(crate) mod test_catalog {
    /// Samples `d{i % dirs}/f{i}` with the given sizes, unlabelled, version `v`.
    pub struct Samples {
        pub names: Vec<(String, String)>,
        pub sizes: Vec<u64>,
        pub labels: Option<Vec<String>>,
    }

    impl Samples {
        pub fn new(sizes: Vec<u64>, dirs: usize) -> Self {
            let names = (0..sizes.len())
                .map(|i| (format!("d{}", i % dirs.max(1)), format!("f{i}")))
                .collect();
            Self {
                names,
                sizes,
                labels: None,
            }
        }
    }

    impl super::CatalogSamples for Samples {
        fn len(&self) -> usize {
            self.sizes.len()
        }
        fn dir_count(&self) -> usize {
            let mut d: Vec<&str> = self.names.iter().map(|(d, _)| d.as_str()).collect();
            d.sort_unstable();
            d.dedup();
            d.len()
        }
        fn dir_and_name(&self, id: u32) -> (&str, &str) {
            let (d, n) = &self.names[id as usize];
            (d, n)
        }
        fn size(&self, id: u32) -> u64 {
            self.sizes[id as usize]
        }
        fn version(&self, _id: u32) -> &str {
            "v"
        }
        fn label(&self, id: u32) -> Option<&str> {
            self.labels.as_ref().map(|l| l[id as usize].as_str())
        }
    }
}
