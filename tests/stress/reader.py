#!/usr/bin/env python3
"""A reader of a metfs mount for the stress tests: walks the view again and again, reads every
file to the end in 128 KiB chunks and checks its SHA-256 against the source's.

    reader.py MOUNTPOINT HASHES_JSON OUT_JSON STOP_FILE SEED [SOCKET]

HASHES_JSON may be `generated` for a source of `content`'s files (`GeneratedDigests`), read by
`stream_loop`.

With SOCKET (the daemon's control socket) it reads the view's slot files directly instead, under
a lease (`direct_loop`).

Runs until STOP_FILE exists, then writes its counters to OUT_JSON. The same loop runs in threads
of the test process (`read_loop`), so the mount sees readers both as threads and as processes.

A file that vanishes between the listing and the open (ENOENT) is expected across a switch: the
new view no longer has it. Every other error, and every byte that differs from the source, is a
failure the test reports.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

CHUNK = 128 * 1024


def new_counters() -> dict[str, Any]:
    return {
        "files": 0,
        "bytes": 0,
        "rounds": 0,
        "enoent": 0,
        "errors": {},
        "mismatches": [],
        "unknown": [],
        "read": set(),
    }


def hash_to_end(f: Any) -> tuple[str, int]:
    """Reads an open file to the end in CHUNK reads: its SHA-256 and length."""
    h = hashlib.sha256()
    n = 0
    while True:
        b = f.read(CHUNK)
        if not b:
            return h.hexdigest(), n
        h.update(b)
        n += len(b)


def tally(c: dict[str, Any], rel: str, digest: str, n: int, hashes: dict[str, str]) -> None:
    """Counts one file read whole and checks it against the source's hash."""
    c["files"] += 1
    c["bytes"] += n
    want = hashes.get(rel)
    if want is None:
        if len(c["unknown"]) < 10:
            c["unknown"].append(rel)
    elif digest != want:
        if len(c["mismatches"]) < 10:
            c["mismatches"].append({"path": rel, "bytes": n})
    else:
        c["read"].add(rel)


def count_error(c: dict[str, Any], key: str) -> None:
    c["errors"][key] = c["errors"].get(key, 0) + 1


def walk_error_counter(c: dict[str, Any]) -> Callable[[OSError], None]:
    """`os.walk`'s onerror: a directory of the old view, gone after a switch, is ENOENT;
    anything else is an error."""

    def walk_error(e: OSError) -> None:
        if e.errno == errno.ENOENT:
            c["enoent"] += 1
        else:
            count_error(c, f"walk {errno.errorcode.get(e.errno or 0, e.errno)}")

    return walk_error


def read_file(c: dict[str, Any], mnt: str, p: str, hashes: Any) -> None:
    """Reads `p` to the end and tallies it; ENOENT at open (the file left the view) is
    expected, every other error is counted."""
    op = "open"
    try:
        with open(p, "rb", buffering=0) as f:
            op = "read"
            digest, n = hash_to_end(f)
    except OSError as e:
        if e.errno == errno.ENOENT and op == "open":
            c["enoent"] += 1
        else:
            count_error(c, f"{op} {errno.errorcode.get(e.errno or 0, str(e.errno))}")
        return
    tally(c, os.path.relpath(p, mnt), digest, n, hashes)


def read_loop(
    mnt: str, hashes: dict[str, str], stop: Callable[[], bool], seed: int, c: dict[str, Any]
) -> None:
    rng = random.Random(seed)
    # Half the readers share one order, so that several open and read the same file at once.
    shared = seed % 2 == 0
    while not stop():
        paths = []
        try:
            for dirpath, _, names in os.walk(mnt, onerror=walk_error_counter(c)):
                for n in names:
                    paths.append(os.path.join(dirpath, n))
        except OSError as e:
            count_error(c, f"walk {errno.errorcode.get(e.errno or 0, e.errno)}")
        paths.sort()
        if shared:
            random.Random(c["rounds"]).shuffle(paths)
        else:
            rng.shuffle(paths)
        for p in paths:
            if stop():
                break
            read_file(c, mnt, p, hashes)
        c["rounds"] += 1


