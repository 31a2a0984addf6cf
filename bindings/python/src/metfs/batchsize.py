"""Batch-size adjustment: ADJUST_BS with AntDT's straggler trigger (paper 003, §VI-A).

This is the training job's side of dynamic sharding (``metfs mount --dds``, whose shard queue
is the daemon's): with dynamic sharding a slow node takes fewer shards; ADJUST_BS also gives
each *rank* a local batch size proportional to its throughput, so that a synchronous step takes
the same time on every rank while the local batches add up to the global batch ``B`` the job
asked for.

:func:`rank_batch_sizes` is the rule on its own, for nodes with several ranks each: ``B`` is
shared among the nodes in proportion to their throughputs (Eq. 3's minimiser of the slowest
rank's time, with at least one sample per rank), rounded by largest remainder with ties to the
node whose name sorts first, and each node's share is split evenly over its ranks (the first
ranks take one more when it does not divide). It is exact: the sizes add up to ``B``.

:class:`StragglerTrigger` is AntDT's trigger, also on its own: from each rank's work (samples,
and seconds spent on them) observed at every pass boundary it estimates each node's throughput
``v_i`` over the most recent ``window_s`` seconds, and its batch processing time
``BPT_i = B_i / v_i`` (the paper's linear model ``F(B_i) = B_i / v_i``, ``B_i`` the rank's
current size). A node is a straggler when its ``BPT_i >= slowness * mean BPT``, the mean taken
over all ranks, the straggler's included (the paper's ``T_i >= λ T``, with λ called
``slowness`` here).

:class:`AdjustBs` puts both on the ranks of a job: at a start step every rank learns the job's
nodes and ranks through the coordinator and takes the even split ``B / n`` (the paper's
initialisation); at every pass boundary all ranks exchange their work through the coordinator
(one all-gather), every rank runs the trigger on the same numbers, and only when a straggler is
found do all ranks adopt the sizes :func:`rank_batch_sizes` gives for the window's
throughputs, together, for the next pass. The loop and the callbacks take one
(``metfs.passes(..., adjust_bs=AdjustBs(256))``), and their ``local_batch_size()`` is this
rank's size.

:func:`queue_throughputs` reads each node's throughput over its whole life from a queue
(``metfs dds status --json``), for inspection.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .client import Client
    from .coordinator import Coordinator

__all__ = [
    "DEFAULT_SLOWNESS",
    "DEFAULT_WINDOW_S",
    "AdjustBs",
    "BsChange",
    "StragglerCheck",
    "StragglerTrigger",
    "queue_throughputs",
    "rank_batch_sizes",
]

#: λ: a node is a straggler once its batch processing time reaches 1.5 times the mean. The
#: value of the paper's experiments (§VII; its practice: "larger than 1.3"). The mean counts
#: the straggler too, so with two nodes of as many ranks each a straggler must be
#: ``λ / (2 - λ)`` = 3 times slower than the other node; lower it for small jobs.
DEFAULT_SLOWNESS = 1.5
#: The window, in seconds, over which throughputs are measured: the paper's short window
#: ``L^trans`` of 5 minutes, long enough to average many steps and short enough to react to a
#: transient straggler within minutes.
DEFAULT_WINDOW_S = 300.0


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def _positive_real(name: str, value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    return float(value)


def rank_batch_sizes(
    global_batch: int,
    node_throughputs: Mapping[str, float],
    ranks_per_node: Mapping[str, int],
) -> dict[str, list[int]]:
    """Each node's list of per-rank batch sizes, adding up to ``global_batch`` over the job.

    ``node_throughputs`` is each node's samples per second (all its ranks together);
    ``ranks_per_node`` each node's number of ranks; both are keyed by node name, with the same
    names. A node without a throughput yet (0) is taken at the mean per-rank throughput of the
    others (all at 0: an even split), so a node that just joined is neither starved nor
    flooded.

    The nodes share ``global_batch`` in proportion to their throughputs (Eq. 3: every rank's
    step then takes as long), except that every rank keeps at least one sample: a node whose
    proportional share is under its number of ranks takes exactly that many, and the other
    nodes share the rest in proportion. The shares are rounded by largest remainder (exact
    rational arithmetic; ties go to the node whose name sorts first), and a node's share is
    split evenly over its ranks, the lower local ranks taking one more where it does not
    divide. The result depends on the arguments alone.

    Raises ``ValueError`` naming the argument (``TypeError`` for a ``global_batch`` that is not
    an int) for no nodes, nodes that differ between the two
    mappings, a number of ranks that is not a positive int, a throughput that is negative or
    not finite, or a ``global_batch`` smaller than the number of ranks.
    """
    if isinstance(global_batch, bool) or not isinstance(global_batch, int):
        raise TypeError(f"global_batch must be an int, got {global_batch!r}")
    if not ranks_per_node:
        raise ValueError("ranks_per_node: no nodes")
    if set(node_throughputs) != set(ranks_per_node):
        only_t = sorted(set(node_throughputs) - set(ranks_per_node))
        only_r = sorted(set(ranks_per_node) - set(node_throughputs))
        raise ValueError(
            "node_throughputs and ranks_per_node name different nodes: "
            f"only in node_throughputs {only_t}, only in ranks_per_node {only_r}"
        )
    names = sorted(ranks_per_node)
    ranks = {n: _positive_int(f"ranks_per_node[{n!r}]", ranks_per_node[n]) for n in names}
    for n in names:
        v = node_throughputs[n]
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            raise ValueError(f"node_throughputs[{n!r}] must be finite and non-negative, got {v!r}")
    total_ranks = sum(ranks.values())
    if global_batch < total_ranks:
        raise ValueError(
            f"global_batch {global_batch} is smaller than the {total_ranks} ranks of the job "
            "(every rank takes at least one sample)"
        )
    # Exact rationals: the same quotas and the same ties on every rank, whatever the floats.
    speed = {n: Fraction(node_throughputs[n]) for n in names}
    known = [n for n in names if speed[n] > 0]
    per_rank = (
        sum((speed[n] for n in known), Fraction(0)) / sum(ranks[n] for n in known)
        if known
        else Fraction(1)
    )
    weight = {n: speed[n] if speed[n] > 0 else per_rank * ranks[n] for n in names}
    # Eq. 3 with every rank at one sample or more: shares in proportion to the weights, except
    # that a node whose proportional share is under its ranks takes exactly its ranks and the
    # others share the rest (water-filling); then the free nodes' shares are rounded.
    fixed: set[str] = set()
    while True:
        free = [n for n in names if n not in fixed]
        room = global_batch - sum(ranks[n] for n in fixed)
        total = sum((weight[n] for n in free), Fraction(0))
        quota = {n: room * weight[n] / total for n in free}
        under = {n for n in free if quota[n] < ranks[n]}
        if not under:
            break
        fixed |= under
    share = {n: ranks[n] for n in fixed}
    share.update({n: math.floor(quota[n]) for n in free})
    left = global_batch - sum(share.values())
    order = sorted(free, key=lambda n: (-(quota[n] - math.floor(quota[n])), n))
    for n in order[:left]:
        share[n] += 1
    out: dict[str, list[int]] = {}
    for n in names:
        q, extra = divmod(share[n], ranks[n])
        out[n] = [q + 1] * extra + [q] * (ranks[n] - extra)
    return out


@dataclass(frozen=True)
class StragglerCheck:
    """One evaluation of the trigger at a pass boundary.

    ``window_s``: the span the throughputs were measured over (at least the trigger's
    ``window_s``); ``throughputs``: each node's samples per second of work over it, its ranks'
    together; ``bpt``: each node's batch processing time ``B_i / v_i`` for a rank's current
    batch and throughput (seconds); ``mean_bpt``: the mean of the ranks' BPTs; ``stragglers``:
    the nodes with ``bpt >= slowness * mean_bpt``, by name.
    """

    window_s: float
    throughputs: dict[str, float]
    bpt: dict[str, float]
    mean_bpt: float
    stragglers: list[str]


class StragglerTrigger:
    """AntDT's straggler trigger over a sliding window (pure: no I/O, no clock of its own).

    Feed it, at every boundary, the time and each rank's cumulative work with :meth:`observe`;
    :meth:`check` then says whether a node is a straggler for the current sizes. ``slowness``
    (λ) and ``window_s`` must be positive; see :data:`DEFAULT_SLOWNESS` and
    :data:`DEFAULT_WINDOW_S` for the defaults and why.

    The window is the span from the newest observation at least ``window_s`` seconds before the
    latest one up to the latest: until ``window_s`` has passed since the first observation
    there is no window and no straggler. A rank is measured in the window when it recorded
    samples and seconds in it; a node with some of its ranks measured is counted at their mean
    for all of its ranks; while any node has none, :meth:`check` decides nothing.
    """

    def __init__(
        self, slowness: float = DEFAULT_SLOWNESS, window_s: float = DEFAULT_WINDOW_S
    ) -> None:
        self.slowness = _positive_real("slowness (λ)", slowness)
        self.window_s = _positive_real("window_s", window_s)
        self._seen: list[tuple[float, dict[str, list[tuple[float, float]]]]] = []

    def observe(self, t: float, work: Mapping[str, Sequence[tuple[float, float]]]) -> None:
        """Records the cumulative ``(samples, seconds)`` of every rank of every node (by node
        name, a list in local-rank order) at time ``t`` in seconds (non-decreasing)."""
        if self._seen and t < self._seen[-1][0]:
            raise ValueError(
                f"observation at {t} s is before the previous one ({self._seen[-1][0]} s)"
            )
        self._seen.append((t, {n: [(float(s), float(d)) for s, d in w] for n, w in work.items()}))
        # Keep the newest observation that still starts a full window, and all after it.
        start = self._window_start()
        if start is not None and start > 0:
            del self._seen[:start]

    def _window_start(self) -> int | None:
        t_now = self._seen[-1][0]
        for j in range(len(self._seen) - 2, -1, -1):
            if t_now - self._seen[j][0] >= self.window_s:
                return j
        return None

    def throughputs(self) -> tuple[float, dict[str, float]] | None:
        """``(span, node throughputs)`` over the window, or ``None`` without a full window or
        while a node has no measured rank in it."""
        if not self._seen:
            return None
        j = self._window_start()
        if j is None:
            return None
        t0, then = self._seen[j]
        t1, now = self._seen[-1]
        out: dict[str, float] = {}
        for node, ranks in now.items():
            before = then.get(node, [])
            rates = []
            for r, (samples, seconds) in enumerate(ranks):
                s0, d0 = before[r] if r < len(before) else (0.0, 0.0)
                ds, dd = samples - s0, seconds - d0
                if ds > 0 and dd > 0:
                    rates.append(ds / dd)
            if not rates:
                return None
            out[node] = sum(rates) / len(rates) * len(ranks)
        return t1 - t0, out

    def check(self, sizes: Mapping[str, Sequence[int]]) -> StragglerCheck | None:
        """The trigger for the current per-rank ``sizes`` (by node, as
        :func:`rank_batch_sizes` gives them), or ``None`` when it cannot decide yet."""
        measured = self.throughputs()
        if measured is None:
            return None
        span, v = measured
        if set(v) != set(sizes):
            raise ValueError(f"sizes name nodes {sorted(sizes)}, the work {sorted(v)}")
        # A rank's BPT is its batch over its throughput: (B_n / r_n) / (v_n / r_n) = B_n / v_n.
        bpt = {n: sum(sizes[n]) / v[n] for n in v}
        ranks = sum(len(sizes[n]) for n in v)
        mean = sum(len(sizes[n]) * bpt[n] for n in v) / ranks
        stragglers = sorted(n for n in v if bpt[n] >= self.slowness * mean)
        return StragglerCheck(span, v, bpt, mean, stragglers)


@dataclass(frozen=True)
class BsChange:
    """Sizes adopted by every rank at one boundary (``boundary``: the pass boundary's index,
    from 0), with the check that triggered them."""

    boundary: int
    before: dict[str, list[int]]
    after: dict[str, list[int]]
    check: StragglerCheck


def _env_int(env: Mapping[str, str], names: Sequence[str]) -> tuple[int, str] | None:
    for name in names:
        raw = env.get(name)
        if raw is None or raw == "":
            continue
        try:
            return int(raw), name
        except ValueError:
            raise ValueError(f"{name}={raw!r} is not an integer") from None
    return None


class AdjustBs:
    """ADJUST_BS for one rank of a job: its local batch size, changed with every other rank's
    when AntDT's trigger finds a straggler.

    ``global_batch`` is the job's batch, the sum of every rank's; ``slowness`` (λ) and
    ``window_s`` are the trigger's settings (:class:`StragglerTrigger`). ``ranks_per_node`` is
    the number of ranks on this rank's node (default: torchrun's ``LOCAL_WORLD_SIZE``, else
    Slurm's ``SLURM_NTASKS_PER_NODE``, else 1) and ``local_rank`` this rank's index among them
    (``LOCAL_RANK``, else ``SLURM_LOCALID``, else 0); ``node`` its node's name (default: the
    node name of the daemon's queue with ``metfs mount --dds``, else ``SLURMD_NODENAME``, else
    the host name); ``env`` the environment these are read from (default ``os.environ``);
    ``clock`` the clock in seconds that times the window (rank 0's is used on every rank).
    Every rank of the job must make one with the same settings and use it with the same
    coordinator: :meth:`start` and :meth:`boundary` are collective.

    Bad settings raise ``ValueError`` naming them: a ``global_batch`` or ``ranks_per_node``
    that is not a positive int, a ``local_rank`` outside the node's ranks, a ``slowness`` or
    ``window_s`` that is not a positive number; at :meth:`start`, a ``global_batch`` smaller
    than the job's ranks, ranks that disagree on a setting, and a node whose ranks are not the
    number its ranks declare.

    Between boundaries the rank tells what it did with :meth:`record` (samples, and seconds of
    its own work on them: data loading and compute, not waits for other ranks), and reads its
    size from :attr:`batch_size`. :attr:`changes` lists every change of sizes and
    :attr:`last_check` the trigger's last evaluation.
    """

    def __init__(
        self,
        global_batch: int,
        *,
        slowness: float = DEFAULT_SLOWNESS,
        window_s: float = DEFAULT_WINDOW_S,
        node: str | None = None,
        ranks_per_node: int | None = None,
        local_rank: int | None = None,
        env: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.global_batch = _positive_int("global_batch", global_batch)
        self._trigger = StragglerTrigger(slowness, window_s)
        self.slowness = self._trigger.slowness
        self.window_s = self._trigger.window_s
        self._env: Mapping[str, str] = os.environ if env is None else env
        self._clock = clock
        if ranks_per_node is None:
            found = _env_int(self._env, ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"))
            ranks_per_node, self._ranks_from = found if found else (1, "the default")
        else:
            self._ranks_from = "ranks_per_node"
        if local_rank is None:
            found = _env_int(self._env, ("LOCAL_RANK", "SLURM_LOCALID"))
            local_rank, local_from = found if found else (0, "the default")
        else:
            local_from = "local_rank"
        #: The number of ranks on this rank's node.
        self.ranks_per_node = _positive_int(
            f"ranks_per_node (from {self._ranks_from})", ranks_per_node
        )
        if (
            isinstance(local_rank, bool)
            or not isinstance(local_rank, int)
            or not 0 <= local_rank < self.ranks_per_node
        ):
            raise ValueError(
                f"local_rank {local_rank!r} (from {local_from}) is not one of the "
                f"{self.ranks_per_node} ranks of the node (from {self._ranks_from})"
            )
        #: This rank's index among its node's ranks.
        self.local_rank: int = local_rank
        #: This rank's node (``None`` until :meth:`start` when not given).
        self.node = node
        #: Every change of sizes, in order.
        self.changes: list[BsChange] = []
        #: The trigger's check at the last boundary (``None`` before a full window).
        self.last_check: StragglerCheck | None = None
        #: Pass boundaries seen so far.
        self.boundaries = 0
        self._samples = 0.0
        self._seconds = 0.0
        self._sizes: dict[str, list[int]] | None = None
        self._ranks: dict[str, int] = {}

    # -- this rank ------------------------------------------------------------------------

    @property
    def started(self) -> bool:
        """Whether :meth:`start` ran."""
        return self._sizes is not None

    @property
    def sizes(self) -> dict[str, list[int]]:
        """Every rank's size now, by node then local rank (the same on every rank)."""
        if self._sizes is None:
            raise RuntimeError("AdjustBs.sizes before start(): the job's ranks are not known yet")
        return {n: list(s) for n, s in self._sizes.items()}

    @property
    def batch_size(self) -> int:
        """This rank's local batch size now."""
        sizes = self.sizes
        assert self.node is not None
        return sizes[self.node][self.local_rank]

    def record(self, samples: float, seconds: float) -> None:
        """Adds this rank's work since the last call: ``samples`` processed in ``seconds`` of
        its own time (both non-negative)."""
        for name, v in (("samples", samples), ("seconds", seconds)):
            if (
                isinstance(v, bool)
                or not isinstance(v, int | float)
                or not math.isfinite(v)
                or v < 0
            ):
                raise ValueError(f"{name} must be finite and non-negative, got {v!r}")
        self._samples += samples
        self._seconds += seconds

    # -- collective steps -----------------------------------------------------------------

    def _node_name(self, client: Client | None) -> str:
        if client is not None:
            dds = client.status().raw.get("dds")
            if dds and dds.get("node"):
                return str(dds["node"])
        return self._env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]

    def start(self, coordinator: Coordinator, client: Client | None = None) -> None:
        """Collective: every rank learns the job's nodes and ranks and takes the even split."""
        if self.node is None:
            self.node = self._node_name(client)
        infos = coordinator.all_gather(
            {
                "node": self.node,
                "local_rank": self.local_rank,
                "ranks_per_node": self.ranks_per_node,
                "ranks_from": self._ranks_from,
                "settings": [self.global_batch, self.slowness, self.window_s],
                "t": self._clock(),
            }
        )
        for i in infos:
            if i["settings"] != infos[0]["settings"]:
                raise ValueError(
                    "ranks disagree on (global_batch, slowness, window_s): "
                    f"{infos[0]['settings']} on node {infos[0]['node']}, "
                    f"{i['settings']} on node {i['node']}"
                )
        declared: dict[str, int] = {}
        local: dict[str, list[int]] = {}
        for i in infos:
            n = str(i["node"])
            r = int(i["ranks_per_node"])
            if declared.setdefault(n, r) != r:
                raise ValueError(f"the ranks of node {n!r} declare {declared[n]} and {r} ranks")
            local.setdefault(n, []).append(int(i["local_rank"]))
        for n, rs in local.items():
            if sorted(rs) != list(range(declared[n])):
                source = next(str(i["ranks_from"]) for i in infos if i["node"] == n)
                raise ValueError(
                    f"node {n!r}: {declared[n]} ranks by {source}, but the job has "
                    f"{len(rs)} there with local ranks {sorted(rs)}"
                )
        self._ranks = declared
        self._sizes = rank_batch_sizes(self.global_batch, dict.fromkeys(declared, 0.0), declared)
        self._trigger.observe(float(infos[0]["t"]), self._work(infos, zero=True))

    def _work(
        self, infos: Sequence[Mapping[str, Any]], zero: bool = False
    ) -> dict[str, list[tuple[float, float]]]:
        work = {n: [(0.0, 0.0)] * r for n, r in self._ranks.items()}
        if not zero:
            for i in infos:
                work[str(i["node"])][int(i["local_rank"])] = (
                    float(i["samples"]),
                    float(i["seconds"]),
                )
        return work

    def boundary(self, coordinator: Coordinator) -> bool:
        """Collective, at a pass boundary: every rank's work is exchanged, every rank runs the
        trigger on the same numbers, and on a straggler all adopt the new sizes for the next
        pass. Returns whether the sizes changed."""
        if self._sizes is None:
            raise RuntimeError("AdjustBs.boundary() before start()")
        infos = coordinator.all_gather(
            {
                "node": self.node,
                "local_rank": self.local_rank,
                "samples": self._samples,
                "seconds": self._seconds,
                "t": self._clock(),
            }
        )
        index = self.boundaries
        self.boundaries += 1
        # The leader's clock times the window on every rank.
        self._trigger.observe(float(infos[0]["t"]), self._work(infos))
        check = self._trigger.check(self._sizes)
        self.last_check = check
        if check is None or not check.stragglers:
            return False
        after = rank_batch_sizes(self.global_batch, check.throughputs, self._ranks)
        if after == self._sizes:
            return False
        self.changes.append(BsChange(index, self.sizes, after, check))
        self._sizes = after
        return True


def queue_throughputs(
    url: str,
    metfs: str | None = None,
    env: Mapping[str, str] | None = None,
    *,
    live_only: bool = False,
) -> dict[str, float]:
    """Each node's throughput on the queue at ``url`` (``etcd://HOST:PORT/PREFIX``), by node
    name, from ``metfs dds status --json`` (``metfs`` is the binary: ``METFS_BIN`` or the one on
    ``PATH``): samples marked done per second of the node's working time over the queue's whole
    life; with ``live_only``, only the nodes holding a lease now. Raises ``RuntimeError`` with
    metfs's message if the status cannot be read."""
    exe = metfs or os.environ.get("METFS_BIN", "metfs")
    r = subprocess.run(
        [exe, "dds", "status", url, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=None if env is None else dict(env),
        check=False,
    )
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip() or f"metfs dds status exited {r.returncode}")
    status = json.loads(r.stdout)
    return {
        str(n["node"]): float(n["throughput"])
        for n in status["nodes"]
        if not live_only or n.get("live") is not None
    }
