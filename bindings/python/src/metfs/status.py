"""The answer to ``status``: where the daemon is and what it holds, every field typed.

:class:`Status` has one attribute per field of the protocol's ``status`` reply (named as there,
but ``passes_done`` for ``pass`` and ``policy`` for ``rf_policy``); the objects nested in it
are ``TypedDict`` s: :data:`Staging` (one of five states, told apart by ``state``),
:class:`Draining`, :class:`JobStatus`, :class:`DdsStatus`, :class:`AggregateStatus` with its
:class:`ExchangeStatus`. ``metfs status --json`` prints the same object. The README's status
table says what each field means; ``tests/test_protocol_schema.py`` checks every type against
the protocol's schema.

No ``from __future__ import annotations`` here: with it, Python 3.11's ``TypedDict`` takes
every key for required.
"""

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, NotRequired, TypeAlias, TypedDict

from .protocol import Compose, PolicyKind, ReadPath, ShardDone, ShuffleCode
from .replies import NotResumed, Replay, read_reply

__all__ = [
    "AggregateStatus",
    "DdsStatus",
    "Draining",
    "ExchangeStatus",
    "FailedSample",
    "JobStatus",
    "Staging",
    "StagingDraining",
    "StagingFailed",
    "StagingIdle",
    "StagingReady",
    "StagingRunning",
    "Status",
]


class StagingIdle(TypedDict):
    """Nothing to stage now."""

    state: Literal["idle"]


class StagingDraining(TypedDict):
    """Waiting for a retired view to be evicted before staging."""

    state: Literal["draining"]


class StagingRunning(TypedDict):
    """Copying the next mini-epoch (``epoch``, ``mini_epoch``) into its ``slot``: files and
    bytes done of the total, the throughput and the seconds left (``None`` before it is known),
    bytes taken from the node's store instead of the tier, fetches retried and the last one's
    error."""

    state: Literal["staging"]
    slot: str
    epoch: int
    mini_epoch: int
    files_done: int
    files_total: int
    bytes_done: int
    bytes_total: int
    bytes_per_s: float
    eta_s: float | None
    bytes_reused: int
    retries: int
    last_retry_error: str | None


class StagingReady(TypedDict):
    """The next mini-epoch is staged in ``slot``: its samples fetched from the tier, found
    already staged (a resume), reused from the store and left out, and the seconds it took."""

    state: Literal["ready"]
    slot: str
    epoch: int
    mini_epoch: int
    fetched: int
    resumed: int
    reused: int
    failed: int
    secs: float


class StagingFailed(TypedDict):
    """Staging of ``(epoch, mini_epoch)`` failed (``error``, ``failures`` in a row); it resumes
    in ``retry_in_secs``, and with ``defers`` that try leaves out, as deferred, the samples the
    tier keeps failing on (the failure has outlasted ``stager.defer_after_secs``)."""

    state: Literal["failed"]
    epoch: int
    mini_epoch: int
    error: str
    failures: int
    retry_in_secs: float
    defers: NotRequired[bool]


#: ``status``'s ``staging``: what the stager does, by ``state``.
Staging: TypeAlias = StagingIdle | StagingDraining | StagingRunning | StagingReady | StagingFailed


class Draining(TypedDict):
    """A retired view not evicted yet, and what holds it: open handles, leases of direct
    readers, the kernel's references to its inodes and a few of the paths it holds."""

    generation: int
    slot: str
    open_handles: int
    leases: NotRequired[int]
    kernel_refs: int
    kernel_held: list[str]


