//! How every node of an aggregate mount lays out an epoch: the one place the daemon
//! (`metfs`'s `daemon::aggregate`) and the exchange ([`crate::Node`]) both plan from, so that
//! they cannot plan differently.
//!
//! Without sample groups the `metfs-shuffle` planner deals the catalog's files. Where samples
//! are several files (`--group-by`, a manifest's `group` column, a format's shards and index
//! files) or some files are in every view (`--always`), it deals the **samples**, each of its
//! files' bytes together, in the slot less the always files, and the layout is expanded back to
//! files ([`metfs_shuffle::Layout::over_files`]): a sample's files are in the same share and
//! the same caches, so they come from the same place each epoch; the always files are in every
//! node's share and cache (each node stages its own copy once, and links it from slot to slot:
//! they never cross between nodes); files of no sample (left out by `--include`/`--exclude`,
//! or a format's index rewritten per view) are in none.
//!
//! The groups reach the exchange as `CACHE/groups.bin` ([`SampleGroups::encode`]), named in
//! the spec with its digest; the ranks compare that digest before exchanging, like the
//! catalog's.

use metfs_plan::digest::Fnv1a;
use metfs_plan::groups::SampleGroups;
use metfs_shuffle::{layout, AggregateConfig, Layout, PlanError};

/// An aggregate mount's planner inputs (module docs).
#[derive(Debug, Clone)]
pub struct EpochLayouts {
    /// Each catalog file's footprint in a slot.
    sizes: Vec<u64>,
    groups: Option<SampleGroups>,
    /// [`groups_digest`] of the groups' bytes, `0` without groups: computed once, since the
    /// ranks' agreement compares it with every other rank's.
    digest: u64,
    /// The settings, `budget` the whole slot's.
    settings: AggregateConfig,
}

impl EpochLayouts {
    /// The layouts of files of `sizes` (footprints) under `settings`, of `groups`' samples
    /// where given.
    pub fn new(sizes: Vec<u64>, groups: Option<SampleGroups>, settings: AggregateConfig) -> Self {
        let digest = groups.as_ref().map_or(0, |g| groups_digest(&g.encode()));
        Self {
            sizes,
            groups,
            digest,
            settings,
        }
    }

    /// The settings (the budget is the whole slot's).
    pub fn settings(&self) -> &AggregateConfig {
        &self.settings
    }

    /// Each catalog file's footprint.
    pub fn sizes(&self) -> &[u64] {
        &self.sizes
    }

    /// The sample groups, if samples are not each one file.
    pub fn groups(&self) -> Option<&SampleGroups> {
        self.groups.as_ref()
    }

    /// What the planner deals: each unit's bytes (a file's, or a sample's files'), and the
    /// bytes of a slot it deals them into (the slot less the always files).
    pub fn dealt(&self) -> (&[u64], u64) {
        match &self.groups {
            Some(g) => (
                g.sample_set().sizes,
                self.settings.budget.saturating_sub(g.always_bytes()),
            ),
            None => (&self.sizes, self.settings.budget),
        }
    }

    /// Epoch `epoch`'s layout of the catalog's files.
    pub fn layout(&self, epoch: u64) -> Result<Layout, PlanError> {
        let (units, budget) = self.dealt();
        let settings = AggregateConfig {
            budget,
            ..self.settings
        };
        let l = layout(units, &settings, epoch)?;
        Ok(match &self.groups {
            Some(g) => l.over_files(
                &self.sizes,
                &|s| g.members(s),
                g.always(),
                self.settings.budget,
            ),
            None => l,
        })
    }

    /// The digest of the groups' bytes ([`SampleGroups::encode`]), `0` without groups.
    pub fn groups_digest(&self) -> u64 {
        self.digest
    }
}

/// The digest of a groups file's bytes, as the spec carries it.
pub fn groups_digest(bytes: &[u8]) -> u64 {
    Fnv1a::of(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The daemon and the exchange plan from the same inputs alike; groups change the layout
    /// (samples dealt whole) and the always files are in every share.
    #[test]
    fn groups_deal_whole_samples_and_every_share_holds_the_always_files() {
        let sizes = vec![100u64; 9];
        let settings = AggregateConfig {
            nodes: 2,
            seed: 3,
            budget: 800,
            extra: 0.0,
        };
        let g = SampleGroups::new(
            &sizes,
            None,
            None,
            vec![vec![0, 1], vec![2, 3], vec![4, 5], vec![6, 7]],
            vec![8],
        )
        .unwrap();
        let l = EpochLayouts::new(sizes.clone(), Some(g.clone()), settings);
        assert_eq!(l.dealt(), (&[200u64, 200, 200, 200][..], 700));
        for epoch in 0..5 {
            let a = l.layout(epoch).unwrap();
            assert_eq!(a, l.clone().layout(epoch).unwrap());
            for i in 0..2 {
                let share = a.share(i);
                assert!(share.contains(&8));
                for s in 0..4 {
                    let m = g.members(s);
                    assert_eq!(share.contains(&m[0]), share.contains(&m[1]));
                }
            }
            assert_eq!(a.share(0).len() + a.share(1).len(), 8 + 2);
        }
        assert_ne!(l.groups_digest(), 0);
        let plain = EpochLayouts::new(sizes, None, settings);
        assert_eq!(plain.groups_digest(), 0);
    }
}
