"""Dynamic sharding from Python: ADJUST_BS (paper 003, Eq. 3) over a queue's node throughputs.

With dynamic sharding a slow node takes fewer shards, and a job that wants every rank to take
the same time per step can also give each rank a local batch size proportional to its
throughput: ``B_i = B * v_i / sum(v)``, rounded so that the sizes add up to the global batch
``B`` exactly (largest remainders; every rank keeps at least one sample while ``B`` allows).

:func:`local_batch_sizes` is that rule on its own; :func:`queue_throughputs` reads each node's
throughput (samples per second of its working time) from ``metfs dds status --json``;
:func:`local_batch_size` is this node's size, with the queue's address and the node's name taken
from its own daemon (``metfs mount --dds``), as the callbacks' ``local_batch_size`` gives it.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .client import Client

__all__ = ["local_batch_size", "local_batch_sizes", "queue_throughputs"]


def local_batch_sizes(global_batch: int, throughputs: Sequence[float]) -> list[int]:
    """Per-rank batch sizes proportional to ``throughputs`` that add up to ``global_batch``.

    Ranks with no throughput measured yet (0) are taken at the mean of the others, so a rank
    that just joined is neither starved nor flooded. Raises ``ValueError`` for a batch smaller
    than the number of ranks, a negative or non-finite throughput, or no ranks.
    """
    n = len(throughputs)
    if n == 0:
        raise ValueError("no ranks")
    if global_batch < n:
        raise ValueError(f"global batch {global_batch} is smaller than the {n} ranks")
    if any(not math.isfinite(v) or v < 0 for v in throughputs):
        raise ValueError(f"throughputs must be finite and non-negative: {list(throughputs)}")
    known = [v for v in throughputs if v > 0]
    mean = sum(known) / len(known) if known else 1.0
    v = [x if x > 0 else mean for x in throughputs]
    total = sum(v)
    # Everyone gets one sample; the rest is shared in proportion (Eq. 3's minimiser of the
    # slowest rank's time), floors first and the remainder by largest fractional part.
    rest = global_batch - n
    exact = [rest * x / total for x in v]
    sizes = [1 + math.floor(e) for e in exact]
    left = global_batch - sum(sizes)
    order = sorted(range(n), key=lambda i: (exact[i] - math.floor(exact[i]), v[i]), reverse=True)
    for i in order[:left]:
        sizes[i] += 1
    return sizes


def queue_throughputs(
    url: str,
    metfs: str | None = None,
    env: Mapping[str, str] | None = None,
    *,
    live_only: bool = False,
) -> dict[str, float]:
    """Each node's throughput on the queue at ``url`` (``etcd://HOST:PORT/PREFIX``), by node
    name, from ``metfs dds status --json`` (``metfs`` is the binary: ``METFS_BIN`` or the one on
    ``PATH``); with ``live_only``, only the nodes holding a lease now. Raises ``RuntimeError``
    with metfs's message if the status cannot be read."""
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


def local_batch_size(
    client: Client,
    global_batch: int,
    metfs: str | None = None,
    env: Mapping[str, str] | None = None,
) -> int:
    """This node's share of ``global_batch`` (Eq. 3) among the nodes working on its daemon's
    queue now: the queue's address and this node's name come from the daemon's ``status``
    (its ``dds`` object), every live node's throughput from :func:`queue_throughputs`. Raises
    ``ValueError`` when the daemon does not shard dynamically (no ``--dds``)."""
    dds = client.status().raw.get("dds")
    if not dds:
        raise ValueError("this node's daemon was not mounted with --dds: there is no queue")
    speeds = queue_throughputs(str(dds["url"]), metfs, env, live_only=True)
    node = str(dds["node"])
    # This node counts even before its first shard is done (throughput 0: the others' mean).
    speeds.setdefault(node, float(dds.get("samples_per_sec") or 0.0))
    names = sorted(speeds)
    return local_batch_sizes(global_batch, [speeds[n] for n in names])[names.index(node)]
