"""Datasets as users store them, through a real mount (issue 53): samples of several files,
files in every view, file selection, and the sharded formats read by their own loaders.

Each test mounts a real source with `metfs mount`, walks several epochs of mini-epochs (rf 1,
`pass_end` after each), and checks every view against the source: a sample's files all or
none, bytes equal, every sample exactly once per epoch. The formats' loaders are the real
libraries (`datasets`, `litdata`, `webdataset`; MosaicML Streaming in its own environment, as
`test_formats_index` makes it), opening the mountpoint itself, unmodified.
"""

from __future__ import annotations

import collections
import csv
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from test_formats_index import STREAMING_PINS, child_said, payload, streaming_python, streaming_turn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bindings" / "python" / "src"))

import metfs  # noqa: E402

SAMPLES = 96
assert STREAMING_PINS  # the MDS test's environment is test_formats_index's


def advance(m: Any) -> None:
    """Ends the pass (rf 1) once the next mini-epoch is staged: the view switches."""
    m.wait_next_ready()
    r = m.pass_end()
    assert r["decision"] == "advance", r


def epochs(m: Any, n: int):
    """Yields (epoch, status) at each of the first `n` epochs' mini-epochs, advancing between."""
    nm = m.status()["mini_epochs"]
    for k in range(n * nm):
        st = m.status()
        yield st["epoch"], st
        if k + 1 < n * nm:
            advance(m)


def source_bytes(src: Path) -> dict[str, bytes]:
    return {str(p.relative_to(src)): p.read_bytes() for p in src.rglob("*") if p.is_file()}


# Image and mask pairs


