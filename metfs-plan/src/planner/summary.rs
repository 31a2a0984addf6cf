//! What `metfs plan` reports about one epoch's plan for every node: bytes per mini-epoch and
//! per share, per-node bytes, copies, and how evenly classes are spread ([`summarize`], and
//! [`PlanSummary`]'s `Display` for the table). Large class counts are capped so that a
//! summary stays small whatever the dataset.

use std::cmp::Reverse;
use std::fmt;

use serde::Serialize;

use crate::size::format_bytes;

use super::assign::{assign, Assignment};
use super::layout::layout;
use super::{ClusterCopies, PlanConfig, PlanError, SampleSet, Strategy, NONE};

/// Smallest, largest and mean of a set of byte counts.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ByteStats {
    /// Smallest value.
    pub min: u64,
    /// Largest value.
    pub max: u64,
    /// Mean value.
    pub mean: f64,
}

impl ByteStats {
    fn of(values: impl Iterator<Item = u64> + Clone) -> Self {
        let (mut min, mut max, mut sum, mut n) = (u64::MAX, 0u64, 0u128, 0u64);
        for v in values {
            min = min.min(v);
            max = max.max(v);
            sum += u128::from(v);
            n += 1;
        }
        if n == 0 {
            return Self {
                min: 0,
                max: 0,
                mean: 0.0,
            };
        }
        Self {
            min,
            max,
            mean: sum as f64 / n as f64,
        }
    }
}

/// One node's part of the epoch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeBytes {
    /// Node rank.
    pub node: u32,
    /// Samples over all its shares (copies counted once per share).
    pub samples: u64,
    /// Bytes over all its shares.
    pub bytes: u64,
    /// Its largest share.
    pub largest_share: u64,
    /// Its smallest share.
    pub smallest_share: u64,
}

/// How one class is spread over the mini-epochs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassSpread {
    /// Class name (or id when no names were given).
    pub class: String,
    /// Samples of the class in the dataset.
    pub samples: u64,
    /// Even count per mini-epoch: `samples / nm`.
    pub ideal: f64,
    /// Fewest samples of the class in one mini-epoch (all nodes).
    pub min: u64,
    /// Most samples of the class in one mini-epoch (all nodes).
    pub max: u64,
    /// A small cluster of `clustered`, copied to every node (see
    /// [`PlanSummary::cluster_copies`]); its counts are of the copies.
    pub copied: bool,
}

/// Per-mini-epoch counts of one class (small class counts only).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassCounts {
    /// Class name (or id).
    pub class: String,
    /// Samples of the class in each mini-epoch (all nodes).
    pub counts: Vec<u64>,
}

/// Class balance of a plan: over labels, or over clusters for `clustered`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassSummary {
    /// `"label"` or `"cluster"`.
    pub by: &'static str,
    /// Distinct classes with at least one sample.
    pub classes: usize,
    /// Classes copied (small clusters of `clustered`).
    pub copied_classes: usize,
    /// Largest `|count − ideal|` over the classes that are not copied and the mini-epochs.
    pub max_deviation: f64,
    /// Full table of counts, only when there are at most [`FULL_TABLE_CLASSES`] classes and
    /// [`FULL_TABLE_MINI_EPOCHS`] mini-epochs.
    pub per_mini_epoch: Option<Vec<ClassCounts>>,
    /// Min and max per class over the mini-epochs, in class id order, for the first
    /// [`LISTED_CLASSES`] classes.
    pub spread: Vec<ClassSpread>,
    /// True when `spread` stops before the last class.
    pub truncated: bool,
}

/// Most classes for which [`ClassSummary::per_mini_epoch`] is filled in.
pub const FULL_TABLE_CLASSES: usize = 16;
/// Most mini-epochs for which [`ClassSummary::per_mini_epoch`] is filled in.
pub const FULL_TABLE_MINI_EPOCHS: usize = 64;
/// Most classes listed in [`ClassSummary::spread`].
pub const LISTED_CLASSES: usize = 1000;
/// Class balance is left out when `classes × nm` exceeds this many counters.
pub(super) const MAX_CLASS_COUNTERS: usize = 1 << 26;

