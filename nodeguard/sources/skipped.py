"""Entries a collector skipped: one bad file costs that entry only, is counted, and is logged once.

A full node has hundreds of cgroups and a thousand processes; one of them with a file that cannot
be read (EACCES, EIO), that is not text, that is longer than any such file can be, or whose
content is not what the kernel writes (a negative size, a truncated ``statm``) must not blank
every pod and process of the node. The collector leaves that entry (a file's values, a process, a
directory's children) out, and :class:`Skipped` counts it by reason: exported as
``nodeguard_collector_errors_total{collector,reason}`` (from each sample's
:attr:`~nodeguard.snapshot.CollectorStatus.skipped`) and logged once per path and reason, so a
file that stays bad is not logged every interval.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Literal

from nodeguard.sources.files import FileTooLargeError

__all__ = ["DuplicateError", "Reason", "Skipped", "reason_of"]

log = logging.getLogger(__name__)

Reason = Literal["unreadable", "not_text", "too_large", "malformed", "duplicate"]
# Paths remembered as logged, least recent forgotten first (the walk sees new paths all the
# time as pods come and go; what is remembered must not grow with them).
_LOGGED = 4096


class DuplicateError(Exception):
    """An entry that another one already stands for (a second cgroup directory of one pod)."""


def reason_of(exc: BaseException) -> Reason:
    """Why a read failed: an OS error (``unreadable``), bytes that are not text
    (``not_text``), a file over the read bound (``too_large``), an entry another one already
    stands for (``duplicate``), anything else ``malformed``."""
    if isinstance(exc, DuplicateError):
        return "duplicate"
    if isinstance(exc, OSError):
        return "unreadable"
    if isinstance(exc, UnicodeDecodeError):
        return "not_text"
    if isinstance(exc, FileTooLargeError):
        return "too_large"
    return "malformed"


class Skipped:
    """Counts of skipped entries by reason, for one collector, since the agent started. Used
    by the sampler's one thread."""

    def __init__(self, *, collector: str) -> None:
        self.collector = collector
        self._counts: dict[Reason, int] = {}
        self._logged: OrderedDict[tuple[str, Reason], None] = OrderedDict()

    def add(self, *, path: str, exc: BaseException) -> None:
        """Count one entry skipped because reading or parsing ``path`` raised ``exc``."""
        reason = reason_of(exc)
        self._counts[reason] = self._counts.get(reason, 0) + 1
        key = (path, reason)
        if key in self._logged:
            self._logged.move_to_end(key)
            return
        self._logged[key] = None
        if len(self._logged) > _LOGGED:
            self._logged.popitem(last=False)
        log.warning("collector %s skips %s (%s): %s", self.collector, path, reason, exc)

    def counts(self) -> dict[str, int]:
        """A copy of the counts by reason."""
        return {str(reason): n for reason, n in self._counts.items()}
