"""The top processes by resident set size, each mapped to its container: evidence, not metrics.

RSS comes from psutil (``memory_info().rss``, read from ``/proc/<pid>/statm``), pointed at the
host's procfs through ``psutil.PROCFS_PATH``. The memory cgroup comes from ``/proc/<pid>/cgroup``
(proc(5)): the ``memory`` controller's line on v1, the ``0::`` line on v2. Processes exit between
listing and reading; those are skipped.
"""

from __future__ import annotations

import heapq

import psutil

from nodeguard.paths import HostPaths
from nodeguard.snapshot import ProcessRss
from nodeguard.sources.cgroup_paths import parse_kubepods_path
from nodeguard.sources.files import read_optional

__all__ = ["memory_cgroup_of", "parse_proc_cgroup", "read_top_processes"]

NAME = "processes"


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


def read_top_processes(*, paths: HostPaths, limit: int = 10) -> tuple[ProcessRss, ...]:
    """The ``limit`` largest processes by RSS, largest first.

    Raises ``ValueError`` when procfs has no readable process: every real procfs has at least
    this one, so that is a wrong ``--path.procfs``.
    """
    # psutil reads procfs through a module-wide path; the sampler runs sources one at a time.
    if str(paths.procfs) != psutil.PROCFS_PATH:
        psutil.PROCFS_PATH = str(paths.procfs)
        psutil.process_iter.cache_clear()  # cached Process objects belong to the old procfs
    sizes: list[tuple[int, int, str]] = []
    for proc in psutil.process_iter(["name", "memory_info"]):
        info = proc.info
        mem = info.get("memory_info")
        if mem is None:
            continue  # gone, or a zombie / kernel thread psutil could not read
        sizes.append((int(mem.rss), proc.pid, str(info.get("name") or "")))
    if not sizes:
        raise ValueError(f"no processes readable under {paths.procfs}")
    top: list[ProcessRss] = []
    for rss, pid, name in heapq.nlargest(limit, sizes):
        cgroup = memory_cgroup_of(paths=paths, pid=pid)
        ident = parse_kubepods_path(cgroup) if cgroup else None
        top.append(
            ProcessRss(
                pid=pid,
                name=name,
                rss_bytes=rss,
                cgroup=cgroup,
                pod_uid=ident.pod_uid if ident else None,
                container_id=ident.container_id if ident else None,
            )
        )
    return tuple(top)
