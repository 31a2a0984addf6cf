"""Who decides when the view advances: the seam for agreement across ranks.

A :class:`Coordinator` turns "this rank finished a pass" into the decision every rank follows.
The default, :class:`LocalCoordinator`, lets the local daemon decide (one process, or ranks that
share one daemon and one job). :class:`TorchDistributedCoordinator` makes ranks of a
``torch.distributed`` job agree: rank 0's daemon decides, every node advances to the same
mini-epoch, and a dead daemon on any node makes every rank fail fast instead of hanging.

:func:`default_coordinator` picks the distributed one only when ``torch.distributed`` is already
imported and initialised with more than one rank; otherwise nothing changes. The core never
imports torch.
"""

from __future__ import annotations

import abc
import dataclasses
import socket as _socket
import sys
from collections.abc import Mapping
from typing import Any

from .client import Client, Decision, FilesView, MetfsError, Status
from .errors import AnyErrorCode
from .signals import PassSignals

__all__ = [
    "Coordinator",
    "LocalCoordinator",
    "TorchDistributedCoordinator",
    "default_coordinator",
]


class Coordinator(abc.ABC):
    """Decides, for every rank of a job, what follows each pass."""

    @property
    def is_leader(self) -> bool:
        """Whether this process makes the decisions (and should, e.g., print progress)."""
        return True

    def start(self, client: Client) -> Status:
        """Called once before the first pass: brings this rank's view to the job's position.

        Returns this rank's status after that.
        """
        return client.status()

    def files(
        self, client: Client, known: FilesView | None = None, direct: bool | None = None
    ) -> FilesView:
        """The view this rank trains on in the coming pass (this rank's own daemon's).

        ``known`` is the view of the last pass: while the generation is unchanged it is
        returned as is, without the list crossing the socket again. ``direct`` asks for the
        view's direct paths under a lease (:meth:`metfs.Client.files`; ``None``: as the
        client); :func:`metfs.passes` passes it only when it was given one.
        """
        return client.files(known, direct=direct)

    @abc.abstractmethod
    def pass_end(
        self,
        client: Client,
        metrics: Mapping[str, Any] | None,
        block: bool,
        signals: PassSignals | None = None,
    ) -> Decision:
        """Reports the end of one pass and returns the decision this rank must follow.

        When the decision is ``advance``, this rank's view already shows the new mini-epoch.
        ``signals`` (:class:`metfs.PassSignals`: progress, fresh-data loss) go with it, from
        the rank that decides.
        """

    def all_gather(self, obj: dict[str, Any]) -> list[dict[str, Any]]:
        """Every rank's ``obj``, in rank order, the same list on every rank. Collective: every
        rank calls it at the same point (``metfs.batchsize.AdjustBs`` does, at the start and at each
        pass boundary). One process alone: ``[obj]``."""
        return [obj]


def _send(
    client: Client,
    metrics: Mapping[str, Any] | None,
    block: bool,
    signals: PassSignals | None,
) -> Decision:
    """``pass_end`` to this rank's daemon, with the signals when there are any."""
    if signals is None:
        return client.pass_end(metrics, block=block)
    return client.pass_end(
        metrics, block=block, progress=signals.progress, fresh_loss=signals.fresh_loss
    )


class LocalCoordinator(Coordinator):
    """The local daemon decides: ``pass_end`` goes straight to it."""

    def pass_end(
        self,
        client: Client,
        metrics: Mapping[str, Any] | None,
        block: bool,
        signals: PassSignals | None = None,
    ) -> Decision:
        return _send(client, metrics, block, signals)


def default_coordinator() -> Coordinator:
    """The coordinator for this process.

    A :class:`TorchDistributedCoordinator` when ``torch.distributed`` has been imported and
    initialised with a world size above one; a :class:`LocalCoordinator` otherwise.
    """
    dist = sys.modules.get("torch.distributed")
    if (
        dist is not None
        and dist.is_available()
        and dist.is_initialized()
        and dist.get_world_size() > 1
    ):
        return TorchDistributedCoordinator()
    return LocalCoordinator()


