"""The package's version: the workspace's, declared once in its ``Cargo.toml``.

An installed wheel carries it in its metadata (maturin copies it from ``Cargo.toml`` at build
time, the same number the ``metfs`` binary prints). A source tree on ``PYTHONPATH`` has no
metadata of its own, so the version is read from the workspace's ``Cargo.toml`` beside it; an
installed copy elsewhere must not answer for the tree being run.
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

# bindings/python/src/metfs/_version.py -> the repository root.
_WORKSPACE = Path(__file__).resolve().parents[4] / "Cargo.toml"


def _from_workspace(cargo_toml: Path) -> str | None:
    try:
        text = cargo_toml.read_text(encoding="utf-8")
    except OSError:
        return None
    # The `version` of `[workspace.package]`, the only version the workspace declares.
    section = re.search(
        r"^\[workspace\.package\]\s*$(.*?)(?=^\[|\Z)", text, re.MULTILINE | re.DOTALL
    )
    if section is None:
        return None
    m = re.search(r'^version\s*=\s*"([^"]+)"', section.group(1), re.MULTILINE)
    return m.group(1) if m else None


def version() -> str:
    """This package's version (see the module's documentation for where it comes from)."""
    from_tree = _from_workspace(_WORKSPACE)
    if from_tree is not None:
        return from_tree
    try:
        return importlib.metadata.version("metfs")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"
