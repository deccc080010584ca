"""What a collector is, the registry of them, and how one is run in a sample.

A collector reads one part of the host into the snapshot and renders that part as metric
families, as a node_exporter collector (``collector/meminfo_linux.go``) owns both its reading
and its metrics. Each is a :class:`Collector` subclass in a module of
:mod:`nodeguard.collectors`, registered with :func:`register` under its ``name``, which is also
its ``--collector.<name>`` flag and its ``collector`` label in ``nodeguard_collector_success``.
The sampler runs the enabled ones in :func:`ordered` order; the exporter renders all of them;
nothing else lists them.

- ``read(parts)`` reads the host and sets the collector's fields of :class:`Parts` (the
  snapshot's host data as it is being built: ``parts.meminfo = ...``); earlier collectors'
  fields are there to read (``after`` names them). It raises
  :class:`~nodeguard.sources.NoDataError` when the data does not exist on this host (PSI off,
  no kubepods): ``success=1, available=0``; any other exception fails that collector alone.
- ``render(snapshot, out)`` yields the collector's families from a snapshot, made with ``out``
  (:class:`~nodeguard.collectors.families.Families`, which applies the metric filter). It reads
  only the snapshot, never the host.
- A collector whose data no other part reads keeps it in ``parts.extra[name]``; one whose data
  rules, reports or incidents read gets a typed field of
  :class:`~nodeguard.snapshot.NodeSnapshot`.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

from nodeguard.collectors.families import Families, Family
from nodeguard.paths import HostPaths
from nodeguard.snapshot import (
    CgroupMemory,
    CollectorStatus,
    GpuInfo,
    MemInfo,
    NodeSnapshot,
    OomLog,
    PodMemory,
    Pressure,
    ProcessRss,
    VmStat,
)
from nodeguard.sources import NoDataError
from nodeguard.sources.skipped import Skipped

__all__ = [
    "COLLECTORS",
    "Collector",
    "Parts",
    "Settings",
    "ordered",
    "register",
    "run",
    "run_refresh",
]

log = logging.getLogger(__name__)
C = TypeVar("C", bound="type[Collector]")


class Settings(Protocol):
    """What collectors are told (the sampler's configuration): the host's filesystem roots,
    how many top processes to keep, how many cgroup files may stay open."""

    @property
    def paths(self) -> HostPaths: ...

    @property
    def top_processes(self) -> int: ...

    @property
    def max_open_files(self) -> int: ...


@dataclass(slots=True, kw_only=True)
class Parts:
    """The host data of one sample as the collectors fill it in, field for field the host
    part of :class:`~nodeguard.snapshot.NodeSnapshot` (documented there); ``None`` or empty
    where no collector set it."""

    meminfo: MemInfo | None = None
    pressure: Pressure | None = None
    pods: tuple[PodMemory, ...] = ()
    cgroup_version: int | None = None
    cgroup_files_open: int | None = None
    kubepods: CgroupMemory | None = None
    cgroup_root: str | None = None
    oom: OomLog | None = None
    processes: tuple[ProcessRss, ...] = ()
    gpu: GpuInfo | None = None
    vmstat: VmStat | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def fields(self) -> dict[str, Any]:
        """The fields by name, for ``NodeSnapshot(**parts.fields(), ...)`` (not copied)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def of(cls, snapshot: NodeSnapshot) -> Parts:
        """The host data of ``snapshot``, for a focused sample to update (``extra`` copied)."""
        parts = cls(**{f.name: getattr(snapshot, f.name) for f in dataclasses.fields(cls)})
        parts.extra = dict(parts.extra)
        return parts


class Collector(abc.ABC):
    """One collector (module docstring). Made by the sampler once, with its settings; reads
    once per sample from the sampler's one thread; :meth:`close` releases what it holds."""

    #: The collector's name: its ``--collector.<name>`` flag and ``collector`` label.
    name: ClassVar[str]
    #: Collectors whose parts :meth:`read` uses: they read first.
    after: ClassVar[tuple[str, ...]] = ()
    #: Whether a focused sample re-reads the whole part (one small node-wide file, so that
    #: every focused sample has the node's value now) rather than carrying it.
    refresh_whole: ClassVar[bool] = False

    def __init__(self, *, settings: Settings) -> None:
        self.settings = settings
        #: Entries left out since the agent started (a bad file costs that entry only).
        self.skipped = Skipped(collector=self.name)

    @abc.abstractmethod
    def read(self, parts: Parts) -> None:
        """Read the host and set this collector's fields of ``parts``."""

    def refresh(self, parts: Parts, *, keys: frozenset[str]) -> frozenset[str]:
        """A focused sample's read (:mod:`nodeguard.sampling.sampler`): ``parts`` holds the last
        sample's values; re-read what is cheap and node-wide, and of the pods and containers
        only those whose keys (a pod's UID, ``<pod uid>/<container id>``) are in ``keys``.
        Returns the keys re-read. By default the whole part when :attr:`refresh_whole`, else
        nothing: the part is carried as it was."""
        if self.refresh_whole:
            self.read(parts)
        return frozenset()

    @staticmethod
    @abc.abstractmethod
    def render(snapshot: NodeSnapshot, out: Families) -> Iterator[Family]:
        """This collector's families, from ``snapshot`` alone."""

    def close(self) -> None:  # noqa: B027 - most collectors hold nothing
        """Release files, devices and libraries held between samples."""


#: Every collector by name, filled by :func:`register` as the modules are imported.
COLLECTORS: dict[str, type[Collector]] = {}


def register(cls: C) -> C:
    """Add a collector class (a class decorator); a second one under a name already taken is a
    programming error (``ValueError``)."""
    if cls.name in COLLECTORS:
        raise ValueError(f"collector {cls.name!r} registered twice")
    COLLECTORS[cls.name] = cls
    return cls


def ordered() -> list[type[Collector]]:
    """Every registered collector, each after those it names in ``after``, otherwise by name.
    Raises ``ValueError`` for an unknown name in ``after`` or a cycle."""
    done: list[type[Collector]] = []
    waiting = dict(sorted(COLLECTORS.items()))
    for cls in waiting.values():
        unknown = set(cls.after) - set(COLLECTORS)
        if unknown:
            raise ValueError(f"collector {cls.name!r} reads after unknown {sorted(unknown)}")
    while waiting:
        names = {c.name for c in done}
        ready = next((c for c in waiting.values() if set(c.after) <= names), None)
        if ready is None:
            raise ValueError(f"collectors wait on each other: {sorted(waiting)}")
        done.append(waiting.pop(ready.name))
    return done


class _OnceLog:
    """Which (collector, message) pairs were logged, so that a lasting condition (PSI off, no
    kubepods) is logged once, and again only after it changed."""

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


def run_refresh(collector: Collector, parts: Parts, keys: frozenset[str]) -> frozenset[str]:
    """``collector.refresh(parts, keys=keys)``; never raises: on any failure the part stays as
    the last sample left it (logged once per distinct message) and no key is re-read."""
    try:
        return collector.refresh(parts, keys=keys)
    except Exception as exc:
        if _once.changed(name=f"{collector.name}:refresh", message=str(exc)):
            log.warning("collector %s: focused read failed: %s", collector.name, exc)
        return frozenset()


def run(collector: Collector, parts: Parts) -> CollectorStatus:
    """Run ``collector.read(parts)``, timing it; never raises.

    :class:`~nodeguard.sources.NoDataError` gives ``success=True, available=False`` and is
    logged at info once; any other exception gives ``success=False`` and is logged as an error
    once per distinct message (a broken file is not logged every 5 s).
    """
    name = collector.name
    start = time.perf_counter()
    error: str | None = None
    success = True
    try:
        collector.read(parts)
    except NoDataError as exc:
        error = str(exc)
        if _once.changed(name=name, message=f"nodata:{exc}"):
            log.info("collector %s has no data: %s", name, exc)
    except Exception as exc:
        success, error = False, f"{type(exc).__name__}: {exc}"
        if _once.changed(name=name, message=f"error:{exc}"):
            # An OSError names the file and the errno (a wrong --path.procfs, a permission the
            # container lacks): one line says it all. Anything else is a bug: its traceback.
            trace = None if isinstance(exc, OSError) else exc
            log.error("collector %s failed: %s", name, exc, exc_info=trace)
    else:
        _once.clear(name=name)
    return CollectorStatus(
        name=name,
        success=success,
        available=success and error is None,
        duration_seconds=time.perf_counter() - start,
        error=error,
        skipped=collector.skipped.counts(),
    )