def stream_loop(
    mnt: str, hashes: Any, stop: Callable[[], bool], seed: int, c: dict[str, Any]
) -> None:
    """`read_loop` for views too large to list whole before reading (half a million files):
    walks the view in a random order of directories and reads each directory's files, in a
    random order, as soon as it is listed."""
    rng = random.Random(seed)
    while not stop():
        try:
            for dirpath, dirnames, names in os.walk(mnt, onerror=walk_error_counter(c)):
                rng.shuffle(dirnames)  # os.walk descends in the order left here
                rng.shuffle(names)
                for n in names:
                    if stop():
                        return
                    read_file(c, mnt, os.path.join(dirpath, n), hashes)
        except OSError as e:
            count_error(c, f"walk {errno.errorcode.get(e.errno or 0, e.errno)}")
        c["rounds"] += 1


class Lease:
    """One reader's connection to the daemon: `files` with `direct` over it lists the view and
    takes the connection's lease on it (JSON list form, so the loop needs no client package)."""

    def __init__(self, sock: str) -> None:
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.connect(sock)
        self.s.settimeout(120)
        self.buf = b""

    def files(self, known: int | None) -> dict[str, Any]:
        req: dict[str, Any] = {"op": "files", "direct": True}
        if known is not None:
            req["known_generation"] = known
        self.s.sendall(json.dumps(req).encode() + b"\n")
        while b"\n" not in self.buf:
            chunk = self.s.recv(1 << 20)
            if not chunk:
                raise ConnectionError("the daemon closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        r = json.loads(line)
        if not r.get("ok"):
            raise RuntimeError(f"files direct: {r}")
        return r

    def close(self) -> None:
        self.s.close()


def direct_loop(
    sock: str, hashes: dict[str, str], stop: Callable[[], bool], seed: int, c: dict[str, Any]
) -> None:
    """Reads the view's slot files directly, as a loader given `direct` paths does: each round
    asks for the view (renewing the lease, or moving it to the view that replaced it), then
    reads every file of it. The lease keeps the slot, so a file listed is a file there: any
    error at all, ENOENT included, is a failure."""
    rng = random.Random(seed)
    lease = Lease(sock)
    known: int | None = None
    files: list[str] = []
    root = ""
    try:
        while not stop():
            r = lease.files(known)
            if not r.get("unchanged"):
                files, root, known = list(r["files"]), r["direct_root"], r["generation"]
                c["views"] = c.get("views", 0) + 1
            order = files[:]
            rng.shuffle(order)
            for rel in order:
                if stop():
                    break
                try:
                    with open(os.path.join(root, rel), "rb", buffering=0) as f:
                        digest, n = hash_to_end(f)
                except OSError as e:
                    key = f"direct {errno.errorcode.get(e.errno or 0, str(e.errno))}"
                    c["errors"][key] = c["errors"].get(key, 0) + 1
                    continue
                tally(c, rel, digest, n, hashes)
            c["rounds"] += 1
    finally:
        lease.close()


def merge(total: dict[str, Any], c: dict[str, Any]) -> None:
    for k in ("files", "bytes", "rounds", "enoent"):
        total[k] += c[k]
    total["views"] = total.get("views", 0) + c.get("views", 0)
    for k, v in c["errors"].items():
        total["errors"][k] = total["errors"].get(k, 0) + v
    total["mismatches"] += c["mismatches"]
    total["unknown"] += c["unknown"]
    total["read"] |= set(c["read"])


def stop_readers(
    stop: threading.Event,
    threads: list[threading.Thread],
    procs: list[Any],
    stop_file: Path,
    timeout: float,
) -> None:
    """Stops reader threads and processes, waiting up to `timeout` for each; a process still
    running then is killed."""
    import subprocess

    stop.set()
    stop_file.touch()
    for t in threads:
        t.join(timeout=timeout)
    for p in procs:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()


def collect(counters: list[dict[str, Any]], outs: list[Path]) -> dict[str, Any]:
    """The stopped readers' counters merged: the threads' and each process's result file (a
    process that wrote none fails the test)."""
    total = new_counters()
    for c in counters:
        merge(total, c)
    for i, out in enumerate(outs):
        assert out.exists(), f"reader process {i} wrote no result"
        merge(total, json.loads(out.read_text()))
    return total


def start_threads(
    mnt: str, hashes: dict[str, str], n: int, seed: int, direct_socket: str | None = None
) -> tuple[threading.Event, list[threading.Thread], list[dict]]:
    """`n` reader threads through the mount, or with `direct_socket` of the slot files directly."""
    stop = threading.Event()
    counters = [new_counters() for _ in range(n)]
    threads = [
        threading.Thread(
            target=direct_loop,
            args=(direct_socket, hashes, stop.is_set, seed + i, counters[i]),
            daemon=True,
        )
        if direct_socket
        else threading.Thread(
            target=read_loop, args=(mnt, hashes, stop.is_set, seed + i, counters[i]), daemon=True
        )
        for i in range(n)
    ]
    for t in threads:
        t.start()
    return stop, threads, counters


# A generated source (`test_large_views.py`): file `i` is `rel_of(i)`, its bytes `content(i)`.
PER_DIR = 1_000


def rel_of(i: int) -> str:
    return f"d{i // PER_DIR:05d}/f{i:07d}.bin"


def content(i: int) -> bytes:
    """File `i`'s bytes: its index repeated, 1-4 KiB long, so no two files are alike."""
    size = 1024 + (i * 2654435761) % 3073
    return (i.to_bytes(8, "little") * 512)[:size]


class GeneratedDigests:
    """The SHA-256 of a generated source's file, computed from its name (what `tally` asks of
    the table of digests it is given): a million digests need no table in every reader."""

    def get(self, rel: str) -> str | None:
        name = rel.rsplit("/", 1)[-1]
        if not (name.startswith("f") and name.endswith(".bin") and name[1:8].isdigit()):
            return None
        i = int(name[1:8])
        return hashlib.sha256(content(i)).hexdigest() if rel == rel_of(i) else None


def main() -> None:
    mnt, hashes_file, out, stop_file, seed = sys.argv[1:6]
    # "generated": a source of `content`'s files.
    hashes: Any = (
        GeneratedDigests()
        if hashes_file == "generated"
        else json.loads(Path(hashes_file).read_text())
    )
    c = new_counters()
    if len(sys.argv) > 6:  # a control socket: read the slot files directly
        direct_loop(sys.argv[6], hashes, lambda: os.path.exists(stop_file), int(seed), c)
    elif hashes_file == "generated":
        stream_loop(mnt, hashes, lambda: os.path.exists(stop_file), int(seed), c)
    else:
        read_loop(mnt, hashes, lambda: os.path.exists(stop_file), int(seed), c)
    c["read"] = sorted(c["read"])
    Path(out).write_text(json.dumps(c))


if __name__ == "__main__":
    main()


def start_burst(
    mnt: str, hashes: dict[str, str], n: int, seed: int
) -> tuple[threading.Event, list[threading.Thread], dict]:
    """`n` threads that open and read the same file at the same instant (a barrier releases them
    together), file after file: the pattern of data loader workers that start an epoch in the
    same order, and the one that made concurrent first opens fail on passthrough."""
    stop = threading.Event()
    c = new_counters()
    lock = threading.Lock()
    rng = random.Random(seed)
    shared: dict[str, Any] = {"paths": [], "path": None, "turn": 0}

    def pick() -> None:
        if shared["turn"] % 50 == 0 or not shared["paths"]:
            shared["paths"] = [os.path.join(d, f) for d, _, fs in os.walk(mnt) for f in fs]
        shared["turn"] += 1
        shared["path"] = rng.choice(shared["paths"]) if shared["paths"] else None

    barrier = threading.Barrier(n, action=pick)

    def run() -> None:
        while not stop.is_set():
            try:
                barrier.wait(timeout=30)
            except threading.BrokenBarrierError:
                return
            p = shared["path"]
            if p is None:
                continue
            local = new_counters()
            rel = os.path.relpath(p, mnt)
            op = "open"
            try:
                with open(p, "rb", buffering=0) as f:
                    op = "read"
                    data = f.read()
                local["files"] += 1
                local["bytes"] += len(data)
                if hashlib.sha256(data).hexdigest() != hashes.get(rel):
                    local["mismatches"].append({"path": rel, "bytes": len(data)})
                else:
                    local["read"].add(rel)
            except OSError as e:
                if e.errno == errno.ENOENT and op == "open":
                    local["enoent"] += 1
                else:
                    key = f"burst {op} {errno.errorcode.get(e.errno, str(e.errno))}"
                    local["errors"][key] = 1
            with lock:
                merge(c, local)

    threads = [threading.Thread(target=run, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()

    def halt() -> None:
        stop.set()
        barrier.abort()

    stop.halt = halt  # type: ignore[attr-defined]
    return stop, threads, c
