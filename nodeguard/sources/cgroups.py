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
computed from those files (:mod:`nodeguard.sources.unreclaimable`).

The reader is made of what it reads: the layout and the kubepods roots
(:mod:`~nodeguard.sources.cgroup_layout`), a limit (:mod:`~nodeguard.sources.cgroup_limits`), one
cgroup's files (:mod:`~nodeguard.sources.cgroup_files`) made into a ``CgroupMemory``
(:mod:`~nodeguard.sources.cgroup_memory`) and kept from one read to the next
(:mod:`~nodeguard.sources.cgroup_records`), the walk of pods and containers
(:mod:`~nodeguard.sources.pod_walk`) and its focused re-read
(:mod:`~nodeguard.sources.pod_refresh`), the kubepods cgroup
(:mod:`~nodeguard.sources.kubepods_cgroup`) and v1's pod OOM kills
(:mod:`~nodeguard.sources.pod_kills`).
"""

from __future__ import annotations

import time
from pathlib import Path

from nodeguard.paths import HostPaths
from nodeguard.snapshot import CgroupMemory, PodMemory
from nodeguard.sources import NoDataError
from nodeguard.sources.cgroup_files import CgroupFiles
from nodeguard.sources.cgroup_layout import CgroupLayout, detect_layout, find_kubepods_roots
from nodeguard.sources.cgroup_limits import normalise_limit, read_limit
from nodeguard.sources.cgroup_records import CgroupRecords
from nodeguard.sources.kubepods_cgroup import Kubepods, read_kubepods, reread_kubepods
from nodeguard.sources.open_files import OpenFiles
from nodeguard.sources.pod_kills import PodKillTally as _PodKillTally
from nodeguard.sources.pod_refresh import PodRefresh
from nodeguard.sources.pod_walk import PodWalk, one_per_pod
from nodeguard.sources.skipped import Skipped

__all__ = ["CgroupLayout", "CgroupReader", "detect_layout", "normalise_limit", "read_limit"]


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
        self._records = CgroupRecords(
            files=CgroupFiles(files=self._files, skipped=self.skipped), paths=paths
        )
        self._kubepods: Kubepods | None = None
        self._pod_kills = _PodKillTally()

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
        built = self._records.built.get(self._kubepods.path)
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
        """Every pod under the kubepods roots, read afresh (see the class)."""
        pods: list[PodMemory] = []
        self._kubepods = None
        records = self._records
        records.set_swap(swap_free)
        try:
            layout, roots = self._discover()
            if not roots:
                raise NoDataError(f"no kubepods cgroup under {layout.root}")
            walk = PodWalk(layout=layout, records=records, kills=self._pod_kills)
            for kube_root in roots:
                limit = records.files.ancestor_limit(
                    layout=layout, path=kube_root, mem_total=mem_total
                )
                found = walk.root(root=kube_root, limit=limit, total=mem_total)
                if self._kubepods is None:  # after its pods: their swap bounds bound its own
                    self._kubepods = read_kubepods(
                        records=records,
                        layout=layout,
                        path=str(kube_root),
                        total=mem_total,
                        pods=tuple(str(layout.root) + p.memory.path for p in found),
                    )
                pods.extend(found)
        finally:
            self._files.sweep()  # what this sample did not read belongs to cgroups now gone
            records.turn()
        pods = one_per_pod(pods, skipped=self.skipped)
        self._pod_kills.keep({p.uid for p in pods})
        return layout.version, tuple(pods)

    def refresh_kubepods(
        self, *, mem_total: int | None, swap_free: int | None = None
    ) -> CgroupMemory | None:
        """Re-read the kubepods cgroup alone (a focused sample); the last one where it cannot
        be read."""
        if self._kubepods is None or self._layout is None:
            return None
        self._records.set_swap(swap_free)
        memory = reread_kubepods(
            records=self._records, layout=self._layout, kubepods=self._kubepods, total=mem_total
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
        self._records.set_swap(swap_free)
        refresh = PodRefresh(layout=self._layout, records=self._records, kills=self._pod_kills)
        return refresh.pods(pods, keys=keys, mem_total=mem_total)
