//! Replies: the body of each op's successful answer (wrapped in [`super::Reply`], which adds
//! `"v"` and `"ok"`). Field names are the protocol; the README's status table and the Python
//! client read them.
//!
//! A value that is not known yet (no pass measured, no staging finished) is `null`, never
//! left out, so a reader can tell "not measured" from "not sent by this version".

use metfs_feedback::history::Replay;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::values::{Compose, FailedSample, PolicyKind, ReadPath, Reason, ShardDone, ShuffleCode};

/// The answer to `hello`: the daemon's protocol and identity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Hello {
    /// The protocol's major version the daemon speaks.
    pub protocol: u32,
    /// The daemon's version (`metfs --version`).
    pub version: String,
    /// Where the view is mounted.
    pub mountpoint: String,
    /// The job the client named, if any.
    pub job: Option<String>,
    /// On a shared mount (`--share`): the job's place in it; `null` on a plain mount.
    #[serde(default)]
    pub share: Option<JobShare>,
    /// On a shared mount restarted with this job's place saved: why the place could not be
    /// resumed, told at the job's first `hello` after the restart (it starts over at epoch 0);
    /// `null` otherwise.
    #[serde(default)]
    pub not_resumed: Option<NotResumed>,
}

/// A job of a shared mount's save file (`share.json`) whose place a restart could not resume:
/// in its next `hello`, in `status` and as a `job_not_resumed` event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NotResumed {
    /// The job's name.
    pub job: String,
    /// Why its place was not resumed.
    pub reason: String,
    /// Where it was when its place was saved: epoch, mini-epoch (its view's sequence) and
    /// passes over that view.
    pub epoch: u64,
    pub mini_epoch: u32,
    pub passes: u32,
}

/// A job's place on a shared mount, in the answer to its `hello`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct JobShare {
    /// The directory its view is at (`MNT/<job>`).
    pub path: String,
    /// Bytes of the store this job may pin (its current and next views), fixed at join.
    pub share_bytes: u64,
    /// Most bytes of one of its views (half its share).
    pub view_bytes: u64,
    /// Samples of its dataset (the whole source, or its subset).
    pub samples: u64,
    /// Give this back in a later `hello` of the same job (after a lost connection): a `hello`
    /// naming a job present without its token is another job with the same name, and refused.
    pub token: String,
}

/// One job of a shared mount, in `status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct JobStatus {
    /// The job's name (its directory under the mount).
    pub name: String,
    /// Its epoch (each job counts its own).
    pub epoch: u64,
    /// Its mini-epoch: the sequence number of its view, from 0; none while it waits for its
    /// first view.
    pub mini_epoch: Option<u32>,
    /// Passes completed over its current view.
    pub pass: u32,
    /// Its rf policy and the passes per view it expects.
    pub rf_policy: PolicyKind,
    pub rf: f64,
    /// Bonus passes it was given (its next view was not staged, or it ran ahead).
    pub bonus_passes: u64,
    /// Generation of its view.
    pub generation: u64,
    /// Files and bytes of its view.
    pub files: u64,
    pub view_bytes: u64,
    /// Samples of its dataset.
    pub samples: u64,
    /// Bytes of the store it may pin.
    pub share_bytes: u64,
    /// Whether its next view is staged.
    pub next_ready: bool,
    /// It was held back last time so as not to drop what a slower job still needs.
    pub held_back: bool,
    /// Seconds since its last request; it is dropped after `share.idle_secs`.
    pub idle_secs: f64,
    /// Bytes of its retired views its readers still hold (a frozen reader), at the last look;
    /// at most its `share.held_open_cap` once the oldest are taken back.
    #[serde(default)]
    pub held_open_bytes: u64,
    /// Bytes of its retired views taken back from its readers so far.
    #[serde(default)]
    pub revoked_bytes: u64,
}

/// A node in aggregate-cache mode (`metfs mount --aggregate`), in `status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AggregateStatus {
    /// This node's rank.
    pub rank: u32,
    /// Nodes holding the dataset together.
    pub nodes: u32,
    /// Probability of keeping a sample outside the share.
    pub extra: f64,
    /// How samples cross between nodes.
    pub code: ShuffleCode,
    /// The last staging's wait for the exchange; `null` before the first after epoch 0.
    pub last_exchange: Option<ExchangeStatus>,
}

