"""Format views read by each format's own loader, unmodified (metfs-formats, issue 53 item 3).

For each format a real dataset is written with the real library (Hugging Face `datasets`,
MosaicML Streaming's MDSWriter, litdata's BinaryWriter, webdataset's ShardWriter), views of
several shard subsets are built with the crate's example (`view_index SRC OUT SHARD...`: the
always files and the shards hard-linked, the index rewritten), and each view is read with the
library's own loader. Each must yield exactly the samples of its shards (by a unique id),
their bytes equal to the source's, and the views of a partition of the shards must together
yield every sample exactly once. Corrupt index files must give an error naming the file.

MosaicML Streaming wants numpy < 2.2 and the test environment pins numpy 2.4.6, so it runs in
an environment of its own (`streaming_python`: made once, cached under /var/tmp beside
install-deps' environment, keyed by its pins and the interpreter), which reuses the test
environment's packages (torch) through a `.pth` file and shadows only what streaming needs at
other versions.
"""

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = 96

# MosaicML Streaming's environment: its pin, and numpy's newest release below its bound.
STREAMING_PINS = ["mosaicml-streaming==0.13.0", "numpy==2.1.3"]


@pytest.fixture(scope="module")
def view_index() -> Path:
    subprocess.run(
        ["cargo", "build", "-q", "-p", "metfs-formats", "--examples"], cwd=ROOT, check=True
    )
    return ROOT / "target/debug/examples/view_index"


def payload(i: int) -> bytes:
    """Sample i's bytes: distinct per sample, of varying length."""
    return hashlib.sha256(str(i).encode()).digest() * (1 + i % 5)


