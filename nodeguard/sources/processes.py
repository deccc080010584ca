"""The top processes by resident set size, each mapped to its container: evidence, not metrics.

RSS is what psutil's ``memory_info().rss`` gives: the second field of ``/proc/<pid>/statm`` in
pages, times the page size; the name is what psutil's ``name()`` gives: ``comm`` from
``/proc/<pid>/stat``, or where the kernel cut it at 15 characters, the basename of the command
line's first word when that starts with it. Both are read here, from the procfs given (psutil
reads only through its one process-wide ``PROCFS_PATH``, and its per-process machinery costs ten
times the read on a node with a thousand processes, docs/benchmarks.md); psutil is the oracle
of the tests (tests/agent/test_real_proc.py). The memory cgroup comes from ``/proc/<pid>/cgroup``
(proc(5)): the ``memory`` controller's line on v1, the ``0::`` line on v2, relative to the
agent's cgroup namespace where it has one (see
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
    "process_name",
    "read_top_processes",
]

#: Characters of a process name kept: comm is 15; a name from the command line (where comm is
#: cut) can be as long as the process likes.
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
        name = process_name(procfs=procfs, pid=pid)
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


def _read(path: str) -> bytes:
    fd = os.open(path, _FLAGS)
    try:
        return os.read(fd, 1 << 16)
    finally:
        os.close(fd)


def process_name(*, procfs: str, pid: int) -> str | None:
    """psutil's ``Process(pid).name()`` read from ``procfs`` (module docstring): ``comm``, or the
    command line's first word's basename where comm was cut at 15 characters and that starts
    with it; at most :data:`MAX_NAME_CHARS`, bytes that are not UTF-8 replaced. ``""`` when it
    cannot be read, ``None`` when the process is gone (proc(5): ``/proc/<pid>/stat`` field 2,
    ``/proc/<pid>/cmdline``)."""
    try:
        stat = _read(f"{procfs}/{pid}/stat")
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return ""
    start, end = stat.find(b"("), stat.rfind(b")")
    if start < 0 or end < start:
        return ""
    name = stat[start + 1 : end]
    if len(name) >= 15:  # TASK_COMM_LEN - 1: perhaps cut; the command line may have it whole
        try:
            cmdline = _read(f"{procfs}/{pid}/cmdline")
        except OSError:
            cmdline = b""
        # Arguments end with NUL; a process that rewrote its command line may use spaces.
        words = cmdline.split(b"\0" if cmdline.endswith(b"\0") else b" ")
        first = os.path.basename(words[0]) if words and words[0] else b""
        if first.startswith(name):
            name = first
    return name.decode("utf-8", "replace")[:MAX_NAME_CHARS]
