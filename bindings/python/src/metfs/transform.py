"""The worker side of ``metfs mount --transform``: preprocessed mini-epochs.

The daemon runs the transform as long-lived workers and sends each sample it stages to one
of them; the slot (and the view) then holds the transform's output, under the sample's name
plus ``--transform-suffix`` (default ``.npy``). A worker is one Python process serving any
number of samples, so the interpreter and the imports are paid once per worker.

Write a function from a sample's bytes (and its relative path) to the transformed bytes, and
serve it::

    # mypkg/prep.py
    import io
    import numpy as np
    from PIL import Image
    import metfs.transform

    @metfs.transform.transform
    def prep(data: bytes, path: str) -> bytes:
        img = Image.open(io.BytesIO(data)).convert("RGB").resize((64, 64))
        buf = io.BytesIO()
        np.save(buf, np.asarray(img))
        return buf.getvalue()

then ``metfs mount --transform "python3 -m mypkg.prep" ...`` (the decorator serves ``prep``
when the module runs as a program), or, for an undecorated function,
``--transform "python3 -m metfs.transform mypkg.prep:prep"``. ``serve(fn)`` does the same
from any code.

An exception raised by the function leaves that sample out of its mini-epoch with the
exception as the reason (``metfs status``: ``failed_samples``, ``transform_failed``); the
worker goes on with the next sample. Anything the function prints goes to stderr (the
daemon's log), never into the protocol.

Keep the transform deterministic (decode, resize, normalise): its output is the same in every
pass over the mini-epoch, so random augmentation belongs in the training loader, applied to
the preprocessed sample at each pass.

The protocol (big-endian, one reply per request, in order): a request is a ``u32`` path
length, the UTF-8 path, a ``u64`` data length and the data; a reply is a status byte (``0``
output follows, ``1`` an error message follows), a ``u64`` length and the payload. The worker
exits when its stdin closes.
"""

from __future__ import annotations

import importlib
import struct
import sys
from collections.abc import Callable
from typing import BinaryIO, cast

__all__ = ["Transform", "load", "main", "serve", "transform"]

Output = bytes | bytearray | memoryview
Transform = Callable[[bytes, str], Output]

#: Longest relative path a request carries (the kernel's PATH_MAX).
MAX_PATH = 4096


def transform(fn: Transform) -> Transform:
    """Declares ``fn(data, path) -> bytes`` a transform. In a module run as a program
    (``python3 -m mypkg.prep``, the worker's command) it serves ``fn`` at once; imported, it
    returns ``fn`` unchanged (so tests and the training code can call it directly)."""
    if getattr(fn, "__module__", None) == "__main__":
        serve(fn)
        sys.exit(0)
    return fn


def _read_exact(inp: BinaryIO, n: int) -> bytes:
    chunks: list[bytes] = []
    left = n
    while left:
        b = inp.read(left)
        if not b:
            break
        chunks.append(b)
        left -= len(b)
    return b"".join(chunks)


def _reply(out: BinaryIO, status: int, payload: Output) -> None:
    body = bytes(payload)
    out.write(struct.pack(">BQ", status, len(body)))
    out.write(body)
    out.flush()


def serve(fn: Transform, stdin: BinaryIO | None = None, stdout: BinaryIO | None = None) -> None:
    """Serves ``fn`` over the worker protocol until the input closes.

    ``stdin``/``stdout`` default to the process's binary standard streams; while serving,
    ``sys.stdout`` points to stderr so that a ``print`` cannot corrupt a frame.
    """
    inp = stdin if stdin is not None else sys.stdin.buffer
    out = stdout if stdout is not None else sys.stdout.buffer
    saved = sys.stdout
    sys.stdout = sys.stderr
    try:
        while True:
            head = _read_exact(inp, 4)
            if not head:
                return
            if len(head) < 4:
                raise EOFError("the input ended inside a request")
            (plen,) = struct.unpack(">I", head)
            if plen > MAX_PATH:
                raise ValueError(f"a request's path of {plen} bytes is longer than {MAX_PATH}")
            path = _read_exact(inp, plen).decode("utf-8")
            (dlen,) = struct.unpack(">Q", _read_exact(inp, 8))
            data = _read_exact(inp, dlen)
            if len(data) != dlen:
                raise EOFError("the input ended inside a request")
            try:
                result = fn(data, path)
                if not isinstance(result, (bytes, bytearray, memoryview)):
                    raise TypeError(f"the transform returned {type(result).__name__}, not bytes")
            except Exception as e:  # noqa: BLE001 - any failure is this sample's, reported
                _reply(out, 1, f"{type(e).__name__}: {e}".encode())
                continue
            _reply(out, 0, result)
    finally:
        sys.stdout = saved


def load(spec: str) -> Transform:
    """The function named by ``module:function`` (``module`` importable)."""
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"`{spec}`: expected module:function")
    fn: object = getattr(importlib.import_module(module), name, None)
    if not callable(fn):
        raise TypeError(f"`{spec}`: {module} has no function {name}")
    return cast(Transform, fn)


def main(argv: list[str] | None = None) -> int:
    """``python3 -m metfs.transform module:function``: serves that function."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python3 -m metfs.transform module:function", file=sys.stderr)
        return 2
    try:
        fn = load(args[0])
    except (ImportError, TypeError, ValueError) as e:
        print(f"metfs.transform: {e}", file=sys.stderr)
        return 2
    serve(fn)
    return 0


if __name__ == "__main__":
    sys.exit(main())
