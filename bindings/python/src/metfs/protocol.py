"""The control socket's requests: their types, one function that builds each, and the version.

The daemon speaks newline-delimited JSON over a Unix socket: one request object per line with an
``"op"`` field, one reply object per line with an ``"ok"`` field. The messages are defined
once, in the daemon (``metfs-protocol/src``, the ``metfs-protocol`` crate), and described by the JSON
schema ``docs/protocol.schema.json`` generated from it. Here each request is a ``TypedDict``
(``HelloRequest``, ..., ``ShutdownRequest``) made by one function (:func:`hello_request`, ...),
every one of which adds the job's name the same way: when the request has a ``job`` field and
a job is given. ``tests/test_protocol_schema.py`` compares these types with the schema's
(field names, required or not, value types and enums); the replies are in
:mod:`metfs.replies`, :mod:`metfs.status` and :mod:`metfs.views`.

Every message carries ``"v"``, the protocol's major version (:data:`PROTOCOL_VERSION`): the
transport (:mod:`metfs.wire`) adds it to each request, and a reply of another major version is
refused with ``unsupported_version``, naming both versions; one without ``"v"`` comes from a
daemon older than the field and is read as version 1.
"""

from collections.abc import Mapping
from typing import Any, Literal, NotRequired, TypeAlias, TypedDict

from .errors import MetfsError

__all__ = [
    "PROTOCOL_VERSION",
    "AdvanceRequest",
    "ApplyRequest",
    "Compose",
    "DecisionKind",
    "FilesForm",
    "FilesRequest",
    "HelloRequest",
    "LeaveRequest",
    "PassEndRequest",
    "PolicyKind",
    "ReadPath",
    "ReleaseRequest",
    "ReplayWhy",
    "Request",
    "ShardDone",
    "ShuffleCode",
    "ShutdownRequest",
    "StatusRequest",
    "Subset",
    "advance_request",
    "apply_request",
    "check_version",
    "files_request",
    "hello_request",
    "leave_request",
    "pass_end_request",
    "release_request",
    "shutdown_request",
    "status_request",
]

#: Protocol major version spoken by this client: the ``"v"`` of every message.
PROTOCOL_VERSION = 1

#: What ``pass_end``, ``advance`` and ``apply`` may answer (the protocol's ``Choice``).
DecisionKind: TypeAlias = Literal["repeat", "advance", "wait"]

#: How a ``files`` reply carries the list: in its JSON line, or packed after it.
FilesForm: TypeAlias = Literal["list", "packed"]

#: Why ``learned`` replays the run it replays (``status``'s ``replay.why``).
ReplayWhy: TypeAlias = Literal["best", "latest", "furthest"]

#: An rf policy (``hello``'s and ``status``'s ``rf_policy``), spelled as ``--rf-policy``.
PolicyKind: TypeAlias = Literal["fixed", "score", "bollinger", "learned", "paced"]

#: The read path in use (``status``'s ``read_path``).
ReadPath: TypeAlias = Literal["cached", "passthrough", "pread"]

#: The composition strategy (``status``'s ``compose``).
Compose: TypeAlias = Literal["sequential", "random", "stratified", "clustered"]

#: When a queue's shards are marked done (``status``'s ``dds.shard_done``).
ShardDone: TypeAlias = Literal["after-pass", "after-rf"]

#: How samples cross between nodes (``status``'s ``aggregate.code``).
ShuffleCode: TypeAlias = Literal["uncoded", "uberShuffle"]


def check_version(message: Mapping[str, Any], what: str) -> None:
    """Refuses a message of another protocol major version, naming both versions.

    A message without ``"v"`` was written before the field existed and is version 1.
    """
    v = message.get("v", 1)
    if isinstance(v, bool) or v != PROTOCOL_VERSION:
        raise MetfsError(
            "unsupported_version",
            f"{what} is protocol version {v!r}; this client speaks version {PROTOCOL_VERSION}",
        )


class Subset(TypedDict, total=False):
    """The part of the source a job of a shared mount reads: exactly one of ``manifest`` (a
    file on the node listing relative paths), ``labels`` or ``fraction`` (0 < f <= 1, drawn
    with ``seed``, default 0)."""

    manifest: str
    labels: list[str]
    fraction: float
    seed: int


class HelloRequest(TypedDict):
    """The handshake; on a shared mount it joins the job (``subset``, ``rf_policy``, ``rf``,
    and ``token`` when it joins again)."""

    op: Literal["hello"]
    version: NotRequired[int]
    job: NotRequired[str]
    subset: NotRequired[Subset]
    rf_policy: NotRequired[PolicyKind]
    rf: NotRequired[int]
    token: NotRequired[str]


class LeaveRequest(TypedDict):
    """A job leaves a shared mount."""

    op: Literal["leave"]
    job: str


class StatusRequest(TypedDict):
    """The daemon's state (of ``job`` on a shared mount)."""

    op: Literal["status"]
    job: NotRequired[str]


class FilesRequest(TypedDict):
    """The current view's files; ``direct`` also asks for their copies and takes a lease."""

    op: Literal["files"]
    job: NotRequired[str]
    form: NotRequired[FilesForm]
    known_generation: NotRequired[int]
    direct: NotRequired[bool]


