"""A cgroup's memory limit: its one-number files and what counts as "no limit".

``memory.max`` (v2, ``max`` for none) and ``memory.limit_in_bytes`` (v1, PAGE_COUNTER_MAX rounded
to a page for none: 9223372036854771712 on 4 KiB pages) (Documentation/admin-guide/cgroup-v2.rst
"Memory Interface Files"; Documentation/admin-guide/cgroup-v1/memory.rst).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from nodeguard.sources.open_files import OpenFiles

__all__ = [
    "PLAIN",
    "UNLIMITED_FLOOR",
    "limit_file",
    "min_limit",
    "normalise_limit",
    "parse_int",
    "read_limit",
]

#: Any limit at or above this is the kernel's "unlimited": v1 prints PAGE_COUNTER_MAX *
#: PAGE_SIZE (9223372036854771712 on 4 KiB pages, other values on 16/64 KiB pages), all far
#: above 2**62.
UNLIMITED_FLOOR = 1 << 62

#: Reads without holding anything open (a budget of 0): for one-off reads.
PLAIN = OpenFiles(max_open=0)


def normalise_limit(value: int | None, *, mem_total: int | None) -> int | None:
    """A limit in bytes, or ``None`` for "no limit": the v1 sentinels (anything >= 2**62) and
    any value >= MemTotal, which can never bind before the node itself runs out."""
    if value is None or value >= UNLIMITED_FLOOR:
        return None
    if mem_total is not None and value >= mem_total:
        return None
    return value


def parse_int(text: str) -> int:
    """A one-number file (``memory.current``, ``memory.max``, ``memory.failcnt``); ``max`` is
    the unlimited sentinel. Raises ``ValueError`` for anything but a number of 0 or more: the
    kernel writes these unsigned, and a negative size must never be exported."""
    text = text.strip()
    if text == "max":
        return UNLIMITED_FLOOR
    value = int(text)
    if value < 0:
        raise ValueError(f"negative value {value}")
    return value


def limit_file(version: Literal[1, 2]) -> str:
    """The name of the file that holds a cgroup's own limit, by cgroup version."""
    return "memory.max" if version == 2 else "memory.limit_in_bytes"


def min_limit(a: int | None, b: int | None) -> int | None:
    """The tighter of two limits in bytes (``None``: no limit)."""
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def read_limit(
    *,
    path: str | Path,
    version: Literal[1, 2],
    mem_total: int | None,
    files: OpenFiles = PLAIN,
    dir_ino: int = 0,
) -> int | None:
    """The cgroup's own memory limit in bytes, ``None`` for none. ``files`` and ``dir_ino``: the
    :class:`OpenFiles` to read with (by default each file is opened, read and closed) and the
    inode number of the cgroup's directory as listed. Raises ``OSError`` when the file cannot be
    read and ``ValueError`` when it is not a limit."""
    own = files.read(f"{os.fspath(path)}/{limit_file(version)}", parse_int, dir_ino=dir_ino)
    return normalise_limit(own, mem_total=mem_total)