/// How a staging's wait for the exchange between nodes ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ExchangeStatus {
    /// The epoch whose slot was staged.
    pub epoch: u64,
    /// The exchange filled the inbox; `false`: it did not within the timeout, and what it
    /// did not bring came from the tier.
    pub complete: bool,
    /// Seconds the staging waited.
    pub wait_s: f64,
}

/// A node's worker on a dynamic-sharding queue (`metfs mount --dds`), in `status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DdsStatus {
    /// The queue's address.
    pub url: String,
    /// This node's name in the queue.
    pub node: String,
    /// This daemon's incarnation of the node (a restart is a new one).
    pub incarnation: u64,
    /// When a view's shards are marked DONE.
    pub shard_done: ShardDone,
    /// The epoch this worker claims from.
    pub epoch: u64,
    /// Shards per epoch.
    pub shards: u32,
    /// The node's totals over the queue's life (every incarnation): shards and samples
    /// claimed and marked done, and shards lost (given back before they were marked done:
    /// their samples may be read twice).
    pub claimed_shards: u64,
    pub claimed_samples: u64,
    pub done_shards: u64,
    pub done_samples: u64,
    pub lost_shards: u64,
    /// Samples marked done per second of the node's working time (its speed `v_i` for
    /// ADJUST_BS).
    pub samples_per_sec: f64,
    /// Batches handed over and not yet marked done in etcd.
    pub pending_done: u64,
    /// Round trips to etcd made by this worker, and their total time.
    pub etcd_round_trips: u64,
    pub etcd_secs: f64,
    /// Every shard of the queue is DONE: the view keeps serving, nothing more is claimed.
    pub finished: bool,
    /// The last etcd error, cleared by the next round trip that succeeds.
    pub last_error: Option<String>,
}

