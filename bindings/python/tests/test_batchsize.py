"""ADJUST_BS (paper 003, §VI-A): per-rank batch sizes from the nodes' throughputs, adding up to
the global batch, and AntDT's straggler trigger with the step at which every rank adopts new
sizes together. `tests/test_slurm.py` runs it on two Slurm nodes with three ranks each."""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Callable
from typing import Any

import pytest
from fake_daemon import FakeDaemon

import metfs
from metfs.batchsize import AdjustBs, StragglerTrigger, rank_batch_sizes
from metfs.coordinator import Coordinator, LocalCoordinator

# -- rank_batch_sizes ---------------------------------------------------------------------------


def test_sizes_add_up_and_every_rank_keeps_one() -> None:
    rng = random.Random(3)
    for _ in range(500):
        nodes = [f"n{i}" for i in range(rng.randint(1, 6))]
        ranks = {n: rng.randint(1, 8) for n in nodes}
        v = {n: rng.choice([0.0, rng.uniform(0.1, 1000)]) for n in nodes}
        b = rng.randint(sum(ranks.values()), 5000)
        sizes = rank_batch_sizes(b, v, ranks)
        assert sorted(sizes) == sorted(nodes)
        assert sum(map(sum, sizes.values())) == b
        for n in nodes:
            assert len(sizes[n]) == ranks[n] and min(sizes[n]) >= 1
            # A node's share is split evenly: its ranks differ by one sample at most, the
            # lower local ranks taking the extra ones.
            assert max(sizes[n]) - min(sizes[n]) <= 1 and sizes[n] == sorted(sizes[n])[::-1]


def test_sizes_follow_throughput() -> None:
    one = dict.fromkeys("abc", 1)
    assert rank_batch_sizes(256, {"a": 4.0, "b": 4.0, "c": 1.0}, one) == {
        "a": [114],
        "b": [114],
        "c": [28],
    }
    # Steps take about equally long: no rank's time is more than two samples' above the best
    # possible, b / sum(v) (one for the sample every rank keeps, one for rounding).
    # (Ranks' times are in their own throughput: v / ranks per rank.)
    rng = random.Random(5)
    for _ in range(500):
        nodes = [f"n{i}" for i in range(rng.randint(1, 5))]
        ranks = {n: rng.randint(1, 6) for n in nodes}
        v = {n: rng.uniform(1, 100) for n in nodes}
        b = rng.randint(sum(ranks.values()), 5000)
        sizes = rank_batch_sizes(b, v, ranks)
        ideal = b / sum(v.values())
        per_rank = {n: v[n] / ranks[n] for n in nodes}
        worst = max(max(sizes[n]) / per_rank[n] for n in nodes)
        assert worst <= ideal + 2 / min(per_rank.values()) + 1e-9


def test_a_nodes_share_is_split_over_its_ranks() -> None:
    # Equal nodes, one with six ranks, one with two: each node takes half of the batch, and
    # each rank a sixth or a half of that (not the node's whole share on every rank).
    assert rank_batch_sizes(96, {"a": 1.0, "b": 1.0}, {"a": 6, "b": 2}) == {
        "a": [8] * 6,
        "b": [24, 24],
    }
    # Three ranks per node, the second node a third as fast: 18 and 6, over three ranks each.
    assert rank_batch_sizes(24, {"n1": 300.0, "n2": 100.0}, {"n1": 3, "n2": 3}) == {
        "n1": [6, 6, 6],
        "n2": [2, 2, 2],
    }
    # A tenth as fast: its share (2.2) is under its three ranks, so it keeps one per rank and
    # the other node takes the rest.
    assert rank_batch_sizes(24, {"n1": 300.0, "n2": 30.0}, {"n1": 3, "n2": 3}) == {
        "n1": [7, 7, 7],
        "n2": [1, 1, 1],
    }
    # Rounding: 25 at 2:1 is 16.67 and 8.33, so 17 and 8; the larger remainder takes the extra.
    assert rank_batch_sizes(25, {"n1": 2.0, "n2": 1.0}, {"n1": 3, "n2": 3}) == {
        "n1": [6, 6, 5],
        "n2": [3, 3, 2],
    }
    # Nothing measured yet: the even split, B / n per rank.
    assert rank_batch_sizes(24, {"n1": 0.0, "n2": 0.0}, {"n1": 3, "n2": 3}) == {
        "n1": [4, 4, 4],
        "n2": [4, 4, 4],
    }
    # A node not measured yet is taken at the others' mean per rank (6 / 3 = 2 per rank).
    assert rank_batch_sizes(12, {"a": 6.0, "b": 0.0}, {"a": 3, "b": 1}) == {
        "a": [3, 3, 3],
        "b": [3],
    }
    assert rank_batch_sizes(90, {"a": 2.0, "b": 0.0, "c": 4.0}, dict.fromkeys("abc", 1)) == {
        "a": [20],
        "b": [30],
        "c": [40],
    }


