"""Helpers of the stress tests: sizes from the environment, the budget sampler, the ledger of
views that checks every sample appears exactly once per epoch, switches with a deadline, and
the results file that `scripts/stress.sh` turns into numbers for docs/RELIABILITY.md.

Sizes come from environment variables so that the test command runs a brief version and
`scripts/stress.sh` the full one:

    METFS_STRESS_READERS     concurrent readers per read path (half threads, half processes)
    METFS_STRESS_SWITCHES    view switches per read path
    METFS_STRESS_KILLS       kill -9 trials
    METFS_STRESS_OUTAGE_S    seconds the source is away in the outage test
    METFS_STRESS_DEADLINE_S  how long a switch or a drain may take before the view counts as stuck
    METFS_STRESS_OUT         directory for one JSON result file per test (unset: no files)
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from conftest import ROOT, Mount, is_mounted, metfs_bin

STRESS_DIR = Path(__file__).resolve().parent


def example_bin(package: str, name: str) -> Path:
    """A Cargo example of `package` beside the binary under test (`METFS_BIN`'s directory,
    `examples/NAME`). The test command's `cargo build --workspace --all-targets` and
    scripts/stress.sh build it; a run without it builds it here, in that directory's profile."""
    bin_dir = Path(metfs_bin()).parent
    exe = bin_dir / "examples" / name
    if not exe.exists():
        cmd = ["cargo", "build", "-q", "-p", package, "--example", name]
        if bin_dir.name == "release":
            cmd.append("--release")
        subprocess.run(cmd, cwd=ROOT, check=True)
    assert exe.exists(), (
        f"{exe} is not built (METFS_BIN={metfs_bin()}): cargo build -p {package} --example {name}"
    )
    return exe


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, str(default)))


READERS = env_int("METFS_STRESS_READERS", 32)
SWITCHES = env_int("METFS_STRESS_SWITCHES", 6)
KILLS = env_int("METFS_STRESS_KILLS", 5)
OUTAGE_S = float(os.environ.get("METFS_STRESS_OUTAGE_S", "3"))
DEADLINE_S = float(os.environ.get("METFS_STRESS_DEADLINE_S", "60"))


def sha256_tree(root: Path) -> tuple[dict[str, str], dict[str, int]]:
    """SHA-256 and size of every file under `root`, keyed by relative path: computed once, up
    front, so that every read through the mount is checked against the source's bytes."""
    hashes: dict[str, str] = {}
    sizes: dict[str, int] = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            data = p.read_bytes()
            rel = str(p.relative_to(root))
            hashes[rel] = hashlib.sha256(data).hexdigest()
            sizes[rel] = len(data)
    return hashes, sizes


def allocated(path: Path, parts: dict[str, int] | None = None) -> int:
    """Allocated bytes of a directory tree: st_blocks * 512 of every entry, the directory too,
    each inode once. With `parts`, also the bytes under each slot, `tmp` and the other entries.

    The walk is not atomic, so it visits `slots/` before `tmp/`: staged files only move from
    `tmp/` into a slot, and in this order a file renamed during the walk is missed rather than
    counted twice (a sample can only be low by the files in flight, never high).
    """
    seen: set[tuple[int, int]] = set()
    total = 0

    def add(p: str, part: str) -> None:
        nonlocal total
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            return
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
            if parts is not None:
                parts[part] = parts.get(part, 0) + st.st_blocks * 512

    def tree(p: str, part: str) -> None:
        add(p, part)
        for dirpath, dirnames, filenames in os.walk(p):
            for n in dirnames + filenames:
                add(os.path.join(dirpath, n), part)

    add(str(path), ".")
    try:
        top = sorted(os.listdir(path), key=lambda n: {"slots": 0, "tmp": 1}.get(n, 2))
    except FileNotFoundError:
        return 0
    for name in top:
        p = os.path.join(path, name)
        if name == "slots":
            add(p, "slots")
            try:
                slots = os.listdir(p)
            except FileNotFoundError:
                continue
            for slot in slots:
                tree(os.path.join(p, slot), f"slots/{slot}")
        else:
            tree(p, name)
    return total


