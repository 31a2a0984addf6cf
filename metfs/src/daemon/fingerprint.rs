//! The fingerprint of a mount's plan: everything the sequence of mini-epochs depends on, saved
//! with the position in `state.json`. A later mount with an equal fingerprint resumes; any
//! difference starts over at epoch 0 (not an error: the dataset or the settings changed).
//!
//! It is a struct, saved as one, so that no field can run into another: the form before it, a
//! `|`-joined string, was split by position to make the rf history's dataset key, and a `|` in
//! a source path shifted every field after it. [`Fingerprint::dataset_key`] is built from the
//! fields instead. Both keep the text they always had for sources without a `|` (the saved
//! positions and rf histories of earlier versions still match), and a `state.json` written
//! with the old string is compared against [`Fingerprint::legacy`], so a cache resumes across
//! the change.

use serde::{Deserialize, Serialize};

/// How the mount's mini-epochs are scheduled, as far as the fingerprint is concerned: a
/// queue's positions belong to one incarnation and are never resumed or taken for a static
/// plan's, and an aggregate plan is another plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PlanKind {
    /// The planner's epochs, cut into mini-epochs.
    Static,
    /// Batches claimed from a dynamic-sharding queue.
    Dds,
    /// Aggregate-cache mode's shares, with the extras' probability.
    Aggregate { extra: f64 },
}

/// Everything a mount's plan depends on (see the module doc).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fingerprint {
    /// The source as given (`/lustre/...` or `s3://bucket/prefix`).
    pub source: String,
    /// Bytes of one slot (half the budget left after metadata).
    pub slot_bytes: u64,
    /// Mini-epochs per epoch.
    pub mini_epochs: u32,
    /// The composition, as its settings print (`Sequential`, `Stratified`, ...).
    pub compose: String,
    /// The plan's seed.
    pub seed: u64,
    /// This node's rank and the node count.
    pub node_rank: u32,
    pub nodes: u32,
    /// The catalog's digest (sizes, versions, labels), 16 hex digits.
    pub catalog: String,
    /// The transform's identity (`--transform`), when there is one: a changed transform starts
    /// over instead of serving the old one's output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transform: Option<String>,
    /// What a sample is (`format`, `group_by`, `always`, `include`, `exclude`), when set: other
    /// groups deal other mini-epochs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples: Option<String>,
    /// How mini-epochs are scheduled.
    pub plan: PlanKind,
}

impl Fingerprint {
    /// The rf history's key for the dataset: the fingerprint but the seed and the node's rank,
    /// which change which samples a mini-epoch holds, not the sequence of mini-epochs a
    /// schedule is indexed by (so `learned` replays a schedule on another seed, and on every
    /// node). The text is the one earlier versions recorded for the same mount.
    pub fn dataset_key(&self) -> String {
        let mut key = format!(
            "{}|{}|{}|{}|{}|{}",
            self.source, self.slot_bytes, self.mini_epochs, self.compose, self.nodes, self.catalog
        );
        self.push_tail(&mut key);
        key
    }

    /// The `|`-joined string that earlier versions saved in `state.json` for this fingerprint.
    pub fn legacy(&self) -> String {
        let mut s = format!(
            "{}|{}|{}|{}|{}|{}|{}|{}",
            self.source,
            self.slot_bytes,
            self.mini_epochs,
            self.compose,
            self.seed,
            self.node_rank,
            self.nodes,
            self.catalog
        );
        self.push_tail(&mut s);
        s
    }

    fn push_tail(&self, s: &mut String) {
        if let Some(t) = &self.transform {
            s.push('|');
            s.push_str(t);
        }
        match &self.plan {
            PlanKind::Static => {}
            PlanKind::Dds => s.push_str("|dds"),
            PlanKind::Aggregate { extra } => s.push_str(&format!("|aggregate:{extra}")),
        }
    }
}

/// A fingerprint as `state.json` holds it: the struct, or the string of earlier versions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SavedFingerprint {
    Current(Fingerprint),
    Legacy(String),
}

impl SavedFingerprint {
    /// Whether the saved fingerprint is `f`'s.
    pub fn matches(&self, f: &Fingerprint) -> bool {
        match self {
            SavedFingerprint::Current(s) => s == f,
            SavedFingerprint::Legacy(s) => *s == f.legacy(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(source: &str) -> Fingerprint {
        Fingerprint {
            source: source.into(),
            slot_bytes: 3 << 20,
            mini_epochs: 4,
            compose: "Sequential".into(),
            seed: 42,
            node_rank: 1,
            nodes: 2,
            catalog: "00112233aabbccdd".into(),
            transform: None,
            samples: None,
            plan: PlanKind::Static,
        }
    }

    #[test]
    fn the_dataset_key_leaves_out_seed_and_rank_whatever_the_source_holds() {
        for source in ["/lustre/data", "/lustre/a|b|c", "s3://bucket/x|y"] {
            let a = fp(source);
            let b = Fingerprint {
                seed: 7,
                node_rank: 0,
                ..a.clone()
            };
            assert_eq!(a.dataset_key(), b.dataset_key(), "{source}");
            assert!(a.dataset_key().starts_with(source), "{}", a.dataset_key());
            // Another dataset (catalog) or plan shape is another key.
            let c = Fingerprint {
                catalog: "ffffffffffffffff".into(),
                ..a.clone()
            };
            assert_ne!(a.dataset_key(), c.dataset_key());
            let d = Fingerprint {
                mini_epochs: 5,
                ..a.clone()
            };
            assert_ne!(a.dataset_key(), d.dataset_key());
        }
    }

    #[test]
    fn keys_are_the_text_earlier_versions_wrote() {
        let mut f = fp("/data");
        assert_eq!(
            f.legacy(),
            "/data|3145728|4|Sequential|42|1|2|00112233aabbccdd"
        );
        assert_eq!(
            f.dataset_key(),
            "/data|3145728|4|Sequential|2|00112233aabbccdd"
        );
        f.transform = Some("python3 -m prep".into());
        f.plan = PlanKind::Aggregate { extra: 0.5 };
        assert_eq!(
            f.legacy(),
            "/data|3145728|4|Sequential|42|1|2|00112233aabbccdd|python3 -m prep|aggregate:0.5"
        );
        assert_eq!(
            f.dataset_key(),
            "/data|3145728|4|Sequential|2|00112233aabbccdd|python3 -m prep|aggregate:0.5"
        );
    }

    #[test]
    fn saved_forms_round_trip_and_match() {
        let f = fp("/lustre/a|b");
        let saved = SavedFingerprint::Current(f.clone());
        let json = serde_json::to_string(&saved).unwrap();
        assert!(json.starts_with('{'), "saved as a struct: {json}");
        let back: SavedFingerprint = serde_json::from_str(&json).unwrap();
        assert!(back.matches(&f));
        let legacy: SavedFingerprint = serde_json::from_str(&format!("{:?}", f.legacy())).unwrap();
        assert!(legacy.matches(&f));
        assert!(!legacy.matches(&Fingerprint {
            seed: 1,
            ..f.clone()
        }));
    }
}
