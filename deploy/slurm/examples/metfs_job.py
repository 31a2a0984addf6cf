"""Pieces shared by the example training scripts of ``deploy/slurm``.

- :func:`node_name`, :func:`expand`, :func:`socket_path`: the node's metfs control socket from
  the same settings as ``metfs-node.sh`` (``METFS_SOCKET`` or ``METFS_CACHE_ROOT/metfs.sock``,
  with ``%n`` = node name and ``%j`` = job id).
- :func:`init_distributed`: ``torch.distributed`` with the gloo backend from ``torchrun``'s
  variables or, under ``srun``, from Slurm's (``SLURM_PROCID``, ``SLURM_NTASKS``), with a
  bounded timeout so that a vanished peer fails a collective instead of hanging it.
- :func:`load_sample`, :func:`label_of`: turn one file into a 64-value feature vector and a
  class index (``.npy`` images from ``scripts/make_dataset.py``; any other file by a byte
  histogram), so the examples run on any ImageFolder-like tree.
- :class:`PassLog`: one JSON line per pass (rank, node, epoch, mini-epoch, generation, files).
- :func:`read_or_explain`: reads a file of the mount and turns an I/O error into a message that
  says whether this node's metfs daemon is still there.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import zlib
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

FEATURES = 64


def node_name() -> str:
    """Slurm's name of this node, else the short host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def expand(path: str) -> str:
    """``%n`` -> node name, ``%j`` -> job id, ``%%`` -> ``%`` (as ``metfs-node.sh`` does)."""
    out: List[str] = []
    i = 0
    while i < len(path):
        c = path[i]
        if c == "%" and i + 1 < len(path) and path[i + 1] in "nj%":
            k = path[i + 1]
            out.append(
                node_name()
                if k == "n"
                else os.environ.get("SLURM_JOB_ID", "nojob")
                if k == "j"
                else "%"
            )
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def socket_path(explicit: Optional[str] = None) -> str:
    """This node's control socket: ``explicit``, ``METFS_SOCKET`` or ``METFS_CACHE_ROOT/metfs.sock``."""
    raw = explicit or os.environ.get("METFS_SOCKET")
    if not raw:
        root = os.environ.get("METFS_CACHE_ROOT")
        if not root:
            raise SystemExit("set METFS_SOCKET or METFS_CACHE_ROOT (as for metfs-node.sh)")
        raw = os.path.join(root, "metfs.sock")
    return os.path.abspath(expand(raw))


def dist_env() -> Tuple[int, int, int, int]:
    """``(rank, world_size, local_rank, local_world_size)`` from torchrun or Slurm variables."""
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:  # torchrun
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        local = int(env.get("LOCAL_RANK", "0"))
        local_world = int(env.get("LOCAL_WORLD_SIZE", "1"))
    else:  # srun: one task per rank
        rank, world = int(env.get("SLURM_PROCID", "0")), int(env.get("SLURM_NTASKS", "1"))
        local = int(env.get("SLURM_LOCALID", "0"))
        per_node = env.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0].split(",")[0]
        local_world = int(per_node) if per_node.isdigit() else 1
    return rank, world, local, local_world


def init_distributed(timeout_s: float) -> Tuple[int, int, int, int]:
    """Initialises torch.distributed (gloo) and returns :func:`dist_env`.

    ``MASTER_ADDR`` and ``MASTER_PORT`` must be set (the sbatch templates set them); the
    timeout bounds every collective, so a rank whose peer died fails instead of waiting.
    """
    import torch.distributed as dist

    rank, world, local, local_world = dist_env()
    if world > 1:
        for var in ("MASTER_ADDR", "MASTER_PORT"):
            if var not in os.environ:
                raise SystemExit(f"{var} is not set: the job script must export it")
        dist.init_process_group(
            "gloo",
            init_method="env://",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
    return rank, world, local, local_world


def label_of(rel: str, classes: int) -> int:
    """Class index of a sample from its first directory: the number if it is one, else a
    stable hash (the same on every node)."""
    top = rel.split("/", 1)[0]
    if top.isdigit():
        return int(top) % classes
    return zlib.crc32(top.encode()) % classes


def features(path: str, data: bytes) -> np.ndarray:
    """64 features in [0, 1] of one sample file's bytes."""
    if path.endswith(".npy"):
        import io

        img = np.load(io.BytesIO(data))
        k = max(1, img.shape[0] // 8)
        v = img.reshape(8, k, 8, k).mean(axis=(1, 3)).reshape(FEATURES) / 16.0
        return v.astype(np.float32)
    hist = np.bincount(np.frombuffer(data, dtype=np.uint8), minlength=256).astype(np.float32)
    hist = hist.reshape(FEATURES, 4).sum(axis=1)
    return hist / max(1.0, float(len(data)))


def read_or_explain(path: str, client: Any) -> bytes:
    """The bytes of ``path`` on the mount; an I/O error becomes a RuntimeError that says
    whether this node's metfs daemon still answers."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        try:
            client.status()
            state = "the daemon still answers; see its log"
        except Exception as se:  # noqa: BLE001 - any failure means the daemon is gone
            state = f"the metfs daemon on {node_name()} is gone ({se})"
        raise RuntimeError(f"reading {path} through the metfs mount failed: {e}; {state}") from e


def load_view(
    paths: Sequence[str], files: Sequence[str], classes: int, client: Any
) -> Tuple[np.ndarray, np.ndarray]:
    """Features and labels of the given files of the view (read through the mount)."""
    x = np.zeros((len(paths), FEATURES), dtype=np.float32)
    y = np.zeros((len(paths),), dtype=np.int64)
    for i, (p, rel) in enumerate(zip(paths, files, strict=True)):
        x[i] = features(p, read_or_explain(p, client))
        y[i] = label_of(rel, classes)
    return x, y


def job_name(default: str) -> str:
    """The job's name for the daemon: ``METFS_JOB`` (each trial of a sweep on a shared mount
    sets its own), else Slurm's job name, else ``default``."""
    return os.environ.get("METFS_JOB") or os.environ.get("SLURM_JOB_NAME") or default


class PassLog:
    """Appends one JSON object per pass to ``DIR/rank<R>.jsonl`` (flushed at once), or to
    ``DIR/<job>-rank<R>.jsonl`` when ``METFS_JOB`` names one of several jobs of a node."""

    def __init__(self, directory: Optional[str], rank: int) -> None:
        job = os.environ.get("METFS_JOB")
        name = f"{job}-rank{rank}.jsonl" if job else f"rank{rank}.jsonl"
        self.path = os.path.join(directory, name) if directory else None
        self.rank = rank
        if self.path:
            os.makedirs(directory or ".", exist_ok=True)
            open(self.path, "w").close()

    def write(self, record: Dict[str, Any]) -> None:
        if not self.path:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(dict(record, rank=self.rank, node=node_name())) + "\n")


def fail(rank: int, message: str) -> None:
    """Prints a one-line reason naming the rank and node, then exits 1 (srun --kill-on-bad-exit
    then ends the other ranks)."""
    print(f"train: rank {rank} on {node_name()}: {message}", file=sys.stderr, flush=True)
    sys.exit(1)
