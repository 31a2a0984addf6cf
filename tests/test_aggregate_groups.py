"""Aggregate-cache mode over samples of several files (issue 53): four daemons with real
mounts and their exchange, `metfs-shuffle`, under a real `mpirun -np 4`, as in
`test_aggregate`. The daemons and every rank of the exchange plan over the same sample groups
(`CACHE/groups.bin`, named in the spec with its digest): a pair's files are in the same
node's view every epoch and cross between nodes together, a file in every view is staged once
per node and never moved, and a Hugging Face dataset's views load with `load_from_disk`, each
node's rows its share's, every row once per epoch."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Callable

import pytest

from conftest import Mount
from test_aggregate import CODED, NODES, Cluster, mpirun, reports
from test_sample_groups import make_pairs, payload, source_bytes

PAIRS = ("--group-by", "images/{}.png,masks/{}.png", "--always", "classes.txt")


def digests_of(src: Path, tmp: Path) -> Path:
    path = tmp / "digests.json"
    path.write_text(
        json.dumps({r: hashlib.sha256(b).hexdigest() for r, b in source_bytes(src).items()})
    )
    return path


def views_by_epoch(res: list[dict[str, Any]], epochs: int) -> list[list[set[str]]]:
    """Each epoch's views, one per node; every node read bytes equal to the source's."""
    assert all(not r["bad"] for r in res), [r["bad"][:3] for r in res]
    out = []
    for e in range(epochs):
        views = [set(f) for r in res for ep, f in r["views"] if ep == e]
        assert len(views) == NODES, f"epoch {e}: {len(views)} views"
        out.append(views)
    return out


@pytest.mark.parametrize("code", [(), CODED], ids=["uncoded", "uberShuffle"])
def test_pairs_stay_whole_across_nodes_and_the_always_file_is_never_moved(
    mounts: Callable[..., Mount], tmp_path: Path, code: tuple[str, ...]
) -> None:
    src = tmp_path / "seg"
    make_pairs(src, 80, classes=4)
    files = source_bytes(src)
    c = Cluster(mounts, tmp_path, src, args=(*PAIRS, *code))
    c.mount()
    assert (c.nodes[0].cache / "groups.bin").is_file()
    first = c.epoch0_tier_bytes()
    ex = mpirun(tmp_path, "--epochs", "3")
    res = c.train(digests_of(src, tmp_path), 3)
    out, err = ex.communicate(timeout=120)
    assert ex.returncode == 0, err[-3000:]
    parts = views_by_epoch(res, 3)
    pairs = {f for f in files if f != "classes.txt"}
    for e, views in enumerate(parts):
        for v in views:
            assert "classes.txt" in v, f"epoch {e}: a view without the always file"
            images = {f.split("/")[1] for f in v if f.startswith("images/")}
            masks = {f.split("/")[1] for f in v if f.startswith("masks/")}
            assert images == masks, f"epoch {e}: split pairs {sorted(images ^ masks)[:4]}"
        dealt = [v - {"classes.txt"} for v in views]
        assert set().union(*dealt) == pairs and sum(map(len, dealt)) == len(pairs), (
            f"epoch {e} is not every pair once"
        )
    assert parts[0] != parts[1] != parts[2], "the shares did not change between epochs"
    st = [m.status() for m in c.nodes]
    # Epoch 0 read each node's cache: without extras every pair once, and each node its own
    # copy of the always file. Later epochs came from the other nodes.
    if not code:
        want = sum(len(files[f]) for f in pairs) + NODES * len(files["classes.txt"])
        assert sum(first) == want, first
    assert [s["tier_bytes_read"] for s in st] == first
    assert all(s["aggregate"]["last_exchange"]["complete"] for s in st), st[0]["aggregate"]
    rep = reports(out)
    assert len(rep) == 3 * NODES and all(r["rejected"] == 0 and r["missing"] == 0 for r in rep), rep
    assert sum(r["received_samples"] for r in rep) > 0


def test_each_nodes_view_of_a_hugging_face_dataset_loads_its_share(
    mounts: Callable[..., Mount], tmp_path: Path
) -> None:
    import datasets

    src = tmp_path / "hf"
    rows = 96
    datasets.Dataset.from_dict(
        {"id": list(range(rows)), "data": [payload(i) for i in range(rows)]}
    ).save_to_disk(str(src), num_shards=8)
    c = Cluster(mounts, tmp_path, src)
    c.mount()
    assert (c.nodes[0].mountpoint / "state.json").is_file()
    ex = mpirun(tmp_path, "--epochs", "2")
    res = c.train(digests_of(src, tmp_path), 2)
    out, err = ex.communicate(timeout=120)
    assert ex.returncode == 0, err[-3000:]
    views_by_epoch(res, 2)
    for e in range(2):
        got = [ids for r in res for ep, ids in r["rows"] if ep == e]
        assert len(got) == NODES and all(got), f"epoch {e}: {[len(g) for g in got]} rows"
        every = sorted(i for ids in got for i in ids)
        assert every == list(range(rows)), f"epoch {e} is not every row once"
    assert all(r["rejected"] == 0 and r["missing"] == 0 for r in reports(out))


def test_nodes_grouping_differently_are_refused_by_every_rank(
    mounts: Callable[..., Mount], tmp_path: Path
) -> None:
    src = tmp_path / "seg"
    make_pairs(src, 40, classes=4)
    c = Cluster(mounts, tmp_path, src, node_args=[PAIRS, PAIRS, PAIRS, ()])
    c.mount()
    err = c.refused()
    assert "sample groups digest differs" in err and "--group-by" in err, err[-2000:]


def test_a_dataset_dict_whose_split_some_share_would_lack_is_refused(
    mounts: Callable[..., Mount], tmp_path: Path
) -> None:
    """A share is drawn without regard to splits: two dealt splits, or a split of fewer arrow
    files than nodes, would leave some node's view without a split its loader needs. Refused
    at mount, naming the split and what to do; with the second split in every view, mounted."""
    import datasets

    src = tmp_path / "hfd"

    def split(base: int, k: int) -> datasets.Dataset:
        return datasets.Dataset.from_dict(
            {"id": list(range(base, base + k)), "data": [payload(i) for i in range(k)]}
        )

    datasets.DatasetDict({"train": split(0, 160), "test": split(10_000, 32)}).save_to_disk(
        str(src), num_shards={"train": 8, "test": 2}
    )
    node = ("--aggregate", "--nodes", str(NODES), "--node-rank", "0")
    r = mounts(src, "5MiB", *node, name="both").mount(check=False)
    assert r.returncode != 0, r.stderr
    assert "is dealt beside other splits on an aggregate mount" in r.stderr, r.stderr
    r = mounts(src, "5MiB", *node, "--always", "train/*", name="few").mount(check=False)
    assert r.returncode != 0, r.stderr
    assert "test has 2 arrow files for 4 nodes' shares" in r.stderr, r.stderr
    m = mounts(src, "5MiB", *node, "--always", "test/*", name="ok")
    m.mount()
    assert (m.mountpoint / "test" / "state.json").is_file()