def test_sizes_are_deterministic() -> None:
    v = {"n2": 1.0, "n1": 1.0, "n3": 1.0}
    r = {"n3": 2, "n1": 2, "n2": 2}
    first = rank_batch_sizes(11, v, r)
    # Ties go to the node whose name sorts first, whatever the order of the mappings.
    assert first == {"n1": [2, 2], "n2": [2, 2], "n3": [2, 1]}
    for _ in range(20):
        keys = list(v)
        random.shuffle(keys)
        assert rank_batch_sizes(11, {k: v[k] for k in keys}, dict(reversed(r.items()))) == first
    # Throughputs that round alike as floats give the same sizes, tie or not.
    a = rank_batch_sizes(7, {"x": 0.1 + 0.2, "y": 0.3}, {"x": 1, "y": 1})
    assert a == rank_batch_sizes(7, {"x": 0.1 + 0.2, "y": 0.3}, {"x": 1, "y": 1})
    assert sum(map(sum, a.values())) == 7


def test_bad_input_is_refused_naming_the_setting() -> None:
    with pytest.raises(ValueError, match="global_batch 5 is smaller than the 6 ranks"):
        rank_batch_sizes(5, {"a": 1.0, "b": 1.0}, {"a": 3, "b": 3})
    with pytest.raises(TypeError, match="global_batch must be an int"):
        rank_batch_sizes(8.0, {"a": 1.0}, {"a": 1})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"ranks_per_node\['a'\] must be a positive int"):
        rank_batch_sizes(8, {"a": 1.0}, {"a": 0})
    with pytest.raises(
        ValueError, match=r"node_throughputs\['b'\] must be finite and non-negative"
    ):
        rank_batch_sizes(8, {"a": 1.0, "b": -1.0}, {"a": 1, "b": 1})
    with pytest.raises(ValueError, match=r"node_throughputs\['a'\]"):
        rank_batch_sizes(8, {"a": math.inf}, {"a": 1})
    with pytest.raises(ValueError, match="name different nodes"):
        rank_batch_sizes(8, {"a": 1.0}, {"b": 1})
    with pytest.raises(ValueError, match="no nodes"):
        rank_batch_sizes(8, {}, {})


# -- the trigger --------------------------------------------------------------------------------


def cumulative(
    rates: dict[str, float], ranks: int, t: float
) -> dict[str, list[tuple[float, float]]]:
    """Each rank's cumulative (samples, seconds) after working `t` seconds at `rate` per rank."""
    return {n: [(rate * t, t)] * ranks for n, rate in rates.items()}


def test_no_straggler_no_change_until_a_full_window() -> None:
    trig = StragglerTrigger(slowness=1.5, window_s=10)
    even = {"n1": [4, 4, 4], "n2": [4, 4, 4]}
    trig.observe(0, cumulative({"n1": 0, "n2": 0}, 3, 0))
    trig.observe(5, cumulative({"n1": 100, "n2": 10}, 3, 5))
    # Half a window: nothing is decided, however slow a node looks.
    assert trig.check(even) is None
    trig.observe(10, cumulative({"n1": 100, "n2": 60}, 3, 10))
    check = trig.check(even)
    assert check is not None and check.window_s == 10
    # n2 at 0.6 of n1 is slower, but its BPT (4/180 s) is under 1.5 x the mean (4/240+4/180)/2.
    assert check.throughputs == pytest.approx({"n1": 300, "n2": 180})
    assert check.stragglers == []


