"""One cgroup's memory files read and parsed into
:class:`~nodeguard.sources.cgroup_memory.ParsedFiles`.

Only the ``memory.stat`` and ``memory.events`` keys that are used are parsed (a full node has
some 450 cgroups read every sample: docs/benchmarks.md). A file that cannot be read, is not
text, is too long or does not hold what the kernel writes (a negative size) is left out and
counted in ``skipped`` (:mod:`nodeguard.sources.skipped`); the files are read through
:class:`~nodeguard.sources.open_files.OpenFiles`, which may keep them open between samples.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Literal, TypeVar

from nodeguard.sources.cgroup_layout import CgroupLayout
from nodeguard.sources.cgroup_limits import (
    PLAIN,
    limit_file,
    min_limit,
    normalise_limit,
    parse_int,
)
from nodeguard.sources.cgroup_memory import ParsedFiles
from nodeguard.sources.files import parse_flat_keyed
from nodeguard.sources.open_files import OpenFiles
from nodeguard.sources.pressure import parse_pressure
from nodeguard.sources.skipped import Skipped

__all__ = ["CgroupFiles"]

T = TypeVar("T")

# The keys read from memory.stat and memory.events (parse_flat_keyed ignores the rest).
_V2_STAT_KEYS = frozenset(
    {
        "anon",
        "file",
        "inactive_file",
        "active_file",
        "active_anon",
        "inactive_anon",
        "slab_reclaimable",
        "workingset_refault_file",
        "workingset_refault",
    }
)
_V1_STAT_KEYS = frozenset(
    {
        "total_inactive_file",
        "inactive_file",
        "total_rss",
        "rss",
        "total_cache",
        "cache",
        "total_active_anon",
        "active_anon",
        "total_inactive_anon",
        "inactive_anon",
        "total_unevictable",
        "unevictable",
        "total_workingset_refault_file",
        "workingset_refault_file",
    }
)
_V2_EVENT_KEYS = frozenset({"oom_kill", "max", "high"})
_V1_OOM_KEYS = frozenset({"oom_kill"})


def _unsigned(values: dict[str, int]) -> dict[str, int]:
    """``values``, or ``ValueError`` when one of them is negative (see :func:`parse_int`)."""
    negative = [k for k, v in values.items() if v < 0]
    if negative:
        raise ValueError(f"negative value of {', '.join(sorted(negative))}")
    return values


# One function per file kind, so that OpenFiles keeps each file's parsed value with its text.
def _stat_v2(text: str) -> dict[str, int]:
    return _unsigned(parse_flat_keyed(text, _V2_STAT_KEYS))


def _stat_v1(text: str) -> dict[str, int]:
    return _unsigned(parse_flat_keyed(text, _V1_STAT_KEYS))


def _events_v2(text: str) -> dict[str, int]:
    return _unsigned(parse_flat_keyed(text, _V2_EVENT_KEYS))


def _oom_v1(text: str) -> dict[str, int]:
    return _unsigned(parse_flat_keyed(text, _V1_OOM_KEYS))


class CgroupFiles:
    """Reads cgroup files with ``files`` (held open between samples up to its budget); what
    cannot be read or parsed is counted in ``skipped`` and read as ``None``."""

    def __init__(self, *, files: OpenFiles, skipped: Skipped) -> None:
        self.files = files
        self.skipped = skipped

    def file(
        self, path: str, parse: Callable[[str], T], *, ino: int, files: OpenFiles | None = None
    ) -> T | None:
        """``parse`` of one cgroup file, ``None`` when it does not exist or is skipped; read
        with ``files`` (the reader's own by default: kept open)."""
        try:
            return (files or self.files).read(path, parse, dir_ino=ino)
        except (OSError, ValueError) as exc:
            self.skipped.add(path=path, exc=exc)
            return None

    def _optional(self, path: str, *, ino: int) -> int | None:
        """A one-number file that older kernels or a kernel option may leave out (the swap
        files without swap accounting): absent is no data, not a skip."""
        if not os.path.exists(path):
            return None
        return self.file(path, parse_int, ino=ino)

    def limit(self, path: str, *, version: Literal[1, 2], ino: int) -> int | None:
        """The raw limit of the cgroup at ``path`` (``None``: absent or skipped)."""
        return self.file(f"{path}/{limit_file(version)}", parse_int, ino=ino)

    def parts(self, base: str, version: Literal[1, 2], ino: int, *, swap: bool) -> ParsedFiles:
        """Every file of the cgroup at ``base``; ``swap``: the node has swap free, so the
        ``memory.swap.*`` files are read (v2)."""
        if version == 2:
            events = self.file(f"{base}/memory.events", _events_v2, ino=ino)
            # memory.high only where it has throttled (a stall there is the cgroup's own:
            # nodeguard.stall); on most nodes no cgroup has, and the file is not read.
            throttled = bool(events and events.get("high"))
            return ParsedFiles(
                stat=self.file(f"{base}/memory.stat", _stat_v2, ino=ino),
                usage=self.file(f"{base}/memory.current", parse_int, ino=ino),
                events=events,
                failcnt=None,
                pressure=self.file(f"{base}/memory.pressure", parse_pressure, ino=ino),
                own_limit=self.file(f"{base}/memory.max", parse_int, ino=ino),
                swap_max=self._optional(f"{base}/memory.swap.max", ino=ino) if swap else None,
                swap_current=self._optional(f"{base}/memory.swap.current", ino=ino)
                if swap
                else None,
                high=self._optional(f"{base}/memory.high", ino=ino) if throttled else None,
            )
        return ParsedFiles(
            stat=self.file(f"{base}/memory.stat", _stat_v1, ino=ino),
            usage=self.file(f"{base}/memory.usage_in_bytes", parse_int, ino=ino),
            events=self.file(f"{base}/memory.oom_control", _oom_v1, ino=ino),
            failcnt=self.file(f"{base}/memory.failcnt", parse_int, ino=ino),
            pressure=None,
            own_limit=self.file(f"{base}/memory.limit_in_bytes", parse_int, ino=ino),
        )

    def ancestor_limit(
        self, *, layout: CgroupLayout, path: Path, mem_total: int | None
    ) -> int | None:
        """The smallest limit from just below the hierarchy root down to ``path`` inclusive
        (each file read once, not held open)."""
        limit: int | None = None
        rel = path.relative_to(layout.root)
        current = layout.root
        for part in rel.parts:
            current = current / part
            own = self.file(
                f"{current}/{limit_file(layout.version)}", parse_int, ino=0, files=PLAIN
            )
            limit = min_limit(limit, normalise_limit(own, mem_total=mem_total))
        return limit
