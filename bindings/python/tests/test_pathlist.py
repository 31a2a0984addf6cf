"""The packed file list on the Python side: layout checks, sequence behaviour, pickling."""

from __future__ import annotations

import pickle
import struct

import pytest

from metfs.client import FilesView, MetfsError
from metfs.pathlist import PathList

PATHS = ["a/1.bin", "bird house/é.bin", "", "中/x", "z"]


def pack(paths: list[str]) -> tuple[bytes, int]:
    """What the daemon sends: count + 1 little-endian u64 offsets, then the names."""
    names = b"".join(p.encode() for p in paths)
    offsets = [0]
    for p in paths:
        offsets.append(offsets[-1] + len(p.encode()))
    return struct.pack(f"<{len(offsets)}Q", *offsets) + names, len(names)


def test_a_packed_list_reads_as_the_paths_packed() -> None:
    payload, names = pack(PATHS)
    pl = PathList(payload, len(PATHS), names)
    assert len(pl) == 5 and list(pl) == PATHS and pl == PATHS and pl != PATHS[:-1]
    assert pl[1] == "bird house/é.bin" and pl[-1] == "z" and pl[1:4:2] == [PATHS[1], PATHS[3]]
    assert "中/x" in pl and pl.index("z") == 4
    absolute = pl.with_prefix("/mnt/")
    assert list(absolute) == ["/mnt/" + p for p in PATHS]
    with pytest.raises(IndexError, match="path 5 of a view of 5 files"):
        pl[5]
    again = pickle.loads(pickle.dumps(absolute))
    assert again == absolute and again.prefix == "/mnt/"
    assert PathList(*pack([])[:1], 0, 0) == []


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b[:-1], "make"),
        (lambda b: b + b"x", "make"),
        (lambda b: b[:8] + struct.pack("<Q", 30) + b[16:], "below the one before"),
        (lambda b: struct.pack("<Q", 1) + b[8:], "run from 1"),
    ],
    ids=["short", "long", "out-of-order", "not-from-zero"],
)
def test_a_damaged_packed_list_is_refused(damage: object, message: str) -> None:
    payload, names = pack(PATHS)
    bad = damage(payload)  # type: ignore[operator]
    with pytest.raises(ValueError, match=message):
        PathList(bad, len(PATHS), names)
    reply = {
        "v": 1,
        "ok": True,
        "generation": 2,
        "epoch": 0,
        "mini_epoch": 0,
        "mountpoint": "/m",
        "files": [],
        "count": len(PATHS),
        "unchanged": False,
        "packed": {"bytes": len(bad), "names_bytes": names},
    }
    with pytest.raises(MetfsError, match="bad_response.*packed list"):
        FilesView.from_response(reply, bad)
