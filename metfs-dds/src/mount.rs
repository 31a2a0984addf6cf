//! The mount's side of dynamic sharding: the `[dds]` settings (`metfs mount --dds URL`) and
//! the node name a daemon claims under.
//!
//! With a queue, a mount's next mini-epoch is not a slice of its own plan but the batch of
//! shards its worker claims (`crate::daemon`, the queue feed). A restarted daemon is a new
//! incarnation of its node: it never resumes the slots or position of the one before (their
//! shards went back to the queue when its lease expired), and starts from its next claim.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{DdsError, DdsUrl, EtcdOptions};

/// When the shards of a view are marked DONE.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ShardDone {
    /// At the end of the view's first completed pass: every sample was read once, which is
    /// all at-least-once delivery needs, and a node that dies during the later passes of its
    /// rf makes no one read its samples again.
    #[default]
    AfterPass,
    /// When the view retires after its rf passes (the job moved on): a node that dies during
    /// them gives its shards back, and another node reads them again.
    AfterRf,
}

impl std::fmt::Display for ShardDone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ShardDone::AfterPass => "after-pass",
            ShardDone::AfterRf => "after-rf",
        })
    }
}

/// Dynamic sharding of a mount (`[dds]` in the config file, `--dds` and `--dds-*` flags).
/// Without `url`, the mount shards statically (`nodes` / `node_rank`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, clap::Args)]
#[serde(default, deny_unknown_fields)]
pub struct DdsConfig {
    /// Take mini-epochs from the shard queue at etcd://HOST:PORT[,HOST:PORT...]/PREFIX
    /// (etcds:// for TLS) instead of a fixed share of each epoch (docs/DYNAMIC_SHARDING.md)
    /// [default: (none)].
    #[arg(id = "dds.url", long = "dds")]
    pub url: Option<String>,
    /// This node's name in the queue [default: $SLURMD_NODENAME, else the host name and the
    /// node rank].
    #[arg(id = "dds.node_name", long = "node-name")]
    pub node_name: Option<String>,
    /// When a view's shards are marked DONE.
    #[arg(id = "dds.shard_done", long = "shard-done", value_enum,
        default_value_t = DdsConfig::default().shard_done)]
    pub shard_done: ShardDone,
    /// Seconds after this node dies before its claimed shards go back to the queue: 10 is
    /// a few missed keep-alives (sent every third of it) on a loaded node, and short beside
    /// a mini-epoch.
    #[arg(id = "dds.lease_ttl_secs", long = "dds-lease-ttl-secs",
        default_value_t = DdsConfig::default().lease_ttl_secs)]
    pub lease_ttl_secs: u64,
    /// Shards per slot when this mount makes the queue: a node takes about this many shards
    /// each time it comes back for work (more: finer balance, more etcd round trips).
    #[arg(id = "dds.shards_per_slot", long = "dds-shards-per-slot",
        default_value_t = DdsConfig::default().shards_per_slot)]
    pub shards_per_slot: u32,
    /// CA bundle of the etcd servers' certificates (turns TLS on) [default: (none)].
    #[arg(id = "dds.cacert", long = "dds-cacert")]
    pub cacert: Option<PathBuf>,
    /// Client certificate for mutual TLS with etcd [default: (none)].
    #[arg(id = "dds.cert", long = "dds-cert")]
    pub cert: Option<PathBuf>,
    /// Private key of the client certificate [default: (none)].
    #[arg(id = "dds.key", long = "dds-key")]
    pub key: Option<PathBuf>,
    /// etcd user, NAME or NAME:PASSWORD [default: (none)].
    #[arg(id = "dds.user", long = "dds-user")]
    pub user: Option<String>,
    /// Password of the etcd user (better given as METFS_DDS_PASSWORD than as a flag)
    /// [default: (none)].
    #[arg(id = "dds.password", long = "dds-password")]
    pub password: Option<String>,
    /// Seconds before a request to etcd fails: above an fsync on a loaded disk, short enough
    /// that an unreachable etcd is reported promptly.
    #[arg(id = "dds.timeout_secs", long = "dds-timeout-secs",
        default_value_t = DdsConfig::default().timeout_secs)]
    pub timeout_secs: u64,
}

impl Default for DdsConfig {
    fn default() -> Self {
        Self {
            url: None,
            node_name: None,
            shard_done: ShardDone::AfterPass,
            lease_ttl_secs: 10,
            shards_per_slot: super::dataset::SHARDS_PER_SLOT,
            cacert: None,
            cert: None,
            key: None,
            user: None,
            password: None,
            timeout_secs: 5,
        }
    }
}

impl DdsConfig {
    /// The queue's address, if dynamic sharding is on.
    pub fn queue_url(&self) -> Result<Option<DdsUrl>, DdsError> {
        self.url.as_deref().map(DdsUrl::parse).transpose()
    }

    /// How to reach etcd.
    pub fn etcd_options(&self) -> EtcdOptions {
        EtcdOptions {
            cacert: self.cacert.clone(),
            cert: self.cert.clone(),
            key: self.key.clone(),
            user: self.user.clone(),
            password: self.password.clone(),
            timeout: Duration::from_secs(self.timeout_secs.max(1)),
        }
    }

    /// The lease TTL (etcd's minimum is 2 s).
    pub fn lease_ttl(&self) -> Duration {
        Duration::from_secs(self.lease_ttl_secs.max(2))
    }

    /// This node's name: `node_name`, else `$SLURMD_NODENAME`, else the host name with the
    /// node rank (two daemons of one host in a test, or a site without Slurm).
    pub fn node(&self, node_rank: u32) -> String {
        if let Some(n) = &self.node_name {
            return n.clone();
        }
        if let Some(n) = std::env::var("SLURMD_NODENAME")
            .ok()
            .filter(|n| !n.is_empty())
        {
            return n;
        }
        let host = hostname().unwrap_or_else(|| "node".into());
        format!("{host}-{node_rank}")
    }
}

fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into the buffer we own.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if r != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..end]).into_owned();
    (!name.is_empty()).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_name_is_given_or_made_from_the_host() {
        let given = DdsConfig {
            node_name: Some("n1".into()),
            ..Default::default()
        };
        assert_eq!(given.node(3), "n1");
        if std::env::var_os("SLURMD_NODENAME").is_none() {
            assert!(DdsConfig::default().node(3).ends_with("-3"));
        }
    }

    #[test]
    fn a_bad_url_is_an_error_naming_it() {
        let c = DdsConfig {
            url: Some("http://x/y".into()),
            ..Default::default()
        };
        let e = c.queue_url().unwrap_err().to_string();
        assert!(e.contains("http://x/y"), "{e}");
    }
}
