"""Keras, PyTorch and Lightning integrations against the fake socket with real files (no FUSE).

The same trainings run over a real mount in ``test_daemon_frameworks.py``.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest
from fake_daemon import FakeDaemon
from training import keras_training, lightning_training, torch_training

import metfs


def _expected(fake: FakeDaemon, epochs: int) -> list[tuple[int, int]]:
    """The (epoch, mini_epoch) of every pass under fixed rf with staging always ready."""
    return [(e, m) for e in range(epochs) for m in range(fake.mini_epochs) for _ in range(fake.rf)]


def _check_pass_files(
    fake: FakeDaemon, per_pass: list[list[str]], positions: list[tuple[int, int]]
) -> None:
    assert len(per_pass) == len(positions)
    for files, (e, m) in zip(per_pass, positions):
        rel = Counter(os.path.relpath(f, fake.mountpoint) for f in files)
        assert rel == Counter(fake.files_at(e, m)), (e, m)


def test_keras_callback_and_sequence(fake_view: FakeDaemon) -> None:
    with metfs.Client(fake_view.path, job="keras") as c:
        out = keras_training(c, epochs=1)
    met = out["callback"]
    positions = _expected(fake_view, 1)
    assert len(out["history"]["loss"]) == len(positions) == 6  # stopped by the callback
    assert met.done and [d.decision for d in met.decisions] == ["repeat", "advance"] * 3
    _check_pass_files(fake_view, out["per_pass"], positions)
    # logs went to the daemon with every pass_end
    assert [set(m) for m in fake_view.metrics] == [{"loss", "accuracy"}] * 6
    assert fake_view.metrics[-1]["loss"] == out["history"]["loss"][-1]


def test_torch_met_train(fake_view: FakeDaemon) -> None:
    with metfs.Client(fake_view.path, job="torch") as c:
        out = torch_training(c, epochs=2)
    run = out["run"]
    positions = _expected(fake_view, 2)
    assert run.done and [r.decision.decision for r in run.records] == ["repeat", "advance"] * 6
    _check_pass_files(fake_view, out["per_pass"], positions)
    assert fake_view.metrics == out["reported"]
    assert all(set(m) == {"loss", "accuracy"} for m in fake_view.metrics)


def test_torch_met_train_with_workers(fake_view: FakeDaemon) -> None:
    with metfs.Client(fake_view.path, job="torch") as c:
        out = torch_training(c, epochs=1, num_workers=2)
    assert out["run"].done and len(out["run"].records) == 6


def test_lightning_callback(  # type: ignore[no-untyped-def]
    fake_view: FakeDaemon, tmp_path
) -> None:
    with metfs.Client(fake_view.path, job="lightning") as c:
        out = lightning_training(c, epochs=1, tmpdir=str(tmp_path))
    met = out["callback"]
    positions = _expected(fake_view, 1)
    assert met.done and len(met.decisions) == 6
    assert out["trainer"].current_epoch == 6
    _check_pass_files(fake_view, out["per_pass"], positions)
    assert [set(m) for m in fake_view.metrics] == [{"loss", "accuracy"}] * 6


def test_keras_warns_when_fit_ends_before_the_met_epochs(fake_view: FakeDaemon) -> None:
    early = pytest.warns(RuntimeWarning, match="before the 1 requested MET epoch")
    with metfs.Client(fake_view.path, job="keras") as c, early:
        out = keras_training(c, epochs=1, fit_epochs=3)
    assert not out["callback"].done and len(out["callback"].decisions) == 3
