"""Client of the metfs control socket.

:class:`Client` holds one connection to a daemon's control socket (:mod:`metfs.wire`) and
offers its requests as methods: each builds its request with the function of
:mod:`metfs.protocol` and reads the reply into its typed answer (:class:`metfs.Hello`,
:class:`metfs.Status`, :class:`metfs.FilesView`, :class:`metfs.Decision`); failures raise
:class:`metfs.MetfsError` (:mod:`metfs.errors`). The names this module exported before it was
split (the reply types, the errors, :func:`metrics_to_floats`, ...) are still importable from
it.

This module uses the standard library only.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .errors import MetfsConnectionError, MetfsError, error_from
from .metrics import metrics_to_floats
from .protocol import (
    PROTOCOL_VERSION,
    DecisionKind,
    HelloRequest,
    PolicyKind,
    Subset,
    advance_request,
    apply_request,
    check_version,
    files_request,
    hello_request,
    leave_request,
    pass_end_request,
    release_request,
    status_request,
)
from .replies import Decision, Hello, Left, NotResumed, Released, Replay, read_reply
from .signals import PassSignals
from .status import Status
from .views import FilesReply, FilesView
from .wire import Connection

if TYPE_CHECKING:
    from typing import Self

__all__ = [
    "PROTOCOL_VERSION",
    "Client",
    "Decision",
    "DecisionKind",
    "FilesView",
    "Hello",
    "MetfsConnectionError",
    "MetfsError",
    "NotResumed",
    "Replay",
    "Status",
    "check_version",
    "metrics_to_floats",
]

#: Environment variable naming the control socket when no path is given.
SOCKET_ENV = "METFS_SOCKET"

#: Environment variable naming the job when no job is given.
JOB_ENV = "METFS_JOB"

#: Ops whose repetition has no further effect; they are retried once after a dropped connection
#: even when the request may already have reached the daemon.
_IDEMPOTENT_OPS = frozenset({"hello", "status", "files", "apply"})


class Client:
    """A persistent connection to one metfs daemon's control socket.

    ``socket`` is the socket path; without it, the environment variable ``METFS_SOCKET``.
    ``job`` names the training job (for rf history and per-job state); without it,
    ``METFS_JOB`` if set. ``timeout`` bounds each request that does not wait for staging
    (``None``: no bound); ``wait_timeout`` bounds requests that wait for staging
    (``pass_end(block=True)``, ``advance(wait=True)``, ``apply(wait=True)``; ``None``: no bound).

    The client connects and sends ``hello`` at construction (``connect=False`` defers that to
    the first request), so a dead daemon is reported at once with ``MetfsConnectionError``.
    A connection the daemon dropped is re-established once per request: a request that cannot
    have reached the daemon is resent; one that may have reached it is resent only if repeating
    it is harmless (``hello``, ``status``, ``files``, ``apply``), otherwise
    ``MetfsConnectionError("connection_lost")`` is raised.

    On a shared mount (``metfs mount --share``) the ``hello`` joins the job under its name
    (required there) and answers once its first view is staged; ``subset`` (one of
    ``{"manifest": PATH}``, ``{"labels": [...]}``, ``{"fraction": F, "seed": S}``),
    ``rf_policy`` and ``rf`` choose what it reads and how often; every request carries the
    job's name, a reconnection the token the daemon gave, and :meth:`leave` ends it (else it
    is dropped after the mount's ``share.idle_secs`` without a request). The job's view is at
    ``client.info.view_path``. A shared mount saves each job's place, so a job whose daemon
    was restarted resumes where it was when it joins again with its name and ``token`` (the
    one ``client.info.share["token"]`` gave; a client that stays alive resends it by itself).

    ``direct=True`` makes :meth:`files` ask for direct paths by default (the view's files in
    the cache, read without FUSE, under a lease: see :meth:`files`); the loaders that take a
    ``direct`` of their own (:func:`metfs.passes`, ``MetDataset``, ``MetSequence``) follow the
    client when theirs is ``None``.

    The client is safe to share between threads (requests are serialised) and is a context
    manager that closes the connection.
    """

    def __init__(
        self,
        socket: str | None = None,
        job: str | None = None,
        timeout: float | None = None,
        *,
        wait_timeout: float | None = None,
        connect: bool = True,
        subset: Subset | None = None,
        rf_policy: PolicyKind | None = None,
        rf: int | None = None,
        direct: bool = False,
        token: str | None = None,
    ) -> None:
        path = socket if socket is not None else os.environ.get(SOCKET_ENV)
        if not path:
            raise MetfsError(
                "no_socket",
                f"no control socket given: pass socket=... or set {SOCKET_ENV} "
                "(the daemon's default is CACHE_DIR/metfs.sock)",
            )
        self.socket_path: str = os.fspath(path)
        self.job: str | None = job if job is not None else (os.environ.get(JOB_ENV) or None)
        self.timeout = timeout
        self.wait_timeout = wait_timeout
        self.subset: Subset | None = subset
        self.rf_policy = rf_policy
        self.rf = rf
        #: Whether :meth:`files` asks for direct paths when its ``direct`` is ``None``.
        self.direct = direct
        #: A direct ``files`` was answered and no ``release`` or ``close`` followed: later
        #: ``files`` stay direct, so the lease follows the view (and a new connection takes
        #: one again) instead of pinning an old slot.
        self._leasing = False
        #: The generation this connection holds a lease on, as its answers said.
        self._lease: int | None = None
        self._token: str | None = token
        self._conn = Connection(self.socket_path)
        self._lock = threading.RLock()
        self._hello: Hello | None = None
        if connect:
            self.connect()

    # -- connection -----------------------------------------------------------------------

    def connect(self) -> Hello:
        """Opens the connection (if closed) and performs the ``hello`` handshake."""
        with self._lock:
            if not self._conn.is_open:
                self._open()
            assert self._hello is not None
            return self._hello

    def _open(self) -> None:
        """Connects and shakes hands (``hello``, which on a shared mount joins the job)."""
        self._conn.open(self.timeout)
        try:
            self._conn.send(self._hello_request(), self.timeout)
            # A join on a shared mount answers once the job's first view is staged.
            resp = self._conn.recv(self.wait_timeout if self.job else self.timeout, "hello")
            if not resp["ok"]:
                raise error_from(resp)
            self._took_hello(Hello.from_response(resp))
        except (OSError, ConnectionError) as e:
            self._close_socket()
            if isinstance(e, MetfsError):
                raise
            raise MetfsConnectionError(
                "connection_failed",
                f"the metfs daemon at {self.socket_path} closed the connection during the "
                f"handshake ({e}): is it shutting down?",
            ) from None
        except BaseException:
            self._close_socket()
            raise

    def _hello_request(self) -> HelloRequest:
        return hello_request(
            self.job, subset=self.subset, rf_policy=self.rf_policy, rf=self.rf, token=self._token
        )

    def _took_hello(self, hello: Hello) -> None:
        self._hello = hello
        if hello.share is not None:
            self._token = hello.share["token"]

    def _close_socket(self) -> None:
        # A lease is the connection's: it ends with it.
        self._lease = None
        self._conn.close()

    def close(self) -> None:
        """Closes the connection, which ends its lease (if :meth:`files` took one with
        ``direct``). A later request reconnects; a later ``files`` takes a lease only if asked
        with ``direct`` (or the client was made with ``direct=True``)."""
        with self._lock:
            self._leasing = False
            self._close_socket()

    @property
    def lease(self) -> int | None:
        """The generation whose slot the open connection holds a lease on (taken by
        :meth:`files` with ``direct``), or ``None``: none taken, released, or lost with a
        dropped connection (the next ``files`` takes it again)."""
        return self._lease

    @property
    def connected(self) -> bool:
        """Whether a connection is open."""
        return self._conn.is_open

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client(socket={self.socket_path!r}, job={self.job!r})"

    # -- requests ---------------------------------------------------------------------------

    def request(self, request: Mapping[str, Any], *, wait: bool = False) -> dict[str, Any]:
        """Sends one request object and returns the successful response object.

        Raises ``MetfsError`` with the daemon's code when the response has ``"ok": false``.
        ``wait`` marks a request that may wait for staging (``wait_timeout`` applies to it).
        """
        return self._exchange(request, wait=wait)[0]

    def _exchange(
        self, request: Mapping[str, Any], *, wait: bool = False
    ) -> tuple[dict[str, Any], bytearray | None]:
        """:meth:`request`, with the packed bytes that follow a ``files`` reply in that form."""
        op = str(request.get("op", "?"))
        timeout = self.wait_timeout if wait else self.timeout
        with self._lock:
            for attempt in (0, 1):
                if not self._conn.is_open:
                    self._open()
                elif self._conn.peer_closed():
                    self._close_socket()
                    self._open()
                sent = False
                try:
                    self._conn.send(request, self.timeout)
                    sent = True
                    resp = self._conn.recv(timeout, op)
                    payload = self._conn.recv_packed(resp, timeout, op)
                except MetfsError as e:
                    if e.code == "timeout":
                        # The answer may still come; the stream is out of step, start afresh.
                        self._close_socket()
                    raise
                except (OSError, ConnectionError) as e:
                    self._close_socket()
                    if attempt == 0 and (not sent or op in _IDEMPOTENT_OPS):
                        continue
                    if sent:
                        raise MetfsConnectionError(
                            "connection_lost",
                            f"the metfs daemon at {self.socket_path} closed the connection "
                            f"before answering `{op}` ({e}); the request may or may not have "
                            "been carried out. Is the daemon still running?",
                        ) from None
                    raise MetfsConnectionError(
                        "connection_lost",
                        f"cannot send `{op}` to the metfs daemon at {self.socket_path}: {e}",
                    ) from None
                if not resp["ok"]:
                    raise error_from(resp)
                self._track_lease(request, resp)
                return resp, payload
        raise AssertionError("unreachable")

    def _track_lease(self, request: Mapping[str, Any], resp: Mapping[str, Any]) -> None:
        """Notes what a successful answer did to the connection's lease (also for requests
        sent with :meth:`request`)."""
        op = request.get("op")
        if op == "files" and request.get("direct") is True:
            generation = resp.get("generation")
            if isinstance(generation, int) and not isinstance(generation, bool):
                self._lease = generation
                self._leasing = True
        elif op == "release":
            self._lease = None
            self._leasing = False

    # -- ops --------------------------------------------------------------------------------

    def hello(self) -> Hello:
        """Performs the handshake again and returns the daemon's identity."""
        self._took_hello(Hello.from_response(self.request(self._hello_request())))
        assert self._hello is not None
        return self._hello

    def leave(self) -> None:
        """Leaves a shared mount: the job's view goes and its share of the store is freed."""
        read_reply(Left, self.request(leave_request(self.job or "")), "leave")
        self._token = None

    @property
    def info(self) -> Hello | None:
        """The last ``hello`` answer (``None`` before the first connection)."""
        return self._hello

    def status(self) -> Status:
        """The daemon's state: position, generation, staging readiness, bytes."""
        return Status.from_response(self.request(status_request(self.job)))

    def files(self, known: FilesView | None = None, direct: bool | None = None) -> FilesView:
        """The current view's files (relative and absolute) with its generation and position.

        The list comes packed (one buffer, a string built only for the path read: see
        :class:`metfs.pathlist.PathList`). With ``known``, a view read earlier, the daemon sends
        no list while its generation is still ``known``'s, and ``known`` itself is returned:
        asking at every pass costs one short round trip, whatever the view's size.

        With ``direct=True`` the view's :attr:`FilesView.paths` (what to open) are its
        ``direct_paths`` under ``direct_root`` (its ``mount_paths`` stay the files under the
        mount): the staged copies of its files in the cache, complete and immutable, to be read
        directly instead of through FUSE (native speed where FUSE
        passthrough is not available), and this connection takes a **lease** on the view's
        generation: while it holds, the daemon does not evict that view's slot, even after the
        view has switched. Only the daemon's own user and root may ask (else ``MetfsError``
        ``not_permitted``: read through the mount). One lease per connection: it moves to the
        view answered by the next direct ``files``, and ends at :meth:`release`, at
        :meth:`close`, or when the connection drops (the daemon closes one idle for its
        ``control.idle_timeout_secs``, 600 s by default). Other processes may read the direct
        paths (forked ``DataLoader`` workers) while this client's connection holds the lease.

        ``direct=None`` (the default) is ``True`` for a client made with ``direct=True`` and
        for one that took a lease and has not released it since: the lease follows the view
        rather than pinning a slot the reader has left. The client remembers that it leases,
        so after a dropped connection (a reconnection loses the lease) the next ``files``
        takes the lease again, on the current view; between the drop and that ``files`` no
        lease is held, and a view that switched meanwhile may have been evicted. ``direct=False``
        asks for the mount's paths only; a lease held stays where it is until :meth:`release`.
        """
        with self._lock:
            want = bool(direct if direct is not None else (self.direct or self._leasing))
            req = files_request(
                self.job,
                known_generation=None if known is None else known.generation,
                direct=want,
            )
            resp, payload = self._exchange(req)
        reply = FilesReply.from_response(resp)
        if want and reply.direct_root is None:
            raise MetfsError(
                "bad_response",
                f"`files` with `direct` got no `direct_root` from {self.socket_path}: the "
                "daemon is older than direct reads; read through the mount",
            )
        root = reply.direct_root if want else None
        if known is not None and reply.unchanged:
            if reply.generation != known.generation:
                raise MetfsError(
                    "bad_response",
                    f"`files` reply says unchanged for generation {reply.generation}; "
                    f"the list held is of generation {known.generation}",
                )
            return known.with_direct_root(root)
        if not want and reply.direct_root is not None:
            reply = dataclasses.replace(reply, direct_root=None)
        return FilesView.from_reply(reply, payload)

    def release(self, generation: int | None = None) -> int:
        """Ends this connection's lease (taken by :meth:`files` with ``direct``) and returns
        its generation; the view's slot may then be evicted once nothing else holds it, so the
        direct paths of that view must not be read any more.

        With ``generation``, only a lease on that generation is ended: a lease on another one
        stays and ``MetfsError`` ``no_lease`` is raised. Without a lease on this connection
        (none taken, already released, or lost with a dropped connection, which ended it) the
        daemon answers ``no_lease`` too. After a release, :meth:`files` asks for direct paths
        again only when told to (or the client was made with ``direct=True``).
        """
        req = release_request(generation)
        with self._lock:
            try:
                resp = self.request(req)
            except MetfsError as e:
                if e.code == "no_lease" and (generation is None or self._lease is None):
                    # This connection holds no lease: nothing is leased, nor to be re-taken.
                    self._lease = None
                    self._leasing = False
                raise
        return read_reply(Released, resp, "release").released

    def pass_end(
        self,
        metrics: Mapping[str, Any] | None = None,
        block: bool = False,
        *,
        progress: float | None = None,
        fresh_loss: float | None = None,
    ) -> Decision:
        """Reports the end of one pass over the current mini-epoch and returns the decision.

        ``metrics`` maps names to numbers (Python, numpy or one-element torch values); they are
        converted to floats here and anything else is rejected with ``bad_metrics`` before
        sending. With ``block=True``, when the policy wants to advance the daemon waits for the
        next mini-epoch to be staged and answers ``advance`` instead of ``wait``.

        ``progress`` (the elapsed fraction of the job's budget, in [0, 1]) and ``fresh_loss``
        (the loss of the first batches of a mini-epoch's first pass, before training on them)
        are the signals a policy such as ``paced`` reads (:mod:`metfs.signals`); out of range
        or not finite, they raise ``bad_metrics`` naming the field, before sending.
        """
        signals = PassSignals(progress=progress, fresh_loss=fresh_loss)
        request = pass_end_request(
            self.job,
            metrics_to_floats(metrics),
            block=block,
            progress=signals.progress,
            fresh_loss=signals.fresh_loss,
        )
        return Decision.from_response(self.request(request, wait=block), "pass_end")

    def advance(self, wait: bool = False) -> Decision:
        """Forces an advance to the next mini-epoch.

        Without ``wait`` the answer is ``wait`` when the next mini-epoch is not staged yet; with
        ``wait=True`` the daemon blocks until it is staged and the view has switched.
        """
        return Decision.from_response(
            self.request(advance_request(self.job, wait=wait), wait=wait), "advance"
        )

    def apply(self, epoch: int, mini_epoch: int, wait: bool = True) -> Decision:
        """Moves the view to exactly ``mini_epoch`` of ``epoch`` (a decision made elsewhere).

        Used by followers in multi-node jobs; with ``wait=True`` blocks until that mini-epoch is
        staged and shown.
        """
        request = apply_request(self.job, epoch, mini_epoch, wait=wait)
        return Decision.from_response(self.request(request, wait=wait), "apply")