/// The answer to `status`: where the job is, what the cache holds, how staging goes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Status {
    /// Current epoch, from 0.
    pub epoch: u64,
    /// Current mini-epoch within the epoch, from 0.
    pub mini_epoch: u32,
    /// Mini-epochs per epoch (nm).
    pub mini_epochs: u32,
    /// Passes completed over the current mini-epoch.
    pub pass: u32,
    /// The passes per mini-epoch the policy expects (fractional for adaptive policies).
    pub rf: f64,
    /// The rf policy of the job whose position this is; `null` on a shared mount asked
    /// without a job (each job has its own, in `jobs`).
    pub rf_policy: Option<PolicyKind>,
    /// The job (the rf history's key) whose position this is.
    pub job: String,
    /// With `rf_policy` `learned`: the earlier run of the rf history it replays and why (the
    /// same record the history file keeps on this run as `replayed`); `null` for other
    /// policies and while there is no earlier run to replay.
    #[serde(default)]
    pub replay: Option<Replay>,
    /// The policy wants to advance and the job waits for the next mini-epoch.
    pub advance_wanted: bool,
    /// Generation of the view: grows by one at every switch.
    pub generation: u64,
    /// The next mini-epoch is fully staged.
    pub next_ready: bool,
    /// Bytes the cache directory holds: slots, staging progress and metadata.
    pub cache_bytes: u64,
    /// The cache budget (EC1).
    pub budget_bytes: u64,
    /// Largest size of one slot: (budget - reserve) / 2.
    pub slot_bytes: u64,
    /// Part of the budget kept for metadata.
    pub reserve_bytes: u64,
    /// Bytes read from the capacity tier since the daemon started.
    pub tier_bytes_read: u64,
    /// Bytes of staged samples taken from the node's store (hard links) instead of the tier.
    pub reused_bytes: u64,
    /// Bytes the daemon read for the kernel.
    pub daemon_bytes_read: u64,
    /// Of `daemon_bytes_read`, those answered by splice from the slot file, without a copy in
    /// the daemon (all of them unless the kernel or the pipe refused).
    #[serde(default)]
    pub daemon_bytes_spliced: u64,
    /// Opens the daemon served.
    pub daemon_opens: u64,
    /// Lookups the daemon answered: each is a round trip a reader's open waited for.
    pub daemon_lookups: u64,
    /// Entries listed through the mount for the kernel after the mount and each switch
    /// (`prime_entries`), so that the first opens of a new view need no lookup.
    pub primed_entries: u64,
    /// The last generation whose listing for the kernel finished (0: none yet).
    pub primed_generation: u64,
    /// Files in the current view.
    pub view_files: u64,
    /// Bytes in the current view.
    pub view_bytes: u64,
    /// Samples in this node's catalog.
    pub dataset_files: u64,
    /// Bytes in this node's catalog.
    pub dataset_bytes: u64,
    /// Passes that ended waiting for the next mini-epoch.
    pub bonus_passes: u64,
    /// Of those, the current mini-epoch's: each gives it one pass more than the policy's rf
    /// (the pass after the `wait`).
    #[serde(default)]
    pub mini_epoch_bonus_passes: u32,
    /// The effective rf: passes per mini-epoch, bonus passes included, averaged over the
    /// mini-epochs completed since the daemon started; `null` before the first. Above `rf`
    /// when staging does not keep up and `pass_end` does not block.
    #[serde(default)]
    pub effective_rf: Option<f64>,
    /// Passes the last completed mini-epoch got (its effective rf); `null` before the first.
    #[serde(default)]
    pub last_rf: Option<u32>,
    /// Mini-epochs completed since the daemon started (those `effective_rf` averages).
    #[serde(default)]
    pub completed_mini_epochs: u64,
    /// Of those, the ones whose rf bonus passes raised above the policy's (each logged as a
    /// `stall_rf` event).
    #[serde(default)]
    pub stalled_mini_epochs: u64,
    /// Seconds callers spent blocked waiting for the next mini-epoch.
    pub blocked_seconds: f64,
    /// Duration of the last pass.
    pub pass_seconds: Option<f64>,
    /// Mean duration of recent passes.
    pub pass_seconds_mean: Option<f64>,
    /// B2: average staging throughput from the tier.
    pub b2_bytes_per_s: Option<f64>,
    /// B2 of the most recent staging.
    pub b2_recent_bytes_per_s: Option<f64>,
    /// EB1: bytes per second the job reads during passes.
    pub eb1_bytes_per_s: Option<f64>,
    /// ceil(EB1 / B2), once both are measured.
    pub stall_free_rf: Option<u32>,
    /// Current cap on staging bandwidth; `null` when unlimited.
    pub prefetch_rate: Option<u64>,
    /// Staging of the next mini-epoch.
    pub staging: Staging,
    /// Retired slots kept on the node as donors of samples the next slots need.
    pub kept_slots: u64,
    /// Samples taken out of kept slots one by one to make room (a shared mount, RefCnt's or
    /// LRU's order), since the mount.
    #[serde(default)]
    pub trimmed_samples: u64,
    /// Retired views not evicted yet.
    pub draining_slots: u64,
    /// What holds each retired view.
    pub draining: Vec<Draining>,
    /// File handles open on the mount.
    pub open_handles: u64,
    /// Reads use kernel FUSE passthrough.
    pub passthrough: bool,
    /// The read path in use.
    pub read_path: ReadPath,
    /// The last error worth reporting.
    pub last_error: Option<String>,
    /// Samples that recently failed to stage, each once with its latest reason (the last
    /// 100).
    pub failed_samples: Vec<FailedSample>,
    /// Samples the tier could not give within `stager.defer_after_secs`, carried now into a
    /// later mini-epoch (docs/RELIABILITY.md, "Faults that last").
    #[serde(default)]
    pub deferred_samples: u64,
    /// Deferrals since the daemon started (a sample deferred twice counts twice).
    #[serde(default)]
    pub deferrals: u64,
    /// Deferred samples a later staging gave.
    #[serde(default)]
    pub recovered_samples: u64,
    /// Samples the transform (`--transform`) failed on since the daemon started, each left
    /// out of its mini-epoch; `null` without a transform.
    #[serde(default)]
    pub transform_failed: Option<u64>,
    /// With `--dds`: this node's worker on the shard queue; `null` without.
    #[serde(default)]
    pub dds: Option<DdsStatus>,
    /// In aggregate-cache mode (`--aggregate`): this node and its last exchange; `null`
    /// otherwise.
    #[serde(default)]
    pub aggregate: Option<AggregateStatus>,
    /// On a shared mount (`--share`): every job, by name (the position fields above are then
    /// those of the job asked for, or zero); `null` on a plain mount.
    #[serde(default)]
    pub jobs: Option<Vec<JobStatus>>,
    /// On a shared mount (`--share`): the saved jobs whose places this start could not resume,
    /// and why (each starts over when it joins again); `null` on a plain mount.
    #[serde(default)]
    pub not_resumed: Option<Vec<NotResumed>>,
    /// The capacity tier's URL.
    pub source: String,
    /// Where the view is mounted.
    pub mountpoint: String,
    /// The control socket.
    pub socket: String,
    /// This node's rank.
    pub node_rank: u32,
    /// Nodes in the job.
    pub nodes: u32,
    /// The composition strategy.
    pub compose: Compose,
    /// Seconds since the daemon started.
    pub uptime_s: f64,
    /// The daemon's process id.
    pub pid: u32,
}

