"""The client's typed replies against what a real daemon sends.

``Hello``, ``Status``, ``FilesView`` and ``Decision`` read their fields by name, and optional
fields quietly become ``None`` when absent; so a field renamed on either side would go unnoticed
by tests that only check the required ones. Here each reply of a real daemon (over the socket,
and ``metfs status --json``) is parsed through a dict that records every key the parser looks
up, and every such key must be in the reply. Every reply, error reply, request and event-log
record is also validated against the protocol's JSON schema (``docs/protocol.schema.json``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
from realmount import RealMount
from test_protocol_schema import validator

import metfs
from metfs.client import Decision, FilesView, Hello, Status


class Recording(dict[str, Any]):
    """A reply that remembers which keys were looked up."""

    def __init__(self, reply: dict[str, Any]) -> None:
        super().__init__(reply)
        self.read: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self.read.add(key)
        return super().__contains__(key)


def _parse(parse: Callable[[dict[str, Any]], Any], reply: dict[str, Any]) -> tuple[Any, set[str]]:
    rec = Recording(reply)
    return parse(rec), rec.read


def _missing(read: set[str], reply: dict[str, Any], absent_ok: frozenset[str]) -> set[str]:
    return {key for key in read if key not in reply and key not in absent_ok}


def _raw(sock_path: str, request: dict[str, Any]) -> dict[str, Any]:
    """One request on a fresh connection, without the client (its reply exactly as sent)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(sock_path)
        s.sendall(json.dumps(request).encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(1 << 16)
            assert chunk, f"daemon closed the connection before answering {request}"
            buf += chunk
    reply: dict[str, Any] = json.loads(buf)
    return reply


def test_every_field_the_client_reads_is_in_the_real_replies(
    real_mount: Callable[..., RealMount],
) -> None:
    m = real_mount(per_class=5, mini_epochs=3, rf=2)
    replies: dict[str, dict[str, Any]] = {}
    parsed: dict[str, tuple[Any, set[str]]] = {}
    with metfs.Client(m.socket, job="schema") as c:
        replies["hello"] = c.request({"op": "hello", "version": 1, "job": "schema"})
        replies["status"] = c.request({"op": "status"})
        replies["files"] = c.request({"op": "files"})
        replies["files direct"] = c.request({"op": "files", "direct": True})
        replies["release"] = c.request({"op": "release"})
        replies["pass_end"] = c.request({"op": "pass_end", "metrics": {"loss": 1.0}})
        replies["pass_end block"] = c.request(
            {"op": "pass_end", "metrics": {"loss": 0.5}, "block": True}, wait=True
        )
        replies["advance"] = c.request({"op": "advance", "wait": True}, wait=True)
        replies["apply"] = c.request(
            {"op": "apply", "epoch": 0, "mini_epoch": 2, "wait": True}, wait=True
        )
    cli = subprocess.run(
        [m.bin, "status", "--json", "--socket", m.socket],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert cli.returncode == 0, cli.stderr
    replies["metfs status --json"] = json.loads(cli.stdout)

    # Every reply is what the schema (generated from the daemon's types) says, "v" included.
    definition = {
        "hello": "HelloReply",
        "status": "StatusReply",
        "metfs status --json": "StatusReply",
        "files": "FilesViewReply",
        "files direct": "FilesViewReply",
        "release": "ReleasedReply",
    }
    for op, reply in replies.items():
        assert reply.get("v") == 1, (op, reply)
        validator(definition.get(op, "DecisionReply")).validate(reply)

    parsed["hello"] = _parse(Hello.from_response, replies["hello"])
    parsed["status"] = _parse(Status.from_response, replies["status"])
    parsed["metfs status --json"] = _parse(Status.from_response, replies["metfs status --json"])
    parsed["files"] = _parse(FilesView.from_response, replies["files"])
    parsed["files direct"] = _parse(FilesView.from_response, replies["files direct"])
    for op in ("pass_end", "pass_end block", "advance", "apply"):
        parsed[op] = _parse(partial(Decision.from_response, op=op.split()[0]), replies[op])

    # `reason` explains a policy's decision; a forced advance or an apply has none to give.
    absent_ok = {"advance": frozenset({"reason"}), "apply": frozenset({"reason"})}
    missing = {
        op: _missing(read, replies[op], absent_ok.get(op, frozenset()))
        for op, (_, read) in parsed.items()
    }
    assert not any(missing.values()), (
        f"fields the client reads that the daemon does not send: {missing}; replies: {replies}"
    )

    # What was read carries the values: the optional fields are not silently None.
    hello: Hello = parsed["hello"][0]
    assert hello.job == "schema" and hello.version and hello.mountpoint
    for key in ("status", "metfs status --json"):
        st: Status = parsed[key][0]
        assert st.policy == "fixed", st
        for name in ("cache_bytes", "budget_bytes", "tier_bytes_read", "view_files"):
            assert isinstance(getattr(st, name), int), (key, name)
        assert os.path.realpath(st.mountpoint or "") == os.path.realpath(m.mountpoint)
    # By the CLI's status, mini-epoch 0 got its 2 passes (the last one blocking) and mini-epoch 1
    # none (an advance): the effective rf counts the first only.
    after: Status = parsed["metfs status --json"][0]
    assert (after.effective_rf, after.last_rf) == (2.0, 2), after.raw
    assert (after.completed_mini_epochs, after.stalled_mini_epochs) == (1, 0), after.raw
    assert after.mini_epoch_bonus_passes == 0, after.raw
    view: FilesView = parsed["files"][0]
    assert len(view) == parsed["status"][0].view_files
    assert view.direct_root is None and replies["files"]["direct_root"] is None
    direct: FilesView = parsed["files direct"][0]
    assert direct.direct_root and direct.files == view.files
    assert replies["release"]["released"] == direct.generation
    first: Decision = parsed["pass_end"][0]
    assert (first.decision, first.passes_done, first.rf) == ("repeat", 1, 2.0)
    assert first.reason is not None and first.reason["policy"] == "fixed"
    second: Decision = parsed["pass_end block"][0]
    assert second.advanced and second.position == (0, 1) and second.passes_done == 0
    assert parsed["advance"][0].position == (0, 2)
    assert parsed["apply"][0].position == (0, 2)


def test_error_replies_carry_code_and_message(real_mount: Callable[..., RealMount]) -> None:
    m = real_mount(per_class=5, mini_epochs=2, rf=1)
    reply = _raw(m.socket, {"op": "no_such_op"})
    assert reply["ok"] is False and set(reply["error"]) >= {"code", "message"}, reply
    validator("ErrorReply").validate(reply)
    # A request of another major version is refused, naming both versions.
    newer = _raw(m.socket, {"v": 2, "op": "status"})
    validator("ErrorReply").validate(newer)
    assert newer["error"]["code"] == "unsupported_version", newer
    assert "version 2" in newer["error"]["message"] and "version 1" in newer["error"]["message"]
    # The client turns them into MetfsError with the daemon's own code and message.
    with metfs.Client(m.socket) as c, pytest.raises(metfs.MetfsError) as e:
        c.request({"op": "no_such_op"})
    assert e.value.code == reply["error"]["code"] == "unknown_op"
    assert e.value.message == reply["error"]["message"] and "no_such_op" in e.value.message


def test_the_event_log_follows_the_schema(real_mount: Callable[..., RealMount]) -> None:
    """Every record a real daemon writes (start, pass_end, decision, staged, switch, tier)."""
    m = real_mount(per_class=5, mini_epochs=3, rf=2)
    with metfs.Client(m.socket) as c:
        for _ in range(4):
            c.pass_end({"loss": 1.0}, block=True)
    log = os.path.join(m.cache, "run", "events.jsonl")
    with open(log) as f:
        records = [json.loads(line) for line in f]
    kinds = {r["event"] for r in records}
    assert {"start", "pass_end", "decision", "staged", "switch"} <= kinds, kinds
    check = validator("Record")
    for r in records:
        assert r["v"] == 1, r
        check.validate(r)


def test_bonus_passes_raise_the_effective_rf_and_log_stall_rf(
    real_mount: Callable[..., RealMount],
) -> None:
    """A slow tier and a non-blocking ``pass_end``: the fixed rf 2 becomes more, and says so."""
    # A mini-epoch (about 36 KiB) takes about half a second to stage at this cap.
    m = real_mount(per_class=5, mini_epochs=3, rf=2, extra_args=["--prefetch-rate", "64KiB/s"])
    with metfs.Client(m.socket) as c:
        assert c.pass_end({"loss": 1.0}).decision == "repeat"
        assert c.pass_end({"loss": 1.0}, block=True).advanced
        passes = 0
        while True:
            d = c.pass_end({"loss": 1.0})
            passes += 1
            if d.advanced:
                break
            assert passes < 3000, "mini-epoch 2 was not staged"
            time.sleep(0.01)
        st = c.status()
    assert passes > 2, "the successor was staged before the second pass ended"
    assert st.rf == 2.0 and st.last_rf == passes, st.raw
    assert st.effective_rf == (2 + passes) / 2 and st.stalled_mini_epochs == 1, st.raw
    log = os.path.join(m.cache, "run", "events.jsonl")
    # The event log writes on a thread of its own; the stall_rf precedes the switch it records.
    stalls: list[dict[str, Any]] = []
    for _ in range(500):
        with open(log) as f:
            records = [json.loads(line) for line in f if line.endswith("\n")]
        stalls = [r for r in records if r["event"] == "stall_rf"]
        if stalls:
            break
        time.sleep(0.01)
    assert len(stalls) == 1, stalls
    validator("Record").validate(stalls[0])
    assert stalls[0]["sequence"] == 1 and stalls[0]["policy_rf"] == 2, stalls
    assert stalls[0]["effective_rf"] == passes and stalls[0]["bonus_passes"] == passes - 2, stalls
