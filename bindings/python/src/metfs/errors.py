"""Errors of the metfs client: the daemon's error codes and the client's own.

A failed request's reply is ``{"v": 1, "ok": false, "error": {"code": ..., "message": ...}}``;
the client raises it as :class:`MetfsError` with the daemon's ``code``, one of
:data:`ErrorCode`, the protocol's closed set (the schema's ``ErrorCode``, checked by
``tests/test_protocol_schema.py``). The client adds codes of its own for what happens on its
side of the socket (:data:`ClientErrorCode`).

No ``from __future__ import annotations`` here: with it, Python 3.11's ``TypedDict`` takes
every key for required.
"""

from collections.abc import Mapping
from typing import Any, Literal, TypeAlias, TypedDict, cast

__all__ = [
    "AnyErrorCode",
    "ClientErrorCode",
    "ErrorBody",
    "ErrorCode",
    "MetfsConnectionError",
    "MetfsError",
    "error_from",
]

#: The codes of a failed request's reply (the protocol's ``ErrorCode``):
#: ``bad_json`` (the line is not a JSON object), ``line_too_long``, ``unknown_op``,
#: ``bad_request`` (a field is missing, of the wrong type or an invalid value; also a request
#: the client cannot encode), ``bad_metrics`` (a metric is not a finite number, or one the
#: policy needs is missing; the client refuses such a metric before sending),
#: ``unsupported_version`` (a message of another protocol major version, either way),
#: ``staging_failed``, ``shutting_down``, ``too_many_connections``, ``not_permitted`` (direct
#: paths asked by a user who may not read the cache), ``no_lease`` (``release`` of a lease not
#: held), ``internal``, and ``bad_response``, said by a client only: a reply that does not fit
#: the protocol.
ErrorCode: TypeAlias = Literal[
    "bad_json",
    "line_too_long",
    "unknown_op",
    "bad_request",
    "bad_metrics",
    "unsupported_version",
    "staging_failed",
    "shutting_down",
    "too_many_connections",
    "not_permitted",
    "no_lease",
    "internal",
    "bad_response",
]

#: The client's own codes: ``no_socket`` (no socket given), ``connection_failed`` (nothing to
#: connect to, or the handshake failed), ``connection_lost`` (the connection dropped during a
#: request that could not be resent), ``timeout``, ``peer_failed`` (another rank's daemon
#: failed in a multi-node job).
ClientErrorCode: TypeAlias = Literal[
    "no_socket",
    "connection_failed",
    "connection_lost",
    "timeout",
    "peer_failed",
]


#: Any code a :class:`MetfsError` carries.
AnyErrorCode: TypeAlias = ErrorCode | ClientErrorCode


class ErrorBody(TypedDict):
    """The ``error`` of a failed request's reply."""

    code: ErrorCode
    message: str


class MetfsError(Exception):
    """A request failed.

    ``code`` is machine-readable: one of the daemon's codes (:data:`ErrorCode`) or one of the
    client's own (:data:`ClientErrorCode`); ``message`` explains it, naming the offending input.
    """

    def __init__(self, code: AnyErrorCode, message: str) -> None:
        super().__init__(f"[{code}] {message}")
        self.code: AnyErrorCode = code
        self.message = message


class MetfsConnectionError(MetfsError, ConnectionError):
    """The daemon cannot be reached, or the connection to it was lost."""


def error_from(reply: Mapping[str, Any]) -> MetfsError:
    """The error a failed reply carries (``shutting_down`` as :class:`MetfsConnectionError`).

    A code outside the closed set (a daemon newer than this client) is kept as sent.
    """
    err = reply.get("error")
    if isinstance(err, dict):
        code = str(err.get("code") or "internal")
        message = str(err.get("message") or "(no message)")
    else:
        code, message = "bad_response", f"failed response without an error object: {reply}"
    typed = cast(ErrorCode, code)
    if typed == "shutting_down":
        return MetfsConnectionError(typed, message)
    return MetfsError(typed, message)
