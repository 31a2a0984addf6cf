"""Unit tests of metfs.Client against an in-process fake control socket."""

from __future__ import annotations

import json
import os
import socket
import tempfile
import threading
import time

import numpy as np
import pytest
import torch
from fake_daemon import FakeDaemon

import metfs
import metfs.protocol

#: A `hello` reply with the fields the protocol requires, for the hand-written servers below.
HELLO = (
    b'{"ok":true,"protocol":1,"version":"0.1.0","mountpoint":"/m","job":null,'
    b'"share":null,"not_resumed":null}\n'
)


def test_connects_with_hello_and_reads_status(fake: FakeDaemon) -> None:
    with metfs.Client(fake.path, job="resnet") as c:
        assert fake.requests[0] == {"v": 1, "op": "hello", "version": 1, "job": "resnet"}
        assert c.info is not None and c.info.protocol == 1 and c.info.mountpoint == "/fake/mnt"
        st = c.status()
        assert (st.epoch, st.mini_epoch, st.mini_epochs, st.passes_done, st.rf) == (0, 0, 3, 0, 2)
        assert st.generation == 1 and st.next_ready is True
        assert (
            st.tier_bytes_read == 10
            and st.policy == st["rf_policy"] == "fixed"
            and st.get("nope", 7) == 7
        )
    assert not c.connected


