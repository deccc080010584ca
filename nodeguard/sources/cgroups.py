"""Every pod and container memory cgroup of the kubepods hierarchy, cgroup v1 or v2.

Files read (Documentation/admin-guide/cgroup-v2.rst "Memory Interface Files";
Documentation/admin-guide/cgroup-v1/memory.rst):

==================  ==========================  ===============================================
                    v2                          v1
==================  ==========================  ===============================================
usage               ``memory.current``          ``memory.usage_in_bytes``
limit               ``memory.max`` (``max``)    ``memory.limit_in_bytes`` (PAGE_COUNTER_MAX
                                                 rounded to a page, 9223372036854771712)
stat                ``memory.stat`` anon, file,  ``memory.stat`` total_rss, total_cache,
                    the LRU lists,               the LRU lists, refaults (hierarchical)
                    slab_reclaimable, refaults
swap room           ``memory.swap.max``,         (none: the kubelet has no swap on v1)
                    ``memory.swap.current``
                    (only where the node has
                    swap free)
OOM kills           ``memory.events`` oom_kill   ``memory.oom_control`` oom_kill (>= 4.13);
                    (hierarchical)               a pod's summed with its containers'
limit hits          ``memory.events`` max        ``memory.failcnt``
throttle bound      ``memory.high`` (only where  (none)
                    ``memory.events`` high > 0)
pressure            ``memory.pressure``          (none)
==================  ==========================  ===============================================

The kubepods roots are found once by a bounded walk from the memory hierarchy root (they can sit
below a docker or kind prefix) and looked for again every ``rediscover_seconds``.

A full node has some 450 pod and container cgroups, read every sample: the walk uses string
paths and reads only the ``memory.stat`` and ``memory.events`` keys it needs (docs/benchmarks.md).

One bad file costs its own values only: a file that cannot be read, is not text, is longer than
any cgroup file (:data:`~nodeguard.sources.files.MAX_FILE_BYTES`) or does not hold what the
kernel writes (a negative size) is left out, and a directory that cannot be listed loses its
children; each is counted and logged once (:mod:`nodeguard.sources.skipped`), and the rest of
the node is read.

Each cgroup's unreclaimable memory (what an OOM kill is on its way from, page cache left out) is
computed here from those files (:mod:`nodeguard.sources.unreclaimable`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, NamedTuple, TypeVar

from nodeguard.paths import HostPaths
from nodeguard.snapshot import CgroupMemory, ContainerMemory, PodMemory, Pressure, QosClass
from nodeguard.sources import NoDataError
from nodeguard.sources.cgroup_paths import (
    is_kubepods_root,
    parse_container_dir,
    parse_pod_dir,
    parse_qos_dir,
)
from nodeguard.sources.files import parse_flat_keyed, read_optional
from nodeguard.sources.open_files import OpenFiles
from nodeguard.sources.pressure import parse_pressure
from nodeguard.sources.skipped import DuplicateError, Skipped
from nodeguard.sources.unreclaimable import (
    anon_lru,
    children_swap_bound,
    refault_file_pages,
    swap_room,
    unreclaimable_v1,
    unreclaimable_v2,
)

__all__ = ["CgroupLayout", "CgroupReader", "detect_layout", "normalise_limit", "read_limit"]

log = logging.getLogger(__name__)
T = TypeVar("T")

# Any limit at or above this is the kernel's "unlimited": v1 prints PAGE_COUNTER_MAX * PAGE_SIZE
# (9223372036854771712 on 4 KiB pages, other values on 16/64 KiB pages), all far above 2**62.
_UNLIMITED_FLOOR = 1 << 62
_MAX_ROOT_DEPTH = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class CgroupLayout:
    """Where the memory controller is mounted and which cgroup version it speaks."""

    version: Literal[1, 2]
    root: Path


def detect_layout(*, cgroupfs: Path) -> CgroupLayout:
    """Find the memory hierarchy under the cgroup mount.

    v1 (or hybrid) when ``<cgroupfs>/memory`` is a v1 memory controller; v2 when the unified
    hierarchy at ``<cgroupfs>`` (or ``<cgroupfs>/unified``) lists ``memory`` in
    ``cgroup.controllers``. Raises :class:`NoDataError` when neither exists.
    """
    v1 = cgroupfs / "memory"
    if (v1 / "memory.usage_in_bytes").exists() or (v1 / "memory.limit_in_bytes").exists():
        return CgroupLayout(version=1, root=v1)
    for candidate in (cgroupfs, cgroupfs / "unified"):
        controllers = read_optional(candidate / "cgroup.controllers")
        if controllers is not None and "memory" in controllers.split():
            return CgroupLayout(version=2, root=candidate)
    raise NoDataError(f"no cgroup memory controller under {cgroupfs}")


def normalise_limit(value: int | None, *, mem_total: int | None) -> int | None:
    """A limit in bytes, or ``None`` for "no limit": the v1 sentinels (anything >= 2**62) and
    any value >= MemTotal, which can never bind before the node itself runs out."""
    if value is None or value >= _UNLIMITED_FLOOR:
        return None
    if mem_total is not None and value >= mem_total:
        return None
    return value


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
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")  # memory.stat counts refaults in pages
_V2_EVENT_KEYS = frozenset({"oom_kill", "max", "high"})
_V1_OOM_KEYS = frozenset({"oom_kill"})


def _parse_int(text: str) -> int:
    """A one-number file (``memory.current``, ``memory.max``, ``memory.failcnt``); ``max`` is
    the unlimited sentinel. Raises ``ValueError`` for anything but a number of 0 or more: the
    kernel writes these unsigned, and a negative size must never be exported."""
    text = text.strip()
    if text == "max":
        return _UNLIMITED_FLOOR
    value = int(text)
    if value < 0:
        raise ValueError(f"negative value {value}")
    return value


def _unsigned(values: dict[str, int]) -> dict[str, int]:
    """``values``, or ``ValueError`` when one of them is negative (see :func:`_parse_int`)."""
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


# Reads without holding anything open (a budget of 0): for one-off reads.
_PLAIN = OpenFiles(max_open=0)
_EMPTY: dict[str, int] = {}

_Stat = dict[str, int] | None


class _Parts(NamedTuple):
    """What one cgroup's files said, parsed (``None``: absent or skipped). Equal parts (and
    parent limit, MemTotal) build an equal CgroupMemory."""

    stat: _Stat
    usage: int | None
    events: _Stat  # v2 memory.events, v1 memory.oom_control
    failcnt: int | None  # v1 only
    pressure: Pressure | None  # v2 only
    own_limit: int | None
    swap_max: int | None = None  # v2, read only where the node has swap free
    swap_current: int | None = None
    high: int | None = None  # v2 memory.high, read only where memory.events high > 0


class _Swap(NamedTuple):
    """What bounds a cgroup's swap room besides its own files: the node's SwapFree (``None``:
    unknown or none), ``vm.swappiness``, the room its pod cgroup leaves (``None``: no bound or
    not a container) and, for a pod or the kubepods cgroup, what its children let swap
    (:func:`~nodeguard.sources.unreclaimable.children_swap_bound`; ``None``: not counted)."""

    node_free: int | None
    swappiness: int | None
    parent_room: int | None
    children: int | None = None


_NO_SWAP = _Swap(node_free=None, swappiness=None, parent_room=None)


# path -> (its parts, parent limit, MemTotal and swap bounds; the CgroupMemory built from them;
# the inode number of its directory)
_Key = tuple[_Parts, int | None, int | None, _Swap]
_Built = dict[str, tuple[_Key, CgroupMemory, int]]


def _limit_file(version: Literal[1, 2]) -> str:
    return "memory.max" if version == 2 else "memory.limit_in_bytes"


def read_limit(
    *,
    path: str | Path,
    version: Literal[1, 2],
    mem_total: int | None,
    files: OpenFiles = _PLAIN,
    dir_ino: int = 0,
) -> int | None:
    """The cgroup's own memory limit in bytes, ``None`` for none. ``files`` and ``dir_ino``: the
    :class:`OpenFiles` to read with (by default each file is opened, read and closed) and the
    inode number of the cgroup's directory as listed. Raises ``OSError`` when the file cannot be
    read and ``ValueError`` when it is not a limit."""
    own = files.read(f"{os.fspath(path)}/{_limit_file(version)}", _parse_int, dir_ino=dir_ino)
    return normalise_limit(own, mem_total=mem_total)


def _min_limit(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def _own_swap_room(parts: _Parts) -> int | None:
    """``memory.swap.max - memory.swap.current``; ``None`` for no bound (``max``, or files
    absent: swap accounting off, or the node has no swap free and they were not read)."""
    if parts.swap_max is None or parts.swap_max >= _UNLIMITED_FLOOR or parts.swap_current is None:
        return None
    return max(0, parts.swap_max - parts.swap_current)


def _room(parts: _Parts, swap: _Swap) -> int:
    """The cgroup's swap room: every bound of :class:`_Swap` and its own files."""
    return swap_room(
        rooms=(swap.node_free, swap.parent_room, _own_swap_room(parts), swap.children),
        swappiness=swap.swappiness,
    )


