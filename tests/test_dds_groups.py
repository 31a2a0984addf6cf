"""Sample groups with dynamic sharding, through real mounts: `metfs dds init --group-by` on a
segmentation-like source (`images/N.png` with `masks/N.png`, a class list in every view), two
daemons (`metfs mount --dds`, one per node) draining an epoch of the queue in a real etcd, each
with a reader that checks every view it is shown and records what it reads through its mount."""

from __future__ import annotations

import collections
import hashlib
import json
import subprocess
import time
from pathlib import Path
from typing import Any

from conftest import Etcd
from test_dds_mount import Reader, dds_mounts, done_shards, shards, wait_epoch_done

PAIRS = 80
TEMPLATE = "images/{}.png,masks/{}.png"
GROUPS = {"group_by": TEMPLATE, "always": "classes.txt"}


def make_pairs(src: Path) -> dict[str, str]:
    """`PAIRS` image and mask pairs of distinct bytes and sizes, a class list, and an image
    without its mask (a sample left out whole): {path: sha256} of every file."""
    files = {"classes.txt": b"background\nforeground\n"}
    for i in range(PAIRS):
        files[f"images/{i:03d}.png"] = hashlib.sha256(b"i%d" % i).digest() * (180 + i)
        files[f"masks/{i:03d}.png"] = hashlib.sha256(b"m%d" % i).digest() * (50 + i)
    files["images/stray.png"] = b"s" * 5000
    for rel, data in files.items():
        p = src / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return {rel: hashlib.sha256(data).hexdigest() for rel, data in files.items()}


