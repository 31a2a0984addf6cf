"""An in-process stand-in for the metfs control socket, for unit tests of the client.

It speaks the control protocol (newline-delimited JSON, docs/protocol.schema.json) with a fixed-rf policy over a
made-up dataset, and lets tests inject faults: dropped connections, staging that is not ready,
error responses. ``files`` with ``direct`` answers a ``direct_root`` and takes a lease for the
connection, as the real daemon does (``release`` ends it, and so does the connection's end);
``leases`` counts them by generation. The real daemon is tested in ``test_daemon_*.py``.
"""

from __future__ import annotations

import json
import math
import os
import socket
import threading
from typing import Any


class FakeDaemon:
    """A fixed-rf MET daemon over ``mini_epochs`` made-up mini-epochs of ``files_per`` files
    (one count for all, or one per mini-epoch index)."""

    def __init__(
        self,
        path: str,
        *,
        mini_epochs: int = 3,
        rf: int = 2,
        files_per: int | list[int] = 4,
        mountpoint: str = "/fake/mnt",
        direct_root: str | None = None,
    ) -> None:
        self.path = path
        self.mini_epochs = mini_epochs
        self.rf = rf
        self.files_per = files_per
        self.mountpoint = mountpoint
        #: The slot directory ``files`` with ``direct`` names (by default one per generation,
        #: under ``/fake/cache``, which does not exist).
        self.direct_root = direct_root
        #: Leases held, by generation: what ``status.draining[*].leases`` counts.
        self.leases: dict[int, int] = {}
        self.epoch = 0
        self.mini_epoch = 0
        self.passes = 0
        self.generation = 1
        self.next_ready = True
        self.requests: list[dict[str, Any]] = []
        self.metrics: list[dict[str, float]] = []
        #: Close the connection after reading the next N requests, without answering.
        self.drop_after_read = 0
        #: Ops to refuse with this error code.
        self.fail_ops: dict[str, str] = {}
        self.hello_count = 0
        #: The protocol version (``"v"``) put on every reply; ``None`` sends none (an older daemon).
        self.reply_version: int | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._srv.bind(path)
        self._srv.listen(16)
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    # -- control ----------------------------------------------------------------------------

    def close(self) -> None:
        """Stops listening and closes every connection (a dead daemon)."""
        self._stop.set()
        try:
            self._srv.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._srv.close()
        self.drop_connections()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def drop_connections(self) -> None:
        """Closes every open connection but keeps listening (a daemon that drops idle clients)."""
        with self._lock:
            conns = list(self._conns)
            self._conns.clear()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()

    def ops(self) -> list[str]:
        """The ops received so far, in order."""
        return [r.get("op", "?") for r in self.requests]

    def files_at(self, epoch: int, mini_epoch: int) -> list[str]:
        """The relative files of a mini-epoch."""
        n = self.files_per if isinstance(self.files_per, int) else self.files_per[mini_epoch]
        return [f"{i % 2}/e{epoch}m{mini_epoch}_{i}.npy" for i in range(n)]

    # -- server -----------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._srv.accept()
            except OSError:
                return
            with self._lock:
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def root_of(self, generation: int) -> str:
        """The ``direct_root`` answered for a view of ``generation``."""
        if self.direct_root is not None:
            return self.direct_root
        return f"/fake/cache/slots/g{generation}"

    def _serve(self, conn: socket.socket) -> None:
        f = conn.makefile("rb")
        #: This connection's lease: the generation it holds, if any.
        held: dict[str, int] = {}
        try:
            for raw in f:
                try:
                    req = json.loads(raw)
                except ValueError:
                    self._send(conn, _err("bad_json", "request is not valid JSON"))
                    continue
                with self._lock:
                    self.requests.append(req)
                    drop = self.drop_after_read > 0
                    if drop:
                        self.drop_after_read -= 1
                if drop:
                    conn.shutdown(socket.SHUT_RDWR)
                    conn.close()
                    return
                with self._lock:
                    resp = self._handle(req, held)
                    if self.reply_version is not None:
                        resp = {"v": self.reply_version, **resp}
                self._send(conn, resp)
                if req.get("op") == "shutdown":
                    self.close()
                    return
        except OSError:
            pass
        finally:
            with self._lock:
                self._conns.discard(conn)
                if "lease" in held:
                    self._drop_lease(held.pop("lease"))
            try:
                conn.close()
            except OSError:
                pass

    @staticmethod
    def _send(conn: socket.socket, resp: dict[str, Any]) -> None:
        conn.sendall((json.dumps(resp) + "\n").encode())

    # -- protocol ---------------------------------------------------------------------------

    def _position(self, decision: str) -> dict[str, Any]:
        return {
            "ok": True,
            "decision": decision,
            "generation": self.generation,
            "epoch": self.epoch,
            "mini_epoch": self.mini_epoch,
            "mini_epochs": self.mini_epochs,
            "pass": self.passes,
            "rf": self.rf,
            "next_ready": self.next_ready,
            "reason": {"policy": "fixed", "rf": self.rf, "passes": self.passes},
        }

    def _advance(self) -> None:
        self.mini_epoch += 1
        if self.mini_epoch == self.mini_epochs:
            self.mini_epoch = 0
            self.epoch += 1
        self.passes = 0
        self.generation += 1

    def _drop_lease(self, generation: int) -> None:
        self.leases[generation] -= 1
        if not self.leases[generation]:
            del self.leases[generation]

    def _handle(self, req: dict[str, Any], held: dict[str, int]) -> dict[str, Any]:
        op = req.get("op")
        if op in self.fail_ops:
            return _err(self.fail_ops[op], f"injected failure of {op}")
        if op == "shutdown":  # the daemon exits right after answering (see _serve)
            return {"ok": True}
        if op == "hello":
            self.hello_count += 1
            if req.get("version", 1) > 1:
                return _err("unsupported_version", "client is newer")
            return {
                "ok": True,
                "protocol": 1,
                "version": "0.1.0",
                "mountpoint": self.mountpoint,
                "job": req.get("job"),
            }
        if op == "status":
            return status_reply(
                epoch=self.epoch,
                mini_epoch=self.mini_epoch,
                mini_epochs=self.mini_epochs,
                rf=self.rf,
                generation=self.generation,
                next_ready=self.next_ready,
                mountpoint=self.mountpoint,
                view_files=len(self.files_at(self.epoch, self.mini_epoch)),
                tier_bytes_read=10 * self.generation,
                # Retired views a lease still holds (the fake keeps no other holder).
                draining=[
                    {
                        "generation": g,
                        "slot": f"g{g}",
                        "open_handles": 0,
                        "leases": n,
                        "kernel_refs": 0,
                        "kernel_held": [],
                    }
                    for g, n in sorted(self.leases.items())
                    if g != self.generation
                ],
                **{"pass": self.passes},
            )
        if op == "files":
            reply = {
                "ok": True,
                "generation": self.generation,
                "epoch": self.epoch,
                "mini_epoch": self.mini_epoch,
                "mountpoint": self.mountpoint,
                "files": self.files_at(self.epoch, self.mini_epoch),
                "unchanged": False,
                "direct_root": None,
            }
            if req.get("known_generation") == self.generation:
                reply["files"], reply["unchanged"] = [], True
            if req.get("direct") is True:
                if "lease" in held:
                    self._drop_lease(held["lease"])
                held["lease"] = self.generation
                self.leases[self.generation] = self.leases.get(self.generation, 0) + 1
                reply["direct_root"] = self.root_of(self.generation)
            return reply
        if op == "release":
            want = req.get("generation")
            if "lease" not in held:
                return _err("no_lease", "`release`: this connection holds no lease")
            if want is not None and want != held["lease"]:
                return _err(
                    "no_lease",
                    f"`release` of generation {want}: this connection's lease is on "
                    f"generation {held['lease']}; nothing was released",
                )
            released = held.pop("lease")
            self._drop_lease(released)
            return {"ok": True, "released": released}
        if op == "pass_end":
            metrics = req.get("metrics") or {}
            if not isinstance(metrics, dict) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                for v in metrics.values()
            ):
                return _err("bad_metrics", "metrics must be finite numbers")
            self.metrics.append(metrics)
            self.passes += 1
            if self.passes < self.rf:
                return self._position("repeat")
            if self.next_ready or req.get("block"):
                self._advance()
                return self._position("advance")
            return self._position("wait")
        if op == "advance":
            if self.next_ready or req.get("wait"):
                self._advance()
                return self._position("advance")
            return self._position("wait")
        if op == "apply":
            target = (req["epoch"], req["mini_epoch"])
            if target != (self.epoch, self.mini_epoch):
                self.epoch, self.mini_epoch = target
                self.passes = 0
                self.generation += 1
                return self._position("advance")
            return self._position("repeat")
        return _err("unknown_op", f"unknown op `{op}`")