def _swappable(key: _Key) -> int:
    """Bytes of a v2 cgroup's anon LRU that fit its swap room, from what built it."""
    parts, swap = key[0], key[3]
    return min(anon_lru(parts.stat or _EMPTY), _room(parts, swap))


def _build(
    *,
    rel: str,
    version: Literal[1, 2],
    parts: _Parts,
    parent_limit: int | None,
    mem_total: int | None,
    swap: _Swap,
) -> CgroupMemory:
    stat = parts.stat or _EMPTY
    events = parts.events or _EMPTY
    usage = parts.usage
    if version == 2:
        inactive = stat.get("inactive_file")
        anon, file_ = stat.get("anon"), stat.get("file")
        limit_hits, high = events.get("max"), events.get("high")
    else:
        inactive = stat.get("total_inactive_file", stat.get("inactive_file"))
        anon = stat.get("total_rss", stat.get("rss"))
        file_ = stat.get("total_cache", stat.get("cache"))
        limit_hits, high = parts.failcnt, None
    working_set = None
    if usage is not None and inactive is not None:
        working_set = max(0, usage - inactive)
    if version == 2:
        unreclaimable = unreclaimable_v2(usage=usage, stat=stat, swap=_room(parts, swap))
    else:
        unreclaimable = unreclaimable_v1(stat=stat)
    refaults = refault_file_pages(stat=stat, version=version)
    limit = normalise_limit(parts.own_limit, mem_total=mem_total)
    return CgroupMemory(
        path=rel,
        cgroup_version=version,
        usage_bytes=usage,
        working_set_bytes=working_set,
        anon_bytes=anon,
        file_bytes=file_,
        inactive_file_bytes=inactive,
        limit_bytes=limit,
        effective_limit_bytes=_min_limit(limit, parent_limit),
        oom_kills=events.get("oom_kill"),
        limit_hits=limit_hits,
        high_events=high,
        high_bytes=normalise_limit(parts.high, mem_total=mem_total),
        pressure=parts.pressure,
        unreclaimable_bytes=unreclaimable,
        refault_file_bytes=None if refaults is None else refaults * _PAGE_SIZE,
    )


