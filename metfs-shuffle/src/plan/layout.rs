//! One epoch's layout: the shares and what each node holds (see the module docs of `plan`).

use super::{AggregateConfig, PlanError};
use crate::rng::{keep_draw, stream};

/// What every node holds in one epoch: its share and its cache (share plus extras).
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    epoch: u64,
    config: AggregateConfig,
    total: u64,
    /// `owner[j]`: the node whose share holds sample `j`.
    owner: Vec<u32>,
    /// Each node's share, ascending.
    shares: Vec<Vec<u32>>,
    /// Each node's cache (share and extras), ascending.
    caches: Vec<Vec<u32>>,
    share_bytes: Vec<u64>,
    cache_bytes: Vec<u64>,
}

impl Layout {
    /// The epoch this layout is for.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The settings it was computed with.
    pub fn config(&self) -> &AggregateConfig {
        &self.config
    }

    /// Number of nodes.
    pub fn nodes(&self) -> u32 {
        self.config.nodes
    }

    /// Number of samples in the catalog.
    pub fn samples(&self) -> u32 {
        self.owner.len() as u32
    }

    /// Bytes of the whole catalog.
    pub fn total_bytes(&self) -> u64 {
        self.total
    }

    /// The node whose share holds `sample`: [`NO_OWNER`] for a file every node holds or none
    /// does, in a layout [`Layout::over_files`] made.
    pub fn owner(&self, sample: u32) -> u32 {
        self.owner[sample as usize]
    }

    /// Node `node`'s share `S(e, node)`, ascending.
    pub fn share(&self, node: u32) -> &[u32] {
        &self.shares[node as usize]
    }

    /// Node `node`'s cache `C(e, node)` (share and extras), ascending.
    pub fn cache(&self, node: u32) -> &[u32] {
        &self.caches[node as usize]
    }

    /// Bytes of node `node`'s share.
    pub fn share_bytes(&self, node: u32) -> u64 {
        self.share_bytes[node as usize]
    }

    /// Bytes of node `node`'s cache; never more than the budget.
    pub fn cache_bytes(&self, node: u32) -> u64 {
        self.cache_bytes[node as usize]
    }

    /// Whether node `node` holds `sample` in this epoch.
    pub fn holds(&self, node: u32, sample: u32) -> bool {
        self.caches[node as usize].binary_search(&sample).is_ok()
    }

    /// The fraction of the catalog's samples node `node` holds (the paper's `α` for it).
    pub fn alpha(&self, node: u32) -> f64 {
        self.caches[node as usize].len() as f64 / self.owner.len() as f64
    }
}

/// The owner of a file no share holds alone (see [`Layout::over_files`]).
pub const NO_OWNER: u32 = u32::MAX;

impl Layout {
    /// This layout of *samples*, each of several files, as the layout of the `file_sizes.len()`
    /// files: sample `s`'s files (`members(s)`) go where it goes, and the `always` files are
    /// in every node's share and cache (each node holds its own copy: they are never moved,
    /// and count in every node's bytes). A file of no sample and not always is in no share
    /// and has [`NO_OWNER`], as the always files do. The budget in [`Layout::config`] is
    /// `budget`, the slot's whole; the samples were laid out in what the always files leave.
    pub fn over_files<'a>(
        &self,
        file_sizes: &[u64],
        members: &dyn Fn(u32) -> &'a [u32],
        always: &[u32],
        budget: u64,
    ) -> Layout {
        let files = |units: &[u32]| {
            let mut out: Vec<u32> = units
                .iter()
                .flat_map(|&s| members(s).iter().copied())
                .chain(always.iter().copied())
                .collect();
            out.sort_unstable();
            out
        };
        let always_bytes: u64 = always.iter().map(|&f| file_sizes[f as usize]).sum();
        let mut owner = vec![NO_OWNER; file_sizes.len()];
        for (s, &o) in self.owner.iter().enumerate() {
            for &f in members(s as u32) {
                owner[f as usize] = o;
            }
        }
        Layout {
            epoch: self.epoch,
            config: AggregateConfig {
                budget,
                ..self.config
            },
            total: self.total + always_bytes,
            owner,
            shares: self.shares.iter().map(|s| files(s)).collect(),
            caches: self.caches.iter().map(|c| files(c)).collect(),
            share_bytes: self.share_bytes.iter().map(|b| b + always_bytes).collect(),
            cache_bytes: self.cache_bytes.iter().map(|b| b + always_bytes).collect(),
        }
    }
}

