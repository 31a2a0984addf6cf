"""Unit tests of metfs.passes against the fake control socket."""

from __future__ import annotations

import pytest
from fake_daemon import FakeDaemon

import metfs


def test_passes_follow_fixed_rf_for_whole_epochs(fake: FakeDaemon) -> None:
    with metfs.Client(fake.path) as c:
        run = metfs.passes(c, epochs=2)
        seen = []
        for p in run:
            assert p.files == fake.files_at(p.epoch, p.mini_epoch)
            assert p.paths[0].startswith("/fake/mnt/") and len(p) == 4
            seen.append((p.index, p.epoch, p.mini_epoch, p.generation, p.pass_in_mini_epoch))
            p.report(loss=1.0 / (p.index + 1), accuracy=0.5)
    # 2 epochs x 3 mini-epochs x rf 2.
    assert len(seen) == 12 and run.done
    assert [s[0] for s in seen] == list(range(12))
    assert [s[4] for s in seen] == [0, 1] * 6
    assert run.rf_per_mini_epoch() == [(e, m, 2) for e in range(2) for m in range(3)]
    assert [d.decision for d in run.decisions] == ["repeat", "advance"] * 6
    assert run.decisions[-1].position == (2, 0)
    assert (run.start_epoch, run.target_epoch) == (0, 2)
    # The generation grows at every switch and the metrics went with each pass_end.
    assert [s[3] for s in seen] == [g for g in range(1, 7) for _ in range(2)]
    assert fake.metrics[3] == {"loss": 0.25, "accuracy": 0.5}
    assert run.records[3].metrics == {"loss": 0.25, "accuracy": 0.5}


def test_file_list_reread_every_pass(fake: FakeDaemon) -> None:
    with metfs.Client(fake.path) as c:
        for _ in metfs.passes(c, epochs=1):
            pass
    assert fake.ops().count("files") == 6 and fake.ops().count("pass_end") == 6


def test_wait_keeps_the_view_until_next_is_staged(fake: FakeDaemon) -> None:
    fake.next_ready = False
    with metfs.Client(fake.path) as c:
        run = metfs.passes(c, epochs=1)
        positions = []
        for p in run:
            positions.append(p.position)
            if p.index == 3:
                fake.next_ready = True
    assert positions[:5] == [(0, 0)] * 4 + [(0, 1)]
    assert [d.decision for d in run.decisions[:4]] == ["repeat", "wait", "wait", "advance"]
    assert run.rf_per_mini_epoch()[0] == (0, 0, 4)


def test_block_asks_daemon_to_wait_for_staging(fake: FakeDaemon) -> None:
    fake.next_ready = False
    with metfs.Client(fake.path) as c:
        run = metfs.passes(c, epochs=1, block=True)
        for _ in run:
            pass
    assert all(r["block"] for r in fake.requests if r["op"] == "pass_end")
    assert [n for _, _, n in run.rf_per_mini_epoch()] == [2, 2, 2]


def test_starts_mid_epoch_and_counts_from_there(fake: FakeDaemon) -> None:
    fake.epoch, fake.mini_epoch, fake.passes = 3, 2, 1
    with metfs.Client(fake.path) as c:
        run = metfs.passes(c, epochs=2)
        seen = [(p.position, p.pass_in_mini_epoch) for p in run]
    # One more pass finishes mini-epoch 2 of epoch 3; then all of epoch 4; stop at epoch 5.
    assert seen[0] == ((3, 2), 1) and len(seen) == 1 + 6
    assert (run.start_epoch, run.target_epoch) == (3, 5)
    assert run.decisions[-1].position == (5, 0)


def test_max_passes_and_zero_epochs(fake: FakeDaemon) -> None:
    with metfs.Client(fake.path) as c:
        run = metfs.passes(c, epochs=5, max_passes=3)
        assert sum(1 for _ in run) == 3 and not run.done
        run = metfs.passes(c, epochs=0)
        assert list(run) == [] and run.done
        with pytest.raises(RuntimeError):
            iter(run)
    with pytest.raises(ValueError):
        metfs.passes(c, epochs=-1)


def test_bad_metric_fails_in_report(fake: FakeDaemon) -> None:
    with metfs.Client(fake.path) as c:
        for p in metfs.passes(c, epochs=1):
            with pytest.raises(metfs.MetfsError) as e:
                p.report(loss="nan-ish")
            assert e.value.code == "bad_metrics" and "loss" in e.value.message
            p.metrics["bad"] = [1, 2]  # set directly: caught before pass_end is sent
            break
    with metfs.Client(fake.path) as c:
        run = metfs.passes(c, epochs=1)
        it = iter(run)
        p = next(it)
        p.metrics["bad"] = "x"
        with pytest.raises(metfs.MetfsError):
            next(it)
    assert "pass_end" not in fake.ops()


def test_custom_coordinator_is_used(fake: FakeDaemon) -> None:
    calls = []

    class Recording(metfs.LocalCoordinator):
        def pass_end(self, client, metrics, block, signals=None):  # type: ignore[no-untyped-def]
            calls.append(metrics)
            return super().pass_end(client, metrics, block, signals)

    with metfs.Client(fake.path) as c:
        run = metfs.passes(c, epochs=1, coordinator=Recording())
        for p in run:
            p.report(loss=p.index)
    assert calls == [{"loss": float(i)} for i in range(6)]
    assert run.is_leader


def test_default_coordinator_is_local_without_torch_distributed() -> None:
    assert isinstance(metfs.default_coordinator(), metfs.LocalCoordinator)