def _subdirs(path: str | Path, skipped: Skipped) -> Iterator[os.DirEntry[str]]:
    """The subdirectories of ``path`` by name (a cgroup directory also holds some 40 files);
    none, counted in ``skipped``, when it cannot be listed."""
    try:
        with os.scandir(path) as it:
            entries = list(it)
    except (FileNotFoundError, NotADirectoryError):
        return  # removed while we walked: a pod or container that just ended
    except OSError as exc:
        skipped.add(path=os.fspath(path), exc=exc)
        return
    dirs = [e for e in entries if e.is_dir(follow_symlinks=False)]
    dirs.sort(key=lambda e: e.name)
    yield from dirs


def find_kubepods_roots(
    *, root: Path, skipped: Skipped, max_depth: int = _MAX_ROOT_DEPTH
) -> list[Path]:
    """Every kubepods root within ``max_depth`` levels of the hierarchy root, outermost first.
    The walk does not descend into a kubepods root, nor into one it has found; a directory
    that cannot be listed is counted in ``skipped``."""
    found: list[Path] = []
    level = [root]
    for _ in range(max_depth):
        nxt: list[Path] = []
        for directory in level:
            for entry in _subdirs(directory, skipped):
                if is_kubepods_root(entry.name):
                    found.append(Path(entry.path))
                else:
                    nxt.append(Path(entry.path))
        level = nxt
    return found


def _liveness(pod: PodMemory) -> tuple[int, int]:
    return len(pod.containers), pod.memory.usage_bytes or 0


