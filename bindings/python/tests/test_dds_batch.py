"""ADJUST_BS (paper 003, Eq. 3): local batch sizes proportional to throughput, summing to the
global batch. `tests/test_dds.py` reads the throughputs from a real queue."""

from __future__ import annotations

import random

import pytest

from metfs.dds import local_batch_sizes


def test_sizes_follow_throughput_and_add_up() -> None:
    assert local_batch_sizes(256, [4.0, 4.0, 1.0]) == [114, 113, 29]
    assert local_batch_sizes(9, [1.0, 1.0, 1.0]) == [3, 3, 3]
    # A rank with nothing measured yet is taken at the others' mean.
    assert local_batch_sizes(90, [2.0, 0.0, 4.0]) == [20, 30, 40]
    rng = random.Random(3)
    for _ in range(500):
        n = rng.randint(1, 9)
        v = [rng.uniform(0.1, 100) for _ in range(n)]
        b = rng.randint(n, 5000)
        sizes = local_batch_sizes(b, v)
        assert sum(sizes) == b and min(sizes) >= 1
        # Steps take about equally long: no rank's time is more than two samples' above the
        # best possible, b / sum(v) (one for the sample every rank keeps, one for rounding).
        ideal = b / sum(v)
        assert max(s / x for s, x in zip(sizes, v)) <= ideal + 2 / min(v) + 1e-9


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="smaller than the 3 ranks"):
        local_batch_sizes(2, [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="non-negative"):
        local_batch_sizes(10, [1.0, -1.0])
    with pytest.raises(ValueError, match="no ranks"):
        local_batch_sizes(10, [])
