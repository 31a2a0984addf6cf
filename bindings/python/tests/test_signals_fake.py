"""``pass_end``'s signals (progress, fresh-data loss): checked before sending, sent as the
protocol's schema says, and filled in by ``passes()`` and ``met_train``."""

from __future__ import annotations

import math
from typing import Any

import pytest
from fake_daemon import FakeDaemon
from test_protocol_schema import validator

import metfs
from metfs.signals import FreshLoss, PassSignals


def pass_ends(fake: FakeDaemon) -> list[dict[str, Any]]:
    return [r for r in fake.requests if r.get("op") == "pass_end"]


def test_pass_end_sends_the_signals_the_schema_describes(fake: FakeDaemon) -> None:
    with metfs.Client(fake.path) as c:
        c.pass_end({"loss": 1.0}, progress=0.25, fresh_loss=2.5)
        c.pass_end({"loss": 1.0})
    first, second = pass_ends(fake)
    assert (first["progress"], first["fresh_loss"]) == (0.25, 2.5)
    assert "progress" not in second and "fresh_loss" not in second
    check = validator("RequestLine")
    for req in (first, second):
        check.validate(req)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"progress": 1.5}, "progress"),
        ({"progress": -0.1}, "progress"),
        ({"progress": math.nan}, "progress"),
        ({"fresh_loss": math.inf}, "fresh_loss"),
        ({"fresh_loss": math.nan}, "fresh_loss"),
        ({"fresh_loss": "low"}, "fresh_loss"),
    ],
)
def test_bad_signals_are_refused_before_sending(
    fake: FakeDaemon, kwargs: dict[str, Any], field: str
) -> None:
    with metfs.Client(fake.path) as c, pytest.raises(metfs.MetfsError) as e:
        c.pass_end({"loss": 1.0}, **kwargs)
    assert e.value.code == "bad_metrics"
    assert field in str(e.value)
    assert not pass_ends(fake)


def test_the_loop_sends_progress_and_the_fresh_loss_of_first_passes(fake: FakeDaemon) -> None:
    with metfs.Client(fake.path) as c:
        run = metfs.passes(c, epochs=1, max_passes=4)
        fresh_flags = []
        for p in run:
            fresh_flags.append(p.fresh)
            if p.fresh:
                p.fresh_loss = 3.0 - p.index
            p.report(loss=1.0)
    sent = pass_ends(fake)
    # rf 2: passes 0 and 2 are first passes of their mini-epochs.
    assert fresh_flags == [True, False, True, False]
    assert [r["progress"] for r in sent] == [0.25, 0.5, 0.75, 1.0]
    assert [r.get("fresh_loss") for r in sent] == [3.0, None, 1.0, None]


def test_progress_by_met_epochs_without_a_pass_cap(fake: FakeDaemon) -> None:
    with metfs.Client(fake.path) as c:
        for p in metfs.passes(c, epochs=1):
            p.report(loss=1.0)
    progress = [r["progress"] for r in pass_ends(fake)]
    # 3 mini-epochs of rf 2: the position before each pass, as a fraction of the epoch.
    assert progress == pytest.approx([0, 0, 1 / 3, 1 / 3, 2 / 3, 2 / 3])


def test_fresh_loss_averages_the_first_batches_of_a_first_pass() -> None:
    f = FreshLoss(2)
    f.begin(True)
    assert f.wants
    for x in [1.0, math.nan, 3.0, 100.0]:
        f.add(x)
    assert not f.wants
    assert f.take() == 2.0
    assert f.take() is None
    f.begin(False)
    f.add(1.0)
    assert f.take() is None
    with pytest.raises(ValueError, match="batches"):
        FreshLoss(0)
    assert PassSignals(progress=1, fresh_loss=None).fields() == {"progress": 1.0}


def test_met_train_measures_the_fresh_loss(fake_view: FakeDaemon) -> None:
    pytest.importorskip("torch")
    from metfs.torch import MetDataset, met_train

    losses = iter(float(i) for i in range(10_000))
    with metfs.Client(fake_view.path) as c:
        ds = MetDataset(c, lambda path: 0.0)
        met_train(c, ds, lambda batch: next(losses), batch_size=4, max_passes=2, fresh_batches=3)
    first, second = pass_ends(fake_view)
    # The first three batch losses of the first pass: 0, 1, 2.
    assert first["fresh_loss"] == 1.0
    assert "fresh_loss" not in second
    assert (first["progress"], second["progress"]) == (0.5, 1.0)
