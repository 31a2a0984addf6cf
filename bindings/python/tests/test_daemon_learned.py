"""``learned`` on a real mount: the run it replays is the best earlier one, and it says so.

Three runs of the same mount at fixed rfs 2, 3 and 4 record their schedules in one rf history
file while the job reports validation losses 0.5, 0.2 and 0.4. A ``learned`` mount ranked by
``min:val_loss`` must replay the second run (rf 3), neither the latest (rf 4) nor the first, and
``status`` (typed, over the socket and from ``metfs status``) and the history file must name it
and the reason. A metric none of those runs recorded is refused at mount, naming the setting.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

import pytest
from realmount import RealMount

import metfs
from metfs.client import Replay


def _remount(m: RealMount, flags: dict[str, str]) -> None:
    """Mounts `m` again over the same source and cache with `flags` set to these values."""
    m.close()
    assert m.umount_result is None or m.umount_result[0] == 0, m.umount_result
    for flag, value in flags.items():
        if flag in m.args:
            m.args[m.args.index(flag) + 1] = value
        else:
            m.args[-1:-1] = [flag, value]
    m.mount()


def test_learned_replays_the_run_that_ended_best(
    real_mount: Callable[..., RealMount], tmp_path: object
) -> None:
    history = f"{tmp_path}/rf-history.json"
    # --reset: each mount starts a new run rather than resuming the saved position's.
    m = real_mount(per_class=5, mini_epochs=2, rf=2, extra_args=["--history", history, "--reset"])
    for i, (rf, val_loss) in enumerate([(2, 0.5), (3, 0.2), (4, 0.4)]):
        if i:
            _remount(m, {"--rf": str(rf)})
        with metfs.Client(m.socket) as c:
            for _ in range(2):  # both mini-epochs of the epoch
                for p in range(1, rf + 1):
                    d = c.pass_end({"val_loss": val_loss}, block=True)
                    assert d.advanced == (p == rf), (rf, p, d.raw)

    # The fallback (score) decides past the replayed schedule; every pass sends its metrics.
    _remount(m, {"--rf-policy": "learned", "--learned-metric": "min:val_loss"})
    want = Replay(
        run=2,
        mini_epochs=2,
        why="best",
        metric="min:val_loss",
        value=0.2,
        finished=False,  # a plain mount's runs never finish: they are ranked among themselves
        compared=3,
    )
    with metfs.Client(m.socket) as c:
        st = c.status()
        assert (st.policy, st.replay, st.rf) == ("learned", want, 3.0), st.raw
        metrics = {"loss": 1.0, "accuracy": 0.5, "val_accuracy": 0.5, "val_loss": 0.3}
        for p in range(1, 4):
            d = c.pass_end(metrics, block=True)
            assert d.reason is not None and d.reason["policy"] == "learned", d.raw
            assert d.reason["source"] == "history" and d.advanced == (p == 3), d.raw
    cli = subprocess.run(
        [m.bin, "status", "--socket", m.socket],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    said = "replaying run 2 (2 mini-epochs): the best final min:val_loss (0.2) of 3 unfinished"
    assert said in cli.stdout, cli.stdout
    m.close()
    with open(history) as f:
        runs = json.load(f)["runs"]
    assert [r["id"] for r in runs] == [1, 2, 3, 4], runs
    assert runs[-1]["replayed"] == st.raw["replay"], runs[-1]
    assert all("replayed" not in r for r in runs[:-1]), runs

    # A metric no run recorded (a typo, a renamed metric) is refused, naming the setting.
    with pytest.raises(RuntimeError) as e:
        _remount(m, {"--learned-metric": "max:top1"})
    assert "learned_metric" in str(e.value) and "`top1`" in str(e.value), str(e.value)
    # `metfs mount` answers a refusal once its daemon is gone: a corrected retry finds the
    # cache's lock free.
    assert not m.mount_.daemon_pids(), m.mount_.daemon_pids()
