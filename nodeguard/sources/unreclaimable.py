"""What the kernel cannot reclaim from a memory cgroup without killing: the share of a limit that
is an OOM kill on its way, where the working set (usage - inactive_file, cAdvisor's and the
kubelet's) also counts active page cache.

The kernel OOM-kills in a cgroup only once reclaim has failed to bring usage under
``memory.max`` (Documentation/admin-guide/cgroup-v2.rst, "memory.max": "If a cgroup's memory
usage reaches this limit and can't be reduced, the OOM killer is invoked"; mm/memcontrol.c
try_charge_memcg() retries mem_cgroup_reclaim before mem_cgroup_oom()). Reclaim drops clean page
cache and writes back dirty cache on both file LRU lists, active and inactive (mm/vmscan.c
shrink_lruvec()), so a data loader that re-reads its dataset, a server that mmaps its weights or
files written to an emptyDir on disk fill the limit with cache and are never killed for it
(kubernetes#43916, cadvisor#2604). What reclaim cannot drop:

- anonymous memory, and shmem/tmpfs (a memory-backed emptyDir, ``/dev/shm``), which sits on the
  *anon* LRU lists (mm/shmem.c: swap-backed pages; cadvisor PR#1380), unless there is swap room
  to write it to;
- unevictable pages (mlocked, ramfs);
- kernel memory charged to the cgroup other than reclaimable slab (stacks, page tables,
  sockets, unreclaimable slab, percpu, vmalloc).

The node-wide SwapFree is a settings input, the v2 swap files are read by
:mod:`nodeguard.sources.cgroups`; this module is the arithmetic, on plain numbers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = [
    "anon_lru",
    "children_swap_bound",
    "refault_file_pages",
    "swap_room",
    "unreclaimable_v1",
    "unreclaimable_v2",
]


def _get(stat: Mapping[str, int], *keys: str) -> int | None:
    """The first of ``keys`` that ``stat`` has."""
    for key in keys:
        value = stat.get(key)
        if value is not None:
            return value
    return None


def swap_room(*, rooms: tuple[int | None, ...], swappiness: int | None) -> int:
    """Bytes of anonymous memory reclaim can still write to swap, from the cgroup's point of view.

    ``rooms``: what each bound leaves, ``None`` for no bound: the node's SwapFree
    (``/proc/meminfo``; ``None`` there means unknown and is taken as no swap), the cgroup's and
    its pod's ``memory.swap.max - memory.swap.current`` (cgroup-v2.rst, "memory.swap.max": swap
    beyond it is never used; the kubelet writes it per container, 0 under ``NoSwap`` and
    ``LimitedSwap``'s share for Burstable pods, KEP-2400), and for a pod or the kubepods cgroup
    what its children let swap (:func:`children_swap_bound`). ``swappiness``: ``vm.swappiness``
    (cgroup v2 has no per-cgroup swappiness: include/linux/swap.h mem_cgroup_swappiness()); at 0
    a cgroup's limit reclaim scans only the file lists (mm/vmscan.c get_scan_count(): "if
    (cgroup_reclaim(sc) && !swappiness) scan_balance = SCAN_FILE"), so nothing is swappable.
    Returns 0 or more."""
    if swappiness == 0 or not rooms or rooms[0] is None:
        return 0
    bounded = [r for r in rooms if r is not None]
    return max(0, min(bounded))


def anon_lru(stat: Mapping[str, int]) -> int:
    """Bytes on a v2 cgroup's anon LRU lists, ``active_anon + inactive_anon`` (anon and shmem:
    what reclaim can only write to swap); a missing line counts as 0."""
    return (stat.get("active_anon") or 0) + (stat.get("inactive_anon") or 0)


def children_swap_bound(*, anon: int, children: Iterable[tuple[int, int]]) -> int:
    """Bytes of a parent cgroup's anon (``anon``: its :func:`anon_lru`) that its children's own
    swap bounds let go to swap: the sum of what each child can swap, plus the anon charged to
    the parent beyond its children's (``children``: ``(anon_lru, swappable)`` of each child
    read), which only the parent's own bounds hold.

    A page charged to a child is swapped only within the child's ``memory.swap.max`` as well as
    every ancestor's (cgroup-v2.rst, "memory.swap.max": once the cgroup's swap usage reaches it,
    "anonymous memory of the cgroup will not be swapped out"; the swap charge is checked up the
    whole tree, mm/memcontrol.c ``__mem_cgroup_try_charge_swap()``). The kubelet writes
    ``memory.swap.max`` per *container* only (0 under ``NoSwap``, the default ``swapBehavior``,
    and for Guaranteed and BestEffort pods and containers without a memory request under
    ``LimitedSwap``: KEP-2400, kubernetes.io "Swap memory management"); the pod and kubepods
    cgroups keep the kernel's ``max``. So a pod's (and kubepods') swappable anon is bounded by
    its containers' rooms, not by SwapFree alone. The excess (anon charged to the parent beyond
    its children's: tasks of its own, or a child not read, such as a container cgroup removed
    whose pages still count in the parent's ``memory.stat``) is held by the parent's own bounds
    only: the side of not acting, as before children were counted. Returns 0 or more."""
    own = swappable = 0
    for child_anon, child_swappable in children:
        own += child_anon
        swappable += child_swappable
    return swappable + max(0, anon - own)


def unreclaimable_v2(*, usage: int | None, stat: Mapping[str, int], swap: int) -> int | None:
    """A cgroup v2 cgroup's unreclaimable bytes: ``memory.current`` minus the file LRU
    (``active_file + inactive_file``: page cache, not shmem), minus ``slab_reclaimable``
    (dentries and inodes the shrinkers free), minus the anonymous memory that fits into
    ``swap`` bytes of swap room (the anon LRU, ``active_anon + inactive_anon``, shmem
    included); clamped at 0. Everything else in ``memory.current`` counts: anon, shmem, the
    unevictable list, and kernel memory (``kernel_stack``, ``pagetables``, ``sock``, the
    unreclaimable slab, ``percpu``, ``vmalloc``; cgroup-v2.rst, "memory.stat").

    ``None`` when ``usage`` or the file LRU lines are missing. A missing ``slab_reclaimable``
    (or the anon LRU, where swap is) counts as 0: what the kernel does not split is taken as
    unreclaimable, the side of acting."""
    active, inactive = stat.get("active_file"), stat.get("inactive_file")
    if usage is None or active is None or inactive is None:
        return None
    swappable = min(anon_lru(stat), swap)
    return max(0, usage - active - inactive - (stat.get("slab_reclaimable") or 0) - swappable)


def unreclaimable_v1(*, stat: Mapping[str, int]) -> int | None:
    """A cgroup v1 cgroup's unreclaimable bytes: its anon LRU and unevictable list,
    ``total_active_anon + total_inactive_anon + total_unevictable`` (hierarchical;
    Documentation/admin-guide/cgroup-v1/memory.rst, "memory.stat file"): anon and shmem/tmpfs
    (swap-backed, on the anon lists), mlocked and ramfs pages. No swap room is subtracted: the
    kubelet supports swap on cgroup v2 only (KEP-2400, NodeSwap).

    Kernel memory is not counted on v1: v1's ``memory.stat`` does not split reclaimable slab
    from the rest (``memory.kmem.usage_in_bytes`` counts both), so counting it would make a
    container full of dentries (a ``find`` over a big tree) a false positive; a container
    whose growth is kernel memory (sockets, page tables) is therefore seen late on v1.
    ``None`` when any of the three lines is missing (neither the ``total_`` nor the
    cgroup's own)."""
    parts = [
        _get(stat, "total_active_anon", "active_anon"),
        _get(stat, "total_inactive_anon", "inactive_anon"),
        _get(stat, "total_unevictable", "unevictable"),
    ]
    if any(p is None for p in parts):
        return None
    return sum(p for p in parts if p is not None)


def refault_file_pages(*, stat: Mapping[str, int], version: int) -> int | None:
    """Refaults of page cache the cgroup's reclaim had dropped (mm/workingset.c
    workingset_refault()), a page count: v2 ``workingset_refault_file`` (5.9+; before it
    ``workingset_refault``, which counted file pages only, the anon lists had no workingset
    detection), v1 ``total_workingset_refault_file`` where the kernel prints it (6.18 here;
    older v1 kernels print none). ``None`` when absent."""
    if version == 2:
        return _get(stat, "workingset_refault_file", "workingset_refault")
    return _get(stat, "total_workingset_refault_file", "workingset_refault_file")
