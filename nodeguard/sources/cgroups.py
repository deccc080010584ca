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
                    inactive_file               total_inactive_file (hierarchical)
OOM kills           ``memory.events`` oom_kill   ``memory.oom_control`` oom_kill (>= 4.13)
limit hits          ``memory.events`` max        ``memory.failcnt``
pressure            ``memory.pressure``          (none)
==================  ==========================  ===============================================

The kubepods roots are found once by a bounded walk from the memory hierarchy root (they can sit
below a docker or kind prefix) and looked for again every ``rediscover_seconds``.

A full node has some 450 pod and container cgroups, read every sample: the walk uses string
paths and reads only the ``memory.stat`` and ``memory.events`` keys it needs (docs/benchmarks.md).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

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

__all__ = ["CgroupLayout", "CgroupSource", "detect_layout", "normalise_limit", "read_limit"]

NAME = "cgroups"
log = logging.getLogger(__name__)

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
_V2_STAT_KEYS = frozenset({"anon", "file", "inactive_file"})
_V1_STAT_KEYS = frozenset(
    {"total_inactive_file", "inactive_file", "total_rss", "rss", "total_cache", "cache"}
)
_V2_EVENT_KEYS = frozenset({"oom_kill", "max", "high"})
_V1_OOM_KEYS = frozenset({"oom_kill"})


def _parse_int(text: str) -> int | None:
    """A one-number file (``memory.current``, ``memory.max``, ``memory.failcnt``); ``max`` is
    the unlimited sentinel."""
    text = text.strip()
    if text == "max":
        return _UNLIMITED_FLOOR
    try:
        return int(text)
    except ValueError:
        return None


# One function per file kind, so that OpenFiles keeps each file's parsed value with its text.
def _stat_v2(text: str) -> dict[str, int]:
    return parse_flat_keyed(text, _V2_STAT_KEYS)


def _stat_v1(text: str) -> dict[str, int]:
    return parse_flat_keyed(text, _V1_STAT_KEYS)


def _events_v2(text: str) -> dict[str, int]:
    return parse_flat_keyed(text, _V2_EVENT_KEYS)


def _oom_v1(text: str) -> dict[str, int]:
    return parse_flat_keyed(text, _V1_OOM_KEYS)


# Reads without holding anything open (a budget of 0): for one-off reads.
_PLAIN = OpenFiles(max_open=0)
_EMPTY: dict[str, int] = {}

# What one cgroup's files said, parsed: (stat, usage, events or oom_control, failcnt,
# pressure, own limit). Equal parts (and parent limit, MemTotal) build an equal CgroupMemory.
_Stat = dict[str, int] | None
_Parts = tuple[_Stat, int | None, _Stat, int | None, Pressure | None, int | None]
# path -> (its parts, parent limit and MemTotal; the CgroupMemory built from them)
_Built = dict[str, tuple[tuple[_Parts, int | None, int | None], CgroupMemory]]


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
    """The cgroup's own memory limit in bytes, ``None`` for none or unreadable. ``files`` and
    ``dir_ino``: the :class:`OpenFiles` to read with (by default each file is opened, read and
    closed) and the inode number of the cgroup's directory as listed."""
    own = files.read(f"{os.fspath(path)}/{_limit_file(version)}", _parse_int, dir_ino=dir_ino)
    return normalise_limit(own, mem_total=mem_total)


def _min_limit(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def _read_parts(base: str, version: Literal[1, 2], files: OpenFiles, ino: int) -> _Parts:
    if version == 2:
        return (
            files.read(f"{base}/memory.stat", _stat_v2, dir_ino=ino),
            files.read(f"{base}/memory.current", _parse_int, dir_ino=ino),
            files.read(f"{base}/memory.events", _events_v2, dir_ino=ino),
            None,
            files.read(f"{base}/memory.pressure", parse_pressure, dir_ino=ino),
            files.read(f"{base}/memory.max", _parse_int, dir_ino=ino),
        )
    return (
        files.read(f"{base}/memory.stat", _stat_v1, dir_ino=ino),
        files.read(f"{base}/memory.usage_in_bytes", _parse_int, dir_ino=ino),
        files.read(f"{base}/memory.oom_control", _oom_v1, dir_ino=ino),
        files.read(f"{base}/memory.failcnt", _parse_int, dir_ino=ino),
        None,
        files.read(f"{base}/memory.limit_in_bytes", _parse_int, dir_ino=ino),
    )


def _build(
    *,
    rel: str,
    version: Literal[1, 2],
    parts: _Parts,
    parent_limit: int | None,
    mem_total: int | None,
) -> CgroupMemory:
    stat_or_none, usage, events_or_none, failcnt, pressure, own_limit = parts
    stat = stat_or_none or _EMPTY
    events = events_or_none or _EMPTY
    if version == 2:
        inactive = stat.get("inactive_file")
        anon, file_ = stat.get("anon"), stat.get("file")
        limit_hits, high = events.get("max"), events.get("high")
    else:
        inactive = stat.get("total_inactive_file", stat.get("inactive_file"))
        anon = stat.get("total_rss", stat.get("rss"))
        file_ = stat.get("total_cache", stat.get("cache"))
        limit_hits, high = failcnt, None
    working_set = None
    if usage is not None and inactive is not None:
        working_set = max(0, usage - inactive)
    limit = normalise_limit(own_limit, mem_total=mem_total)
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
        pressure=pressure,
    )


