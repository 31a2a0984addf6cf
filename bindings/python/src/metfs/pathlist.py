"""A view's file list kept as one buffer: what a ``files`` reply in packed form carries.

A view of 500,000 files as a Python ``list[str]`` costs ~35 MB of string objects, and every
``DataLoader`` worker forked from the process that holds it slowly copies those pages as the
strings' reference counts change. :class:`PathList` keeps the daemon's packed bytes as they
arrived (``count + 1`` little-endian u64 offsets, then the names back to back: see
``PackedList`` in ``metfs-protocol/src/reply.rs``) and builds a ``str`` only when one is asked
for. Its memory is two flat buffers whose pages a forked worker only reads, so worker memory
does not grow with the number of samples read; pickling (spawned workers) sends the buffer
once.

A ``PathList`` is a read-only ``Sequence[str]``: ``len``, indexing, slicing (a slice is a
``list``), iteration, ``in``, and ``==`` with any sequence of the same strings.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterator, Sequence
from typing import Any, overload

__all__ = ["PathList", "unpack_offsets"]


def unpack_offsets(
    payload: bytes | bytearray | memoryview, count: int, names_bytes: int
) -> memoryview:
    """Checks a packed payload's layout and returns its offsets as a ``memoryview`` of u64.

    Raises ``ValueError`` naming what does not fit: a payload of another length than the
    header says, offsets out of order, or past the names block.
    """
    head = 8 * (count + 1)
    if len(payload) != head + names_bytes:
        raise ValueError(
            f"packed list is {len(payload)} bytes; {count} files and {names_bytes} bytes of "
            f"names make {head + names_bytes}"
        )
    view = memoryview(payload)
    if sys.byteorder == "little":
        offsets = view[:head].cast("Q")
    else:  # pragma: no cover - no big-endian CI
        swapped = array("Q", view[:head].tobytes())
        swapped.byteswap()
        offsets = memoryview(swapped)
    if offsets[0] != 0 or offsets[count] != names_bytes:
        raise ValueError(
            f"packed list's offsets run from {offsets[0]} to {offsets[count]}, "
            f"not over its {names_bytes} bytes of names"
        )
    # Ordered offsets are what makes every slice valid; one pass over a compact array.
    prev = 0
    for i, off in enumerate(offsets):
        if off < prev:
            raise ValueError(f"packed list's offset {i} ({off}) is below the one before ({prev})")
        prev = off
    return offsets


class PathList(Sequence[str]):
    """The paths of a packed list, each ``prefix`` followed by its relative path."""

    __slots__ = ("_buf", "_count", "_names", "_offsets", "prefix")

    def __init__(
        self, payload: bytes | bytearray, count: int, names_bytes: int, prefix: str = ""
    ) -> None:
        self._buf = payload
        self._count = count
        self._offsets = unpack_offsets(payload, count, names_bytes)
        self._names = memoryview(payload)[8 * (count + 1) :]
        #: What every path starts with: ``""`` for paths relative to the mount, the mountpoint
        #: and a slash for absolute ones.
        self.prefix = prefix

    def with_prefix(self, prefix: str) -> PathList:
        """The same list (the same buffer, not a copy) with another prefix."""
        other = PathList.__new__(PathList)
        other._buf, other._count = self._buf, self._count
        other._offsets, other._names = self._offsets, self._names
        other.prefix = prefix
        return other

    def __len__(self) -> int:
        return self._count

    def _at(self, i: int) -> str:
        return self.prefix + str(self._names[self._offsets[i] : self._offsets[i + 1]], "utf-8")

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self._at(j) for j in range(*i.indices(self._count))]
        if i < 0:
            i += self._count
        if not 0 <= i < self._count:
            raise IndexError(f"path {i} of a view of {self._count} files")
        return self._at(i)

    def __iter__(self) -> Iterator[str]:
        for i in range(self._count):
            yield self._at(i)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(other) == self._count and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        head = ", ".join(repr(p) for p in self[:3])
        more = ", ..." if self._count > 3 else ""
        return f"PathList([{head}{more}], {self._count} files)"

    def __reduce__(self) -> tuple[Any, ...]:
        names_bytes = len(self._names)
        return (PathList, (bytes(self._buf), self._count, names_bytes, self.prefix))