/// Epoch `epoch`'s layout of the catalog whose sample `j` is `sizes[j]` bytes.
pub fn layout(sizes: &[u64], config: &AggregateConfig, epoch: u64) -> Result<Layout, PlanError> {
    let n = config.nodes;
    if n == 0 {
        return Err(PlanError::NoNodes);
    }
    if sizes.is_empty() {
        return Err(PlanError::Empty);
    }
    let samples = u32::try_from(sizes.len()).map_err(|_| PlanError::TooManySamples(sizes.len()))?;
    if !(0.0..=1.0).contains(&config.extra) {
        return Err(PlanError::BadExtra(config.extra));
    }
    let mut total = 0u64;
    let mut largest = 0u64;
    for (j, &size) in sizes.iter().enumerate() {
        total = total
            .checked_add(size)
            .ok_or(PlanError::TotalTooLarge { sample: j as u32 })?;
        if size > config.budget {
            return Err(PlanError::SampleTooLarge {
                sample: j as u32,
                size,
                budget: config.budget,
            });
        }
        largest = largest.max(size);
    }
    let aggregate = u128::from(n) * u128::from(config.budget);
    if u128::from(total) > aggregate {
        return Err(PlanError::DoesNotFit {
            total,
            samples,
            nodes: n,
            budget: config.budget,
            aggregate,
            missing: u128::from(total) - aggregate,
        });
    }

    let mut order: Vec<u32> = (0..samples).collect();
    stream(config.seed, epoch).shuffle(&mut order);
    let owner = cut(&order, sizes, n, total);

    let mut shares = vec![Vec::new(); n as usize];
    let mut share_bytes = vec![0u64; n as usize];
    for (j, &o) in owner.iter().enumerate() {
        shares[o as usize].push(j as u32);
        share_bytes[o as usize] += sizes[j];
    }
    if let Some(node) = (0..n).find(|&i| share_bytes[i as usize] > config.budget) {
        return Err(PlanError::ShareTooLarge {
            epoch,
            node,
            share: share_bytes[node as usize],
            budget: config.budget,
            total,
            slack: config.budget - total / u64::from(n),
            largest,
        });
    }

    let mut caches = Vec::with_capacity(n as usize);
    let mut cache_bytes = Vec::with_capacity(n as usize);
    for i in 0..n {
        let (cache, bytes) = cache_of(i, &owner, sizes, config, share_bytes[i as usize]);
        caches.push(cache);
        cache_bytes.push(bytes);
    }
    Ok(Layout {
        epoch,
        config: *config,
        total,
        owner,
        shares,
        caches,
        share_bytes,
        cache_bytes,
    })
}

/// Cuts the permuted `order` into `n` runs of nearly equal bytes and returns each sample's run.
/// Run `i` takes the positions before the first one where the bytes so far reach
/// `(i + 1)·T/n` (compared as `bytes·n ≥ (i + 1)·T`, exact in 128 bits), so each run is within
/// one sample of `T/n`; with `T = 0` the same rule on counts.
fn cut(order: &[u32], sizes: &[u64], n: u32, total: u64) -> Vec<u32> {
    let weight = |j: u32| if total == 0 { 1 } else { sizes[j as usize] };
    let total = if total == 0 {
        order.len() as u64
    } else {
        total
    };
    let mut owner = vec![0u32; order.len()];
    let mut node = 0u32;
    let mut before = 0u128; // bytes of the positions before this one
    for &j in order {
        // Move to the run whose span contains this sample's start.
        while node + 1 < n && before * u128::from(n) >= u128::from(node + 1) * u128::from(total) {
            node += 1;
        }
        owner[j as usize] = node;
        before += u128::from(weight(j));
    }
    owner
}

/// Node `node`'s cache: its share plus the extras (see the module docs of `plan`), ascending,
/// and its bytes.
fn cache_of(
    node: u32,
    owner: &[u32],
    sizes: &[u64],
    config: &AggregateConfig,
    share_bytes: u64,
) -> (Vec<u32>, u64) {
    let mut cache: Vec<u32> = Vec::new();
    let mut candidates: Vec<(f64, u32)> = Vec::new();
    for (j, &o) in owner.iter().enumerate() {
        let j = j as u32;
        if o == node {
            cache.push(j);
        } else if config.extra > 0.0 {
            let u = keep_draw(config.seed, node, j);
            if u < config.extra {
                candidates.push((u, j));
            }
        }
    }
    // Draws are distinct with overwhelming probability; the id breaks a tie deterministically.
    candidates.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut room = config.budget - share_bytes;
    for (_, j) in candidates {
        let size = sizes[j as usize];
        if size <= room {
            room -= size;
            cache.push(j);
        }
    }
    cache.sort_unstable();
    (cache, config.budget - room)
}
