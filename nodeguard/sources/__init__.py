"""Sources read one part of the host each and report their own success and duration.

A source is a module with a ``NAME`` (also its ``--collector.<name>`` flag) and a read function
that returns its part of the snapshot or raises :class:`NoDataError` when the data does not exist
on this host (PSI off in the kernel, no kubepods); any other exception is a failure of that
source alone.
:func:`run_source` times the call and turns the outcome into a
:class:`~nodeguard.snapshot.CollectorStatus`; one failing source never fails the sample.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from nodeguard.snapshot import CollectorStatus

__all__ = ["NoDataError", "SourceResult", "run_source"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class NoDataError(Exception):
    """The data this source reads does not exist on this host; logged once, not every sample."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceResult(Generic[T]):
    """A source's value (``None`` on no data or failure) and its status."""

    value: T | None
    status: CollectorStatus


class _OnceLog:
    """Remembers which (source, message) pairs were logged so a persistent condition (PSI off,
    no kubepods) is logged once and again only after it changed."""

    def __init__(self) -> None:
        self._last: dict[str, str] = {}

    def changed(self, *, name: str, message: str) -> bool:
        if self._last.get(name) == message:
            return False
        self._last[name] = message
        return True

    def clear(self, *, name: str) -> None:
        self._last.pop(name, None)


_once = _OnceLog()


def run_source(*, name: str, read: Callable[[], T]) -> SourceResult[T]:
    """Run ``read()``, timing it; never raises.

    :class:`NoDataError` gives ``success=True, available=False`` and is logged at info once;
    any other exception gives ``success=False`` and is logged as an error once per distinct
    message (a broken file is not logged every 5 s).
    """
    start = time.perf_counter()

    def result(value: T | None, *, success: bool, error: str | None = None) -> SourceResult[T]:
        status = CollectorStatus(
            name=name,
            success=success,
            available=success and error is None,
            duration_seconds=time.perf_counter() - start,
            error=error,
        )
        return SourceResult(value=value, status=status)

    try:
        value = read()
    except NoDataError as exc:
        if _once.changed(name=name, message=f"nodata:{exc}"):
            log.info("collector %s has no data: %s", name, exc)
        return result(None, success=True, error=str(exc))
    except Exception as exc:
        if _once.changed(name=name, message=f"error:{exc}"):
            log.error("collector %s failed: %s", name, exc, exc_info=exc)
        return result(None, success=False, error=f"{type(exc).__name__}: {exc}")
    _once.clear(name=name)
    return result(value, success=True)
