"""The current view as the ``files`` reply gives it: position, generation and files.

One rule names a view's paths, here and in :class:`metfs.Pass`: ``paths`` are **what to open**
(the staged copies in the cache for a view asked with ``direct``, else the files under the
mount), ``mount_paths`` are always the files under the mount, and ``direct_paths`` the copies
(empty without ``direct``). ``files`` are the relative paths both are made of.

No ``from __future__ import annotations`` here: with it, Python 3.11's ``TypedDict`` takes
every key for required.
"""

import dataclasses
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypedDict

from .errors import MetfsError
from .pathlist import PathList
from .replies import read_reply

__all__ = ["FilesReply", "FilesView", "PackedList"]


class PackedList(TypedDict):
    """The layout of a packed list, sent right after the reply's line: ``count + 1``
    little-endian u64 offsets into the names block, then the names block (``names_bytes``);
    ``bytes`` is the length of both."""

    bytes: int
    names_bytes: int


@dataclass(frozen=True)
class FilesReply:
    """The ``files`` reply as sent: ``files`` is empty when the reply is ``unchanged`` (the
    request's ``known_generation`` is still the view's) or ``packed`` (the list follows the
    line as raw bytes); ``direct_root`` is set for a request with ``direct``."""

    generation: int
    epoch: int
    mini_epoch: int
    mountpoint: str
    files: list[str]
    count: int = 0
    unchanged: bool = False
    packed: PackedList | None = None
    direct_root: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_response(cls, obj: dict[str, Any]) -> "FilesReply":
        """Reads the reply, refusing an empty ``mountpoint`` or ``direct_root``."""
        reply = read_reply(cls, obj, "files")
        if not reply.mountpoint:
            raise MetfsError("bad_response", "`files` response has no string `mountpoint`")
        if reply.direct_root == "":
            raise MetfsError("bad_response", "`files` response has an empty `direct_root`")
        return reply


def _under(root: str, files: Sequence[str]) -> Sequence[str]:
    """``files`` (relative paths) as absolute paths under ``root``: for a packed list the same
    buffer with another prefix (no string per file), else a plain list."""
    if isinstance(files, PathList):
        return files.with_prefix(root.rstrip("/") + "/")
    return [os.path.join(root, f.lstrip("/")) for f in files]


@dataclass(frozen=True)
class FilesView:
    """The current view: its position, generation and files.

    ``files`` are paths relative to the mount, as the daemon sends them. ``paths`` are what to
    open: for a view asked with ``direct`` (:meth:`metfs.Client.files`) the staged copies of
    its files in the cache, else the files under ``mountpoint``; iterating yields them.
    ``mount_paths`` are always the files under ``mountpoint``. All are read-only sequences of
    ``str``: for a list the daemon sent packed (what :meth:`metfs.Client.files` asks for), a
    :class:`metfs.pathlist.PathList` over one shared buffer, which builds each string when it
    is read; ``list(view.paths)`` gives a plain list.

    A view asked for with ``direct`` also has ``direct_root``, the slot directory in the cache
    that holds the view's files, and ``direct_paths``, each file's copy there
    (``direct_root/<file>``, the same buffer as ``files`` for a packed list; ``paths`` is this
    sequence): complete, immutable files that may be read directly, bypassing FUSE, while the
    client's lease on the view's generation holds (see :meth:`metfs.Client.files`). Without
    ``direct``, ``direct_root`` is ``None``, ``direct_paths`` empty and ``paths`` the
    mount's.
    """

    generation: int
    epoch: int
    mini_epoch: int
    mountpoint: str
    files: Sequence[str]
    #: How many files the view holds.
    count: int = 0
    #: What to open: ``direct_paths`` for a view asked with ``direct``, else ``mount_paths``.
    paths: Sequence[str] = field(default=(), repr=False)
    #: With ``direct``: the slot directory in the cache that holds the view's files.
    direct_root: str | None = None
    #: With ``direct``: the copies of the view's files in the cache (else empty).
    direct_paths: Sequence[str] = field(default=(), repr=False)
    #: The view's files under the mount, with ``direct`` or without.
    mount_paths: Sequence[str] = field(default=(), repr=False)

    #: Fields computed here rather than sent by the daemon.
    DERIVED: ClassVar[frozenset[str]] = frozenset({"paths", "direct_paths", "mount_paths"})
    #: Fields of the reply the client reads and does not keep (see :class:`FilesReply`).
    WIRE_ONLY: ClassVar[frozenset[str]] = frozenset({"unchanged", "packed"})

    @classmethod
    def from_response(
        cls, obj: dict[str, Any], payload: bytes | bytearray | None = None
    ) -> "FilesView":
        """Builds the view from a response object, and the bytes after it for a packed list."""
        return cls.from_reply(FilesReply.from_response(obj), payload)

    @classmethod
    def from_reply(cls, reply: FilesReply, payload: bytes | bytearray | None = None) -> "FilesView":
        """Builds the view from a read reply, and the bytes after it for a packed list."""
        files: Sequence[str]
        if payload is not None:
            if reply.packed is None:
                raise MetfsError("bad_response", "`files` response has no `packed.names_bytes`")
            try:
                files = PathList(payload, reply.count, reply.packed["names_bytes"])
            except ValueError as e:
                raise MetfsError("bad_response", f"`files` packed list: {e}") from None
        else:
            files = reply.files
        mount_paths = _under(reply.mountpoint, files)
        direct_paths = () if reply.direct_root is None else _under(reply.direct_root, files)
        return cls(
            generation=reply.generation,
            epoch=reply.epoch,
            mini_epoch=reply.mini_epoch,
            mountpoint=reply.mountpoint,
            files=files,
            # A daemon older than `count` sends none: the list's length is the count.
            count=reply.count if "count" in reply.raw else len(files),
            paths=direct_paths if reply.direct_root is not None else mount_paths,
            direct_root=reply.direct_root,
            direct_paths=direct_paths,
            mount_paths=mount_paths,
        )

    def with_direct_root(self, direct_root: str | None) -> "FilesView":
        """The same view with another ``direct_root`` (``None``: without direct paths, its
        ``paths`` then the mount's); the lists share this view's buffer."""
        if direct_root == self.direct_root:
            return self
        direct_paths = () if direct_root is None else _under(direct_root, self.files)
        return dataclasses.replace(
            self,
            direct_root=direct_root,
            direct_paths=direct_paths,
            paths=direct_paths if direct_root is not None else self.mount_paths,
        )

    def __len__(self) -> int:
        return len(self.files)

    def __iter__(self) -> Iterator[str]:
        return iter(self.paths)