def make_pairs(src: Path, n: int, classes: int) -> dict[str, int]:
    """`images/N.png` and `masks/N.png` (distinct bytes, varying sizes), a class list, and a
    manifest labelling each pair by its image's class. Returns {stem: class}."""
    label = {}
    rows = []
    for i in range(n):
        stem = f"{i:04d}"
        label[stem] = i % classes
        for tree, size in (("images", 6000 + 37 * i), ("masks", 1500 + 11 * i)):
            p = src / tree / f"{stem}.png"
            p.parent.mkdir(parents=True, exist_ok=True)
            data = hashlib.sha256(f"{tree}{i}".encode()).digest() * (size // 32)
            p.write_bytes(data)
            rows.append((f"{tree}/{stem}.png", len(data), f"c{i % classes}"))
    (src / "classes.txt").write_text("".join(f"c{c}\n" for c in range(classes)))
    rows.append(("classes.txt", (src / "classes.txt").stat().st_size, "meta"))
    with open(src.parent / "manifest.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "size", "label"])
        w.writerows(rows)
    return label


class PairDataset:
    """A PyTorch map-style dataset of (image bytes, mask bytes) over a list of paths, as a
    segmentation loader would build it from the view's files."""

    def __init__(self, paths: list[str]) -> None:
        by = collections.defaultdict(dict)
        for p in paths:
            tree, name = p.split("/")[-2:]
            if tree in ("images", "masks"):
                by[name][tree] = p
        self.items = sorted(by.items())

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[str, bytes, bytes]:
        name, pair = self.items[i]
        # A missing mask is a KeyError here: the loader of a real job would crash the same way.
        return name, Path(pair["images"]).read_bytes(), Path(pair["masks"]).read_bytes()


def test_image_and_mask_travel_together_through_the_mount_and_direct_paths(mounts, tmp_path):
    import torch.utils.data

    src = tmp_path / "seg"
    label = make_pairs(src, 120, classes=4)
    want = source_bytes(src)
    m = mounts(
        src,
        "3MiB",
        "--rf",
        "1",
        compose="stratified",
        manifest=tmp_path / "manifest.csv",
        group_by="images/{}.png,masks/{}.png",
        always="classes.txt",
    )
    m.mount()
    nm = m.status()["mini_epochs"]
    assert nm >= 3, m.status()
    client = metfs.Client(m.socket, direct=True)
    switches = 0
    per_epoch: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for epoch, _ in epochs(m, max(2, -(-21 // nm))):
        rel = m.files()["files"]
        assert "classes.txt" in rel
        stems = {p.split("/")[-1][:-4] for p in rel if p.startswith("images/")}
        assert stems == {p.split("/")[-1][:-4] for p in rel if p.startswith("masks/")}, rel
        # Stratified by the image's class: each class within one of its share.
        counts = collections.Counter(label[s] for s in stems)
        for c in range(4):
            assert abs(counts[c] - 30 / nm) < 1 + 1e-9, (counts, nm)
        # Through the mount and through the direct paths, with a PyTorch DataLoader.
        for paths in ([str(m.mountpoint / r) for r in rel], client.files().paths):
            loader = torch.utils.data.DataLoader(
                PairDataset(list(paths)), batch_size=None, num_workers=0
            )
            for name, image, mask in loader:
                assert image == want[f"images/{name}"] and mask == want[f"masks/{name}"], name
        assert (m.mountpoint / "classes.txt").read_bytes() == want["classes.txt"]
        per_epoch[epoch].update(stems)
        switches += 1
    client.release()
    assert switches >= 21
    for epoch, seen in per_epoch.items():
        if len(seen) and epoch < max(per_epoch):
            assert seen == collections.Counter({s: 1 for s in label}), epoch


def test_a_sample_missing_a_file_is_left_out_whole_and_named(mounts, tmp_path):
    src = tmp_path / "seg"
    make_pairs(src, 40, classes=2)
    (src / "masks/0007.png").unlink()
    (src / "images/0011.png").unlink()
    m = mounts(src, "3MiB", "--rf", "1", group_by="images/{}.png,masks/{}.png")
    m.mount()
    seen = set()
    for _ in epochs(m, 1):
        seen |= set(m.files()["files"])
    assert "images/0007.png" not in seen and "masks/0011.png" not in seen
    assert {"images/0006.png", "masks/0006.png"} <= seen
    st = m.status()
    listed = "\n".join(f"{f['path']}: {f['reason']}" for f in st["failed_samples"])
    assert "images/0007.png: its sample is left out whole: missing masks/0007.png" in listed
    assert "masks/0011.png: its sample is left out whole: missing images/0011.png" in listed


def test_a_manifest_group_column_makes_explicit_groups(mounts, tmp_path):
    src = tmp_path / "seg"
    make_pairs(src, 40, classes=2)
    rows = list(csv.reader(open(tmp_path / "manifest.csv")))
    with open(tmp_path / "grouped.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*rows[0], "group"])
        for r in rows[1:]:
            # An image and its mask share their number; the class list is no group's.
            w.writerow([*r, r[0].split("/")[-1][:-4] if "/" in r[0] else ""])
    m = mounts(src, "2MiB", "--rf", "1", manifest=tmp_path / "grouped.csv")
    m.mount()
    assert m.status()["mini_epochs"] >= 2
    seen = collections.Counter()
    for _ in epochs(m, 1):
        rel = m.files()["files"]
        stems = {p.split("/")[-1] for p in rel if p.startswith("images/")}
        assert stems == {p.split("/")[-1] for p in rel if p.startswith("masks/")}, rel
        seen.update(rel)
    assert seen == collections.Counter({r[0]: 1 for r in rows[1:]})
    both = mounts(
        src,
        "2MiB",
        name="both",
        manifest=tmp_path / "grouped.csv",
        group_by="images/{}.png,masks/{}.png",
    )
    r = both.mount(check=False)
    assert r.returncode != 0 and "the manifest groups the files itself" in r.stderr, r.stderr


def test_stem_groups_and_always_files_are_staged_once(mounts, make_tier, tmp_path):
    src = tmp_path / "src"
    for i in range(60):
        (src / "d").mkdir(parents=True, exist_ok=True)
        (src / f"d/{i}.jpg").write_bytes(payload(i) * 100)
        (src / f"d/{i}.json").write_text(json.dumps({"id": i}))
    (src / "annotations.json").write_bytes(b"A" * 60000)
    (src / ".DS_Store").write_bytes(b"junk")
    (src / "d/SHA256SUMS.md5").write_bytes(b"junk")
    want = source_bytes(src)
    m = mounts(
        make_tier(src),
        "2MiB",
        "--rf",
        "1",
        group_by="stem",
        always="annotations.json",
        exclude=[".DS_Store", "*.md5"],
    )
    m.mount()
    nm = m.status()["mini_epochs"]
    assert nm >= 3
    seen = collections.Counter()
    for _ in epochs(m, 1):
        rel = m.files()["files"]
        assert "annotations.json" in rel
        assert not any(r.endswith((".DS_Store", ".md5")) for r in rel), rel
        jpgs = {r[:-4] for r in rel if r.endswith(".jpg")}
        assert jpgs == {r[:-5] for r in rel if r.endswith(".json") and r.startswith("d/")}
        for r in rel:
            assert (m.mountpoint / r).read_bytes() == want[r]
        seen.update(r for r in rel if r.startswith("d/"))
    dealt = {r for r in want if r.startswith("d/") and not r.endswith(".md5")}
    assert seen == collections.Counter({r: 1 for r in dealt})
    # The always file is fetched once per mount, not once per mini-epoch: what the tier gave
    # is every sample of the epoch, the next epoch's first mini-epoch (staged while the last
    # one is read), and the always file once.
    m.wait_next_ready()
    read = m.status()["tier_bytes_read"]
    advance(m)
    first_next = [r for r in m.files()["files"] if r != "annotations.json"]
    # Samples of that first mini-epoch still held on the node are linked, not fetched: so at
    # most these bytes, and at least every sample once; fetched once per mini-epoch, the
    # always file alone would be nm times its size.
    epoch_bytes = sum(len(want[r]) for r in dealt)
    expected = epoch_bytes + sum(len(want[r]) for r in first_next)
    assert epoch_bytes + 60000 <= read <= expected + 60000, (read, expected, nm)
    m.wait_next_ready()
    st = m.status()
    slots = [m.slot_dir(), m.slot_dir(st["epoch"], st["mini_epoch"] + 1)]
    inodes = {(p / "annotations.json").stat().st_ino for p in slots}
    assert len(inodes) == 1, "one copy, linked into every slot"


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"exclude": "*.nope"}, "exclude '*.nope' matches no file"),
        ({"always": "big.bin"}, "always: the files in every view (big.bin)"),
        ({"group_by": "images/{}.png"}, "group_by 'images/{}.png': a template needs two parts"),
        ({"include": "[a-"}, "include '[a-': not a glob"),
        ({"format": "mds"}, "index.json: not in the listing"),
        ({"format": "parquet"}, "unknown format 'parquet'"),
        ({"group_by": "stem", "compose": "random", "transform": "cat"}, "not with a transform"),
    ],
)
def test_bad_sample_settings_are_refused_at_mount_naming_them(mounts, tmp_path, settings, message):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(8):
        (src / f"{i}.bin").write_bytes(payload(i) * 10)
    (src / "big.bin").write_bytes(b"x" * (3 << 20))
    m = mounts(src, "4MiB", **settings)
    r = m.mount(check=False)
    assert r.returncode != 0
    assert message in r.stderr, r.stderr
    slots = m.cache / "slots"
    assert not slots.exists() or not any(slots.iterdir()), "staged before refusing"


def test_an_always_pattern_naming_a_shard_is_refused(mounts, tmp_path):
    import datasets

    src = tmp_path / "hf"
    datasets.Dataset.from_dict({"id": list(range(40))}).save_to_disk(str(src), num_shards=4)
    m = mounts(src, "4MiB", always="data-00001-of-00004.arrow")
    r = m.mount(check=False)
    assert r.returncode != 0
    assert "always: data-00001-of-00004.arrow is a shard of the hf-dataset dataset" in r.stderr
    slots = m.cache / "slots"
    assert not slots.exists() or not any(slots.iterdir()), "staged before refusing"


def test_a_corrupt_index_is_refused_naming_the_file(mounts, tmp_path):
    import datasets

    src = tmp_path / "hf"
    datasets.Dataset.from_dict({"id": list(range(40))}).save_to_disk(str(src), num_shards=4)
    (src / "state.json").write_text('{"_data_files": [')
    m = mounts(src, "4MiB")
    r = m.mount(check=False)
    assert r.returncode != 0
    assert "state.json: does not parse as JSON" in r.stderr, r.stderr


def test_a_dataset_format_is_refused_where_files_are_dealt_one_by_one(mounts, tmp_path):
    """A transform deals files one by one: a Hugging Face dataset would lose its index in
    every view but one. Refused at mount (from the names, before anything is read or staged),
    naming the format, its index file and what to do. A shared mount deals the format's shards
    (the shared-mount tests below), and takes `--format files` to deal its files as asked; an
    aggregate mount deals them too (`test_aggregate_groups`). The names are those
    `save_to_disk` writes, so the test needs no `datasets` (it also runs as an ordinary
    user)."""
    src = tmp_path / "hf"
    src.mkdir()
    (src / "dataset_info.json").write_text("{}")
    (src / "state.json").write_text('{"_data_files": []}')
    for k in range(4):
        (src / f"data-{k:05d}-of-00004.arrow").write_bytes(payload(k) * 100)
    m = mounts(src, "4MiB", "--transform", "cat")
    r = m.mount(check=False)
    assert r.returncode != 0
    assert (
        "looks like a hf-dataset dataset (state.json)" in r.stderr
        and "a transform deals files one by one" in r.stderr
        and "--format files" in r.stderr
    ), r.stderr
    slots = m.cache / "slots"
    assert not slots.exists() or not any(slots.iterdir()), "staged before refusing"
    m = mounts(src, "4MiB", "--share", "--share-jobs", "2", "--format", "files", name="f")
    m.mount()
    assert m.status()["dataset_files"] == len([p for p in src.rglob("*") if p.is_file()])


# Shared mounts: each job's views hold whole samples, the always files and the format's index

# One job of a shared mount (as `test_share`'s): joins, trains `epochs` epochs at rf 1 with
# metfs.passes, and at each view records its files, checks every byte against the source's
# digests (but a Hugging Face dataset's `state.json`, rewritten for each view) and, for such a
# dataset (`hf`), loads the view with `load_from_disk` and records its rows beside the rows of
# the view's own arrow files; then leaves.
JOB = r"""
import hashlib, json, sys, metfs
sock, job, digests, out, epochs, hf = sys.argv[1:7]
digests = json.load(open(digests))
c = metfs.Client(sock, job=job, rf_policy="fixed", rf=1)
res = {"views": [], "bad": [], "rows": [], "share": c.info.share}
for p in metfs.passes(c, epochs=int(epochs)):
    if p.pass_in_mini_epoch == 0:
        res["views"].append([p.epoch, p.mini_epoch, list(p.files)])
        if hf == "1":
            import datasets
            view = datasets.load_from_disk(p.mountpoint)
            own = [
                i
                for path, rel in zip(p.paths, p.files)
                if rel.endswith(".arrow")
                for i in datasets.Dataset.from_file(path)["id"]
            ]
            res["rows"].append([p.epoch, sorted(view["id"]), sorted(own)])
    for path, rel in zip(p.paths, p.files):
        if hf == "1" and rel == "state.json":
            continue  # the view's own index, rewritten to its shards
        with open(path, "rb") as f:
            if hashlib.sha256(f.read()).hexdigest() != digests[rel]:
                res["bad"].append(rel)
    p.report(loss=1.0)
res["status"] = c.status().raw
c.leave()
json.dump(res, open(out, "w"))
"""


def run_jobs(m: Any, tmp: Path, src: Path, names: list[str], epochs: int, hf: bool = False):
    """Runs one JOB per name on shared mount `m` of `src` together; returns their results, and
    every inode of each file of the cache's slots seen while they ran: {name: {inode}}."""
    digests = tmp / "digests.json"
    digests.write_text(
        json.dumps({r: hashlib.sha256(b).hexdigest() for r, b in source_bytes(src).items()})
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT / "bindings" / "python" / "src"))
    procs = {
        n: subprocess.Popen(
            [sys.executable, "-c", JOB, m.socket, n, str(digests), str(tmp / f"job-{n}.json")]
            + [str(epochs), "1" if hf else "0"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in names
    }
    inodes: dict[str, set[int]] = collections.defaultdict(set)
    while any(p.poll() is None for p in procs.values()):
        for f in (m.cache / "slots").glob("*/*"):
            try:
                inodes[f.name].add(f.stat().st_ino)
            except OSError:
                pass  # deleted meanwhile
        time.sleep(0.02)
    results = {}
    for n, p in procs.items():
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, f"job {n} failed: {err[-3000:]}\nlog:\n{m.log()}"
        results[n] = json.loads((tmp / f"job-{n}.json").read_text())
        assert not results[n]["bad"], f"bytes differ from the source: {results[n]['bad'][:5]}"
    return results, inodes


def test_shared_jobs_read_whole_pairs_and_the_always_file_staged_once(mounts, tmp_path):
    src = tmp_path / "seg"
    make_pairs(src, 40, classes=4)
    (src / "classes.txt").write_bytes(b"c\n" * 100_000)  # 200 kB, in every view
    want = source_bytes(src)
    pairs = {r for r in want if r != "classes.txt"}
    m = mounts(
        src,
        "3MiB",
        "--share",
        "--share-jobs",
        "2",
        group_by="images/{}.png,masks/{}.png",
        always="classes.txt",
    )
    m.mount()
    results, inodes = run_jobs(m, tmp_path, src, ["a", "b"], epochs=2)
    for name, res in results.items():
        assert res["share"]["samples"] == 40, res["share"]
        by_epoch = collections.defaultdict(list)
        for epoch, _, files in res["views"]:
            assert "classes.txt" in files, (name, files)
            images = {f.split("/")[1] for f in files if f.startswith("images/")}
            masks = {f.split("/")[1] for f in files if f.startswith("masks/")}
            assert images == masks and images, (name, files)
            by_epoch[epoch].extend(f for f in files if f != "classes.txt")
        views = len(res["views"])
        assert views >= 2 * 3, f"job {name}: {views} views in two epochs"
        for epoch in (0, 1):
            got = by_epoch[epoch]
            assert len(got) == len(set(got)) and set(got) == pairs, (name, epoch)
    # One copy of the always file on the node at any time, hard-linked into every job's slots.
    assert len(inodes["classes.txt"]) == 1, inodes["classes.txt"]
    # The budget holds the whole dataset, so the tier served each pair once (the jobs that drew
    # it share one copy, and its later views link it from the slots kept) and the always file
    # once: fetched per view, it alone would be each view's 200 kB again.
    st = m.status()
    once = sum(len(want[f]) for f in pairs) + len(want["classes.txt"])
    assert st["budget_bytes"] > 2 * once, st
    assert once <= st["tier_bytes_read"] < once + len(want["classes.txt"]), (
        st["tier_bytes_read"],
        once,
    )


def test_a_shared_job_resumes_its_pairs_after_a_kill_9(mounts, tmp_path):
    """The save file holds the cohort's samples; a restart stages the kept slots' files again
    from them: the job resumes at its view, whole pairs and the always file, nothing fetched."""
    from test_share import _all_next_ready, _client

    src = tmp_path / "seg"
    make_pairs(src, 40, classes=4)
    want = source_bytes(src)
    m = mounts(
        src,
        "3MiB",
        "--share",
        "--share-jobs",
        "2",
        "--share-idle-secs",
        "3600",
        "--rf",
        "1",
        group_by="images/{}.png,masks/{}.png",
        always="classes.txt",
        name="r",
    )
    m.mount()

    def view() -> list[str]:
        root = m.mountpoint / "a"
        files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
        for rel in files:
            assert (root / rel).read_bytes() == want[rel], rel
        images = {f.split("/")[1] for f in files if f.startswith("images/")}
        assert "classes.txt" in files and images
        assert images == {f.split("/")[1] for f in files if f.startswith("masks/")}, files
        return files

    def job() -> dict[str, Any]:
        return next(j for j in m.status()["jobs"] if j["name"] == "a")

    c = _client(m, "a")
    for _ in range(2):
        view()
        while c.pass_end({"loss": 1.0}).decision != "advance":
            time.sleep(0.05)
    last = view()
    _all_next_ready(m, ["a"])
    before = job()
    token = c.info.share["token"]
    c.close()
    os.kill(m.pid(), signal.SIGKILL)
    time.sleep(0.5)
    m.mount()
    assert "job resumed from its kept slots" in (m.cache / "metfs.log").read_text(errors="replace")
    c = _client(m, "a", token)
    after = job()
    for k in ("epoch", "mini_epoch", "generation", "samples", "files", "view_bytes"):
        assert after[k] == before[k], (k, before, after)
    assert view() == last
    _all_next_ready(m, ["a"])
    assert m.status()["tier_bytes_read"] == 0, "the kept slots held every file"
    while c.pass_end({"loss": 1.0}).decision != "advance":
        time.sleep(0.05)
    view()
    c.leave()
    c.close()


def test_shared_jobs_load_each_view_of_a_hugging_face_dataset(mounts, tmp_path):
    import datasets

    src = tmp_path / "hf"
    rows = 320
    ds = datasets.Dataset.from_dict(
        {"id": list(range(rows)), "data": [payload(i) * 40 for i in range(rows)]}
    )
    ds.save_to_disk(str(src), num_shards=8)
    m = mounts(src, "3MiB", "--share", "--share-jobs", "2")
    m.mount()
    assert "format=hf-dataset" in m.log()
    results, _ = run_jobs(m, tmp_path, src, ["a", "b"], epochs=2, hf=True)
    for name, res in results.items():
        assert res["share"]["samples"] == 8, res["share"]
        assert len(res["views"]) >= 4, f"job {name}: {len(res['views'])} views in two epochs"
        per_epoch = collections.defaultdict(collections.Counter)
        for (epoch, loaded, own), (_, _, files) in zip(res["rows"], res["views"], strict=True):
            # The view's index names exactly its own shards: its rows, no other view's.
            assert loaded == own and loaded, (name, epoch, files)
            assert {"state.json", "dataset_info.json"} <= set(files), files
            per_epoch[epoch].update(loaded)
        for epoch in (0, 1):
            assert per_epoch[epoch] == collections.Counter(range(rows)), (name, epoch)


def test_a_dataset_dict_on_a_shared_mount_deals_one_split(mounts, tmp_path):
    """A shared mount's views are drawn without regard to splits: two dealt splits are refused
    at mount, naming the fix; with the test split whole in every view, each job's view loads,
    its train rows those of its own arrow files."""
    import datasets

    from test_share import _client

    src = tmp_path / "hfd"

    def split(base: int, k: int) -> datasets.Dataset:
        return datasets.Dataset.from_dict(
            {"id": list(range(base, base + k)), "data": [payload(i) * 10 for i in range(k)]}
        )

    datasets.DatasetDict({"train": split(0, 320), "test": split(10_000, 64)}).save_to_disk(
        str(src), num_shards={"train": 8, "test": 2}
    )
    share = ("--share", "--share-jobs", "2", "--rf", "1")
    m = mounts(src, "3MiB", *share, name="refused")
    r = m.mount(check=False)
    assert r.returncode != 0 and "is dealt beside other splits on a shared mount" in r.stderr
    assert "--always 'train/*'" in r.stderr or "--always 'test/*'" in r.stderr, r.stderr
    m = mounts(src, "3MiB", *share, always="test/*")
    m.mount()
    c = _client(m, "a")
    rows: collections.Counter = collections.Counter()
    views = 0
    while True:
        root = m.mountpoint / "a"
        st = next(j for j in m.status()["jobs"] if j["name"] == "a")
        if st["epoch"] > 0:
            break
        view = datasets.load_from_disk(str(root))
        assert sorted(view["test"]["id"]) == list(range(10_000, 10_064))
        own = [
            i
            for p in sorted(root.glob("train/*.arrow"))
            for i in datasets.Dataset.from_file(str(p))["id"]
        ]
        assert sorted(view["train"]["id"]) == sorted(own) and own
        rows.update(own)
        views += 1
        while c.pass_end({"loss": 1.0}).decision != "advance":
            time.sleep(0.05)
    assert rows == collections.Counter(range(320)) and views >= 2, views
    c.leave()
    c.close()


# The formats, read by their own loaders from the mountpoint


def test_load_from_disk_reads_each_view_and_an_epoch_is_every_row_once(mounts, make_tier, tmp_path):
    import datasets

    src = tmp_path / "hf"
    ds = datasets.Dataset.from_dict(
        {"id": list(range(SAMPLES * 4)), "data": [payload(i) * 40 for i in range(SAMPLES * 4)]}
    )
    ds.save_to_disk(str(src), num_shards=16)
    # From a POSIX directory and from S3 (the index files read through the tier at mount).
    m = mounts(make_tier(src), "2MiB", "--rf", "1")
    m.mount()
    assert "format=hf-dataset" in m.log()
    nm = m.status()["mini_epochs"]
    assert nm >= 3, m.status()
    rows: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    fingerprints = set()
    for epoch, _ in epochs(m, 2):
        view = datasets.load_from_disk(str(m.mountpoint))
        for i, data in zip(view["id"], view["data"], strict=True):
            assert data == payload(i) * 40, i
            rows[epoch][i] += 1
        fingerprints.add(view._fingerprint)
        assert {"state.json", "dataset_info.json"} <= set(m.files()["files"])
    for epoch in (0, 1):
        assert rows[epoch] == collections.Counter(range(SAMPLES * 4)), epoch
    assert len(fingerprints) > 1, "each view is its own dataset to the cache"


def test_a_dataset_dict_deals_train_and_shows_test_whole(mounts, tmp_path):
    import datasets

    src = tmp_path / "hfd"
    n = SAMPLES * 4

    def split(base: int, k: int) -> datasets.Dataset:
        return datasets.Dataset.from_dict(
            {"id": list(range(base, base + k)), "data": [payload(i) * 10 for i in range(k)]}
        )

    datasets.DatasetDict({"train": split(0, n), "test": split(10_000, 64)}).save_to_disk(
        str(src), num_shards={"train": 16, "test": 2}
    )
    # A split with fewer arrow files than mini-epochs cannot be in every view: refused, naming
    # it and the fix.
    m = mounts(src, "2MiB", "--rf", "1", name="refused", compose="stratified")
    r = m.mount(check=False)
    assert r.returncode != 0 and "test has 2 arrow files for" in r.stderr, r.stderr
    assert "--always 'test/*'" in r.stderr
    m = mounts(src, "2MiB", "--rf", "1", compose="stratified", always="test/*")
    m.mount()
    rows = collections.Counter()
    for _ in epochs(m, 1):
        view = datasets.load_from_disk(str(m.mountpoint))
        assert sorted(view["test"]["id"]) == list(range(10_000, 10_064))
        for i, data in zip(view["train"]["id"], view["train"]["data"], strict=True):
            assert data == payload(i) * 10, i
            rows[i] += 1
    assert rows == collections.Counter(range(n))


def test_litdata_streaming_dataset_reads_each_view(mounts, tmp_path):
    import litdata
    from litdata.streaming.writer import BinaryWriter

    src = tmp_path / "lit"
    w = BinaryWriter(str(src), chunk_size=6)
    for i in range(SAMPLES):
        w[i] = {"id": i, "data": payload(i) * 60}
    w.done()
    w.merge()
    m = mounts(src, "2MiB", "--rf", "1")
    m.mount()
    assert "format=litdata" in m.log()
    seen = collections.Counter()
    for _ in epochs(m, 1):
        ds = litdata.StreamingDataset(input_dir=str(m.mountpoint), cache_dir=str(tmp_path / "lc"))
        # As litdata's documentation loads: its loader's workers map the chunks, and end with
        # the epoch, so the view they read can be let go (the loader's process itself keeps
        # every chunk it maps for its life: the old view's slot could never be freed).
        loader = litdata.StreamingDataLoader(ds, batch_size=1, num_workers=1)
        n = 0
        for batch in loader:
            i = int(batch["id"][0])
            assert bytes(batch["data"][0]) == payload(i) * 60, i
            seen[i] += 1
            n += 1
        assert n == len(ds)
        del loader, ds
    assert seen == collections.Counter(range(SAMPLES))


def test_webdataset_shards_travel_with_their_index_files(mounts, tmp_path):
    import webdataset as wds

    src = tmp_path / "wds"
    (src / "shards").mkdir(parents=True)
    with wds.ShardWriter(str(src / "shards/part-%04d.tar"), maxcount=8, verbose=0) as sink:
        for i in range(SAMPLES):
            sink.write({"__key__": f"s{i:05d}", "id.txt": str(i), "data.bin": payload(i) * 30})
    for t in (src / "shards").glob("*.tar"):
        t.with_suffix(".idx").write_text(t.name + "\n")
    m = mounts(src, "2MiB", "--rf", "1")
    m.mount()
    assert "format=webdataset" in m.log()
    seen = collections.Counter()
    for _ in epochs(m, 1):
        rel = m.files()["files"]
        tars = [r for r in rel if r.endswith(".tar")]
        assert tars and {r[:-4] for r in tars} == {r[:-4] for r in rel if r.endswith(".idx")}
        for s in wds.WebDataset([str(m.mountpoint / t) for t in tars], shardshuffle=False):
            assert s["data.bin"] == payload(int(s["id.txt"])) * 30
            seen[int(s["id.txt"])] += 1
    assert seen == collections.Counter(range(SAMPLES))


MDS_CHILD = r"""
import hashlib, json, sys
from streaming import MDSWriter, StreamingDataset

# Writes the source, says so, then reads the mountpoint each time a line arrives on stdin
# (one process: importing streaming takes seconds).
src, n, mnt = sys.argv[1], int(sys.argv[2]), sys.argv[3]
with MDSWriter(out=src, columns={"id": "int", "data": "bytes"}, size_limit=1 << 14) as w:
    for i in range(n):
        w.write({"id": i, "data": hashlib.sha256(str(i).encode()).digest() * (1 + i % 5) * 100})
print("written", flush=True)
for _ in sys.stdin:
    ds = StreamingDataset(local=mnt, remote=None, shuffle=False, batch_size=1)
    rows = [[int(s["id"]), hashlib.sha256(s["data"]).hexdigest()] for s in ds]
    print(json.dumps({"len": len(ds), "rows": rows}), flush=True)
    del ds
"""


def test_mds_streaming_dataset_reads_each_view(mounts, tmp_path):
    python = streaming_python()
    src = tmp_path / "mds"
    m = mounts(src, "2MiB", "--rf", "1")
    with streaming_turn():
        child = subprocess.Popen(
            [str(python), "-c", MDS_CHILD, str(src), str(SAMPLES), str(m.mountpoint)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, PYTHONWARNINGS="ignore"),
        )
        assert child.stdin is not None and child.stdout is not None
        try:
            child_said(child, "written\n")
            m.mount()
            assert "format=mds" in m.log()
            seen = collections.Counter()
            for _ in epochs(m, 1):
                child.stdin.write("read\n")
                child.stdin.flush()
                line = child.stdout.readline()
                assert line, child.stderr.read() if child.stderr else ""
                res = json.loads(line)
                assert res["len"] == len(res["rows"])
                for i, digest in res["rows"]:
                    want = hashlib.sha256(str(i).encode()).digest() * (1 + i % 5) * 100
                    assert digest == hashlib.sha256(want).hexdigest(), i
                    seen[i] += 1
            assert seen == collections.Counter(range(SAMPLES))
        finally:
            child.kill()
            child.wait()