/// Staging of the next mini-epoch, by its `state`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Staging {
    /// Nothing to stage now.
    Idle,
    /// Waiting for a retired view to be evicted before staging.
    Draining,
    /// Copying the next mini-epoch into its slot.
    Staging {
        /// The slot's name.
        slot: String,
        /// Epoch of the mini-epoch being staged.
        epoch: u64,
        /// The mini-epoch being staged.
        mini_epoch: u32,
        /// Files staged so far.
        files_done: u64,
        /// Files to stage.
        files_total: u64,
        /// Bytes staged so far.
        bytes_done: u64,
        /// Bytes to stage.
        bytes_total: u64,
        /// Throughput so far.
        bytes_per_s: f64,
        /// Seconds left at that throughput; `null` before it is known.
        eta_s: Option<f64>,
        /// Bytes taken from the node's store so far instead of the tier.
        bytes_reused: u64,
        /// Fetches retried.
        retries: u64,
        /// The last retried fetch's error.
        last_retry_error: Option<String>,
    },
    /// The next mini-epoch is staged.
    Ready {
        /// The slot's name.
        slot: String,
        /// Epoch of the staged mini-epoch.
        epoch: u64,
        /// The staged mini-epoch.
        mini_epoch: u32,
        /// Samples fetched from the tier.
        fetched: u64,
        /// Samples found already staged (a resume).
        resumed: u64,
        /// Samples taken from the node's store instead of the tier.
        reused: u64,
        /// Samples left out.
        failed: u64,
        /// Seconds staging took.
        secs: f64,
    },
    /// Staging failed; it is resumed after a pause.
    Failed {
        /// Epoch of the mini-epoch that failed.
        epoch: u64,
        /// The mini-epoch that failed.
        mini_epoch: u32,
        /// Why.
        error: String,
        /// Failures in a row.
        failures: u32,
        /// Seconds until staging resumes.
        retry_in_secs: f64,
        /// Whether that next try defers: the failure will by then have outlasted
        /// `stager.defer_after_secs`, so the samples the tier keeps failing on are left out
        /// and carried to a later mini-epoch, and the slot completes (every mode but a shared store).
        #[serde(default)]
        defers: bool,
    },
}

/// What holds one retired view that is not evicted yet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Draining {
    /// The view's generation.
    pub generation: u64,
    /// Its slot.
    pub slot: String,
    /// Handles open on it.
    pub open_handles: u64,
    /// Leases of clients that read its slot's files directly (`files` with `direct`).
    #[serde(default)]
    pub leases: u64,
    /// The kernel's references to its inodes.
    pub kernel_refs: u64,
    /// A few of the paths the kernel holds.
    pub kernel_held: Vec<String>,
}

/// The answer to `files`: the current view.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FilesView {
    /// The view's generation.
    pub generation: u64,
    /// Its epoch.
    pub epoch: u64,
    /// Its mini-epoch.
    pub mini_epoch: u32,
    /// Where it is mounted.
    pub mountpoint: String,
    /// Its files, relative to the mount; empty when the reply is `unchanged` or `packed`.
    pub files: Vec<String>,
    /// How many files the view holds (also when `files` is empty).
    #[serde(default)]
    pub count: u64,
    /// The request's `known_generation` is still the view's: no list is sent, the client keeps
    /// the one it holds.
    #[serde(default)]
    pub unchanged: bool,
    /// With `form: "packed"` (and a changed view): the list follows this line as raw bytes.
    #[serde(default)]
    pub packed: Option<PackedList>,
    /// With `direct`: the slot directory that holds the view's files in the cache; a file's
    /// copy is `direct_root/<path>`, a complete, immutable file that may be read directly.
    /// The connection holds a lease on `generation` (see the `files` request).
    #[serde(default)]
    pub direct_root: Option<String>,
}

/// Builds a packed list one path at a time (a view walks its tree into one).
#[derive(Debug)]
pub struct PackedBuilder {
    offsets: Vec<u8>,
    names: Vec<u8>,
}

impl PackedBuilder {
    /// An empty list with room for `count` offsets.
    pub fn with_count(count: usize) -> Self {
        let mut offsets = Vec::with_capacity(8 * (count + 1));
        offsets.extend_from_slice(&0u64.to_le_bytes());
        Self {
            offsets,
            names: Vec::new(),
        }
    }