def _subdirs(path: str | Path) -> Iterator[os.DirEntry[str]]:
    """The subdirectories of ``path`` by name (a cgroup directory also holds some 40 files)."""
    try:
        with os.scandir(path) as it:
            entries = list(it)
    except (FileNotFoundError, NotADirectoryError):
        return  # removed while we walked: a pod or container that just ended
    except OSError as exc:
        _skip(Path(path), exc)
        return
    dirs = [e for e in entries if e.is_dir(follow_symlinks=False)]
    dirs.sort(key=lambda e: e.name)
    yield from dirs


def find_kubepods_roots(*, root: Path, max_depth: int = _MAX_ROOT_DEPTH) -> list[Path]:
    """Every kubepods root within ``max_depth`` levels of the hierarchy root, outermost first.
    The walk does not descend into a kubepods root, nor into one it has found."""
    found: list[Path] = []
    level = [root]
    for _ in range(max_depth):
        nxt: list[Path] = []
        for directory in level:
            for entry in _subdirs(directory):
                if is_kubepods_root(entry.name):
                    found.append(Path(entry.path))
                else:
                    nxt.append(Path(entry.path))
        level = nxt
    return found


def _skip(path: Path, exc: OSError) -> None:
    """One unreadable cgroup is skipped, never the whole sample; logged once per path."""
    key = f"{path}:{exc.errno}"
    if key not in _skipped_logged:
        _skipped_logged.add(key)
        log.warning("skipping unreadable cgroup %s: %s", path, exc)


_skipped_logged: set[str] = set()


class CgroupSource:
    """Reads every pod and container cgroup under the kubepods roots.

    ``read(mem_total=...)`` returns ``(cgroup_version, pods)``. Raises :class:`NoDataError` when
    there is no memory controller or no kubepods hierarchy (a node without a kubelet).
    With ``max_open_files`` above 0, up to that many cgroup files stay open between samples and
    are re-read with ``pread`` (:mod:`nodeguard.sources.open_files`); :meth:`close` closes them.
    """

    def __init__(
        self, *, paths: HostPaths, rediscover_seconds: float = 60.0, max_open_files: int = 0
    ) -> None:
        self._paths = paths
        self._rediscover = rediscover_seconds
        self._layout: CgroupLayout | None = None
        self._roots: list[Path] = []
        self._found_at = float("-inf")
        self._files = OpenFiles(max_open=max_open_files)
        # what each cgroup's files said and what was built from it, last sample and this one
        self._built: _Built = {}
        self._building: _Built = {}

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
            self._roots = find_kubepods_roots(root=self._layout.root)
            self._found_at = now
        return self._layout, self._roots

    def read(self, *, mem_total: int | None) -> tuple[int, tuple[PodMemory, ...]]:
        pods: list[PodMemory] = []
        try:
            layout, roots = self._discover()
            if not roots:
                raise NoDataError(f"no kubepods cgroup under {layout.root}")
            for kube_root in roots:
                limit = self._ancestor_limit(layout=layout, path=kube_root, mem_total=mem_total)
                pods.extend(
                    self._read_root(layout=layout, root=kube_root, limit=limit, total=mem_total)
                )
        finally:
            self._files.sweep()  # what this sample did not read belongs to cgroups now gone
            self._built, self._building = self._building, {}
        return layout.version, tuple(pods)

    def _ancestor_limit(
        self, *, layout: CgroupLayout, path: Path, mem_total: int | None
    ) -> int | None:
        """The smallest limit from just below the hierarchy root down to ``path`` inclusive."""
        limit: int | None = None
        rel = path.relative_to(layout.root)
        current = layout.root
        for part in rel.parts:
            current = current / part
            own = read_limit(path=current, version=layout.version, mem_total=mem_total)
            limit = _min_limit(limit, own)
        return limit

    def _read_root(
        self, *, layout: CgroupLayout, root: Path, limit: int | None, total: int | None
    ) -> list[PodMemory]:
        pods: list[PodMemory] = []
        for entry in _subdirs(root):
            qos = parse_qos_dir(entry.name)
            if qos is not None:
                qos_path = entry.path
                own = read_limit(
                    path=qos_path,
                    version=layout.version,
                    mem_total=total,
                    files=self._files,
                    dir_ino=entry.inode(),
                )
                qos_limit = _min_limit(limit, own)
                for pod_entry in _subdirs(qos_path):
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
        path = entry.path
        memory = self._read(
            layout=layout, path=path, ino=entry.inode(), parent_limit=limit, total=total
        )
        if memory is None:
            return None
        containers: list[ContainerMemory] = []
        for child in _subdirs(path):
            parsed = parse_container_dir(child.name)
            if parsed is None:
                continue
            cmem = self._read(
                layout=layout,
                path=child.path,
                ino=child.inode(),
                parent_limit=memory.effective_limit_bytes,
                total=total,
            )
            if cmem is not None:
                containers.append(
                    ContainerMemory(container_id=parsed[0], runtime=parsed[1], memory=cmem)
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
    ) -> CgroupMemory | None:
        """The cgroup, or ``None`` when it is gone or unreadable (then skipped)."""
        try:
            parts = _read_parts(path, layout.version, self._files, ino)
        except OSError as exc:
            _skip(Path(path), exc)
            return None
        if parts[1] is None and not os.path.isdir(path):
            return None  # removed between listing and reading
        key = (parts, parent_limit, total)
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
            )
        self._building[path] = (key, memory)
        return memory
