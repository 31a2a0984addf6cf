"""Metrics of a pass as the protocol carries them: plain finite floats by name.

This module uses the standard library only: numpy and torch values are read through ``.item()``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

from .errors import MetfsError

__all__ = ["metrics_to_floats"]


def _metric_to_float(name: str, value: Any) -> float:
    """Converts one metric value to a finite float or raises ``MetfsError("bad_metrics")``."""
    if isinstance(value, bool):
        raise MetfsError("bad_metrics", f"metric `{name}` must be a number, got a bool ({value})")
    if isinstance(value, numbers.Real):
        out = float(value)
    else:
        item = getattr(value, "item", None)  # numpy scalars and arrays, torch tensors
        size = getattr(value, "numel", None) or getattr(value, "size", None)
        if callable(size):
            size = size()
        if item is None or not callable(item):
            raise MetfsError(
                "bad_metrics",
                f"metric `{name}` must be a number, got {type(value).__name__} ({value!r:.80})",
            )
        if isinstance(size, int) and size != 1:
            raise MetfsError(
                "bad_metrics",
                f"metric `{name}` must be a single number, got {type(value).__name__} "
                f"with {size} elements",
            )
        try:
            scalar = item()
        except (ValueError, RuntimeError, TypeError) as e:
            raise MetfsError(
                "bad_metrics", f"metric `{name}` must be a single number: {e}"
            ) from None
        if isinstance(scalar, bool) or not isinstance(scalar, numbers.Real):
            raise MetfsError(
                "bad_metrics",
                f"metric `{name}` must be a number, got {type(scalar).__name__} ({scalar!r:.80})",
            )
        out = float(scalar)
    if not math.isfinite(out):
        raise MetfsError("bad_metrics", f"metric `{name}` must be finite, got {out}")
    return out


def metrics_to_floats(metrics: Mapping[str, Any] | None) -> dict[str, float]:
    """Converts a mapping of metric name to number into plain floats.

    Accepts Python numbers, numpy scalars and one-element arrays, and one-element torch tensors
    (via ``.item()``). Rejects anything else, and NaN or infinite values, with
    ``MetfsError("bad_metrics")`` naming the metric.
    """
    if metrics is None:
        return {}
    if not isinstance(metrics, Mapping):
        raise MetfsError(
            "bad_metrics",
            f"metrics must be a mapping of name to number, got {type(metrics).__name__}",
        )
    out: dict[str, float] = {}
    for name, value in metrics.items():
        if not isinstance(name, str) or not name:
            raise MetfsError("bad_metrics", f"metric names must be non-empty strings, got {name!r}")
        out[name] = _metric_to_float(name, value)
    return out
