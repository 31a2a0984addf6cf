//! A queue as a whole: make it (or check an existing one against this dataset), inspect it,
//! reset it. A node's own claims are in [`super::worker`].

use std::collections::BTreeMap;

use etcd_client::{Client, Compare, CompareOp, DeleteOptions, GetOptions, Txn, TxnOp};
use serde::Serialize;

use super::keys::{parse, Holder, Keys, Kind, NodeStats, QueueMeta};
use super::{etcd, DdsError, DdsUrl, EtcdOptions};

/// A connection to one queue.
#[derive(Clone)]
pub struct Queue {
    pub(super) client: Client,
    pub(super) keys: Keys,
    pub(super) url: DdsUrl,
}

/// One epoch's progress.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct EpochStatus {
    pub epoch: u64,
    pub todo: u64,
    pub doing: u64,
    pub done: u64,
}

/// One node's part.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct NodeStatus {
    pub node: String,
    /// The live incarnation, if the node holds a lease now.
    pub live: Option<u64>,
    /// Shards it holds now (DOING).
    pub doing: u64,
    #[serde(flatten)]
    pub stats: NodeStats,
    /// Its fraction of all samples claimed so far.
    pub share: f64,
    /// Samples per second over its working time.
    pub throughput: f64,
}

/// What `metfs dds status` shows.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct QueueStatus {
    pub url: String,
    pub meta: QueueMeta,
    /// Every epoch that has been started, oldest first.
    pub epochs: Vec<EpochStatus>,
    pub nodes: Vec<NodeStatus>,
}

fn entry(epochs: &mut BTreeMap<u64, EpochStatus>, epoch: u64) -> &mut EpochStatus {
    epochs.entry(epoch).or_insert(EpochStatus {
        epoch,
        todo: 0,
        doing: 0,
        done: 0,
    })
}

pub(super) fn describe(m: &QueueMeta) -> String {
    format!(
        "dataset {} with seed {} ({}, {} shards of at most {} bytes, queue layout {}; {})",
        m.fingerprint,
        m.seed,
        m.strategy,
        m.shards,
        m.shard_bytes,
        m.version,
        describe_samples(m)
    )
}

/// The samples a queue deals, for messages.
pub(super) fn describe_samples(m: &QueueMeta) -> String {
    match &m.sample_settings {
        Some(s) => format!("samples by {s}"),
        None => "every file a sample".to_string(),
    }
}

/// [`Queue::check`] for the queue at `url`: its sample settings first (a mount of other
/// settings has another catalog or sample count too, and the settings are what to fix).
fn refuse_other(url: &str, stored: &QueueMeta, ours: &QueueMeta) -> Result<(), DdsError> {
    if stored.sample_settings != ours.sample_settings {
        return Err(DdsError::SamplesMismatch {
            url: url.to_string(),
            queue: describe_samples(stored),
            ours: describe_samples(ours),
        });
    }
    if stored.fingerprint != ours.fingerprint
        || stored.seed != ours.seed
        || stored.strategy != ours.strategy
        || stored.samples != ours.samples
        || stored.version != ours.version
    {
        return Err(DdsError::Mismatch {
            url: url.to_string(),
            queue: describe(stored),
            ours: describe(ours),
        });
    }
    Ok(())
}

impl Queue {
    /// Connects to the etcd of `url` (checking that it answers).
    pub async fn connect(url: &DdsUrl, opts: &EtcdOptions) -> Result<Self, DdsError> {
        let client = super::connect(url, opts).await?;
        Ok(Self::with_client(client, url))
    }

    /// A queue over an existing client.
    pub fn with_client(client: Client, url: &DdsUrl) -> Self {
        Self {
            client,
            keys: Keys::new(&url.prefix),
            url: url.clone(),
        }
    }

    /// The queue's address.
    pub fn url(&self) -> &DdsUrl {
        &self.url
    }

    /// What the queue was made for, or `None` if there is no queue at this prefix.
    pub async fn meta(&self) -> Result<Option<QueueMeta>, DdsError> {
        let key = self.keys.meta();
        let r = self
            .client
            .kv_client()
            .get(key.clone(), None)
            .await
            .map_err(etcd("read of the queue record"))?;
        match r.kvs().first() {
            None => Ok(None),
            Some(kv) => Ok(Some(parse(key.as_bytes(), kv.value())?)),
        }
    }