#: One job of a shared mount, in ``status``'s ``jobs``: its name (its directory under the
#: mount), position (``mini_epoch`` ``None`` while it waits for its first view; ``pass``),
#: rf policy and rf, bonus passes, its view's generation, files and bytes, the samples of its
#: dataset, the bytes it may pin, whether its next view is staged, whether it was held back
#: for a slower job, the seconds since its last request, and the bytes of its retired views
#: its readers still hold and those taken back from them (``share.held_open_cap``).
JobStatus = TypedDict(
    "JobStatus",
    {
        "name": str,
        "epoch": int,
        "mini_epoch": int | None,
        "pass": int,
        "rf_policy": PolicyKind,
        "rf": float,
        "bonus_passes": int,
        "generation": int,
        "files": int,
        "view_bytes": int,
        "samples": int,
        "share_bytes": int,
        "next_ready": bool,
        "held_back": bool,
        "idle_secs": float,
        "held_open_bytes": NotRequired[int],
        "revoked_bytes": NotRequired[int],
    },
)


class DdsStatus(TypedDict):
    """With ``metfs mount --dds``: this node's worker on the shard queue at ``url``: its
    name and incarnation, when shards are marked done (``shard_done``), the epoch it claims
    from and the shards per epoch, its totals of shards and samples claimed, done and lost,
    its speed (samples done per second of work), batches not yet marked done, its round trips
    to etcd and their seconds, whether every shard is done, and the last etcd error."""

    url: str
    node: str
    incarnation: int
    shard_done: ShardDone
    epoch: int
    shards: int
    claimed_shards: int
    claimed_samples: int
    done_shards: int
    done_samples: int
    lost_shards: int
    samples_per_sec: float
    pending_done: int
    etcd_round_trips: int
    etcd_secs: float
    finished: bool
    last_error: str | None


class FailedSample(TypedDict):
    """A sample left out of its mini-epoch (``status``'s ``failed_samples``): its ``path``,
    relative to the source, and the ``reason`` (the latest, when it failed more than once)."""

    path: str
    reason: str


class ExchangeStatus(TypedDict):
    """How a staging's wait for the exchange between nodes ended: the epoch staged, whether
    the exchange filled the inbox (else the tier gave the rest) and the seconds waited."""

    epoch: int
    complete: bool
    wait_s: float


class AggregateStatus(TypedDict):
    """With ``metfs mount --aggregate``: this node's rank of ``nodes``, the probability of
    keeping a sample outside its share, how samples cross between nodes (``code``) and the
    last staging's wait for the exchange."""

    rank: int
    nodes: int
    extra: float
    code: ShuffleCode
    last_exchange: ExchangeStatus | None