/// What `metfs plan` reports about one epoch's plan, for every node.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanSummary {
    /// Composition strategy.
    pub strategy: Strategy,
    /// The epoch summarised.
    pub epoch: u64,
    /// Seed of the plan.
    pub seed: u64,
    /// Number of nodes.
    pub nodes: u32,
    /// The node that asked.
    pub node_rank: u32,
    /// Samples in the dataset.
    pub samples: u64,
    /// Bytes in the dataset.
    pub total_bytes: u64,
    /// Budget of one share (half the slot budget of a node).
    pub slot_bytes: u64,
    /// Mini-epochs per epoch.
    pub mini_epochs: u32,
    /// True when the count was requested rather than chosen.
    pub mini_epochs_requested: bool,
    /// The most any share can hold in any epoch: the proven bound the count was chosen by for
    /// the permuting strategies, the exact largest share for `sequential`.
    pub share_bound: u64,
    /// Whole mini-epochs (all nodes, copies once per share).
    pub mini_epoch_bytes: ByteStats,
    /// Every node's share of every mini-epoch.
    pub share_bytes: ByteStats,
    /// Fewest and most samples in one share.
    pub share_samples: (u64, u64),
    /// Per node.
    pub node_bytes: Vec<NodeBytes>,
    /// `clustered`: how small clusters are copied; `None` for the other strategies.
    pub cluster_copies: Option<ClusterCopies>,
    /// Samples of the copied clusters. Every node holds each of them: in every share
    /// (`per-share`), or in one of its mini-epochs (`per-node`).
    pub copied_samples: u64,
    /// Their bytes: in every share (`per-share`), or over each node's epoch (`per-node`).
    pub copied_bytes: u64,
    /// Class balance, when the samples have labels (or clusters, for `clustered`).
    pub classes: Option<ClassSummary>,
}