class _PodKillTally:
    """cgroup v1's pod OOM kills counted as v2 counts them.

    v2's ``memory.events`` counts hierarchically: a pod's ``oom_kill`` includes its containers'.
    v1's ``memory.oom_control`` ``oom_kill`` counts only the kills of tasks in that very cgroup
    (mm/memcontrol.c memcg_memory_event() walks up only on the default hierarchy, and the kill
    is charged to the victim's cgroup, a container's, even when the pod's limit was hit), so a
    v1 pod's own counter stays 0. Here a v1 pod's count is its own, plus its containers' now,
    plus the last count of each of its containers that has gone since (a container OOM-killed
    is restarted in a new cgroup): a counter that only grows while the pod lives.
    """

    def __init__(self) -> None:
        self._last: dict[str, dict[str, int]] = {}  # pod uid -> container id -> last count
        self._gone: dict[str, int] = {}  # pod uid -> kills of its containers that have gone

    def fold(
        self,
        *,
        uid: str,
        memory: CgroupMemory,
        containers: tuple[ContainerMemory, ...],
        listed: frozenset[str] | None,
    ) -> CgroupMemory:
        """``memory`` with the pod's count; ``listed``: the container ids whose directories the
        read found (one that could not be read keeps its last count), ``None`` for a re-read of
        the same containers."""
        if memory.cgroup_version != 1 or memory.oom_kills is None:
            return memory
        now = dict(self._last.get(uid, {}))
        # A count the kernel did not give this time (a file skipped, a container going) keeps
        # the last one: unknown is not 0.
        now.update(
            (c.container_id, c.memory.oom_kills)
            for c in containers
            if c.memory.oom_kills is not None
        )
        if listed is not None:
            gone = [cid for cid in now if cid not in listed]
            self._gone[uid] = self._gone.get(uid, 0) + sum(now.pop(cid) for cid in gone)
        self._last[uid] = now
        total = memory.oom_kills + sum(now.values()) + self._gone.get(uid, 0)
        return memory if total == memory.oom_kills else replace(memory, oom_kills=total)

    def keep(self, uids: set[str]) -> None:
        """Forget the pods not in ``uids`` (gone)."""
        for uid in [u for u in self._last if u not in uids]:
            del self._last[uid]
            self._gone.pop(uid, None)


class _Kubepods(NamedTuple):
    """The kubepods cgroup of the last full read: where it is, the limit above it, and the pod
    cgroups read under it (their swap bounds bound its own)."""

    path: str
    ino: int
    above: int | None
    pods: tuple[str, ...]