class BudgetSampler(threading.Thread):
    """Samples the cache directory's allocated bytes every 10 ms and remembers each sample over
    the budget. Use as a context manager around everything a test does with the mount."""

    def __init__(self, cache: Path, budget: int, period: float = 0.01) -> None:
        super().__init__(daemon=True)
        self.cache = cache
        self.budget = budget
        self.period = period
        self.max = 0
        self.samples = 0
        self.over: list[tuple[float, int]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        t0 = self.t0 = time.monotonic()
        while not self._halt.is_set():
            parts: dict[str, int] = {}
            b = allocated(self.cache, parts)
            self.samples += 1
            self.max = max(self.max, b)
            if b > self.budget and len(self.over) < 1000:
                self.over.append(
                    (round(time.monotonic() - t0, 3), b, parts if len(self.over) < 5 else None)
                )
            time.sleep(self.period)

    def __enter__(self) -> BudgetSampler:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._halt.set()
        self.join()
        self.secs = time.monotonic() - self.t0

    def summary(self) -> dict[str, Any]:
        return {
            "budget_bytes": self.budget,
            "budget_samples": self.samples,
            "budget_max_bytes": self.max,
            "budget_sample_interval_ms": round(
                1000 * getattr(self, "secs", 0) / max(self.samples, 1), 1
            ),
            "budget_samples_over": len(self.over),
            "budget_first_over": self.over[:5],
        }

    def check(self) -> None:
        assert self.samples > 10, f"budget sampled only {self.samples} times"
        assert not self.over, (
            f"cache held more than the budget of {self.budget} bytes in {len(self.over)} of "
            f"{self.samples} samples (max {self.max}); first (s, bytes): {self.over[:5]}"
        )


class Ledger:
    """The file list of every view seen, keyed by (epoch, mini-epoch), to check that across an
    epoch every sample appears exactly once in some view, or is reported as failed."""

    def __init__(self, m: Mount, all_files: set[str]) -> None:
        self.m = m
        self.all = all_files
        self.views: dict[tuple[int, int], set[str]] = {}
        self.generations: list[int] = []
        self.nm = 0

    def record(self) -> dict[str, Any]:
        f = self.m.files()
        key = (f["epoch"], f["mini_epoch"])
        files = set(f["files"])
        if key in self.views:
            # The same mini-epoch seen again (a remount resumed it): it must show the same samples.
            assert self.views[key] == files, (
                f"mini-epoch {key} showed different files on a second look"
            )
        self.views[key] = files
        self.generations.append(f["generation"])
        return f

    def complete_epochs(self, nm: int) -> list[int]:
        epochs = {e for e, _ in self.views}
        return sorted(e for e in epochs if all((e, k) in self.views for k in range(nm)))

    def check(
        self, nm: int, failed: list[dict[str, str]], require_epochs: int = 1
    ) -> dict[str, Any]:
        """Asserts exactly-once coverage of every complete epoch (``failed``: ``status``'s
        ``failed_samples``, each ``{"path", "reason"}``). Returns counts for the results."""
        done = self.complete_epochs(nm)
        assert len(done) >= require_epochs, (
            f"only epochs {done} were seen whole; views: {sorted(self.views)}"
        )
        out = {
            "epochs_checked": done,
            "views_seen": len(self.views),
            "silently_dropped": 0,
            "reported_failed": len(failed),
            "duplicates": 0,
        }
        for e in done:
            seen: dict[str, int] = {}
            for k in range(nm):
                for f in self.views[(e, k)]:
                    seen[f] = seen.get(f, 0) + 1
            dups = sorted(f for f, c in seen.items() if c > 1)
            missing = sorted(self.all - set(seen))
            reported = {r["path"] for r in failed}
            silent = [f for f in missing if f not in reported]
            out["silently_dropped"] += len(silent)
            out["duplicates"] += len(dups)
            assert not dups, (
                f"epoch {e}: {len(dups)} samples in more than one mini-epoch, e.g. {dups[:5]}"
            )
            assert not silent, (
                f"epoch {e}: {len(silent)} samples silently dropped (in no view and not in failed_samples), "
                f"e.g. {silent[:5]}"
            )
            assert not missing, (
                f"epoch {e}: {len(missing)} samples dropped (reported as failed: {failed[:5]})"
            )
            extra = sorted(set(seen) - self.all)
            assert not extra, f"epoch {e}: views showed files that are not samples: {extra[:5]}"
        return out


class StuckView(AssertionError):
    pass


def advance_wait(m: Mount, deadline: float = DEADLINE_S) -> tuple[float, dict[str, Any]]:
    """`advance` with wait through the control socket. A switch that does not return within
    `deadline` seconds is a stuck view: fails with the daemon's `status` JSON."""
    t = time.monotonic()
    try:
        r = m.rpc({"op": "advance", "wait": True}, timeout=deadline)
    except TimeoutError:
        raise StuckView(
            f"advance --wait did not return in {deadline} s; status: {json.dumps(status_or_error(m))}"
        ) from None
    assert r.get("ok"), r
    assert r["decision"] == "advance", r
    return time.monotonic() - t, r


def status_or_error(m: Mount) -> Any:
    try:
        return m.rpc({"op": "status"}, timeout=10)
    except Exception as e:  # noqa: BLE001 - only for the failure message
        return f"status failed: {e!r}"


def wait_drained(m: Mount, deadline: float = DEADLINE_S) -> float:
    """Waits until no slot is draining; a drain that takes longer than `deadline` is stuck."""
    t = time.monotonic()
    while time.monotonic() - t < deadline:
        if m.status()["draining_slots"] == 0:
            return time.monotonic() - t
        time.sleep(0.05)
    raise StuckView(
        f"the old view did not drain in {deadline} s after the readers stopped; status: "
        f"{json.dumps(status_or_error(m))}"
    )


def wait_ready(m: Mount, deadline: float = DEADLINE_S) -> float:
    t = time.monotonic()
    while time.monotonic() - t < deadline:
        if m.status()["next_ready"]:
            return time.monotonic() - t
        time.sleep(0.05)
    raise StuckView(
        f"the next mini-epoch was not staged in {deadline} s; status: {json.dumps(status_or_error(m))}"
    )


def median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 4) if xs else None