    /// Makes the queue for `meta` if there is none; otherwise checks that the existing one was
    /// made for the same dataset, seed and composition, and returns the stored record (whose
    /// shard count wins over a differently sized new one). Returns whether it was made now.
    pub async fn init(&self, meta: &QueueMeta) -> Result<(QueueMeta, bool), DdsError> {
        let key = self.keys.meta();
        let value = serde_json::to_vec(meta).expect("serializable");
        let txn = Txn::new()
            .when([Compare::version(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.clone(), value, None)])
            .or_else([TxnOp::get(key.clone(), None)]);
        let r = self
            .client
            .kv_client()
            .txn(txn)
            .await
            .map_err(etcd("creation of the queue"))?;
        if r.succeeded() {
            return Ok((meta.clone(), true));
        }
        let stored = self.meta().await?.ok_or_else(|| DdsError::NotInitialized {
            url: self.url.to_string(),
        })?;
        self.check(&stored, meta)?;
        Ok((stored, false))
    }

    /// Refuses a queue made for other sample settings, or another dataset, seed or
    /// composition, naming both.
    pub fn check(&self, stored: &QueueMeta, ours: &QueueMeta) -> Result<(), DdsError> {
        refuse_other(&self.url.to_string(), stored, ours)
    }

    async fn range(
        &self,
        prefix: String,
        keys_only: bool,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, DdsError> {
        let mut opts = GetOptions::new().with_prefix();
        if keys_only {
            opts = opts.with_keys_only();
        }
        let r = self
            .client
            .kv_client()
            .get(prefix, Some(opts))
            .await
            .map_err(etcd("read of the queue"))?;
        Ok(r.kvs()
            .iter()
            .map(|kv| (kv.key().to_vec(), kv.value().to_vec()))
            .collect())
    }

    /// Every started epoch's counts and every node's part.
    pub async fn status(&self) -> Result<QueueStatus, DdsError> {
        let meta = self.meta().await?.ok_or_else(|| DdsError::NotInitialized {
            url: self.url.to_string(),
        })?;
        let k = &self.keys;
        let mut epochs: BTreeMap<u64, EpochStatus> = BTreeMap::new();
        // Never-claimed shards: of every stripe of each epoch with a cursor (a stripe without
        // one is at 0).
        let stripes = meta.stripes();
        let listing = self.range(k.cursors(), false).await?;
        let cursors = k.cursors_by_epoch(
            &stripes,
            listing
                .iter()
                .map(|(key, v)| (key.as_slice(), v.as_slice())),
        )?;
        for (e, c) in &cursors {
            entry(&mut epochs, *e).todo += stripes.fresh_left(c);
        }
        let mut doing_by: BTreeMap<String, u64> = BTreeMap::new();
        for prefix in [k.todo_all(), k.doing_all(), k.done_all()] {
            let with_values = prefix == k.doing_all();
            for (key, v) in self.range(prefix, !with_values).await? {
                let Some((kind, e, _)) = k.parse_shard(&key) else {
                    continue;
                };
                let st = entry(&mut epochs, e);
                match kind {
                    Kind::Todo => st.todo += 1,
                    Kind::Doing => {
                        st.doing += 1;
                        let h: Holder = parse(&key, &v)?;
                        *doing_by.entry(h.node).or_default() += 1;
                    }
                    Kind::Done => st.done += 1,
                    Kind::Claim => {}
                }
            }
        }
        let mut live: BTreeMap<String, u64> = BTreeMap::new();
        for (key, v) in self.range(k.workers(), false).await? {
            if let Some(node) = k.parse_node(&key, &k.workers()) {
                let h: Holder = parse(&key, &v)?;
                live.insert(node.to_string(), h.inc);
            }
        }
        let mut nodes = Vec::new();
        for (key, v) in self.range(k.stats_all(), false).await? {
            if let Some(node) = k.parse_node(&key, &k.stats_all()) {
                let stats: NodeStats = parse(&key, &v)?;
                nodes.push(NodeStatus {
                    node: node.to_string(),
                    live: live.get(node).copied(),
                    doing: doing_by.get(node).copied().unwrap_or(0),
                    throughput: stats.throughput(),
                    stats,
                    share: 0.0,
                });
            }
        }
        for (node, inc) in &live {
            if !nodes.iter().any(|n| &n.node == node) {
                nodes.push(NodeStatus {
                    node: node.clone(),
                    live: Some(*inc),
                    doing: 0,
                    stats: NodeStats::default(),
                    share: 0.0,
                    throughput: 0.0,
                });
            }
        }
        let total: u64 = nodes.iter().map(|n| n.stats.claimed_samples).sum();
        for n in &mut nodes {
            if total > 0 {
                n.share = n.stats.claimed_samples as f64 / total as f64;
            }
        }
        nodes.sort_by(|a, b| a.node.cmp(&b.node));
        Ok(QueueStatus {
            url: self.url.to_string(),
            meta,
            epochs: epochs.into_values().collect(),
            nodes,
        })
    }

    /// Deletes the whole queue. Refused while a worker holds a lease on it unless `force`.
    /// Returns the number of keys deleted.
    pub async fn reset(&self, force: bool) -> Result<i64, DdsError> {
        let live: Vec<String> = self
            .range(self.keys.workers(), true)
            .await?
            .iter()
            .filter_map(|(k, _)| {
                self.keys
                    .parse_node(k, &self.keys.workers())
                    .map(str::to_string)
            })
            .collect();
        if !live.is_empty() && !force {
            return Err(DdsError::LiveWorkers {
                url: self.url.to_string(),
                nodes: live.join(", "),
            });
        }
        let r = self
            .client
            .kv_client()
            .delete(self.keys.all(), Some(DeleteOptions::new().with_prefix()))
            .await
            .map_err(etcd("deletion of the queue"))?;
        Ok(r.deleted())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metfs_plan::planner::Strategy;

    fn meta(sample_settings: Option<&str>) -> QueueMeta {
        QueueMeta {
            version: crate::keys::LAYOUT_VERSION,
            fingerprint: "240:1000:00ff".into(),
            seed: 3,
            strategy: Strategy::Random,
            shards: 12,
            shard_bytes: 1 << 20,
            samples: 120,
            stripes: 1,
            sample_settings: sample_settings.map(str::to_string),
        }
    }

    /// A mount whose sample settings differ from the queue's is refused naming both, whether
    /// the queue has settings and the mount none or the other way round.
    #[test]
    fn other_sample_settings_are_refused_naming_both() {
        let url = "etcd://127.0.0.1:2379/q";
        let grouped = meta(Some("group_by 'images/{}.png,masks/{}.png'"));
        let e = refuse_other(url, &grouped, &meta(None))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("made with samples by group_by 'images/{}.png,masks/{}.png'")
                && e.contains("this node has every file a sample")
                && e.contains(url),
            "{e}"
        );
        let e = refuse_other(url, &meta(None), &meta(Some("group_by 'stem'")))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("made with every file a sample") && e.contains("group_by 'stem'"),
            "{e}"
        );
        refuse_other(url, &grouped, &grouped.clone()).unwrap();
        // Another dataset under the same settings is the dataset refusal, naming the samples.
        let other = QueueMeta {
            fingerprint: "9:9:9".into(),
            ..grouped.clone()
        };
        let e = refuse_other(url, &grouped, &other).unwrap_err().to_string();
        assert!(
            e.contains("was made for dataset 240:1000:00ff") && e.contains("samples by group_by"),
            "{e}"
        );
    }

    /// A queue record written before sample settings existed has none: every file a sample.
    #[test]
    fn a_record_without_sample_settings_deals_files() {
        let mut old = serde_json::to_value(meta(None)).unwrap();
        assert!(
            old.get("sample_settings").is_none(),
            "not written when none"
        );
        old.as_object_mut().unwrap().remove("sample_settings");
        let m: QueueMeta = serde_json::from_value(old).unwrap();
        assert_eq!(m, meta(None));
        let grouped = serde_json::to_string(&meta(Some("group_by 'stem'"))).unwrap();
        let back: QueueMeta = serde_json::from_str(&grouped).unwrap();
        assert_eq!(back.sample_settings.as_deref(), Some("group_by 'stem'"));
    }
}
