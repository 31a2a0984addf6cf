"""End-to-end tests of continued copies: a large sample whose copy a `kill -9` of the daemon cut
short is continued from its mark (how much of it was known to be written, recorded in its
sidecar as the copy went) when the daemon mounts again, reading only the rest from the tier,
unless its source changed meanwhile (then it is fetched again from byte 0). The mark trails the
copy by at most one look of the stall watch (250 ms of writes), so a continuation starts at or
before the partial's length; on S3, whose parallel ranged GETs may have written pieces past a
hole, it starts at the end of the pieces that were all in place.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
from pathlib import Path

from conftest import Tier, is_mounted, read_view, wait_for

BIG = 64 << 20
RATE = "16MiB/s"
SLOT = "e000000-m00000"


def big_source(src: Path, seed: int = 0) -> dict[str, bytes]:
    """Two samples of 64 MiB (catalogued as ids 0 and 1, in path order)."""
    src.mkdir(parents=True, exist_ok=True)
    files = {}
    for i in range(2):
        data = random.Random(seed * 10 + i).randbytes(BIG)
        (src / f"big{i}.bin").write_bytes(data)
        files[f"big{i}.bin"] = data
    return files


def partials(cache: Path) -> dict[str, int]:
    """The partial copies in the cache's tmp/, with their lengths."""
    out = {}
    for p in (cache / "tmp").glob("*.part"):
        try:
            out[p.name] = p.stat().st_size
        except FileNotFoundError:
            pass
    return out


def kill_mid_copy(m, in_order: bool = True) -> dict[str, int]:
    """Starts the mount paced at RATE, kills it with SIGKILL once its first staging has written
    24 MiB of the two copies, and returns the partial copies it left (shorter than the sample
    where the tier writes `in_order`; parallel ranged GETs may have written the last bytes)."""
    first = m.spawn(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(
        lambda: sum(partials(m.cache).values()) >= 24 << 20,
        timeout=60,
        what="the first staging to write 24 MiB of its copies",
    )
    os.kill(m.pid(), signal.SIGKILL)
    first.communicate(timeout=60)
    assert not is_mounted(m.mountpoint), "the first mount never returned"
    left = partials(m.cache)
    assert left and all(0 < n <= BIG for n in left.values()), left
    assert not in_order or all(n < BIG for n in left.values()), left
    for name in left:
        assert (m.cache / "tmp" / f"{name}.src").exists(), name
    return left


def remount(m) -> tuple[str, int]:
    """Mounts again without the pace; returns the new log and the first staging's tier bytes."""
    log_len = len((m.cache / "metfs.log").read_text())
    m.args = [a for a in m.args if a not in ("--prefetch-rate", RATE)]
    m.mount()
    log = (m.cache / "metfs.log").read_text()[log_len:]
    staged = [ln for ln in log.splitlines() if "mini-epoch staged" in ln and "next" not in ln]
    assert staged, log[-2000:]
    fetched = re.search(r"tier_bytes=(\d+)", staged[-1])
    assert fetched, staged[-1]
    return log, int(fetched.group(1))


def continued_from(log: str) -> dict[str, int]:
    """The samples whose copies the log says were continued, with the offset."""
    return {
        s: int(n)
        for s, n in re.findall(r"continued an interrupted copy.*?sample=(\S+) from=(\d+)", log)
    }


def check_continued(m, left: dict[str, int], log: str, fetched: int) -> dict[str, int]:
    """Each cut copy was continued from at most its length, and only the rest came from the
    tier; returns where each was continued."""
    cont = continued_from(log)
    for i in range(2):
        at = cont.get(f"big{i}.bin", 0)
        assert at <= left.get(f"{SLOT}-{i}.part", 0), (cont, left)
    assert sum(cont.values()) > 0, (log[-3000:], left)
    assert fetched == 2 * BIG - sum(cont.values()), (fetched, cont, left)
    assert m.status()["tier_bytes_read"] < 2 * BIG
    print(f"partials {left}; continued from {cont}; tier bytes {fetched} of {2 * BIG}")
    return cont


def test_copies_cut_by_a_kill_are_continued_reading_only_the_rest(mounts, tmp_path):
    src = tmp_path / "tier"
    files = big_source(src)
    m = mounts(src, "512MiB", "--rf", "1", "--compose", "sequential", "--prefetch-rate", RATE)
    left = kill_mid_copy(m)
    log, fetched = remount(m)
    check_continued(m, left, log, fetched)
    assert read_view(m.mountpoint) == files
    assert not list((m.cache / "tmp").glob("*.part*"))


def test_a_copy_whose_source_changed_is_fetched_again_from_0(mounts, tmp_path):
    src = tmp_path / "tier"
    big_source(src)
    m = mounts(src, "512MiB", "--rf", "1", "--compose", "sequential", "--prefetch-rate", RATE)
    left = kill_mid_copy(m)
    assert f"{SLOT}-0.part" in left, left
    # big0.bin replaced by another version of the same size (a new file, a new stamp).
    new = random.Random(99).randbytes(BIG)
    (src / "big0.bin.new").write_bytes(new)
    os.replace(src / "big0.bin.new", src / "big0.bin")
    files = {"big0.bin": new, "big1.bin": (src / "big1.bin").read_bytes()}
    log, fetched = remount(m)
    # The new catalog makes a new plan, whose start removes the old slots with their partial
    # copies; where a partial outlives that, its sidecar names the old version and the copy
    # starts again at 0 (the stager's `a_partial_of_another_version_is_fetched_again_from_0`).
    assert "big0.bin" not in continued_from(log), log[-3000:]
    assert fetched >= BIG, fetched
    assert read_view(m.mountpoint) == files
    assert not list((m.cache / "tmp").glob("*.part*"))


def test_s3_copies_cut_by_a_kill_are_continued_from_their_marks(mounts, garage, tmp_path):
    """The S3 tier writes a large object as parallel ranged GETs, so a cut copy may hold a
    piece past a hole (as long as the sample, even): it is continued from its mark, the end of
    the pieces all in place, with ranged GETs pinned to the catalogued ETag."""
    local = tmp_path / "local"
    files = big_source(local)
    prefix = f"big{abs(hash(str(tmp_path))) % 10**8}"
    garage.upload(local, prefix)
    tier = Tier(
        "s3",
        f"s3://metfs/{prefix}",
        ["--endpoint", garage.endpoint, "--region", "garage", "--allow-http"],
        garage.env,
    )
    m = mounts(tier, "512MiB", "--rf", "1", "--compose", "sequential", "--prefetch-rate", RATE)
    left = kill_mid_copy(m, in_order=False)
    log, fetched = remount(m)
    check_continued(m, left, log, fetched)
    assert read_view(m.mountpoint) == files
    assert not list((m.cache / "tmp").glob("*.part*"))
