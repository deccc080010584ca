"""Whose memory stall is it: the node's, or a cgroup's at its own limit.

``/proc/pressure/memory`` sums the stalls of every task, also of a task reclaiming inside its
own cgroup's ``memory.max`` or throttled at ``memory.high`` (Documentation/accounting/psi.rst;
mm/memcontrol.c charges at the limit reclaim with ``try_to_free_mem_cgroup_pages``, which
enters a PSI memstall like global reclaim does, and ``mem_cgroup_handle_over_high()`` reclaims
and sleeps in a memstall). One container thrashing at its own limit on an otherwise idle node
drives the node's ``full`` up as far as its own: the stall is real, but it is that
container's, and nothing done to the node frees anything for it (kubernetes/enhancements#5062,
the review of KEP-4205). This module says how much of the node's stall such cgroups do not
explain.

A cgroup is *at its own limit* when its bound (the smaller of its effective limit, the
smallest real ``memory.max`` up its tree, and its own ``memory.high``) is what its tasks stall
on, which takes two things:

- its usage is at least :data:`AT_LIMIT_SHARE` of the bound: the kernel charges a page only
  once usage plus the page fits under ``memory.max``, reclaiming inside the cgroup until it
  does (mm/memcontrol.c ``try_charge_memcg()``), and throttles a cgroup over ``memory.high``
  until reclaim brings it back under (``reclaim_high()``), so a cgroup stalling there sits
  within a charge batch of it;
- its unreclaimable memory is at least :data:`AT_LIMIT_UNRECLAIMABLE_SHARE` of the bound: with
  the bound full of page cache, reclaim at the bound drops that cache and the charge goes on
  (cgroup-v2.rst "memory.max"; the throttling sleep of ``memory.high`` is only for what reclaim
  could not take back, ``calculate_high_delay()``). A data loader's container sits at its limit
  by usage all day; when the node runs short its tasks stall in *global* reclaim like
  everyone's, and that stall is the node's. Where unreclaimable memory is unknown (the LRU
  lines missing), usage alone decides, as it did before: the side of not acting on the node.
"""

from __future__ import annotations

from nodeguard.snapshot import CgroupMemory, NodeSnapshot

__all__ = [
    "AT_LIMIT_SHARE",
    "AT_LIMIT_UNRECLAIMABLE_SHARE",
    "at_own_limit",
    "stall_outside_limits",
]

#: Usage at or above this share of the bound is "at the bound": within 2 % (a charge batch is
#: 64 pages a CPU; 2 % of a 1 GiB limit is 20 MiB).
AT_LIMIT_SHARE = 0.98

#: Unreclaimable memory at or above this share of the bound leaves reclaim at the bound too
#: little page cache to drop without thrashing: 0.90 is where ``container-near-limit`` of
#: rules/default.yaml stays firing (its clearing line), the runbook's own "near an OOM kill".
AT_LIMIT_UNRECLAIMABLE_SHARE = 0.90


def _bound(mem: CgroupMemory) -> int | None:
    """The smaller of the effective limit and ``memory.high``; ``None`` with neither."""
    bounds = [b for b in (mem.effective_limit_bytes, mem.high_bytes) if b]
    return min(bounds) if bounds else None


def at_own_limit(mem: CgroupMemory) -> bool:
    """Whether the cgroup's tasks stall at its own bound (module docstring): usage at
    :data:`AT_LIMIT_SHARE` of its effective limit or ``memory.high`` (the smaller) and its
    unreclaimable memory at :data:`AT_LIMIT_UNRECLAIMABLE_SHARE` of it (usage alone where that
    is unknown). ``False`` without a bound or with the usage unknown."""
    usage, bound = mem.usage_bytes, _bound(mem)
    if usage is None or bound is None or usage < AT_LIMIT_SHARE * bound:
        return False
    unreclaimable = mem.unreclaimable_bytes
    return unreclaimable is None or unreclaimable >= AT_LIMIT_UNRECLAIMABLE_SHARE * bound


def _full_avg10(mem: CgroupMemory) -> float | None:
    line = mem.pressure.full if mem.pressure is not None else None
    return None if line is None else line.avg10


def stall_outside_limits(snapshot: NodeSnapshot) -> float | None:
    """The share (0..1) of the node's memory PSI ``full`` avg10 that cgroups stalling at their
    own limit do not explain.

    - *explained*: the largest ``full`` avg10 of a pod or container cgroup at its own limit
      (:func:`at_own_limit`; a pod at its limit stands for its containers). The largest, not
      the sum: node ``full`` is the time all non-idle tasks of a CPU stall, averaged over the
      busy CPUs (kernel/sched/psi.c), so cgroups stalling side by side on their own CPUs add
      up to no more than the largest of them.
    - *outside*: the larger of the node's ``full`` minus *explained* (stalls of tasks in no
      such cgroup: system daemons, the kubelet) and the largest ``full`` avg10 of a container
      cgroup that is not at its limit (a task stalled in global reclaim).
    - The share is *outside* / node ``full``, at most 1; 0 when the node does not stall.

    ``None`` where it cannot be told: no node PSI ``full`` line, or a cgroup at its limit
    without PSI of its own. cgroup v1 has no per-cgroup PSI, so on v1 the share is 1 while no
    container or pod is at its limit and ``None`` (unknown: no node action on it) while one is
    (usage and unreclaimable memory at it, as on v2: a v1 container whose limit is full of page
    cache is not); ``memory.failcnt`` says a v1 cgroup hit its limit but not how long its tasks
    stalled.
    """
    full = snapshot.pressure.full if snapshot.pressure is not None else None
    if full is None:
        return None
    explained = outside = 0.0
    for pod in snapshot.pods:
        if at_own_limit(pod.memory):
            stall = _full_avg10(pod.memory)
            if stall is None:
                return None
            explained = max(explained, stall)
            continue
        for c in pod.containers:
            stall = _full_avg10(c.memory)
            if at_own_limit(c.memory):
                if stall is None:
                    return None
                explained = max(explained, stall)
            elif stall is not None:
                outside = max(outside, stall)
    node = full.avg10
    if node <= 0:
        return 0.0
    return min(1.0, max(node - explained, outside) / node)