def run(metfs: str, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([metfs, *args], capture_output=True, text=True, timeout=60)
    if ok:
        assert r.returncode == 0, r.stderr
    return r


def init(metfs: str, url: str, src: Path, *extra: str, ok: bool = True) -> Any:
    return run(
        metfs,
        "dds",
        "init",
        url,
        "--source",
        str(src),
        "--budget",
        "2MiB",
        "--compose",
        "stratified",
        *extra,
        ok=ok,
    )


def test_two_nodes_drain_an_epoch_of_image_and_mask_pairs(
    mounts: Any, etcd: Etcd, tmp_path: Path, metfs: str
) -> None:
    src = tmp_path / "seg"
    digests = make_pairs(src)
    url = etcd.url("seg")
    out = init(metfs, url, src, "--group-by", TEMPLATE, "--always", "classes.txt").stdout
    assert f"({PAIRS} samples by group_by '{TEMPLATE}', always 'classes.txt')" in out, out
    meta = json.loads(run(metfs, "dds", "status", url, "--json").stdout)["meta"]
    assert meta["samples"] == PAIRS, meta
    assert meta["sample_settings"] == f"group_by '{TEMPLATE}', always 'classes.txt'", meta
    assert meta["shards"] >= 4, meta
    ms = dds_mounts(mounts, src, etcd, "seg", 2, **GROUPS)
    for m in ms:
        m.mount()
    readers = [Reader(m) for m in ms]
    for r in readers:
        r.start()
    wait_epoch_done(etcd, "seg", 0, 120)
    for r in readers:
        r.stop.set()
    for r in readers:
        r.join(timeout=30)
        assert r.error is None, r.error
    # Every view holds whole pairs and the class list.
    for r in readers:
        assert r.views, "a node was shown no view"
        for files in r.views:
            assert "classes.txt" in files, files
            stems = {f[len("images/") :] for f in files if f.startswith("images/")}
            assert stems == {f[len("masks/") :] for f in files if f.startswith("masks/")}, files
            assert "images/stray.png" not in files
    # Every pair of the epoch read exactly once between the nodes, with the tier's bytes, and
    # the class list whole in every view.
    epoch0 = [(p, h) for r in readers for (e, p, h) in r.reads if e == 0]
    pairs = sorted(p for p, _ in epoch0 if p != "classes.txt")
    want = sorted(p for p in digests if p not in ("classes.txt", "images/stray.png"))
    assert pairs == want, (len(pairs), len(want))
    assert all(digests[p] == h for p, h in epoch0)
    assert all(any(e == 0 for e, _, _ in r.reads) for r in readers), "both nodes took part"
    holders = {d["node"] for d in done_shards(etcd, "seg", 0)}
    assert holders == {"n0", "n1"} and len(done_shards(etcd, "seg", 0)) == shards(etcd, "seg")
    for m in ms:
        st = m.status()
        assert st["dds"]["last_error"] is None, st["dds"]
        failed = {f["path"]: f["reason"] for f in st["failed_samples"]}
        assert "missing masks/stray.png" in failed.get("images/stray.png", ""), failed


def test_a_mount_of_other_sample_settings_is_refused_naming_both(
    mounts: Any, etcd: Etcd, tmp_path: Path, metfs: str
) -> None:
    src = tmp_path / "seg"
    make_pairs(src)
    url = etcd.url("other")
    init(metfs, url, src, "--group-by", TEMPLATE, "--always", "classes.txt")
    for name, settings, ours in [
        ("files", {}, "this node has every file a sample"),
        ("no-always", {"group_by": TEMPLATE}, f"this node has samples by group_by '{TEMPLATE}';"),
    ]:
        m = mounts(src, "2MiB", "--dds", url, "--compose", "stratified", name=name, **settings)
        r = m.mount(check=False)
        assert r.returncode != 0
        made = f"made with samples by group_by '{TEMPLATE}', always 'classes.txt'"
        assert made in r.stderr and ours in r.stderr and url in r.stderr, r.stderr
        slots = m.cache / "slots"
        assert not slots.exists() or not any(slots.iterdir()), "staged before refusing"
    # A queue made without the settings deals files; a grouped mount on it is refused too.
    files_url = etcd.url("files")
    init(metfs, files_url, src)
    m = mounts(src, "2MiB", "--dds", files_url, "--compose", "stratified", name="g", **GROUPS)
    r = m.mount(check=False)
    assert r.returncode != 0 and "made with every file a sample" in r.stderr, r.stderr


def test_init_refuses_a_group_by_that_groups_nothing(
    etcd: Etcd, tmp_path: Path, metfs: str
) -> None:
    src = tmp_path / "seg"
    make_pairs(src)
    r = init(metfs, etcd.url("bad"), src, "--group-by", "img/{}.png,msk/{}.png", ok=False)
    assert r.returncode != 0
    assert "group_by 'img/{}.png,msk/{}.png' groups no two files" in r.stderr, r.stderr
    r = run(metfs, "dds", "status", etcd.url("bad"), ok=False)
    assert "no queue at" in r.stderr, "nothing made"


def test_a_pair_whose_mask_cannot_be_staged_is_left_out_whole(
    mounts: Any, etcd: Etcd, tmp_path: Path, metfs: str
) -> None:
    """The manifest (of `metfs dds init` and the mount alike) gives one mask a size the source
    does not have: its staging fails, and the pair is in no view while every other pair is
    read once."""
    src = tmp_path / "seg"
    digests = make_pairs(src)
    del digests["images/stray.png"]
    (src / "images/stray.png").unlink()
    manifest = tmp_path / "manifest.csv"
    rows = ["path,size"]
    for rel in sorted(digests):
        size = (src / rel).stat().st_size
        rows.append(f"{rel},{size + 1 if rel == 'masks/007.png' else size}")
    manifest.write_text("\n".join(rows) + "\n")
    url = etcd.url("bad-mask")
    init(
        metfs,
        url,
        src,
        "--manifest",
        str(manifest),
        "--group-by",
        TEMPLATE,
        "--always",
        "classes.txt",
    )
    [m] = dds_mounts(mounts, src, etcd, "bad-mask", 1, manifest=manifest, **GROUPS)
    m.mount()
    reader = Reader(m)
    reader.start()
    wait_epoch_done(etcd, "bad-mask", 0, 120)
    reader.stop.set()
    reader.join(timeout=30)
    assert reader.error is None, reader.error
    assert not any("007.png" in f for files in reader.views for f in files), "pair 7 shown"
    read = sorted(p for e, p, _ in reader.reads if e == 0 and p != "classes.txt")
    want = sorted(p for p in digests if p != "classes.txt" and "007.png" not in p)
    assert read == want, (len(read), len(want))
    failed = {f["path"]: f["reason"] for f in m.status()["failed_samples"]}
    assert "masks/007.png" in failed, failed


def test_two_nodes_read_a_hugging_face_dataset_with_its_own_loader(
    mounts: Any, etcd: Etcd, tmp_path: Path
) -> None:
    """A Hugging Face `datasets` directory (16 arrow shards) under dynamic sharding: the mounts
    detect the format and the queue deals its shards; every view of each node opens with
    `datasets.load_from_disk(MNT)` unmodified and yields its shards' rows with the source's
    bytes, and over epoch 0 the two nodes' views yield every row exactly once."""
    import datasets
    from test_formats_index import payload

    src = tmp_path / "hf"
    rows = 640
    data = {"id": list(range(rows)), "data": [payload(i) * 40 for i in range(rows)]}
    datasets.Dataset.from_dict(data).save_to_disk(str(src), num_shards=16)
    ms = dds_mounts(mounts, src, etcd, "hf", 2)
    for m in ms:
        m.mount()
        assert "format=hf-dataset" in m.log()
    seen: list[set[int]] = [set() for _ in ms]
    read: collections.Counter[int] = collections.Counter()
    views = 0
    deadline = time.monotonic() + 120
    while len(done_shards(etcd, "hf", 0)) < shards(etcd, "hf"):
        assert time.monotonic() < deadline, "epoch 0 not done"
        for m, mine in zip(ms, seen, strict=True):
            v = m.files()
            if v["epoch"] == 0 and v["generation"] not in mine:
                mine.add(v["generation"])
                assert {"state.json", "dataset_info.json"} <= set(v["files"]), v["files"]
                view = datasets.load_from_disk(str(m.mountpoint))
                for i, d in zip(view["id"], view["data"], strict=True):
                    assert d == payload(i) * 40, i
                    read[i] += 1
                views += 1
            m.pass_end()
        time.sleep(0.02)
    assert read == collections.Counter(range(rows)), sorted(set(range(rows)) - set(read))
    assert all(seen), "both nodes took part"
    assert views >= 3, views