def test_a_straggler_over_the_recent_window() -> None:
    trig = StragglerTrigger(slowness=1.5, window_s=10)
    even = {"n1": [4, 4, 4], "n2": [4, 4, 4]}
    work = cumulative({"n1": 0, "n2": 0}, 3, 0)
    # 100 s at the same speed, then n2 at a tenth of it.
    for t in range(0, 111, 2):
        slow = max(0, t - 100)
        work = {
            "n1": [(100.0 * t, float(t))] * 3,
            "n2": [(100.0 * (t - slow) + 10.0 * slow, float(t))] * 3,
        }
        trig.observe(t, work)
        check = trig.check(even)
        if t < 104:
            assert check is None or check.stragglers == [], (t, check)
    assert check is not None and check.stragglers == ["n2"]
    # Over the window (100..110 s) n2 did 30 samples a second, not the ~280 of its whole life.
    assert check.throughputs["n2"] == pytest.approx(30.0)
    assert check.bpt["n2"] >= 1.5 * check.mean_bpt
    # Sizes by those throughputs even out the BPTs: no straggler any more.
    sizes = rank_batch_sizes(24, check.throughputs, {"n1": 3, "n2": 3})
    assert sizes == {"n1": [7, 7, 7], "n2": [1, 1, 1]}
    after = trig.check(sizes)
    assert after is not None and after.stragglers == []


def test_the_mean_counts_every_rank() -> None:
    # Paper 003: T_i >= λ T, T the mean over all workers, the straggler's ranks included: with
    # two equal nodes a straggler must be λ / (2 - λ) = 3 times slower at λ = 1.5.
    even = {"a": [2, 2], "b": [2, 2]}
    for ratio, found in ((2.9, []), (3.0, ["b"])):
        trig = StragglerTrigger(slowness=1.5, window_s=1)
        trig.observe(0, cumulative({"a": 0, "b": 0}, 2, 0))
        trig.observe(1, cumulative({"a": ratio, "b": 1.0}, 2, 1))
        check = trig.check(even)
        assert check is not None and check.stragglers == found, (ratio, check)


def test_a_node_without_work_in_the_window_decides_nothing() -> None:
    trig = StragglerTrigger(slowness=1.5, window_s=1)
    trig.observe(0, cumulative({"a": 0, "b": 0}, 1, 0))
    trig.observe(2, {"a": [(100.0, 1.0)], "b": [(0.0, 0.0)]})
    assert trig.throughputs() is None and trig.check({"a": [1], "b": [1]}) is None


@pytest.mark.parametrize(
    ("kw", "name"),
    [
        ({"slowness": 0}, r"slowness \(λ\)"),
        ({"slowness": -1.5}, r"slowness \(λ\)"),
        ({"slowness": math.nan}, r"slowness \(λ\)"),
        ({"window_s": 0}, "window_s"),
        ({"window_s": -5.0}, "window_s"),
        ({"window_s": math.inf}, "window_s"),
    ],
)
def test_a_slowness_or_window_that_is_not_positive_is_refused(
    kw: dict[str, float], name: str
) -> None:
    with pytest.raises(ValueError, match=f"{name} must be a positive number"):
        StragglerTrigger(**kw)
    with pytest.raises(ValueError, match=f"{name} must be a positive number"):
        AdjustBs(24, **kw)  # type: ignore[arg-type]


# -- AdjustBs on the ranks of a job -------------------------------------------------------------