@dataclass(frozen=True, kw_only=True)
class Status:
    """Answer to ``status``: where the daemon is and what it holds.

    ``passes_done`` is the protocol's ``pass``: passes completed over the current mini-epoch.
    ``rf`` is the passes per mini-epoch the policy expects (a float: adaptive policies give a
    fractional estimate). ``policy`` is the protocol's ``rf_policy`` (``fixed``, ``score``,
    ``bollinger``, ``learned``, ``paced``; ``None`` on a shared mount asked without a job).
    Every field the daemon sent is also in ``raw``, and ``status["name"]`` reads it from there.

    ``effective_rf`` is the passes a mini-epoch actually got, averaged over those completed
    since the daemon started: with a non-blocking ``pass_end``, passes answered ``wait`` while
    the next mini-epoch stages (bonus passes) raise it above ``rf``. ``last_rf`` is the last
    completed mini-epoch's, ``mini_epoch_bonus_passes`` the current one's bonus passes so far,
    ``stalled_mini_epochs`` how many completed mini-epochs got bonus passes (each a
    ``stall_rf`` event in the daemon's event log).

    ``replay``, under ``rf_policy`` ``learned``, is the earlier run being replayed and why
    (:class:`metfs.replies.Replay`); ``None`` for other policies and while there is no earlier
    run. The fields the protocol gives a default (those added after the first daemons) take it
    when absent.
    """

    # -- position and policy --------------------------------------------------------------
    epoch: int
    mini_epoch: int
    mini_epochs: int
    passes_done: int
    rf: float
    generation: int
    next_ready: bool
    #: The job (the rf history's key) whose position this is.
    job: str
    #: ``None`` on a shared mount asked without a job (each job's is in ``jobs``).
    policy: PolicyKind | None
    #: The policy wants to advance and the job waits for the next mini-epoch.
    advance_wanted: bool
    #: ``ceil(EB1 / B2)``, the rf at which staging keeps up, once both are measured.
    stall_free_rf: int | None
    effective_rf: float | None = None
    last_rf: int | None = None
    mini_epoch_bonus_passes: int = 0
    completed_mini_epochs: int = 0
    stalled_mini_epochs: int = 0
    #: Passes that ended waiting for the next mini-epoch, and seconds callers spent blocked.
    bonus_passes: int
    blocked_seconds: float
    #: The last pass's seconds and the mean of recent passes (``None`` before the first).
    pass_seconds: float | None
    pass_seconds_mean: float | None
    replay: Replay | None = None

    # -- the mount --------------------------------------------------------------------------
    mountpoint: str
    source: str
    socket: str
    pid: int
    uptime_s: float
    node_rank: int
    nodes: int
    #: The composition strategy and the read path in use (``cached``, ``passthrough``,
    #: ``pread``); whether reads use kernel FUSE passthrough; the cap on staging bandwidth
    #: (``None``: unlimited).
    compose: Compose
    read_path: ReadPath
    passthrough: bool
    prefetch_rate: int | None

    # -- bytes and files --------------------------------------------------------------------
    #: The cache directory's bytes, the budget (EC1), the part of it kept for metadata and the
    #: largest slot ((budget - reserve) / 2); the view's bytes and files, the catalog's, the
    #: bytes read from the tier and those taken from the node's store instead.
    cache_bytes: int
    budget_bytes: int
    reserve_bytes: int
    slot_bytes: int
    view_bytes: int
    view_files: int
    dataset_bytes: int
    dataset_files: int
    tier_bytes_read: int
    reused_bytes: int
    #: What the daemon served the kernel: bytes read (of which spliced), lookups, opens, the
    #: handles open on the mount, and the entries listed ahead of the first opens of a view.
    daemon_bytes_read: int
    daemon_bytes_spliced: int = 0
    daemon_lookups: int
    daemon_opens: int
    open_handles: int
    primed_entries: int
    primed_generation: int
    #: B2: average and most recent staging throughput from the tier; EB1: the job's read rate.
    b2_bytes_per_s: float | None
    b2_recent_bytes_per_s: float | None
    eb1_bytes_per_s: float | None

    # -- staging and retired views ----------------------------------------------------------
    staging: Staging
    draining: list[Draining]
    draining_slots: int
    kept_slots: int
    #: Samples that recently failed to stage, each once with its latest reason (the last 100).
    failed_samples: list[FailedSample]
    #: Samples the tier could not give within ``stager.defer_after_secs``, carried now into a
    #: later mini-epoch; deferrals so far; deferred samples a later staging gave.
    deferred_samples: int = 0
    deferrals: int = 0
    recovered_samples: int = 0
    #: Samples the transform failed on (``None`` without a transform); samples trimmed out of
    #: kept slots to make room.
    transform_failed: int | None = None
    trimmed_samples: int = 0
    last_error: str | None

    # -- modes --------------------------------------------------------------------------------
    #: On a shared mount: every job; ``None`` on a plain mount.
    jobs: list[JobStatus] | None = None
    #: On a shared mount: the saved jobs whose places this start could not resume, and why;
    #: ``None`` on a plain mount.
    not_resumed: list[NotResumed] | None = None
    dds: DdsStatus | None = None
    aggregate: AggregateStatus | None = None

    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    #: Fields named differently from the protocol: attribute -> protocol field.
    PROTOCOL_NAMES: ClassVar[dict[str, str]] = {"passes_done": "pass", "policy": "rf_policy"}

    @classmethod
    def from_response(cls, obj: dict[str, Any]) -> "Status":
        """Builds the answer from a response object."""
        return read_reply(cls, obj, "status")

    def __getitem__(self, name: str) -> Any:
        """Any field of the raw response, e.g. ``status["stage_bytes"]``."""
        return self.raw[name]

    def get(self, name: str, default: Any = None) -> Any:
        """Any field of the raw response, or ``default``."""
        return self.raw.get(name, default)