def status_reply(**fields: Any) -> dict[str, Any]:
    """A ``status`` reply with every field the protocol requires, as a plain mount at the start
    of its first mini-epoch would answer; ``fields`` replace any of them."""
    reply: dict[str, Any] = {
        "ok": True,
        "epoch": 0,
        "mini_epoch": 0,
        "mini_epochs": 3,
        "pass": 0,
        "rf": 2.0,
        "generation": 1,
        "next_ready": True,
        "job": "default",
        "rf_policy": "fixed",
        "advance_wanted": False,
        "stall_free_rf": None,
        "bonus_passes": 0,
        "blocked_seconds": 0.0,
        "pass_seconds": None,
        "pass_seconds_mean": None,
        "mountpoint": "/fake/mnt",
        "source": "/fake/src",
        "socket": "/fake/cache/metfs.sock",
        "pid": 1,
        "uptime_s": 1.0,
        "node_rank": 0,
        "nodes": 1,
        "compose": "stratified",
        "read_path": "cached",
        "passthrough": False,
        "prefetch_rate": None,
        "cache_bytes": 100,
        "budget_bytes": 1000,
        "reserve_bytes": 10,
        "slot_bytes": 495,
        "view_bytes": 40,
        "view_files": 4,
        "dataset_bytes": 120,
        "dataset_files": 12,
        "tier_bytes_read": 10,
        "reused_bytes": 0,
        "daemon_bytes_read": 0,
        "daemon_lookups": 0,
        "daemon_opens": 0,
        "open_handles": 0,
        "primed_entries": 0,
        "primed_generation": 0,
        "b2_bytes_per_s": None,
        "b2_recent_bytes_per_s": None,
        "eb1_bytes_per_s": None,
        "staging": {"state": "idle"},
        "draining": [],
        "draining_slots": 0,
        "kept_slots": 0,
        "failed_samples": [],
        "last_error": None,
    }
    reply.update(fields)
    return reply


def _err(code: str, message: str) -> dict[str, Any]:
    return {"ok": False, "error": {"code": code, "message": message}}


def short_socket_path(tmp_path: Any, name: str = "s.sock") -> str:
    """A socket path short enough for AF_UNIX (108 bytes) even under a deep tmp dir."""
    path = os.path.join(str(tmp_path), name)
    if len(path) < 100:
        return path
    import tempfile

    return os.path.join(tempfile.mkdtemp(prefix="metfs"), name)


def wait_for(pred: Any, timeout: float = 5.0) -> bool | None:
    """Polls ``pred`` until it is true or ``timeout`` seconds pass."""
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.01)
    return None