def p_max(xs: list[float]) -> float | None:
    return round(max(xs), 4) if xs else None


def write_result(name: str, result: dict[str, Any]) -> None:
    out = os.environ.get("METFS_STRESS_OUT")
    if not out:
        return
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{name}.json").write_text(json.dumps(result, indent=1, sort_keys=True, default=str))


class FaultFs:
    """`faultfs` (metfs-fs/examples/faultfs.rs) serving `src` read-only at `mnt`: open and
    read of each path listed in `control` answer EIO until the file no longer lists it. Used as
    a context manager; the mount is live on entry (the tool's `mounted` line), and on exit it
    is unmounted and the tool must have ended cleanly. Whatever mounted `mnt` as its source must
    be closed first."""

    def __init__(self, src: Path, mnt: Path, control: Path, stats: Path) -> None:
        self.args = [str(example_bin("metfs-fs", "faultfs")), str(src), str(mnt), str(control)]
        self.args += ["--stats", str(stats)]
        self.mnt = mnt
        self.stats = stats

    def __enter__(self) -> FaultFs:
        self.mnt.mkdir()
        self.proc = subprocess.Popen(
            self.args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        # The line comes once the kernel's INIT is answered; a failed mount ends the tool, and
        # the read returns "" at once.
        line = self.proc.stdout.readline()
        if line.strip() != "mounted":
            self.proc.kill()
            raise AssertionError(f"faultfs did not mount: {line!r} {self.proc.stderr.read()}")
        assert is_mounted(self.mnt)
        return self

    def counts(self) -> dict[str, int]:
        return json.loads(self.stats.read_text()) if self.stats.exists() else {}

    def __exit__(self, *exc: object) -> None:
        r = subprocess.run(["umount", str(self.mnt)], capture_output=True, text=True)
        if r.returncode != 0:
            subprocess.run(["umount", "-l", str(self.mnt)], capture_output=True)
        try:
            rc = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            rc = None
        if exc[0] is None:
            assert r.returncode == 0, f"faultfs's mount was busy at the end: {r.stderr}"
            assert rc == 0, f"faultfs ended with {rc}: {self.proc.stderr.read()}"
