"""The pass-tracking state machine on its own, fed statuses and decisions as the daemon sends them."""

from __future__ import annotations

from typing import Any

import pytest
from fake_daemon import status_reply

from metfs.client import Decision, Status
from metfs.tracker import PassTracker


def status(epoch: int, mini_epoch: int = 0, passes_done: int = 0, generation: int = 0) -> Status:
    return Status.from_response(
        status_reply(epoch=epoch, mini_epoch=mini_epoch, mini_epochs=3, generation=generation, rf=2)
        | {"pass": passes_done}
    )


def decision(
    kind: str, epoch: int, mini_epoch: int, passes_done: int, generation: int, **extra: Any
) -> Decision:
    return Decision.from_response(
        {
            "ok": True,
            "decision": kind,
            "epoch": epoch,
            "mini_epoch": mini_epoch,
            "pass": passes_done,
            "generation": generation,
            "mini_epochs": 3,
            "rf": 2.0,
            "next_ready": True,
            **extra,
        },
        "pass_end",
    )


# One MET epoch of 3 mini-epochs at rf 2, with one `wait` while mini-epoch 2 was still staging.
ONE_EPOCH = [
    decision("repeat", 0, 0, 1, 0),
    decision("advance", 0, 1, 0, 1),
    decision("repeat", 0, 1, 1, 1),
    decision("wait", 0, 1, 2, 1),
    decision("advance", 0, 2, 0, 2),
    decision("repeat", 0, 2, 1, 2),
    decision("advance", 1, 0, 0, 3),
]


def test_done_exactly_when_a_decision_reaches_the_target_epoch() -> None:
    t = PassTracker(1)
    assert not t.started and not t.wants_pass and t.passes == 0
    t.start(status(0))
    assert (t.start_epoch, t.target_epoch) == (0, 1)
    assert t.started and t.wants_pass and not t.done
    for i, d in enumerate(ONE_EPOCH):
        done = t.record(d)
        last = i == len(ONE_EPOCH) - 1
        assert done is last and t.done is last and t.wants_pass is not last
        assert t.passes == i + 1
        assert t.passes_done == d.passes_done
    assert t.decisions == ONE_EPOCH
    assert t.generations == [0, 1, 1, 1, 2, 2, 3]
    assert t.unfinished("unused") is None


def test_target_counts_from_the_epoch_at_start() -> None:
    t = PassTracker(2)
    t.start(status(3, mini_epoch=1, passes_done=1, generation=7))
    assert (t.start_epoch, t.target_epoch, t.passes_done) == (3, 5, 1)
    assert not t.record(decision("advance", 4, 0, 0, 8))
    # A decision that jumps past the target (e.g. a follower applying the leader's position)
    # finishes the job too.
    assert t.record(decision("advance", 6, 0, 0, 9))
    assert t.generations == [8, 9]


def test_wait_and_repeat_never_finish() -> None:
    t = PassTracker(1)
    t.start(status(0))
    for _ in range(50):
        assert not t.record(decision("wait", 0, 2, 5, 2))
    assert t.wants_pass and t.passes == 50


def test_unfinished_run_names_passes_epochs_and_hint() -> None:
    t = PassTracker(1)
    t.start(status(0))
    for d in ONE_EPOCH[:3]:
        t.record(d)
    message = t.unfinished("give fit() a larger epochs=")
    assert message is not None
    assert "after 3 passes" in message
    assert "before the 1 requested MET epoch(s)" in message
    assert message.endswith("give fit() a larger epochs=")


def test_zero_epochs_is_done_at_start() -> None:
    t = PassTracker(0)
    t.start(status(2, generation=5))
    assert t.done and not t.wants_pass and t.target_epoch == 2
    assert t.unfinished("hint") is None


def test_max_passes_stops_asking_but_is_not_done() -> None:
    t = PassTracker(1, max_passes=2)
    t.start(status(0))
    t.record(ONE_EPOCH[0])
    assert t.wants_pass
    t.record(ONE_EPOCH[1])
    assert not t.wants_pass and not t.done
    assert PassTracker(1, max_passes=0).wants_pass is False


def test_start_again_keeps_history_and_sets_a_new_target() -> None:
    t = PassTracker(1)
    t.start(status(0))
    for d in ONE_EPOCH:
        t.record(d)
    assert t.done
    # A second fit() on the same callback: the daemon is now in epoch 1.
    t.start(status(1, generation=3))
    assert not t.done and t.wants_pass and (t.start_epoch, t.target_epoch) == (1, 2)
    assert t.passes == len(ONE_EPOCH) and t.passes_done == 0
    t.record(decision("repeat", 1, 0, 1, 3))
    assert t.passes == len(ONE_EPOCH) + 1 and not t.done


def test_record_before_start_is_an_error() -> None:
    t = PassTracker(1)
    with pytest.raises(RuntimeError, match="before start"):
        t.record(ONE_EPOCH[0])
    assert t.passes == 0


@pytest.mark.parametrize("bad", [-1, True, 1.0, "2", None])
def test_bad_epochs_are_rejected(bad: Any) -> None:
    with pytest.raises(ValueError, match="epochs must be a non-negative int"):
        PassTracker(bad)


def test_bad_max_passes_is_rejected() -> None:
    with pytest.raises(ValueError, match="max_passes must be non-negative"):
        PassTracker(1, max_passes=-1)


def test_passes_and_callbacks_expose_the_tracker_state() -> None:
    # All three drivers read their history from the tracker rather than keeping their own.
    from metfs.loop import Passes
    from metfs.tracker import TracksPasses

    assert issubclass(Passes, TracksPasses)
    keras_cb = pytest.importorskip("metfs.keras").MetCallback
    lightning_cb = pytest.importorskip("metfs.lightning").MetCallback
    assert issubclass(keras_cb, TracksPasses) and issubclass(lightning_cb, TracksPasses)