class ThreadJob(Coordinator):
    """The collective of a job whose ranks are threads: `all_gather` waits for every rank."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.slots: list[dict[str, Any]] = [{} for _ in range(world)]
        self.barrier = threading.Barrier(world, timeout=30)
        self.rank = threading.local()

    def pass_end(self, client: Any, metrics: Any, block: bool, signals: Any = None) -> Any:
        raise NotImplementedError

    def all_gather(self, obj: dict[str, Any]) -> list[dict[str, Any]]:
        self.slots[self.rank.value] = obj
        self.barrier.wait()
        out = [dict(s) for s in self.slots]
        self.barrier.wait()
        return out


def run_job(world: int, body: Callable[[int, ThreadJob], Any]) -> list[Any]:
    job = ThreadJob(world)
    results: list[Any] = [None] * world
    errors: list[BaseException] = []

    def main(rank: int) -> None:
        job.rank.value = rank
        try:
            results[rank] = body(rank, job)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            job.barrier.abort()

    threads = [threading.Thread(target=main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    return results


def test_ranks_adopt_new_sizes_together_after_a_straggler_and_only_then() -> None:
    """Two nodes of three ranks: n2's ranks slow to a fifth at pass 10. Every rank sees the
    same sizes at every pass; they stay even until the trigger, change once, at the same
    boundary on every rank, n2's smaller, and add up to the global batch throughout."""
    nodes = ["n1", "n1", "n1", "n2", "n2", "n2"]

    def rank_body(rank: int, job: ThreadJob) -> dict[str, Any]:
        now = [0.0]
        bs = AdjustBs(
            24,
            slowness=1.5,
            window_s=3.0,
            node=nodes[rank],
            ranks_per_node=3,
            local_rank=rank % 3,
            env={},
            clock=lambda: now[0],
        )
        bs.start(job)
        seen = []
        for p in range(25):
            size = bs.batch_size
            seen.append(bs.sizes)
            rate = 20.0 if nodes[rank] == "n2" and p >= 10 else 100.0  # samples/s of a rank
            bs.record(size, size / rate)
            now[0] += 1.0  # a pass a second, every rank waiting for the slowest
            bs.boundary(job)
        return {"seen": seen, "changes": bs.changes, "boundaries": bs.boundaries}

    out = run_job(6, rank_body)
    for r in out[1:]:
        assert r["seen"] == out[0]["seen"] and r["changes"] == out[0]["changes"]
    seen = out[0]["seen"]
    assert all(sum(map(sum, s.values())) == 24 for s in seen)
    (change,) = out[0]["changes"]
    # The slowdown shows at boundary 10's work; the window must see it first.
    assert change.boundary >= 10
    assert change.check.stragglers == ["n2"]
    assert change.before == {"n1": [4, 4, 4], "n2": [4, 4, 4]}
    assert all(s == change.before for s in seen[: change.boundary + 1])
    assert all(s == change.after for s in seen[change.boundary + 1 :])
    assert max(change.after["n2"]) < min(change.after["n1"])
    assert out[0]["boundaries"] == 25


def test_no_straggler_keeps_the_even_split() -> None:
    def rank_body(rank: int, job: ThreadJob) -> list[dict[str, list[int]]]:
        now = [0.0]
        bs = AdjustBs(
            30,
            window_s=2.0,
            node=f"n{rank // 2}",
            ranks_per_node=2,
            local_rank=rank % 2,
            env={},
            clock=lambda: now[0],
        )
        bs.start(job)
        seen = []
        rng = random.Random(rank)
        for _ in range(12):
            seen.append(bs.sizes)
            # Within 40 % of each other: no node reaches 1.5 x the mean BPT.
            bs.record(bs.batch_size, bs.batch_size / rng.uniform(70, 100))
            now[0] += 1.0
            bs.boundary(job)
            assert bs.last_check is None or bs.last_check.stragglers == []
        return seen

    out = run_job(6, rank_body)
    assert all(s == {"n0": [5, 5], "n1": [5, 5], "n2": [5, 5]} for r in out for s in r)


