"""The top processes by resident set size, each mapped to its container: evidence, not metrics.

RSS is what psutil's ``memory_info().rss`` gives: the second field of ``/proc/<pid>/statm`` in
pages, times the page size. It is read here for every process (psutil's per-process machinery
costs ten times the read on a node with a thousand processes, docs/benchmarks.md); psutil,
pointed at the host's procfs through ``psutil.PROCFS_PATH``, names only the processes kept. The
memory cgroup comes from ``/proc/<pid>/cgroup`` (proc(5)): the ``memory`` controller's line on
v1, the ``0::`` line on v2, relative to the agent's cgroup namespace where it has one (see
:mod:`nodeguard.sources.cgroup_paths`). Processes exit between listing and reading; those are
skipped. A process whose ``statm`` cannot be read or parsed is left out, and one whose
``cgroup`` cannot is kept without its cgroup: each counted and logged once
(:mod:`nodeguard.sources.skipped`), never the whole collector failed. Names are what the process
chose: cut to :data:`MAX_NAME_CHARS` and made valid text, so a name never costs more than a line
of evidence.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NamedTuple

import psutil

from nodeguard.paths import HostPaths
from nodeguard.snapshot import ProcessRss
from nodeguard.sources.cgroup_paths import identify_cgroup
from nodeguard.sources.files import read_optional
from nodeguard.sources.skipped import Skipped

__all__ = [
    "ProcessOwner",
    "memory_cgroup_of",
    "owner_of",
    "parse_proc_cgroup",
    "read_top_processes",
]

#: Characters of a process name kept: comm is 15; a name from the command line (psutil's, where
#: comm is cut) can be as long as the process likes.
MAX_NAME_CHARS = 128

_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
_FLAGS = os.O_RDONLY | os.O_CLOEXEC


def parse_proc_cgroup(text: str) -> str | None:
    """The memory cgroup path in a ``/proc/<pid>/cgroup`` text: the v1 line whose controller
    list holds ``memory``, else the v2 ``0::`` line; ``None`` when neither is there."""
    unified = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if "memory" in controllers.split(","):
            return path
        if hierarchy == "0" and controllers == "":
            unified = path
    return unified


def memory_cgroup_of(*, paths: HostPaths, pid: int) -> str | None:
    """The memory cgroup of a host PID, ``None`` when the process has gone."""
    text = read_optional(paths.proc(str(pid), "cgroup"))
    return None if text is None else parse_proc_cgroup(text)


class ProcessOwner(NamedTuple):
    """A process's memory cgroup as ``/proc/<pid>/cgroup`` gives it, and the pod and container
    it names (``None`` outside kubepods, or when the process has gone)."""

    cgroup: str | None
    pod_uid: str | None
    container_id: str | None


def owner_of(
    *, paths: HostPaths, pid: int, containers: Mapping[str, str] | None = None
) -> ProcessOwner:
    """The cgroup, pod and container of a host PID, in any form the kernel prints the path
    (:func:`~nodeguard.sources.cgroup_paths.identify_cgroup`; ``containers``: container ID ->
    pod UID from the cgroup walk, for a container of the agent's own pod). Raises ``OSError``
    when the file cannot be read for another reason than the process having gone."""
    cgroup = memory_cgroup_of(paths=paths, pid=pid)
    ident = identify_cgroup(cgroup, containers=containers) if cgroup else None
    return ProcessOwner(
        cgroup=cgroup,
        pod_uid=ident.pod_uid if ident else None,
        container_id=ident.container_id if ident else None,
    )


def read_top_processes(
    *,
    paths: HostPaths,
    limit: int = 10,
    containers: Mapping[str, str] | None = None,
    skipped: Skipped | None = None,
) -> tuple[ProcessRss, ...]:
    """The ``limit`` largest processes by RSS, largest first, each with its container
    (``containers``: see :func:`owner_of`); processes skipped are counted in ``skipped``.

    Raises ``ValueError`` when procfs has no readable process: every real procfs has at least
    this one, so that is a wrong ``--path.procfs``.
    """
    skipped = skipped or Skipped(collector="processes")
    # psutil reads procfs through a module-wide path; the sampler runs collectors one at a time.
    if str(paths.procfs) != psutil.PROCFS_PATH:
        psutil.PROCFS_PATH = str(paths.procfs)
        psutil.process_iter.cache_clear()  # cached Process objects belong to the old procfs
    procfs = str(paths.procfs)
    sizes: list[tuple[int, int]] = []
    for entry in os.listdir(procfs):
        if not entry.isdigit():
            continue
        statm = f"{procfs}/{entry}/statm"
        try:
            rss = _rss(statm)
        except (OSError, ValueError) as exc:
            skipped.add(path=statm, exc=exc)
            continue
        if rss is not None:
            sizes.append((rss, int(entry)))
    if not sizes:
        raise ValueError(f"no processes readable under {paths.procfs}")
    top: list[ProcessRss] = []
    for rss, pid in sorted(sizes, reverse=True):  # as heapq.nlargest orders them
        if len(top) == limit:
            break
        name = _name(pid)
        if name is None:
            continue  # gone since its statm was read: as if it had gone before
        try:
            owner = owner_of(paths=paths, pid=pid, containers=containers)
        except (OSError, ValueError) as exc:
            skipped.add(path=str(paths.proc(str(pid), "cgroup")), exc=exc)
            owner = ProcessOwner(cgroup=None, pod_uid=None, container_id=None)
        top.append(
            ProcessRss(
                pid=pid,
                name=name,
                rss_bytes=rss,
                cgroup=owner.cgroup,
                pod_uid=owner.pod_uid,
                container_id=owner.container_id,
            )
        )
    return tuple(top)


def _rss(statm: str) -> int | None:
    """psutil's ``memory_info().rss`` of one process; ``None`` when it is gone or unreadable
    (psutil's NoSuchProcess and AccessDenied)."""
    try:
        fd = os.open(statm, _FLAGS)
        try:
            line = os.read(fd, 512)
        finally:
            os.close(fd)
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = line.split()[:7]
    if len(fields) != 7:  # psutil fails the same way on a statm it cannot unpack
        raise ValueError(f"{statm}: unexpected content {line[:80]!r}")
    pages = int(fields[1])
    if pages < 0:
        raise ValueError(f"{statm}: negative resident size {pages}")
    return pages * _PAGE_SIZE


def _name(pid: int) -> str | None:
    """psutil's process name (``comm``, or the command's basename where comm is truncated);
    ``""`` when it cannot be read, ``None`` when the process is gone."""
    try:
        name = psutil.Process(pid).name()
    except psutil.NoSuchProcess:
        return None
    except (psutil.AccessDenied, psutil.ZombieProcess):
        return ""
    # psutil gives bytes that are not UTF-8 as lone surrogates: back to bytes, then text.
    text = name[:MAX_NAME_CHARS].encode("utf-8", "surrogateescape")
    return text.decode("utf-8", "replace")
