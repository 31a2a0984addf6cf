"""The control socket's transport: one Unix-socket connection carrying JSON lines.

:class:`Connection` connects, sends a request as one line with the protocol's version added,
reads one reply line (and the raw bytes of a packed list after a ``files`` reply) and notices a
peer that closed while the connection was idle. What a request means, the handshake and
reconnecting are the :class:`metfs.Client`'s.
"""

from __future__ import annotations

import errno
import json
import socket as _socket
from collections.abc import Mapping
from typing import Any

from .errors import MetfsConnectionError, MetfsError
from .protocol import PROTOCOL_VERSION, check_version

__all__ = ["MAX_PACKED_BYTES", "MAX_RESPONSE_BYTES", "Connection"]

#: Longest response line accepted from the daemon (a ``files`` answer for a large view is long).
MAX_RESPONSE_BYTES = 1 << 30

#: Largest packed file list accepted after a ``files`` reply (10M paths take ~1 GB).
MAX_PACKED_BYTES = 1 << 34


class Connection:
    """One connection to the control socket at ``path`` (opened by :meth:`open`)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._sock: _socket.socket | None = None
        self._buf = bytearray()

    @property
    def is_open(self) -> bool:
        """Whether a connection is open."""
        return self._sock is not None

    def open(self, timeout: float | None) -> None:
        """Connects (``timeout`` bounds the connect); failures raise
        :class:`metfs.MetfsConnectionError` saying what is wrong."""
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(self.path)
        except FileNotFoundError:
            sock.close()
            raise MetfsConnectionError(
                "connection_failed",
                f"metfs control socket {self.path} does not exist: is the daemon "
                "running (`metfs mount ...`) and is this the socket it was given?",
            ) from None
        except ConnectionRefusedError:
            sock.close()
            raise MetfsConnectionError(
                "connection_failed",
                f"nothing listens on metfs control socket {self.path}: "
                "the daemon has exited (see its log) or the mount was unmounted",
            ) from None
        except TimeoutError:
            sock.close()
            raise MetfsConnectionError(
                "timeout", f"connecting to metfs control socket {self.path} timed out"
            ) from None
        except OSError as e:
            sock.close()
            raise MetfsConnectionError(
                "connection_failed", f"cannot connect to metfs control socket {self.path}: {e}"
            ) from None
        self._sock = sock
        self._buf.clear()

    def close(self) -> None:
        """Closes the connection (if open)."""
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None
                self._buf.clear()

    def peer_closed(self) -> bool:
        """Whether the daemon closed its end while we were idle (a pending EOF or error)."""
        assert self._sock is not None
        if self._buf:
            return False
        # Non-blocking for the peek: with a timeout set, CPython waits for the socket to become
        # readable before `recv` (MSG_DONTWAIT or not), so every request on an idle, healthy
        # connection would first wait out the client's whole timeout. `send` sets it back.
        self._sock.settimeout(0.0)
        try:
            data = self._sock.recv(1, _socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True
        return data == b""

    def send(self, request: Mapping[str, Any], timeout: float | None) -> None:
        """Sends one request line, with ``"v"``; one that JSON cannot carry is ``bad_request``."""
        assert self._sock is not None
        try:
            message = {"v": PROTOCOL_VERSION, **request}
            line = json.dumps(message, allow_nan=False, separators=(",", ":")) + "\n"
        except (TypeError, ValueError) as e:
            raise MetfsError("bad_request", f"request cannot be encoded as JSON: {e}") from None
        self._sock.settimeout(timeout)
        self._sock.sendall(line.encode("utf-8"))

    def recv(self, timeout: float | None, op: str) -> dict[str, Any]:
        """The next reply line as an object with ``ok``, of this protocol version."""
        assert self._sock is not None
        self._sock.settimeout(timeout)
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line = bytes(self._buf[:nl])
                del self._buf[: nl + 1]
                break
            if len(self._buf) > MAX_RESPONSE_BYTES:
                raise MetfsError(
                    "bad_response", f"`{op}` response is longer than {MAX_RESPONSE_BYTES} bytes"
                )
            try:
                chunk = self._sock.recv(1 << 16)
            except TimeoutError:
                raise MetfsError(
                    "timeout", f"no answer to `{op}` from {self.path} within {timeout} s"
                ) from None
            if not chunk:
                raise ConnectionResetError(errno.ECONNRESET, "daemon closed the connection")
            self._buf.extend(chunk)
        try:
            obj = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise MetfsError(
                "bad_response", f"`{op}` response is not JSON ({e}): {line[:200]!r}"
            ) from None
        if not isinstance(obj, dict) or not isinstance(obj.get("ok"), bool):
            raise MetfsError(
                "bad_response", f"`{op}` response is not an object with `ok`: {line[:200]!r}"
            )
        check_version(obj, f"`{op}` reply")
        return obj

    def recv_packed(
        self, reply: Mapping[str, Any], timeout: float | None, op: str
    ) -> bytearray | None:
        """The bytes after a reply whose ``packed`` says a list follows (else ``None``)."""
        packed = reply.get("packed")
        if not reply.get("ok") or not isinstance(packed, dict):
            return None
        n = packed.get("bytes")
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_PACKED_BYTES:
            raise MetfsError(
                "bad_response",
                f"`{op}` reply announces a packed list of {n!r} bytes "
                f"(at most {MAX_PACKED_BYTES} are read)",
            )
        assert self._sock is not None
        out = bytearray(n)
        have = min(len(self._buf), n)
        out[:have] = self._buf[:have]
        del self._buf[:have]
        mv = memoryview(out)
        self._sock.settimeout(timeout)
        while have < n:
            try:
                got = self._sock.recv_into(mv[have:], min(n - have, 1 << 22))
            except TimeoutError:
                raise MetfsError(
                    "timeout",
                    f"the packed list after `{op}` stopped after {have} of {n} bytes "
                    f"({self.path}, {timeout} s)",
                ) from None
            if not got:
                raise ConnectionResetError(errno.ECONNRESET, "daemon closed the connection")
            have += got
        mv.release()
        return out