def test_the_job_must_have_the_ranks_each_node_declares() -> None:
    def rank_body(rank: int, job: ThreadJob) -> None:
        # Three ranks on one node, each told the node has four (e.g. a wrong LOCAL_WORLD_SIZE).
        AdjustBs(12, node="n1", env={"LOCAL_WORLD_SIZE": "4", "LOCAL_RANK": str(rank)}).start(job)

    with pytest.raises(
        ValueError, match=r"node 'n1': 4 ranks by LOCAL_WORLD_SIZE, but the job has 3"
    ):
        run_job(3, rank_body)

    def small_batch(rank: int, job: ThreadJob) -> None:
        AdjustBs(5, node=f"n{rank // 3}", ranks_per_node=3, local_rank=rank % 3).start(job)

    with pytest.raises(ValueError, match="global_batch 5 is smaller than the 6 ranks"):
        run_job(6, small_batch)

    def disagree(rank: int, job: ThreadJob) -> None:
        AdjustBs(12 + rank, node=f"n{rank}", env={}).start(job)

    with pytest.raises(ValueError, match="ranks disagree on"):
        run_job(2, disagree)


def test_ranks_per_node_and_local_rank_from_the_launcher() -> None:
    torchrun = {
        "LOCAL_WORLD_SIZE": "4",
        "LOCAL_RANK": "2",
        "SLURM_NTASKS_PER_NODE": "1",
        "SLURM_LOCALID": "0",
    }
    bs = AdjustBs(16, env=torchrun)
    assert (bs.ranks_per_node, bs.local_rank) == (4, 2)
    bs = AdjustBs(16, env={"SLURM_NTASKS_PER_NODE": "3", "SLURM_LOCALID": "1"})
    assert (bs.ranks_per_node, bs.local_rank) == (3, 1)
    assert (AdjustBs(16, env={}).ranks_per_node, AdjustBs(16, env={}).local_rank) == (1, 0)
    with pytest.raises(ValueError, match="SLURM_NTASKS_PER_NODE='2\\(x3\\)' is not an integer"):
        AdjustBs(16, env={"SLURM_NTASKS_PER_NODE": "2(x3)"})
    with pytest.raises(
        ValueError, match="local_rank 3 \\(from SLURM_LOCALID\\) is not one of the 3"
    ):
        AdjustBs(16, env={"SLURM_NTASKS_PER_NODE": "3", "SLURM_LOCALID": "3"})
    with pytest.raises(ValueError, match="global_batch must be a positive int"):
        AdjustBs(0)
    with pytest.raises(ValueError, match="ranks_per_node \\(from ranks_per_node\\)"):
        AdjustBs(8, ranks_per_node=0)


def test_one_process_takes_the_whole_batch() -> None:
    bs = AdjustBs(32, env={}, node="here")
    bs.start(LocalCoordinator())
    assert bs.sizes == {"here": [32]} and bs.batch_size == 32
    bs.record(32, 0.1)
    assert bs.boundary(LocalCoordinator()) is False
    # A launcher that says three ranks per node, with no collective to meet them: refused.
    with pytest.raises(ValueError, match="3 ranks by LOCAL_WORLD_SIZE, but the job has 1"):
        AdjustBs(32, env={"LOCAL_WORLD_SIZE": "3"}, node="here").start(LocalCoordinator())


def test_the_loop_gives_each_pass_its_batch_size(fake: FakeDaemon) -> None:
    with metfs.Client(fake.path) as c:
        run = metfs.passes(c, epochs=1, adjust_bs=AdjustBs(64, env={}))
        sizes = []
        for p in run:
            sizes.append(p.batch_size)
            assert run.local_batch_size() == run.local_batch_size(64) == p.batch_size
            assert run.adjust_bs is not None
            run.adjust_bs.record(64, 0.01)
        assert sizes and set(sizes) == {64}
        assert run.adjust_bs is not None and run.adjust_bs.boundaries == len(sizes)
        with pytest.raises(ValueError, match="not the adjust_bs's 64"):
            run.local_batch_size(32)
        # Without ADJUST_BS there is no local batch size to give.
        with pytest.raises(ValueError, match="adjust_bs=metfs.batchsize.AdjustBs"):
            metfs.Passes(c).local_batch_size(64)
