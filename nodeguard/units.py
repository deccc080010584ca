"""Durations and memory sizes as people write and read them: one grammar for every flag and
every rule file, one way to print a size.

- A duration is ``500ms``, ``30s``, ``5m``, ``1h30m``, ``2d`` (parts of ``ms``, ``s``, ``m``,
  ``h``, ``d``, largest first or not; decimals allowed) or a number of seconds (``90``, ``1.5``).
  ``nodeguard run --evict.window=1h30m`` and a rule's ``for: 1h30m`` read the same.
- A size prints in binary units with one decimal (``1.5 GiB``); exact bytes go to JSON.

This module imports nothing of nodeguard: the rule schema, the actions and the command line all
use it.
"""

from __future__ import annotations

import math
import re
from typing import Any

__all__ = [
    "DURATION_EXAMPLES",
    "MAX_DURATION_CHARS",
    "format_bytes",
    "format_duration",
    "parse_duration",
]

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
# Anchored and unambiguous (each part ends in a unit), so a match costs linear time; the
# unanchored search of each part from every position was quadratic in the length, and a
# 60,000-digit `for:` held the event loop for 92 s.
_WHOLE = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
#: Characters of a duration string: ``1d23h59m59s999ms`` is 16.
MAX_DURATION_CHARS = 32
#: How help texts and error messages show the grammar.
DURATION_EXAMPLES = "500ms, 30s, 5m, 1h30m, 2d, or seconds"
_SIZES = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def _shown(value: Any) -> str:
    """A value for an error message, cut to 40 characters (the value may be huge)."""
    text = repr(value) if isinstance(value, str | int | float) else type(value).__name__
    return text if len(text) <= 40 else f"{text[:37]}..."


def parse_duration(value: Any) -> float:
    """A duration (see the module docstring) as seconds. Raises ``ValueError`` for anything
    else: a negative or non-finite duration (``.nan`` or ``.inf`` would switch timing off), a
    boolean, a string over :data:`MAX_DURATION_CHARS` characters."""
    if isinstance(value, bool):
        raise ValueError("a duration, not a boolean")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        if text.startswith("-"):
            raise ValueError(f"negative duration {_shown(value)}")
        if len(text) > MAX_DURATION_CHARS:
            raise ValueError(
                f"not a duration: {len(text)} characters (at most {MAX_DURATION_CHARS})"
            )
        if _NUMBER.fullmatch(text):
            seconds = float(text)
        elif _WHOLE.fullmatch(text):
            seconds = sum(float(m.group(1)) * _UNIT[m.group(2)] for m in _PART.finditer(text))
        else:
            raise ValueError(f"not a duration: {_shown(value)} (use {DURATION_EXAMPLES})")
    else:
        raise ValueError(f"not a duration: {_shown(value)}")
    if not math.isfinite(seconds):
        raise ValueError(f"not a finite duration: {_shown(value)}")
    if seconds < 0:
        raise ValueError(f"negative duration {_shown(value)}")
    return seconds


def format_duration(seconds: float) -> str:
    """The shortest form of the grammar for ``seconds``: ``10m``, ``1h30m``, ``500ms``,
    ``1.5s``; ``0s`` for zero."""
    if seconds < 1 and seconds > 0:
        return f"{seconds * 1000:g}ms"
    whole = int(seconds)
    if whole != seconds:
        return f"{seconds:g}s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if whole >= size:
            parts.append(f"{whole // size}{unit}")
            whole %= size
    return "".join(parts) or "0s"


def format_bytes(value: int | float | None) -> str:
    """Binary units with one decimal (``1.5 GiB``, ``512 B``); ``-`` for unknown."""
    if value is None:
        return "-"
    size = float(value)
    for unit in _SIZES:
        if abs(size) < 1024 or unit == _SIZES[-1]:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")