    /// Appends one path.
    pub fn push(&mut self, path: &str) {
        self.names.extend_from_slice(path.as_bytes());
        self.offsets
            .extend_from_slice(&(self.names.len() as u64).to_le_bytes());
    }

    /// The header and the bytes to send after the reply's line.
    pub fn finish(mut self) -> (PackedList, Vec<u8>) {
        let header = PackedList {
            bytes: (self.offsets.len() + self.names.len()) as u64,
            names_bytes: self.names.len() as u64,
        };
        self.offsets.extend_from_slice(&self.names);
        (header, self.offsets)
    }
}

/// The layout of a packed file list: `count + 1` little-endian u64 offsets into the names
/// block, then the names block, every relative path's UTF-8 bytes back to back; path `i` is
/// `names[offsets[i]..offsets[i + 1]]`. Sent on the socket right after the reply's newline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PackedList {
    /// Length of what follows the reply's line: `8 * (count + 1) + names_bytes`.
    pub bytes: u64,
    /// Length of the names block.
    pub names_bytes: u64,
}

impl PackedList {
    /// Packs relative paths in the order given, with the header describing them.
    pub fn pack<'a>(paths: impl ExactSizeIterator<Item = &'a str>) -> (PackedList, Vec<u8>) {
        let mut b = PackedBuilder::with_count(paths.len());
        paths.for_each(|p| b.push(p));
        b.finish()
    }

    /// Reads a packed list back (what a Rust client does with the bytes after the line),
    /// checking every offset, so a short or garbled payload is an error, not a panic.
    pub fn unpack(&self, count: u64, payload: &[u8]) -> Result<Vec<String>, String> {
        let head = usize::try_from(count)
            .ok()
            .and_then(|c| c.checked_add(1))
            .and_then(|c| c.checked_mul(8))
            .ok_or_else(|| format!("packed list of {count} files is too large"))?;
        if payload.len() as u64 != self.bytes || head as u64 + self.names_bytes != self.bytes {
            return Err(format!(
                "packed list is {} bytes; its header says {} ({} files, {} bytes of names)",
                payload.len(),
                self.bytes,
                count,
                self.names_bytes
            ));
        }
        let (offs, names) = payload.split_at(head);
        let at = |i: usize| u64::from_le_bytes(offs[8 * i..8 * i + 8].try_into().unwrap());
        let mut out = Vec::with_capacity(count as usize);
        for i in 0..count as usize {
            let (a, b) = (at(i), at(i + 1));
            if a > b || b > names.len() as u64 {
                return Err(format!(
                    "packed list: offsets {a}..{b} of file {i} are out of order"
                ));
            }
            let name = std::str::from_utf8(&names[a as usize..b as usize])
                .map_err(|_| format!("packed list: file {i} is not UTF-8"))?;
            out.push(name.to_string());
        }
        Ok(out)
    }
}

/// What the job does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Choice {
    /// Run another pass over the current mini-epoch.
    Repeat,
    /// The view moved to the next mini-epoch.
    Advance,
    /// The policy wants to advance but the next mini-epoch is not staged yet: repeat meanwhile.
    Wait,
}

impl Choice {
    /// The protocol's name.
    pub fn name(self) -> &'static str {
        match self {
            Choice::Repeat => "repeat",
            Choice::Advance => "advance",
            Choice::Wait => "wait",
        }
    }
}

/// The answer to `pass_end`, `advance` and `apply`: the decision and the position after it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Decision {
    /// What the job does next.
    pub decision: Choice,
    /// The view's generation after the decision.
    pub generation: u64,
    /// The epoch after the decision.
    pub epoch: u64,
    /// The mini-epoch after the decision.
    pub mini_epoch: u32,
    /// Mini-epochs per epoch.
    pub mini_epochs: u32,
    /// Passes completed over the (new) current mini-epoch.
    pub pass: u32,
    /// The passes per mini-epoch the policy expects.
    pub rf: f64,
    /// The next mini-epoch is fully staged.
    pub next_ready: bool,
    /// Why the policy decided so, by the policy (`{"policy": "score", ...}`); only
    /// `pass_end` has one (a forced advance or an apply has no policy decision).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<Reason>,
}

/// The answer to `leave`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Left {
    /// The job that left.
    pub left: String,
}

/// The answer to `release`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Released {
    /// The generation whose lease ended.
    pub released: u64,
}

/// The answer to `shutdown`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ShuttingDown {
    /// Always true: the daemon unmounts and stops after this reply.
    pub shutting_down: bool,
}