/// Plans `epoch` for every node and summarises it: the mini-epoch count, bytes per
/// mini-epoch and per share, per-node bytes, copies, and how evenly classes are spread.
/// `label_names` names the class ids the summary groups by (labels, or clusters for
/// `clustered`); ids are shown when it is `None`.
pub fn summarize(
    samples: &SampleSet<'_>,
    cfg: &PlanConfig,
    epoch: u64,
    label_names: Option<&[String]>,
) -> Result<PlanSummary, PlanError> {
    let layout = layout(samples, cfg)?;
    let a = assign(samples, cfg, &layout, epoch);
    let sizes = samples.sizes;
    let (nm, nodes) = (layout.nm as usize, cfg.nodes as usize);
    let parts = nm * nodes;
    let mut share = vec![0u64; parts];
    let mut count = vec![0u64; parts];
    let (mut copied_samples, mut copied_bytes) = (0u64, 0u64);
    let (mut everywhere_samples, mut everywhere_bytes) = (0u64, 0u64);
    for (id, (&p, &s)) in a.part_of.iter().zip(sizes).enumerate() {
        if p != NONE {
            share[p as usize] += s;
            count[p as usize] += 1;
            continue;
        }
        copied_samples += 1;
        copied_bytes += s;
        let cluster = samples.clusters.map_or(0, |c| c[id]);
        for r in 0..nodes {
            match a.copy_mini_epoch(cluster, r as u32) {
                Some(m) => {
                    let p = m as usize * nodes + r;
                    share[p] += s;
                    count[p] += 1;
                }
                None => {
                    everywhere_samples += 1;
                    everywhere_bytes += s;
                    break;
                }
            }
        }
    }
    debug_assert_eq!(copied_bytes, layout.copied_bytes);
    // Shares fit (validated), but totals over nodes and mini-epochs count the copies of small
    // clusters many times; these are report figures, so they saturate rather than wrap.
    for (b, c) in share.iter_mut().zip(count.iter_mut()) {
        *b = b.saturating_add(everywhere_bytes);
        *c += everywhere_samples;
    }
    let me_bytes: Vec<u64> = share
        .chunks(nodes)
        .map(|c| c.iter().fold(0u64, |a, &b| a.saturating_add(b)))
        .collect();
    let node_bytes = (0..nodes)
        .map(|r| {
            let mine = || (0..nm).map(|m| share[m * nodes + r]);
            NodeBytes {
                node: r as u32,
                samples: (0..nm).map(|m| count[m * nodes + r]).sum(),
                bytes: mine().fold(0, u64::saturating_add),
                largest_share: mine().max().unwrap_or(0),
                smallest_share: mine().min().unwrap_or(0),
            }
        })
        .collect();
    let share_stats = ByteStats::of(share.iter().copied());
    let classes = match cfg.strategy {
        Strategy::Clustered => samples.clusters.map(|c| ("cluster", c)),
        _ => samples.labels.map(|l| ("label", l)),
    }
    .and_then(|(by, col)| class_summary(by, col, &a, &layout.copied, nm, nodes, label_names));
    Ok(PlanSummary {
        strategy: cfg.strategy,
        epoch,
        seed: cfg.seed,
        nodes: cfg.nodes,
        node_rank: cfg.node_rank,
        samples: sizes.len() as u64,
        total_bytes: sizes.iter().sum(),
        slot_bytes: cfg.slot_bytes,
        mini_epochs: layout.nm,
        mini_epochs_requested: cfg.mini_epochs.is_some(),
        share_bound: layout.bound.unwrap_or(share_stats.max),
        mini_epoch_bytes: ByteStats::of(me_bytes.iter().copied()),
        share_bytes: share_stats,
        share_samples: (
            count.iter().copied().min().unwrap_or(0),
            count.iter().copied().max().unwrap_or(0),
        ),
        node_bytes,
        cluster_copies: (cfg.strategy == Strategy::Clustered).then_some(cfg.cluster_copies),
        copied_samples,
        copied_bytes,
        classes,
    })
}

pub(super) fn class_summary(
    by: &'static str,
    col: &[u32],
    a: &Assignment,
    copied: &[bool],
    nm: usize,
    nodes: usize,
    names: Option<&[String]>,
) -> Option<ClassSummary> {
    let ncls = col.iter().max().map_or(0, |&m| m as usize + 1);
    if ncls.checked_mul(nm)? > MAX_CLASS_COUNTERS {
        return None;
    }
    let mut counts = vec![0u64; ncls * nm];
    let mut totals = vec![0u64; ncls];
    for (&c, &p) in col.iter().zip(&a.part_of) {
        totals[c as usize] += 1;
        if p != NONE {
            counts[c as usize * nm + p as usize / nodes] += 1;
        }
    }
    let is_copied = |c: usize| copied.get(c).copied().unwrap_or(false);
    for c in (0..ncls).filter(|&c| is_copied(c)) {
        for r in 0..nodes {
            match a.copy_mini_epoch(c as u32, r as u32) {
                Some(m) => counts[c * nm + m as usize] += totals[c],
                None => {
                    counts[c * nm..(c + 1) * nm].fill(totals[c]);
                    break;
                }
            }
        }
    }
    let name = |c: usize| {
        names
            .and_then(|n| n.get(c))
            .cloned()
            .unwrap_or_else(|| c.to_string())
    };
    let present: Vec<usize> = (0..ncls).filter(|&c| totals[c] > 0).collect();
    let mut max_deviation = 0f64;
    for &c in present.iter().filter(|&&c| !is_copied(c)) {
        let ideal = totals[c] as f64 / nm as f64;
        for &k in &counts[c * nm..(c + 1) * nm] {
            max_deviation = max_deviation.max((k as f64 - ideal).abs());
        }
    }
    let per_mini_epoch = (present.len() <= FULL_TABLE_CLASSES && nm <= FULL_TABLE_MINI_EPOCHS)
        .then(|| {
            present
                .iter()
                .map(|&c| ClassCounts {
                    class: name(c),
                    counts: counts[c * nm..(c + 1) * nm].to_vec(),
                })
                .collect()
        });
    let spread = present
        .iter()
        .take(LISTED_CLASSES)
        .map(|&c| {
            let row = &counts[c * nm..(c + 1) * nm];
            ClassSpread {
                class: name(c),
                samples: totals[c],
                ideal: totals[c] as f64 / nm as f64,
                min: row.iter().copied().min().unwrap_or(0),
                max: row.iter().copied().max().unwrap_or(0),
                copied: is_copied(c),
            }
        })
        .collect();
    Some(ClassSummary {
        by,
        classes: present.len(),
        copied_classes: present.iter().filter(|&&c| is_copied(c)).count(),
        max_deviation,
        per_mini_epoch,
        spread,
        truncated: present.len() > LISTED_CLASSES,
    })
}