class ReleaseRequest(TypedDict):
    """Ends this connection's lease (of ``generation`` only, when given)."""

    op: Literal["release"]
    generation: NotRequired[int]


class PassEndRequest(TypedDict):
    """The end of one pass, with its metrics and the signals the job knows."""

    op: Literal["pass_end"]
    job: NotRequired[str]
    metrics: dict[str, float]
    block: bool
    progress: NotRequired[float]
    fresh_loss: NotRequired[float]


class AdvanceRequest(TypedDict):
    """A forced advance (``wait``: until the next mini-epoch is shown)."""

    op: Literal["advance"]
    job: NotRequired[str]
    wait: bool


class ApplyRequest(TypedDict):
    """Moves the view to exactly ``mini_epoch`` of ``epoch`` (a decision made elsewhere)."""

    op: Literal["apply"]
    job: NotRequired[str]
    epoch: int
    mini_epoch: int
    wait: bool


class ShutdownRequest(TypedDict):
    """Stops the daemon (which unmounts)."""

    op: Literal["shutdown"]


#: Any request the client sends.
Request: TypeAlias = (
    HelloRequest
    | LeaveRequest
    | StatusRequest
    | FilesRequest
    | ReleaseRequest
    | PassEndRequest
    | AdvanceRequest
    | ApplyRequest
    | ShutdownRequest
)


def hello_request(
    job: str | None = None,
    *,
    subset: Subset | None = None,
    rf_policy: PolicyKind | None = None,
    rf: int | None = None,
    token: str | None = None,
) -> HelloRequest:
    """``hello`` with this client's version and whatever of the job's choices are set."""
    req: HelloRequest = {"op": "hello", "version": PROTOCOL_VERSION}
    if job:
        req["job"] = job
    if subset is not None:
        req["subset"] = subset
    if rf_policy is not None:
        req["rf_policy"] = rf_policy
    if rf is not None:
        req["rf"] = rf
    if token is not None:
        req["token"] = token
    return req


def leave_request(job: str) -> LeaveRequest:
    """``leave`` of ``job`` (which a shared mount's job must name)."""
    if not job:
        raise MetfsError("bad_request", "`leave` needs the client's job name")
    return {"op": "leave", "job": job}


def status_request(job: str | None = None) -> StatusRequest:
    """``status`` (of ``job``)."""
    req: StatusRequest = {"op": "status"}
    if job:
        req["job"] = job
    return req


def files_request(
    job: str | None = None,
    *,
    form: FilesForm = "packed",
    known_generation: int | None = None,
    direct: bool = False,
) -> FilesRequest:
    """``files`` in ``form``, unchanged-aware with ``known_generation``, leasing with
    ``direct``."""
    req: FilesRequest = {"op": "files", "form": form}
    if job:
        req["job"] = job
    if known_generation is not None:
        req["known_generation"] = known_generation
    if direct:
        req["direct"] = True
    return req


def release_request(generation: int | None = None) -> ReleaseRequest:
    """``release`` of the connection's lease (only on ``generation``, when given)."""
    if generation is not None and (
        isinstance(generation, bool) or not isinstance(generation, int) or generation < 0
    ):
        raise MetfsError(
            "bad_request", f"`generation` must be a non-negative int, got {generation!r}"
        )
    req: ReleaseRequest = {"op": "release"}
    if generation is not None:
        req["generation"] = generation
    return req


def pass_end_request(
    job: str | None,
    metrics: Mapping[str, float],
    *,
    block: bool = False,
    progress: float | None = None,
    fresh_loss: float | None = None,
) -> PassEndRequest:
    """``pass_end`` with metrics already made floats (:func:`metfs.metrics.metrics_to_floats`)
    and signals already checked (:class:`metfs.PassSignals`)."""
    req: PassEndRequest = {"op": "pass_end", "metrics": dict(metrics), "block": bool(block)}
    if job:
        req["job"] = job
    if progress is not None:
        req["progress"] = progress
    if fresh_loss is not None:
        req["fresh_loss"] = fresh_loss
    return req


def advance_request(job: str | None = None, *, wait: bool = False) -> AdvanceRequest:
    """``advance`` (``wait``: block until the view has switched)."""
    req: AdvanceRequest = {"op": "advance", "wait": bool(wait)}
    if job:
        req["job"] = job
    return req


def apply_request(
    job: str | None, epoch: int, mini_epoch: int, *, wait: bool = True
) -> ApplyRequest:
    """``apply`` of the position ``(epoch, mini_epoch)``, each a non-negative int."""
    for name, value in (("epoch", epoch), ("mini_epoch", mini_epoch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise MetfsError("bad_request", f"`{name}` must be a non-negative int, got {value!r}")
    req: ApplyRequest = {
        "op": "apply",
        "epoch": epoch,
        "mini_epoch": mini_epoch,
        "wait": bool(wait),
    }
    if job:
        req["job"] = job
    return req


def shutdown_request() -> ShutdownRequest:
    """``shutdown``: the daemon unmounts and stops after its reply."""
    return {"op": "shutdown"}