class TorchDistributedCoordinator(Coordinator):
    """Agreement across the ranks of an initialised ``torch.distributed`` process group.

    At every pass end:

    1. every rank asks its own daemon for ``status`` and all ranks exchange (all-gather) whether
       their next mini-epoch is staged, and whether their daemon answered at all; a rank whose
       daemon failed makes every rank raise ``MetfsError("peer_failed")`` naming it;
    2. the leader (rank 0) sends ``pass_end`` with its metrics to its daemon and broadcasts the
       decision and the target position ``(epoch, mini_epoch)``;
    3. on ``advance`` every other rank calls ``apply(epoch, mini_epoch, wait=True)`` on its own
       daemon, and all ranks check (all-gather) that every apply succeeded.

    So no rank ever trains on a different mini-epoch index than another. With dynamic sharding
    (``metfs mount --dds``) the index is each node's batch sequence number and the nodes'
    epochs may differ by one at an epoch's end (each batch is the node's own claim). The readiness of all
    ranks (step 1) is known before the leader decides and is reported in every decision
    (``all_ready``, ``not_ready_ranks``); but protocol 1's ``pass_end`` has no way to
    tell the leader's daemon "do not advance", so when the leader's next mini-epoch is staged
    and another node's is not, the leader advances and that node's ``apply`` waits for its
    staging (a stall on that node only, never a disagreement).

    Several ranks may share one node's daemon: ``apply`` to the position the daemon already
    shows is expected to be a no-op.
    """

    def __init__(self, group: Any = None, leader: int = 0) -> None:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise MetfsError(
                "bad_request",
                "TorchDistributedCoordinator needs an initialised torch.distributed process group",
            )
        self._dist = dist
        self.group = group
        self.leader = leader
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size(group)
        self.host = _socket.gethostname()
        self._pending_error: str | None = None
        # Whether this rank's daemon shards dynamically (its status has a `dds` object).
        self._dds = False

    @property
    def is_leader(self) -> bool:
        return self.rank == self.leader

    # -- collectives --------------------------------------------------------------------------

    def _gather(self, obj: dict[str, Any]) -> list[dict[str, Any]]:
        out: list[Any] = [None] * self.world_size
        self._dist.all_gather_object(out, obj, group=self.group)
        return out

    def _broadcast(self, obj: dict[str, Any] | None) -> dict[str, Any]:
        box = [obj]
        self._dist.broadcast_object_list(box, src=self.leader, group=self.group)
        assert box[0] is not None
        return box[0]

    def _check(self, infos: list[dict[str, Any]], what: str) -> None:
        failed = [(i, info) for i, info in enumerate(infos) if info.get("error")]
        if not failed:
            return
        parts = [
            f"rank {info.get('rank', i)} on {info.get('host', '?')}: {info['error']}"
            for i, info in failed
        ]
        mine = next((info for info in infos if info.get("rank") == self.rank), None)
        if mine is not None and mine.get("error"):
            code: AnyErrorCode = mine.get("code") or "peer_failed"
        else:
            code = "peer_failed"
        raise MetfsError(code, f"metfs failed during {what}: " + "; ".join(parts))

    def _local_status(self, client: Client) -> tuple[Status | None, dict[str, Any]]:
        info: dict[str, Any] = {"rank": self.rank, "host": self.host}
        if self._pending_error:
            info["error"], self._pending_error = self._pending_error, None
            info["code"] = "connection_lost"
            return None, info
        try:
            st = client.status()
        except MetfsError as e:
            info["error"] = f"{e} (socket {client.socket_path})"
            info["code"] = e.code
            return None, info
        info.update(ready=st.next_ready, position=(st.epoch, st.mini_epoch))
        self._dds = st.dds is not None
        return st, info

    def _same(self, a: tuple[int, int], b: tuple[int, int]) -> bool:
        """Whether two positions are the same mini-epoch. With dynamic sharding (``--dds``)
        each node's mini-epochs are its own batches: ranks agree on the sequence number, and the
        epoch is whichever each node's batch came from."""
        return a[1] == b[1] if self._dds else tuple(a) == tuple(b)

    def _apply(self, client: Client, position: tuple[int, int]) -> dict[str, Any]:
        info: dict[str, Any] = {"rank": self.rank, "host": self.host}
        try:
            d = client.apply(position[0], position[1], wait=True)
            info["generation"] = d.generation
            if not self._same((d.epoch, d.mini_epoch), position):
                info["error"] = (
                    f"apply({position[0]}, {position[1]}) left the view at "
                    f"({d.epoch}, {d.mini_epoch})"
                )
        except MetfsError as e:
            info["error"] = f"{e} (socket {client.socket_path})"
            info["code"] = e.code
        return info

    # -- Coordinator --------------------------------------------------------------------------

    def all_gather(self, obj: dict[str, Any]) -> list[dict[str, Any]]:
        return self._gather(obj)

    def start(self, client: Client) -> Status:
        st, info = self._local_status(client)
        infos = self._gather(info)
        self._check(infos, "start")
        assert st is not None
        leader_epoch, leader_mini_epoch = infos[self.leader]["position"]
        target = (leader_epoch, leader_mini_epoch)
        outcome: dict[str, Any] = {"rank": self.rank, "host": self.host}
        moved = not self._same((st.epoch, st.mini_epoch), target)
        if moved:
            outcome = self._apply(client, target)
        self._check(self._gather(outcome), "start (moving to the leader's mini-epoch)")
        mine = client.status() if moved else st
        if self._dds:
            # Each node's batch has its own epoch; training counts the leader's, on every rank.
            mine = dataclasses.replace(mine, epoch=leader_epoch)
        return mine

    def files(
        self, client: Client, known: FilesView | None = None, direct: bool | None = None
    ) -> FilesView:
        # Collective, so that a daemon failing here fails every rank, not just this one.
        info: dict[str, Any] = {"rank": self.rank, "host": self.host}
        view: FilesView | None = None
        try:
            view = client.files(known, direct=direct)
            info["position"] = (view.epoch, view.mini_epoch)
        except MetfsError as e:
            info["error"] = f"{e} (socket {client.socket_path})"
            info["code"] = e.code
        infos = self._gather(info)
        self._check(infos, "reading the view's files")
        # With dynamic sharding the epochs of the nodes' batches may differ: the sequence
        # number is what the ranks agree on.
        positions = {tuple(i["position"])[1:] if self._dds else tuple(i["position"]) for i in infos}
        if len(positions) != 1:
            raise MetfsError(
                "peer_failed",
                "ranks show different mini-epochs: "
                + ", ".join(
                    f"rank {i['rank']} on {i['host']}: {tuple(i['position'])}" for i in infos
                ),
            )
        assert view is not None
        return view

    def pass_end(
        self,
        client: Client,
        metrics: Mapping[str, Any] | None,
        block: bool,
        signals: PassSignals | None = None,
    ) -> Decision:
        st, info = self._local_status(client)
        infos = self._gather(info)
        self._check(infos, "pass end (readiness check)")
        assert st is not None
        payload: dict[str, Any] | None = None
        if self.is_leader:
            try:
                d = _send(client, metrics, block, signals)
                payload = {"raw": d.raw}
            except MetfsError as e:
                payload = {
                    "error": f"rank {self.rank} on {self.host}: {e} (socket {client.socket_path})",
                    "code": e.code,
                }
        payload = self._broadcast(payload)
        if "error" in payload:
            failed: AnyErrorCode = payload["code"] if self.is_leader else "peer_failed"
            raise MetfsError(failed, f"metfs failed during pass end: {payload['error']}")
        decided = Decision.from_response(payload["raw"], "pass_end")
        not_ready = [i["rank"] for i in infos if not i.get("ready")]
        decided = dataclasses.replace(decided, all_ready=not not_ready, not_ready_ranks=not_ready)
        outcome: dict[str, Any] = {"rank": self.rank, "host": self.host}
        mine = decided
        if not self.is_leader:
            generation = st.generation
            if decided.advanced or not self._same((st.epoch, st.mini_epoch), decided.position):
                outcome = self._apply(client, decided.position)
                generation = outcome.get("generation", generation)
            mine = dataclasses.replace(
                decided,
                generation=generation,
                leader_generation=decided.generation,
            )
        if decided.advanced:
            # Every rank knows the decision, so every rank joins this check.
            self._check(self._gather(outcome), "advance (followers applying the leader's decision)")
        elif outcome.get("error"):
            # Reported to every rank at the next pass end's readiness exchange.
            self._pending_error = outcome["error"]
        return mine
