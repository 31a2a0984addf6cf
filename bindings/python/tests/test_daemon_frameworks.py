"""Keras (torch backend), PyTorch and Lightning: short real trainings over a real metfs mount,
seeing the view advance (the generation grows and the files change)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable

from realmount import RealMount
from training import keras_training, lightning_training, torch_training

import metfs


def _check(
    m: RealMount,
    per_pass: list[list[str]],
    decisions: list[metfs.Decision],
    generations: list[int],
    epochs: int = 1,
) -> None:
    """Each pass read one whole mini-epoch through the mount; the view advanced over a whole
    epoch; the generation grew at every advance."""
    assert len(per_pass) == len(decisions) >= 3
    views: list[set[str]] = []
    for files in per_pass:
        rel = Counter(os.path.relpath(f, m.mountpoint) for f in files)
        assert set(rel.values()) == {1}, "a file was read twice in one pass"
        if not views or views[-1] != set(rel):
            views.append(set(rel))
    # Consecutive views differ and the mini-epochs of an epoch cover the source exactly.
    assert len(views) == 3 * epochs
    for e in range(epochs):
        part = views[3 * e : 3 * e + 3]
        assert sum(len(v) for v in part) == len(m.source_files)
        assert set().union(*part) == set(m.source_files)
    advances = [d for d in decisions if d.advanced]
    assert len(advances) == 3 * epochs
    assert generations == sorted(generations) and generations[-1] - generations[0] == 3 * epochs
    assert decisions[-1].epoch == epochs


def test_keras_over_real_mount(real_mount: Callable[..., RealMount]) -> None:
    m = real_mount(per_class=12, mini_epochs=3, rf=2, val=True)
    with metfs.Client(m.socket, job="keras") as c:
        g0 = c.status().generation
        out = keras_training(c, epochs=1, val_dir=m.val)
    met = out["callback"]
    assert met.done
    # Stopped by the callback after the first epoch: rf passes over each of 3 mini-epochs at
    # least (more if a pass ended before the next mini-epoch was staged).
    assert len(out["history"]["loss"]) == len(met.decisions) >= 6
    _check(m, out["per_pass"], met.decisions, [g0] + met.generations)
    assert "val_accuracy" in out["history"]
    # The sequence re-read the view: it served several generations.
    assert len(set(out["sequence"].generations)) == 3


def test_torch_over_real_mount(real_mount: Callable[..., RealMount]) -> None:
    m = real_mount(per_class=12, mini_epochs=3, rf=2, val=True)
    with metfs.Client(m.socket, job="torch") as c:
        g0 = c.status().generation
        out = torch_training(c, epochs=2, val_dir=m.val)
    run = out["run"]
    assert run.done
    _check(m, out["per_pass"], run.decisions, [g0] + [d.generation for d in run.decisions], 2)
    assert all({"loss", "accuracy", "val_accuracy"} <= set(r) for r in out["reported"])
    assert out["reported"][-1]["val_accuracy"] > 0.3


def test_torch_sampler_with_workers_follows_the_view(real_mount: Callable[..., RealMount]) -> None:
    import torch

    from metfs.torch import MetDataset, met_loader

    m = real_mount(per_class=8, mini_epochs=3, rf=4)
    with metfs.Client(m.socket, job="sampler") as c:
        ds = MetDataset(c, lambda p: torch.tensor(os.path.getsize(p)))
        loader = met_loader(
            ds, batch_size=7, num_workers=2, persistent_workers=True, collate_fn=list
        )
        seen = []
        for _ in range(3):
            before = c.files()
            sizes = sorted(int(t) for batch in loader for t in batch)
            expected = sorted(os.path.getsize(p) for p in before.paths)
            assert sizes == expected
            seen.append(before.generation)
            assert c.advance(wait=True).advanced
    assert seen == [seen[0], seen[0] + 1, seen[0] + 2]


def test_lightning_over_real_mount(  # type: ignore[no-untyped-def]
    real_mount: Callable[..., RealMount], tmp_path
) -> None:
    m = real_mount(per_class=12, mini_epochs=3, rf=2)
    with metfs.Client(m.socket, job="lightning") as c:
        g0 = c.status().generation
        out = lightning_training(c, epochs=1, tmpdir=str(tmp_path))
    met = out["callback"]
    assert met.done and out["trainer"].should_stop
    _check(m, out["per_pass"], met.decisions, [g0] + met.generations)
    # The train dataloader was rebuilt for every pass and counted the current view.
    assert len(out["loader_lengths"]) == len(met.decisions)
    assert [len(f) for f in out["per_pass"]] == out["loader_lengths"]