def run_view(tool: Path, src: Path, out: Path, shards: list[str], *flags: str) -> dict:
    r = subprocess.run(
        [str(tool), *flags, str(src), str(out), *shards], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def layout(tool: Path, src: Path, *flags: str) -> dict:
    r = subprocess.run([str(tool), *flags, "--list", str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def partition(names: list[str]) -> list[list[str]]:
    """Views of several sizes that together hold every shard once: 1, 2, 3, ... shards, the
    last taking what is left (shuffled, so a view's shards are not contiguous)."""
    order = names[::2] + names[1::2]
    parts, k = [], 1
    while order:
        parts.append(order[:k])
        order = order[k:]
        k += 1
    return parts


def check_partition(views: list[tuple[list[str], dict[int, bytes]]], owner: dict[int, str]):
    """Each view yields exactly its shards' samples with the source's bytes; together, every
    sample exactly once."""
    seen: dict[int, int] = {}
    for shards, got in views:
        want = {i for i, s in owner.items() if s in shards}
        assert set(got) == want, (shards, sorted(got), sorted(want))
        for i, b in got.items():
            assert b == payload(i), i
            seen[i] = seen.get(i, 0) + 1
    assert seen == {i: 1 for i in range(SAMPLES)}


def files_of(d: Path) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*") if p.is_file()}


def bad_index(tool: Path, src: Path, index: str, tmp_path: Path) -> None:
    """A corrupt index file: the example refuses with an error naming the file."""
    bad = tmp_path / "bad"
    shutil.copytree(src, bad)
    (bad / index).write_text('{"truncated": [')
    r = subprocess.run([str(tool), "--list", str(bad)], capture_output=True, text=True)
    assert r.returncode == 2, r
    assert f"{index}: does not parse as JSON" in r.stderr, r.stderr


# Hugging Face datasets


def test_hf_dataset_views_load_with_load_from_disk(view_index: Path, tmp_path: Path) -> None:
    import datasets

    src = tmp_path / "src"
    ds = datasets.Dataset.from_dict(
        {"id": list(range(SAMPLES)), "data": [payload(i) for i in range(SAMPLES)]}
    )
    ds.save_to_disk(str(src), num_shards=8)
    lay = layout(view_index, src)
    assert lay["format"] == "hf-dataset"
    assert lay["index"] == ["state.json"] and lay["always"] == ["dataset_info.json"]
    names = [s["name"] for s in lay["shards"]]
    assert len(names) == 8
    owner = {}
    for n in names:
        for i in datasets.Dataset.from_file(str(src / n))["id"]:
            owner[i] = n
    source_fp = json.loads((src / "state.json").read_text())["_fingerprint"]
    views, fingerprints = [], set()
    for k, part in enumerate(partition(names)):
        out = tmp_path / f"view{k}"
        run_view(view_index, src, out, part)
        view = datasets.load_from_disk(str(out))
        got = dict(zip(view["id"], view["data"], strict=True))
        assert len(got) == len(view), "an id twice"
        views.append((part, got))
        fingerprints.add(view._fingerprint)
        # Each view is its own dataset to `datasets`' cache.
        assert view._fingerprint != source_fp
        # In the source's order: rows come as the source's arrow files hold them.
        assert view["id"] == sorted(view["id"])
    assert len(fingerprints) == len(views)
    check_partition(views, owner)
    print(f"hf-dataset views: {[len(g) for _, g in views]} samples")
    bad_index(view_index, src, "state.json", tmp_path)
    # An arrow file state.json names that is not there.
    gone = tmp_path / "gone"
    shutil.copytree(src, gone)
    (gone / names[3]).unlink()
    r = subprocess.run([str(view_index), "--list", str(gone)], capture_output=True, text=True)
    assert r.returncode == 2, r
    assert f"state.json: names the arrow file '{names[3]}', which is not in the listing" in r.stderr
    # A shard the index does not name.
    r = subprocess.run(
        [str(view_index), str(src), str(tmp_path / "v"), "data-00009-of-00008.arrow"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2, r
    assert "state.json: names no shard 'data-00009-of-00008.arrow'" in r.stderr, r.stderr


def test_hf_dataset_dict_deals_train_and_shows_test_whole(view_index: Path, tmp_path: Path) -> None:
    import datasets

    src = tmp_path / "src"
    train = datasets.Dataset.from_dict(
        {"id": list(range(SAMPLES)), "data": [payload(i) for i in range(SAMPLES)]}
    )
    test = datasets.Dataset.from_dict({"id": [-1, -2, -3], "data": [b"a", b"b", b"c"]})
    datasets.DatasetDict({"train": train, "test": test}).save_to_disk(
        str(src), num_shards={"train": 6, "test": 2}
    )
    lay = layout(view_index, src, "--always-split", "test")
    assert lay["format"] == "hf-dataset-dict" and lay["index"] == ["train/state.json"]
    names = [s["name"] for s in lay["shards"]]
    assert len(names) == 6 and all(n.startswith("train/") for n in names)
    owner = {}
    for n in names:
        for i in datasets.Dataset.from_file(str(src / n))["id"]:
            owner[i] = n
    views = []
    for k, part in enumerate(partition(names)):
        out = tmp_path / f"view{k}"
        run_view(view_index, src, out, part, "--always-split", "test")
        dd = datasets.load_from_disk(str(out))
        assert sorted(dd["test"]["id"]) == [-3, -2, -1]
        views.append((part, dict(zip(dd["train"]["id"], dd["train"]["data"], strict=True))))
    check_partition(views, owner)
    # Dealt, the test split's two shards cannot all be in a view of one train shard.
    r = subprocess.run(
        [str(view_index), str(src), str(tmp_path / "v"), names[0]], capture_output=True, text=True
    )
    assert r.returncode == 2 and "test/state.json: the view holds none" in r.stderr, r.stderr
    bad_index(view_index, src, "dataset_dict.json", tmp_path)


# litdata


def test_litdata_views_load_with_streaming_dataset(view_index: Path, tmp_path: Path) -> None:
    import litdata
    from litdata.streaming.writer import BinaryWriter

    src = tmp_path / "src"
    w = BinaryWriter(str(src), chunk_size=9)
    for i in range(SAMPLES):
        w[i] = {"id": i, "data": payload(i)}
    w.done()
    w.merge()
    lay = layout(view_index, src)
    assert lay["format"] == "litdata" and lay["index"] == ["index.json"]
    names = [s["name"] for s in lay["shards"]]
    assert len(names) >= 8, names
    chunks = json.loads((src / "index.json").read_text())["chunks"]
    owner, start = {}, 0
    for c in chunks:
        for i in range(start, start + c["chunk_size"]):
            owner[i] = c["filename"]
        start += c["chunk_size"]
    views = []
    for k, part in enumerate(partition(names)):
        out = tmp_path / f"view{k}"
        made = run_view(view_index, src, out, part)
        assert files_of(out) == {*made["files"], "index.json"}
        ds = litdata.StreamingDataset(input_dir=str(out))
        got = {}
        for item in ds:
            i = int(item["id"])
            assert i not in got, "an id twice"
            got[i] = bytes(item["data"])
        assert len(ds) == len(got)
        views.append((part, got))
        assert files_of(out) == {*part, "index.json"}, "litdata wrote into the view"
    check_partition(views, owner)
    print(f"litdata views: {[len(g) for _, g in views]} samples")
    bad_index(view_index, src, "index.json", tmp_path)


# WebDataset


def test_webdataset_views_read_with_webdataset(view_index: Path, tmp_path: Path) -> None:
    import webdataset as wds

    src = tmp_path / "src"
    (src / "shards").mkdir(parents=True)
    with wds.ShardWriter(str(src / "shards/part-%04d.tar"), maxcount=12, verbose=0) as sink:
        for i in range(SAMPLES):
            sink.write({"__key__": f"s{i:05d}", "id.txt": str(i), "data.bin": payload(i)})
    tars = sorted(p.name for p in (src / "shards").glob("*.tar"))
    assert len(tars) == 8, tars
    # Each shard's index file (DALI's wds2idx kind: one line per sample), which must travel
    # with it; WebDataset itself reads the tar alone.
    owner = {}
    for t in tars:
        ids = [
            int(s["id.txt"]) for s in wds.WebDataset(str(src / "shards" / t), shardshuffle=False)
        ]
        for i in ids:
            owner[i] = f"shards/{t}"
        (src / "shards" / t.replace(".tar", ".idx")).write_text("".join(f"{i}\n" for i in ids))
    (src / "README.md").write_text("not a shard\n")
    lay = layout(view_index, src)
    assert lay["format"] == "webdataset" and lay["index"] == [] and lay["other"] == ["README.md"]
    assert all(len(s["files"]) == 2 for s in lay["shards"]), lay["shards"]
    names = [s["name"] for s in lay["shards"]]
    views = []
    for k, part in enumerate(partition(names)):
        out = tmp_path / f"view{k}"
        # Asked for by their index files: a group's files travel together.
        run_view(view_index, src, out, [p.replace(".tar", ".idx") for p in part])
        got_tars = sorted((out / "shards").glob("*.tar"))
        assert sorted(f"shards/{p.name}" for p in got_tars) == sorted(part)
        assert all(p.with_suffix(".idx").exists() for p in got_tars)
        got = {}
        for s in wds.WebDataset([str(p) for p in got_tars], shardshuffle=False):
            got[int(s["id.txt"])] = s["data.bin"]
        views.append((part, got))
    check_partition(views, owner)


# MosaicML Streaming (MDS), in its own environment

STREAMING_CHILD = r"""
import hashlib, json, sys
from streaming import MDSWriter, StreamingDataset

# Writes the source, says so, then reads each view directory named on stdin (a JSON list):
# one process, since importing streaming takes seconds.
src, n = sys.argv[1], int(sys.argv[2])
with MDSWriter(out=src, columns={"id": "int", "data": "bytes"}, size_limit=1 << 10) as w:
    for i in range(n):
        w.write({"id": i, "data": hashlib.sha256(str(i).encode()).digest() * (1 + i % 5)})
print("written", flush=True)
views = []
for path in json.loads(sys.stdin.readline()):
    ds = StreamingDataset(local=path, remote=None, shuffle=False, batch_size=1)
    rows = [[int(s["id"]), s["data"].hex()] for s in ds]
    views.append({"len": len(ds), "rows": rows})
    del ds
print(json.dumps(views))
"""


def streaming_python() -> Path:
    """The interpreter of MosaicML Streaming's environment, made on first use (see the module
    docs): /var/tmp/metfs-streaming-venv-HASH, HASH naming its pins and the test environment."""
    key = hashlib.sha256(
        "\n".join([sys.prefix, sys.version, *STREAMING_PINS]).encode()
    ).hexdigest()[:8]
    venv = Path(f"/var/tmp/metfs-streaming-venv-{key}")
    python = venv / "bin/python"
    done = venv / ".complete"
    with open(f"{venv}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            site = subprocess.run(
                [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            # The test environment's packages after this one's: torch is not downloaded twice,
            # and this environment's numpy shadows the test environment's.
            ours = [p for p in sys.path if p.endswith("site-packages")]
            Path(site, "metfs-test-env.pth").write_text("".join(f"{p}\n" for p in ours))
            subprocess.run(
                [str(python), "-m", "pip", "install", "-q", "--no-warn-conflicts", *STREAMING_PINS],
                check=True,
                timeout=1800,
            )
            subprocess.run([str(python), "-c", "import streaming, numpy"], check=True)
            done.write_text("\n".join(STREAMING_PINS) + "\n")
    return python


@contextlib.contextmanager
def streaming_turn() -> Iterator[None]:
    """Held while a process of this machine's tests uses MosaicML Streaming.

    Streaming's datasets name their shared memory machine-wide (/dev/shm/NNNNNN_locals, ...):
    two processes that create datasets at once can both pick the same prefix (FileExistsError),
    and its `clean_stale_shared_memory` unlinks every process's, or dies on an empty one that
    a killed process left. The tests take turns (the two pytest workers would otherwise
    collide) and do not clean: a dataset releases its own memory when it is deleted."""
    with open("/var/tmp/metfs-streaming-turn.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def child_said(child: subprocess.Popen, want: str) -> None:
    """Asserts the child's next line is `want`, else shows what it wrote to stderr."""
    assert child.stdout is not None
    line = child.stdout.readline()
    if line != want:
        child.kill()
        _, err = child.communicate()
        pytest.fail(f"the streaming child wrote {line!r}, not {want!r}; stderr:\n{err[-3000:]}")


def test_mds_views_load_with_streaming_dataset(view_index: Path, tmp_path: Path) -> None:
    python = streaming_python()
    src = tmp_path / "src"
    with streaming_turn():
        mds_views_load(python, view_index, src, tmp_path)


def mds_views_load(python: Path, view_index: Path, src: Path, tmp_path: Path) -> None:
    child = subprocess.Popen(
        [str(python), "-c", STREAMING_CHILD, str(src), str(SAMPLES)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONWARNINGS="ignore"),
    )
    try:
        child_said(child, "written\n")
        lay = layout(view_index, src)
        assert lay["format"] == "mds" and lay["index"] == ["index.json"]
        names = [s["name"] for s in lay["shards"]]
        assert len(names) >= 6, names
        parts = partition(names)
        outs = []
        for k, part in enumerate(parts):
            # A directory per view: streaming registers each local directory it reads.
            outs.append(tmp_path / f"view{k}")
            made = run_view(view_index, src, outs[-1], part)
            assert files_of(outs[-1]) == {*made["files"], "index.json"}
        stdout, stderr = child.communicate(json.dumps([str(o) for o in outs]) + "\n", 300)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, stderr[-3000:]
    # The loader wrote nothing into the views (a mount's view is read-only).
    for o, part in zip(outs, parts, strict=True):
        assert files_of(o) == {*part, "index.json"}, o
    owner, start = {}, 0
    for s in json.loads((src / "index.json").read_text())["shards"]:
        for i in range(start, start + s["samples"]):
            owner[i] = s["raw_data"]["basename"]
        start += s["samples"]
    views = []
    for part, res in zip(parts, json.loads(stdout.strip().splitlines()[-1]), strict=True):
        got = {i: bytes.fromhex(h) for i, h in res["rows"]}
        assert len(got) == len(res["rows"]) == res["len"], "an id twice"
        views.append((part, got))
    check_partition(views, owner)
    print(f"mds views: {[len(g) for _, g in views]} samples")
    bad_index(view_index, src, "index.json", tmp_path)
