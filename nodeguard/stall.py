"""Whose memory stall is it: the node's, or a cgroup's at its own limit.

``/proc/pressure/memory`` sums the stalls of every task, also of a task reclaiming inside its
own cgroup's ``memory.max`` or throttled at ``memory.high`` (Documentation/accounting/psi.rst;
mm/memcontrol.c charges at the limit reclaim with ``try_to_free_mem_cgroup_pages``, which
enters a PSI memstall like global reclaim does). One container thrashing at its own limit on
an otherwise idle node drives the node's ``full`` up as far as its own: the stall is real, but
it is that container's, and nothing done to the node frees anything for it
(kubernetes/enhancements#5062, the review of KEP-4205). This module says how much of the
node's stall such cgroups do not explain.

A cgroup is *at its own limit* when its usage is at least :data:`AT_LIMIT_SHARE` of its
effective limit (the smallest real limit up its tree): the kernel charges a page only once
usage plus the page fits, and reclaims inside the cgroup until it does, so a cgroup stalling
there sits within a charge batch of the limit (mm/memcontrol.c ``try_charge``).
"""

from __future__ import annotations

from nodeguard.snapshot import CgroupMemory, NodeSnapshot

__all__ = ["AT_LIMIT_SHARE", "at_own_limit", "stall_outside_limits"]

#: Usage at or above this share of the effective limit is "at the limit": within 2 % (a
#: charge batch is 64 pages a CPU; 2 % of a 1 GiB limit is 20 MiB).
AT_LIMIT_SHARE = 0.98


def at_own_limit(mem: CgroupMemory) -> bool:
    """Whether the cgroup's usage is at its effective limit (module docstring); ``False``
    without a limit or with the usage unknown."""
    usage, limit = mem.usage_bytes, mem.effective_limit_bytes
    if usage is None or not limit:
        return False
    return usage >= AT_LIMIT_SHARE * limit


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
    container or pod is at its limit and ``None`` (unknown: no node action on it) while one is;
    ``memory.failcnt`` says a v1 cgroup hit its limit but not how long its tasks stalled.
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