impl fmt::Display for PlanSummary {
    /// A short human report; the JSON form (serde) has everything.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = format_bytes;
        writeln!(
            f,
            "plan: {} composition, epoch {}, seed {}, {} node(s), this node {}",
            self.strategy, self.epoch, self.seed, self.nodes, self.node_rank
        )?;
        writeln!(
            f,
            "dataset: {} samples, {}; budget per share {}",
            self.samples,
            b(self.total_bytes),
            b(self.slot_bytes)
        )?;
        writeln!(
            f,
            "mini-epochs: {} ({}); no share of any epoch can exceed {}",
            self.mini_epochs,
            if self.mini_epochs_requested {
                "requested"
            } else {
                "the smallest that always fits"
            },
            b(self.share_bound)
        )?;
        writeln!(
            f,
            "mini-epoch bytes: min {}, max {}, mean {}",
            b(self.mini_epoch_bytes.min),
            b(self.mini_epoch_bytes.max),
            b(self.mini_epoch_bytes.mean as u64)
        )?;
        writeln!(
            f,
            "share bytes: min {}, max {}, mean {}; samples per share {}..{}",
            b(self.share_bytes.min),
            b(self.share_bytes.max),
            b(self.share_bytes.mean as u64),
            self.share_samples.0,
            self.share_samples.1
        )?;
        for nb in &self.node_bytes {
            writeln!(
                f,
                "node {}: {} samples, {} over the epoch, shares {}..{}{}",
                nb.node,
                nb.samples,
                b(nb.bytes),
                b(nb.smallest_share),
                b(nb.largest_share),
                if nb.node == self.node_rank {
                    " (this node)"
                } else {
                    ""
                }
            )?;
        }
        if self.copied_samples > 0 {
            writeln!(
                f,
                "{}: {} samples, {}",
                match self.cluster_copies {
                    Some(ClusterCopies::PerNode) => {
                        "copied once to every node, each copy in one of its mini-epochs"
                    }
                    _ => "copied into every share",
                },
                self.copied_samples,
                b(self.copied_bytes)
            )?;
        }
        if let Some(c) = &self.classes {
            writeln!(
                f,
                "{}s: {} ({} copied); per mini-epoch counts are within {:.2} of even",
                c.by, c.classes, c.copied_classes, c.max_deviation
            )?;
            if let Some(table) = &c.per_mini_epoch {
                for row in table {
                    writeln!(f, "  {}: {:?}", row.class, row.counts)?;
                }
            } else {
                // The widest spreads are the interesting ones with a thousand classes.
                let mut rows: Vec<&ClassSpread> = c.spread.iter().collect();
                rows.sort_by_key(|r| Reverse(r.max - r.min));
                for r in rows.iter().take(5) {
                    writeln!(
                        f,
                        "  {}: {}..{} per mini-epoch (even {:.1}){}",
                        r.class,
                        r.min,
                        r.max,
                        r.ideal,
                        if r.copied { ", copied" } else { "" }
                    )?;
                }
            }
        }
        Ok(())
    }
}