def test_socket_from_environment(fake: FakeDaemon, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("METFS_SOCKET", fake.path)
    monkeypatch.setenv("METFS_JOB", "envjob")
    c = metfs.Client()
    assert c.socket_path == fake.path and c.job == "envjob"
    assert fake.requests[0]["job"] == "envjob"
    c.close()


def test_no_socket_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("METFS_SOCKET", raising=False)
    with pytest.raises(metfs.MetfsError) as e:
        metfs.Client()
    assert e.value.code == "no_socket" and "METFS_SOCKET" in e.value.message


def test_missing_daemon_fails_fast(tmp_path) -> None:  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    with pytest.raises(metfs.MetfsConnectionError) as e:
        metfs.Client(str(tmp_path / "none.sock"))
    assert e.value.code == "connection_failed" and "does not exist" in e.value.message
    # A socket file nobody listens on (the daemon died without removing it).
    path = str(tmp_path / "dead.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.close()
    with pytest.raises(metfs.MetfsConnectionError) as e:
        metfs.Client(path)
    assert "nothing listens" in e.value.message
    assert time.monotonic() - t0 < 2.0


def test_files_gives_relative_and_absolute_paths(fake: FakeDaemon) -> None:
    with metfs.Client(fake.path) as c:
        v = c.files()
    assert v.generation == 1 and (v.epoch, v.mini_epoch) == (0, 0)
    assert v.files == fake.files_at(0, 0)
    assert v.paths == [os.path.join("/fake/mnt", f) for f in v.files]
    assert list(v) == v.paths and len(v) == 4


def test_pass_end_converts_metrics(fake: FakeDaemon) -> None:
    with metfs.Client(fake.path, job="j") as c:
        d = c.pass_end(
            {
                "loss": np.float32(0.25),
                "acc": torch.tensor(0.5),
                "n": 3,
                "arr": np.array([1.5]),
                "t1": torch.tensor([2.0]),
            }
        )
    assert d.decision == "repeat" and not d.advanced and d.passes_done == 1
    assert d.reason == {"policy": "fixed", "rf": 2, "passes": 1}
    sent = fake.requests[-1]
    assert sent["op"] == "pass_end" and sent["job"] == "j" and sent["block"] is False
    assert sent["metrics"] == {"loss": 0.25, "acc": 0.5, "n": 3.0, "arr": 1.5, "t1": 2.0}
    assert all(type(v) is float for v in sent["metrics"].values())


@pytest.mark.parametrize(
    "bad, needle",
    [
        ({"loss": "low"}, "must be a number"),
        ({"loss": None}, "must be a number"),
        ({"loss": True}, "bool"),
        ({"loss": float("nan")}, "finite"),
        ({"loss": np.inf}, "finite"),
        ({"loss": np.array([1.0, 2.0])}, "single number"),
        ({"loss": torch.ones(3)}, "single number"),
        ({"": 1.0}, "non-empty"),
        ([("loss", 1.0)], "mapping"),
    ],
)
def test_bad_metrics_rejected_before_sending(fake: FakeDaemon, bad: object, needle: str) -> None:
    with metfs.Client(fake.path) as c, pytest.raises(metfs.MetfsError) as e:
        c.pass_end(bad)  # type: ignore[arg-type]
    assert e.value.code == "bad_metrics" and needle in e.value.message
    assert "pass_end" not in fake.ops()


def test_daemon_errors_raise_with_code(fake: FakeDaemon) -> None:
    fake.fail_ops["advance"] = "staging_failed"
    with metfs.Client(fake.path) as c:
        with pytest.raises(metfs.MetfsError) as e:
            c.advance()
        assert e.value.code == "staging_failed" and "injected" in e.value.message
        with pytest.raises(metfs.MetfsError) as e:
            c.request({"op": "format_disk"})
        assert e.value.code == "unknown_op"
        # The connection survives errors.
        assert c.status().epoch == 0


def test_advance_wait_and_apply(fake: FakeDaemon) -> None:
    fake.next_ready = False
    with metfs.Client(fake.path) as c:
        assert c.advance().decision == "wait"
        d = c.advance(wait=True)
        assert d.advanced and d.position == (0, 1) and d.generation == 2
        d = c.apply(1, 2)
        assert d.position == (1, 2) and d.generation == 3
        assert fake.requests[-1] == {
            "v": 1,
            "op": "apply",
            "epoch": 1,
            "mini_epoch": 2,
            "wait": True,
        }
        with pytest.raises(metfs.MetfsError) as e:
            c.apply(-1, 0)
        assert e.value.code == "bad_request"


def test_pass_end_wait_and_block(fake: FakeDaemon) -> None:
    fake.next_ready = False
    with metfs.Client(fake.path) as c:
        assert c.pass_end().decision == "repeat"
        assert c.pass_end().decision == "wait"
        d = c.pass_end(block=True)
        assert d.advanced and d.passes_done == 0 and d.mini_epoch == 1
    assert fake.requests[-1]["block"] is True


def test_reconnects_when_daemon_dropped_idle_connection(fake: FakeDaemon) -> None:
    with metfs.Client(fake.path) as c:
        fake.drop_connections()
        time.sleep(0.05)
        d = c.pass_end({"loss": 1.0})
        assert d.decision == "repeat"
    # Sent once: the reconnect happened before sending, so no pass was counted twice.
    assert fake.ops().count("pass_end") == 1 and fake.hello_count == 2
    assert fake.passes == 1


def test_idempotent_request_is_retried_after_lost_answer(fake: FakeDaemon) -> None:
    with metfs.Client(fake.path) as c:
        fake.drop_after_read = 1
        assert c.status().epoch == 0
    assert fake.ops() == ["hello", "status", "hello", "status"]


def test_state_changing_request_is_not_resent_after_lost_answer(fake: FakeDaemon) -> None:
    with metfs.Client(fake.path) as c:
        fake.drop_after_read = 1
        with pytest.raises(metfs.MetfsConnectionError) as e:
            c.pass_end({"loss": 1.0})
        assert e.value.code == "connection_lost" and "may or may not" in e.value.message
        # The next request reconnects.
        assert c.status().epoch == 0
    assert fake.ops().count("pass_end") == 1


def test_dead_daemon_mid_run_is_a_connection_error(fake: FakeDaemon) -> None:
    c = metfs.Client(fake.path)
    fake.close()
    with pytest.raises(metfs.MetfsConnectionError) as e:
        c.status()
    assert e.value.code == "connection_failed"
    assert isinstance(e.value, ConnectionError)


def test_timeout_when_daemon_does_not_answer() -> None:
    d = tempfile.mkdtemp(prefix="metfs-mute")
    path = os.path.join(d, "s.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(1)
    conns = []

    def serve() -> None:
        conn, _ = srv.accept()
        conns.append(conn)
        f = conn.makefile("rb")
        f.readline()
        conn.sendall(HELLO)
        f.readline()  # never answers the second request

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        c = metfs.Client(path, timeout=0.3)
        t0 = time.monotonic()
        with pytest.raises(metfs.MetfsError) as e:
            c.status()
        assert e.value.code == "timeout" and time.monotonic() - t0 < 2.0
        assert not c.connected
    finally:
        srv.close()
        for conn in conns:
            conn.close()
        os.unlink(path)
        os.rmdir(d)


def test_malformed_response_is_reported() -> None:
    d = tempfile.mkdtemp(prefix="metfs-bad")
    path = os.path.join(d, "s.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(1)

    def serve() -> None:
        conn, _ = srv.accept()
        f = conn.makefile("rb")
        f.readline()
        conn.sendall(HELLO)
        f.readline()
        conn.sendall(b'{"ok":true,"decision":"explode","generation":1}\n')
        f.readline()
        conn.sendall(b"not json\n")
        f.readline()
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        c = metfs.Client(path)
        with pytest.raises(metfs.MetfsError) as e:
            c.pass_end()
        assert e.value.code == "bad_response" and "explode" in e.value.message
        with pytest.raises(metfs.MetfsError) as e:
            c.status()
        assert e.value.code == "bad_response"
    finally:
        srv.close()
        os.unlink(path)
        os.rmdir(d)


def test_unsupported_version_error_surfaces(
    fake: FakeDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The handshake says the version the client speaks (`hello_request` reads it).
    monkeypatch.setattr(metfs.protocol, "PROTOCOL_VERSION", 2)
    with pytest.raises(metfs.MetfsError) as e:
        metfs.Client(fake.path)
    assert e.value.code == "unsupported_version"


def test_client_is_thread_safe(fake: FakeDaemon) -> None:
    with metfs.Client(fake.path) as c:
        errors = []

        def work() -> None:
            try:
                for _ in range(50):
                    assert c.files().generation == 1
            except Exception as e:  # noqa: BLE001 - any failure in a thread is reported below
                errors.append(e)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors
    assert fake.ops().count("files") == 200


def test_requests_are_single_json_lines(fake: FakeDaemon) -> None:
    with metfs.Client(fake.path) as c:
        c.pass_end({"loss\n": 1.0})
    # json.dumps escapes the newline, so the request stays one line.
    assert fake.requests[-1]["metrics"] == {"loss\n": 1.0}
    assert json.dumps(fake.requests[-1])


def test_a_client_with_a_timeout_does_not_wait_it_out_before_each_request(fake: FakeDaemon) -> None:
    """Before each request the client peeks whether the daemon closed the idle connection. With
    a timeout set, that peek used to wait for the socket to become readable, so every request
    on a healthy connection first waited out the whole timeout."""
    with metfs.Client(fake.path, timeout=30.0) as c:
        t0 = time.monotonic()
        for _ in range(3):
            assert c.status().epoch == 0
        assert time.monotonic() - t0 < 15.0, "a request waited for the client's timeout"
        assert c.connected