class CgroupReader:
    """Reads every pod and container cgroup under the kubepods roots.

    ``read(mem_total=..., swap_free=...)`` returns ``(cgroup_version, pods)``; ``swap_free``:
    the node's SwapFree in bytes (``None``: unknown, taken as no swap), which bounds what
    unreclaimable memory leaves out (:func:`~nodeguard.sources.unreclaimable.swap_room`); only
    where it is above 0 are ``memory.swap.*`` and ``vm.swappiness`` read. Raises
    :class:`NoDataError` when
    there is no memory controller or no kubepods hierarchy (a node without a kubelet).
    With ``max_open_files`` above 0, up to that many cgroup files stay open between samples and
    are re-read with ``pread`` (:mod:`nodeguard.sources.open_files`); :meth:`close` closes them.
    Files and directories skipped are counted in ``skipped``.
    """

    def __init__(
        self,
        *,
        paths: HostPaths,
        rediscover_seconds: float = 60.0,
        max_open_files: int = 0,
        skipped: Skipped | None = None,
    ) -> None:
        self._paths = paths
        self.skipped = skipped or Skipped(collector="cgroups")
        self._rediscover = rediscover_seconds
        self._layout: CgroupLayout | None = None
        self._roots: list[Path] = []
        self._found_at = float("-inf")
        self._files = OpenFiles(max_open=max_open_files)
        # what each cgroup's files said and what was built from it, last sample and this one
        self._built: _Built = {}
        self._building: _Built = {}
        self._kubepods: _Kubepods | None = None
        self._pod_kills = _PodKillTally()
        self._node_swap = _NO_SWAP  # SwapFree and vm.swappiness of this read

    def _set_swap(self, swap_free: int | None) -> None:
        """The node's swap state for this read: SwapFree, and ``vm.swappiness`` where there is
        swap free to use (one procfs file; absent or bad: unknown)."""
        swappiness: int | None = None
        if swap_free:
            text = read_optional(self._paths.proc("sys", "vm", "swappiness"))
            try:
                swappiness = int(text) if text is not None else None
            except ValueError:
                swappiness = None
        self._node_swap = _Swap(node_free=swap_free, swappiness=swappiness, parent_room=None)

    @property
    def root(self) -> str | None:
        """The memory hierarchy's root directory (what ``CgroupMemory.path`` is relative to);
        ``None`` before the first read found one."""
        return str(self._layout.root) if self._layout is not None else None

    @property
    def kubepods(self) -> CgroupMemory | None:
        """The outermost kubepods cgroup as the last read or refresh saw it; ``None`` when
        there is none."""
        if self._kubepods is None:
            return None
        built = self._built.get(self._kubepods[0])
        return built[1] if built else None

    @property
    def open_files(self) -> int:
        """Cgroup files held open between samples now (:mod:`nodeguard.sources.open_files`)."""
        return self._files.open_count

    def close(self) -> None:
        """Close the cgroup files held open."""
        self._files.close()

    def _discover(self) -> tuple[CgroupLayout, list[Path]]:
        now = time.monotonic()
        stale = now - self._found_at >= self._rediscover
        if self._layout is None or stale or not all(r.is_dir() for r in self._roots):
            self._layout = detect_layout(cgroupfs=self._paths.cgroupfs)
            self._roots = find_kubepods_roots(root=self._layout.root, skipped=self.skipped)
            self._found_at = now
        return self._layout, self._roots

    def read(
        self, *, mem_total: int | None, swap_free: int | None = None
    ) -> tuple[int, tuple[PodMemory, ...]]:
        pods: list[PodMemory] = []
        self._kubepods = None
        self._set_swap(swap_free)
        try:
            layout, roots = self._discover()
            if not roots:
                raise NoDataError(f"no kubepods cgroup under {layout.root}")
            for kube_root in roots:
                limit = self._ancestor_limit(layout=layout, path=kube_root, mem_total=mem_total)
                found = self._read_root(layout=layout, root=kube_root, limit=limit, total=mem_total)
                if self._kubepods is None:  # after its pods: their swap bounds bound its own
                    self._read_kubepods(
                        layout=layout,
                        path=str(kube_root),
                        total=mem_total,
                        pods=tuple(str(layout.root) + p.memory.path for p in found),
                    )
                pods.extend(found)
        finally:
            self._files.sweep()  # what this sample did not read belongs to cgroups now gone
            self._built, self._building = self._building, {}
        pods = self._one_per_pod(pods)
        self._pod_kills.keep({p.uid for p in pods})
        return layout.version, tuple(pods)

    def _one_per_pod(self, pods: list[PodMemory]) -> list[PodMemory]:
        """One cgroup per pod UID. Two kubepods roots can hold one pod: a kubelet run in a
        container (kind, a kubelet-in-docker node) writes its tree under the container's cgroup
        (``/docker/<id>/kubepods``) while the host's view or a leftover tree shows a
        ``/kubepods`` beside it; exporting both doubles every series of the pod. The one kept
        has the most container cgroups, then the higher usage (a leftover directory of an old
        kubelet is empty), then comes first (outermost root); the others are counted as
        ``duplicate`` in ``nodeguard_collector_errors_total`` and logged once each."""
        best: dict[str, PodMemory] = {}
        for pod in pods:
            kept = best.get(pod.uid)
            if kept is None:
                best[pod.uid] = pod
                continue
            dropped = pod
            if _liveness(pod) > _liveness(kept):
                dropped, kept = kept, pod
                best[kept.uid] = kept
            self.skipped.add(
                path=dropped.memory.path,
                exc=DuplicateError(f"pod {kept.uid} also at {kept.memory.path}, which is kept"),
            )
        return [p for p in pods if best[p.uid] is p]

    def _read_kubepods(
        self, *, layout: CgroupLayout, path: str, total: int | None, pods: tuple[str, ...]
    ) -> None:
        """The kubepods cgroup itself (node allocatable); its limit against the limits above
        it (a kind or docker node's own); ``pods``: the pod cgroups just read under it."""
        try:
            ino = os.stat(path).st_ino
        except OSError:
            return
        parent = Path(path).parent
        above = (
            self._ancestor_limit(layout=layout, path=parent, mem_total=total)
            if parent != layout.root
            else None
        )
        if self._read(
            layout=layout, path=path, ino=ino, parent_limit=above, total=total, children=pods
        ):
            self._kubepods = _Kubepods(path=path, ino=ino, above=above, pods=pods)

    def refresh_kubepods(
        self, *, mem_total: int | None, swap_free: int | None = None
    ) -> CgroupMemory | None:
        """Re-read the kubepods cgroup alone (a focused sample); the last one where it cannot
        be read."""
        if self._kubepods is None or self._layout is None:
            return None
        self._set_swap(swap_free)
        kp = self._kubepods
        memory = self._reread(
            path=kp.path, ino=kp.ino, parent_limit=kp.above, total=mem_total, children=kp.pods
        )
        return memory or self.kubepods

    def refresh(
        self,
        pods: tuple[PodMemory, ...],
        *,
        keys: frozenset[str],
        mem_total: int | None,
        swap_free: int | None = None,
    ) -> tuple[tuple[PodMemory, ...], frozenset[str]]:
        """Re-read only the pods and containers of ``pods`` (the last read's) whose keys are
        in ``keys`` (a pod's UID: its pod cgroup; ``<pod uid>/<container id>``: that container
        and its pod); the others are returned as they were. A cgroup gone since the last read
        keeps its last values (the next full read drops it). Returns the pods and the keys
        re-read. Never sweeps held files: only a full read knows which cgroups are gone."""
        if self._layout is None or not keys:
            return pods, frozenset()
        self._set_swap(swap_free)
        root = str(self._layout.root)
        out: list[PodMemory] = []
        done: set[str] = set()
        for pod in pods:
            wanted = {
                c.container_id for c in pod.containers if f"{pod.uid}/{c.container_id}" in keys
            }
            if pod.uid not in keys and not wanted:
                out.append(pod)
                continue
            # Its containers first: their swap bounds bound the pod's own.
            containers = tuple(
                ContainerMemory(
                    container_id=c.container_id,
                    runtime=c.runtime,
                    memory=self._refreshed(
                        root + c.memory.path,
                        f"{pod.uid}/{c.container_id}",
                        c.memory,
                        mem_total,
                        done,
                    ),
                )
                if c.container_id in wanted
                else c
                for c in pod.containers
            )
            memory = self._refreshed(
                root + pod.memory.path,
                pod.uid,
                pod.memory,
                mem_total,
                done,
                children=tuple(root + c.memory.path for c in containers),
            )
            memory = self._pod_kills.fold(
                uid=pod.uid, memory=memory, containers=containers, listed=None
            )
            out.append(
                PodMemory(
                    uid=pod.uid, qos_class=pod.qos_class, memory=memory, containers=containers
                )
            )
        return tuple(out), frozenset(done)

    def _refreshed(
        self,
        path: str,
        key: str,
        last: CgroupMemory,
        total: int | None,
        done: set[str],
        *,
        children: tuple[str, ...] | None = None,
    ) -> CgroupMemory:
        """The cgroup at ``path`` read again (its key added to ``done``), or ``last`` when it
        cannot be: not in the last full read, or gone since. ``children``: a pod's container
        cgroups (see :meth:`_read`)."""
        built = self._built.get(path)
        if built is None:
            return last
        memory = self._reread(
            path=path,
            ino=built[2],
            parent_limit=built[0][1],
            total=total,
            parent_room=built[0][3].parent_room,
            children=children,
        )
        if memory is None:
            return last
        done.add(key)
        return memory

    def _reread(
        self,
        *,
        path: str,
        ino: int,
        parent_limit: int | None,
        total: int | None,
        parent_room: int | None = None,
        children: tuple[str, ...] | None = None,
    ) -> CgroupMemory | None:
        """One cgroup read again between full reads; what it said replaces the last read's
        record (so the next full read finds it unchanged, and builds nothing anew)."""
        assert self._layout is not None
        memory = self._read(
            layout=self._layout,
            path=path,
            ino=ino,
            parent_limit=parent_limit,
            total=total,
            parent_room=parent_room,
            children=children,
        )
        if memory is not None:
            self._built[path] = self._building.pop(path)
        return memory

    def _ancestor_limit(
        self, *, layout: CgroupLayout, path: Path, mem_total: int | None
    ) -> int | None:
        """The smallest limit from just below the hierarchy root down to ``path`` inclusive."""
        limit: int | None = None
        rel = path.relative_to(layout.root)
        current = layout.root
        for part in rel.parts:
            current = current / part
            own = self._file(
                f"{current}/{_limit_file(layout.version)}", _parse_int, ino=0, files=_PLAIN
            )
            limit = _min_limit(limit, normalise_limit(own, mem_total=mem_total))
        return limit

    def _file(
        self, path: str, parse: Callable[[str], T], *, ino: int, files: OpenFiles | None = None
    ) -> T | None:
        """``parse`` of one cgroup file, ``None`` when it does not exist or is skipped; read
        with ``files`` (the reader's own by default: kept open)."""
        try:
            return (files or self._files).read(path, parse, dir_ino=ino)
        except (OSError, ValueError) as exc:
            self.skipped.add(path=path, exc=exc)
            return None

    def _optional(self, path: str, *, ino: int) -> int | None:
        """A one-number file that older kernels or a kernel option may leave out (the swap
        files without swap accounting): absent is no data, not a skip."""
        if not os.path.exists(path):
            return None
        return self._file(path, _parse_int, ino=ino)

    def _read_parts(self, base: str, version: Literal[1, 2], ino: int) -> _Parts:
        if version == 2:
            swap = bool(self._node_swap.node_free)
            events = self._file(f"{base}/memory.events", _events_v2, ino=ino)
            # memory.high only where it has throttled (a stall there is the cgroup's own:
            # nodeguard.stall); on most nodes no cgroup has, and the file is not read.
            throttled = bool(events and events.get("high"))
            return _Parts(
                stat=self._file(f"{base}/memory.stat", _stat_v2, ino=ino),
                usage=self._file(f"{base}/memory.current", _parse_int, ino=ino),
                events=events,
                failcnt=None,
                pressure=self._file(f"{base}/memory.pressure", parse_pressure, ino=ino),
                own_limit=self._file(f"{base}/memory.max", _parse_int, ino=ino),
                swap_max=self._optional(f"{base}/memory.swap.max", ino=ino) if swap else None,
                swap_current=self._optional(f"{base}/memory.swap.current", ino=ino)
                if swap
                else None,
                high=self._optional(f"{base}/memory.high", ino=ino) if throttled else None,
            )
        return _Parts(
            stat=self._file(f"{base}/memory.stat", _stat_v1, ino=ino),
            usage=self._file(f"{base}/memory.usage_in_bytes", _parse_int, ino=ino),
            events=self._file(f"{base}/memory.oom_control", _oom_v1, ino=ino),
            failcnt=self._file(f"{base}/memory.failcnt", _parse_int, ino=ino),
            pressure=None,
            own_limit=self._file(f"{base}/memory.limit_in_bytes", _parse_int, ino=ino),
        )

    def _read_root(
        self, *, layout: CgroupLayout, root: Path, limit: int | None, total: int | None
    ) -> list[PodMemory]:
        pods: list[PodMemory] = []
        for entry in _subdirs(root, self.skipped):
            qos = parse_qos_dir(entry.name)
            if qos is not None:
                qos_path = entry.path
                own = self._file(
                    f"{qos_path}/{_limit_file(layout.version)}", _parse_int, ino=entry.inode()
                )
                qos_limit = _min_limit(limit, normalise_limit(own, mem_total=total))
                for pod_entry in _subdirs(qos_path, self.skipped):
                    pod = self._read_pod(
                        layout=layout, entry=pod_entry, qos=qos, limit=qos_limit, total=total
                    )
                    if pod is not None:
                        pods.append(pod)
                continue
            pod = self._read_pod(
                layout=layout, entry=entry, qos="guaranteed", limit=limit, total=total
            )
            if pod is not None:
                pods.append(pod)
        return pods

    def _read_pod(
        self,
        *,
        layout: CgroupLayout,
        entry: os.DirEntry[str],
        qos: QosClass,
        limit: int | None,
        total: int | None,
    ) -> PodMemory | None:
        uid = parse_pod_dir(entry.name)
        if uid is None:
            return None
        path, ino = entry.path, entry.inode()
        parts = self._read_parts(path, layout.version, ino)
        if parts.usage is None and not os.path.isdir(path):
            return None  # removed between listing and reading
        # The pod is built after its containers (their swap bounds bound its own); they need
        # its effective limit and swap room, which its files give.
        pod_limit = _min_limit(normalise_limit(parts.own_limit, mem_total=total), limit)
        pod_room = _own_swap_room(parts)
        containers: list[ContainerMemory] = []
        listed: set[str] = set()
        read: list[str] = []
        for child in _subdirs(path, self.skipped):
            parsed = parse_container_dir(child.name)
            if parsed is None:
                continue
            listed.add(parsed[0])
            cmem = self._read(
                layout=layout,
                path=child.path,
                ino=child.inode(),
                parent_limit=pod_limit,
                total=total,
                parent_room=pod_room,
            )
            if cmem is not None:
                read.append(child.path)
                containers.append(
                    ContainerMemory(container_id=parsed[0], runtime=parsed[1], memory=cmem)
                )
        memory = self._record(
            layout=layout,
            path=path,
            ino=ino,
            parts=parts,
            parent_limit=limit,
            total=total,
            swap=self._node_swap._replace(children=self._children_swap(layout, parts, read)),
        )
        memory = self._pod_kills.fold(
            uid=uid, memory=memory, containers=tuple(containers), listed=frozenset(listed)
        )
        return PodMemory(uid=uid, qos_class=qos, memory=memory, containers=tuple(containers))

    def _read(
        self,
        *,
        layout: CgroupLayout,
        path: str,
        ino: int,
        parent_limit: int | None,
        total: int | None,
        parent_room: int | None = None,
        children: Iterable[str] | None = None,
    ) -> CgroupMemory | None:
        """The cgroup, or ``None`` when it is gone; a file skipped leaves its values out.
        ``parent_room``: the swap room its pod leaves a container (``None``: no bound);
        ``children``: the paths of the cgroups below it read (a pod's containers, the kubepods
        cgroup's pods), whose swap bounds bound its own (``None``: not counted)."""
        parts = self._read_parts(path, layout.version, ino)
        if parts.usage is None and not os.path.isdir(path):
            return None  # removed between listing and reading
        swap = self._node_swap._replace(parent_room=parent_room)
        if children is not None:
            swap = swap._replace(children=self._children_swap(layout, parts, children))
        return self._record(
            layout=layout,
            path=path,
            ino=ino,
            parts=parts,
            parent_limit=parent_limit,
            total=total,
            swap=swap,
        )

    def _children_swap(
        self, layout: CgroupLayout, parts: _Parts, children: Iterable[str]
    ) -> int | None:
        """What the cgroups at ``children`` (built in this read, or else in the last) let of
        the parent's anon go to swap (:func:`children_swap_bound`); ``None`` where swap cannot
        be used (cgroup v1, no swap free on the node)."""
        if layout.version != 2 or not self._node_swap.node_free:
            return None
        known: list[tuple[int, int]] = []
        for child in children:
            built = self._building.get(child) or self._built.get(child)
            if built is not None:
                known.append((anon_lru(built[0][0].stat or _EMPTY), _swappable(built[0])))
        return children_swap_bound(anon=anon_lru(parts.stat or _EMPTY), children=known)

    def _record(
        self,
        *,
        layout: CgroupLayout,
        path: str,
        ino: int,
        parts: _Parts,
        parent_limit: int | None,
        total: int | None,
        swap: _Swap,
    ) -> CgroupMemory:
        """The cgroup built from ``parts`` (the last read's object where they and the bounds
        are unchanged), recorded for this read."""
        key = (parts, parent_limit, total, swap)
        last = self._built.get(path)
        if last is not None and last[0] == key:
            memory = last[1]  # the same files said the same: the same (immutable) object
        else:
            root = str(layout.root)
            if path.startswith(root + "/"):  # always, for paths listed under the root
                rel = path[len(root) :]
            else:
                rel = "/" + str(Path(path).relative_to(layout.root))
            memory = _build(
                rel=rel,
                version=layout.version,
                parts=parts,
                parent_limit=parent_limit,
                mem_total=total,
                swap=swap,
            )
        self._building[path] = (key, memory, ino)
        return memory
