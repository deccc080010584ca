"""The signal registry: named values a rule compares with a threshold, per scope.

A signal is a function of the current snapshot and the agent's own recent history for one
target (the node, a pod, a container, a GPU). It returns ``None`` when the data is not there (no
limit, PSI off, no pod metadata, no GPU), and a condition on ``None`` never holds. Adding a
signal is one function and one :func:`register` call under its literal name.

Ratios are 0..1 (a share; the overcommit and request ratios go above 1); bytes are bytes;
seconds are seconds. Each signal declares its :class:`Range`: a threshold outside it can never
trip, so the rule schema refuses it at load time and names the range.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from nodeguard.rules.oom_history import OomHistory
from nodeguard.snapshot import (
    CgroupMemory,
    ContainerMemory,
    GpuDevice,
    NodeSnapshot,
    PodMemory,
    PodMemoryTotals,
    PodMeta,
)
from nodeguard.stall import stall_outside_limits

__all__ = [
    "ABOVE_ZERO",
    "SHARE",
    "SIGNALS",
    "History",
    "Range",
    "Scope",
    "Signal",
    "Target",
    "counter_rate",
    "register",
    "targets",
]

Scope = Literal["node", "pod", "container", "gpu"]

#: How far back growth is fitted for the time-to-limit prediction, and OOM kills counted.
GROWTH_WINDOW = 30.0
GROWTH_FLOOR = 0.01  # share of the limit to grow over the window that always counts
OOM_WINDOW = 600.0
#: How far back the node's direct reclaim rate is taken.
RECLAIM_WINDOW = 30.0
#: How far back the refault rate is taken.
REFAULT_WINDOW = 10.0
#: Points kept per target and series: at short intervals (the least is 50 ms) a point is kept
#: per window/120 at most (0.5 s for the growth window), the newest always; 120 points of a
#: target cost about 12 KB, whatever the interval.
MAX_POINTS = 120


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """One thing a rule is evaluated on. ``key`` is stable across samples: the node name, the
    pod UID, ``<pod uid>/<container id>``, or a GPU's UUID (``gpu<index>`` where unknown)."""

    scope: Scope
    key: str
    pod: PodMemory | None = None
    container: ContainerMemory | None = None
    meta: PodMeta | None = None
    gpu: GpuDevice | None = None

    @property
    def memory(self) -> CgroupMemory | None:
        if self.container is not None:
            return self.container.memory
        return self.pod.memory if self.pod is not None else None


def targets(snapshot: NodeSnapshot, scope: Scope, *, current: bool = False) -> list[Target]:
    """Every target of a scope in the snapshot; with ``current``, of a focused sample only
    those it re-read (the node always; no GPU: NVML is not read again)."""
    if current and snapshot.focused is not None and scope != "node":
        if scope == "gpu":
            return []
        return [t for t in targets(snapshot, scope) if t.key in snapshot.focused]
    metas = snapshot.pod_meta or {}
    if scope == "node":
        return [Target(scope="node", key=snapshot.node_name)]
    if scope == "pod":
        return [Target(scope="pod", key=p.uid, pod=p, meta=metas.get(p.uid)) for p in snapshot.pods]
    if scope == "container":
        return [
            Target(
                scope="container",
                key=f"{p.uid}/{c.container_id}",
                pod=p,
                container=c,
                meta=metas.get(p.uid),
            )
            for p, c in snapshot.containers()
        ]
    if scope == "gpu":
        devices = snapshot.gpu.devices if snapshot.gpu else ()
        return [Target(scope="gpu", key=d.key, gpu=d) for d in devices]
    return []


class History:
    """The agent's own recent samples per target: working set and unreclaimable memory (for
    growth; targets not seen in a sample are forgotten, each keeps at most :data:`MAX_POINTS`
    + 1 points a series), the refault counter (for its rate), the node's direct-reclaim scan
    counter (for its rate; at most :data:`MAX_POINTS` + 1 points) and, in ``ooms``, the OOM
    kills of the window by pod and container name from the cgroup counters and the kernel log
    (:mod:`nodeguard.rules.oom_history`)."""

    def __init__(self) -> None:
        self._ws: dict[str, deque[tuple[float, int]]] = {}
        self._un: dict[str, deque[tuple[float, int]]] = {}
        self._refault: dict[str, deque[tuple[float, int]]] = {}
        self._reclaim: dict[str, deque[tuple[float, int]]] = {}
        self.ooms = OomHistory(window=OOM_WINDOW, thin=OOM_WINDOW / MAX_POINTS)

    def observe(self, snapshot: NodeSnapshot) -> None:
        """Record one snapshot. Of a focused sample, only the targets it re-read: the others'
        values are the last sample's, and a point at the new time would fake a flat stretch
        (and forgetting them would lose their growth)."""
        now = snapshot.timestamp
        vm = snapshot.vmstat
        if vm is not None and vm.pgscan_direct is not None:
            # In bytes, so that a rate needs no page size.
            scanned = vm.pgscan_direct * vm.page_size_bytes
            _push(self._reclaim, snapshot.node_name, now, scanned, RECLAIM_WINDOW * 2)
        else:
            self._reclaim.pop(snapshot.node_name, None)
        self.ooms.observe(snapshot, current=snapshot.is_current)
        seen: set[str] = set()
        for scope in ("pod", "container"):
            for t in targets(snapshot, scope):
                mem = t.memory
                if mem is None or not snapshot.is_current(t.key):
                    continue
                seen.add(t.key)
                if mem.working_set_bytes is not None:
                    _push(self._ws, t.key, now, mem.working_set_bytes, GROWTH_WINDOW * 2)
                if mem.unreclaimable_bytes is not None:
                    _push(self._un, t.key, now, mem.unreclaimable_bytes, GROWTH_WINDOW * 2)
                if mem.refault_file_bytes is not None:
                    _push(self._refault, t.key, now, mem.refault_file_bytes, REFAULT_WINDOW)
        if snapshot.focused is not None:
            return
        for store in (self._ws, self._un, self._refault):
            for key in [k for k in store if k not in seen]:
                del store[key]

    def working_set(self, key: str) -> list[tuple[float, int]]:
        return list(self._ws.get(key, ()))

    def direct_reclaim(self, node: str) -> list[tuple[float, int]]:
        """``(time, bytes scanned by direct reclaim since boot)`` of the node's samples."""
        return list(self._reclaim.get(node, ()))

    def unreclaimable(self, key: str) -> list[tuple[float, int]]:
        return list(self._un.get(key, ()))

    def refaults(self, key: str) -> list[tuple[float, int]]:
        return list(self._refault.get(key, ()))


def _push(
    store: dict[str, deque[tuple[float, int]]], key: str, now: float, value: int, keep: float
) -> None:
    series = store.setdefault(key, deque())
    if len(series) >= 2 and now - series[-2][0] < keep / MAX_POINTS:
        series[-1] = (now, value)  # too close to the point before: the newest takes its place
    else:
        series.append((now, value))
    while series and series[0][0] < now - keep:
        series.popleft()


@dataclass(frozen=True, slots=True, kw_only=True)
class Range:
    """The values a signal can take, ``low`` to ``high`` inclusive (``inf``: no bound)."""

    low: float
    high: float = math.inf

    def __contains__(self, value: float) -> bool:
        return self.low <= value <= self.high

    def __str__(self) -> str:
        return (
            f"{self.low:g} or more" if math.isinf(self.high) else f"{self.low:g} to {self.high:g}"
        )


#: A share of a whole: 0 to 1 (0.05 is 5 %).
SHARE = Range(low=0.0, high=1.0)
#: Bytes, seconds, counts, and ratios that exceed 1 (overcommit): 0 or more.
ABOVE_ZERO = Range(low=0.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class Signal:
    """A registered signal: its scope, unit (``ratio``, ``bytes``, ``seconds``, ``count``),
    the range of its values, help text and function."""

    name: str
    scope: Scope
    unit: str
    valid: Range
    help: str
    fn: Callable[[NodeSnapshot, History, Target], float | None]


SIGNALS: dict[str, Signal] = {}

SignalFn = Callable[[NodeSnapshot, History, Target], float | None]


def register(name: str, *, scope: Scope, unit: str, valid: Range, help: str, fn: SignalFn) -> None:
    """Register ``fn`` as the signal ``name`` (each name is written out where it is registered,
    so that ``grep`` finds it). Raises ``ValueError`` for a name registered twice."""
    if name in SIGNALS:
        raise ValueError(f"signal {name} registered twice")
    SIGNALS[name] = Signal(name=name, scope=scope, unit=unit, valid=valid, help=help, fn=fn)


def _ratio(part: float | None, whole: float | None) -> float | None:
    if part is None or not whole:
        return None
    return part / whole


# -- node ----------------------------------------------------------------------------------------
def _mem_ratio(attr: str) -> SignalFn:
    # A share of the node's usable memory (MemTotal - hugetlb pool - HardwareCorrupted,
    # MemInfo.usable_bytes), never of MemTotal: on a node whose RAM is mostly huge pages
    # MemAvailable / MemTotal reads a few percent while the node idles.
    def fn(snap: NodeSnapshot, _h: History, _t: Target) -> float | None:
        m = snap.meminfo
        return None if m is None else _ratio(getattr(m, attr), m.usable_bytes)

    return fn


def _available(snap: NodeSnapshot, _h: History, _t: Target) -> float | None:
    return None if snap.meminfo is None else snap.meminfo.available_bytes


def _psi(kind: str, window: str) -> SignalFn:
    def fn(snap: NodeSnapshot, _h: History, _t: Target) -> float | None:
        line = getattr(snap.pressure, kind, None) if snap.pressure else None
        return None if line is None else float(getattr(line, window))

    return fn


def _overcommit(total: Callable[[PodMemoryTotals], int]) -> SignalFn:
    def fn(snap: NodeSnapshot, _h: History, _t: Target) -> float | None:
        totals = snap.pod_memory_totals()
        if totals is None or snap.node_meta is None:
            return None
        return _ratio(total(totals), snap.node_meta.allocatable_memory_bytes)

    return fn


register(
    "node_memory_available_ratio",
    scope="node",
    unit="ratio",
    valid=SHARE,
    help="MemAvailable / usable memory (MemTotal - hugetlb pool - HardwareCorrupted)",
    fn=_mem_ratio("available_bytes"),
)
register(
    "node_page_cache_ratio",
    scope="node",
    unit="ratio",
    valid=SHARE,
    help="page cache (file LRU) / usable memory",
    fn=_mem_ratio("page_cache_bytes"),
)
register(
    "node_slab_reclaimable_ratio",
    scope="node",
    unit="ratio",
    valid=SHARE,
    help="SReclaimable / usable memory",
    fn=_mem_ratio("slab_reclaimable_bytes"),
)
register(
    "node_slab_unreclaimable_ratio",
    scope="node",
    unit="ratio",
    valid=SHARE,
    help="SUnreclaim / usable memory",
    fn=_mem_ratio("slab_unreclaimable_bytes"),
)
register(
    "node_memory_available_bytes",
    scope="node",
    unit="bytes",
    valid=ABOVE_ZERO,
    help="MemAvailable",
    fn=_available,
)
register(
    "node_psi_some_avg10",
    scope="node",
    unit="ratio",
    valid=SHARE,
    help="memory PSI some avg10, share of time stalled",
    fn=_psi("some", "avg10"),
)
register(
    "node_psi_some_avg60",
    scope="node",
    unit="ratio",
    valid=SHARE,
    help="memory PSI some avg60, share of time stalled",
    fn=_psi("some", "avg60"),
)
register(
    "node_psi_full_avg10",
    scope="node",
    unit="ratio",
    valid=SHARE,
    help="memory PSI full avg10, share of time stalled",
    fn=_psi("full", "avg10"),
)
register(
    "node_psi_full_avg60",
    scope="node",
    unit="ratio",
    valid=SHARE,
    help="memory PSI full avg60, share of time stalled",
    fn=_psi("full", "avg60"),
)


def _allocatable(snap: NodeSnapshot, _h: History, _t: Target) -> float | None:
    k = snap.kubepods
    return None if k is None else k.limit_ratio


register(
    "node_allocatable_working_set_ratio",
    scope="node",
    unit="ratio",
    valid=SHARE,
    help="working set of all pods (the kubepods cgroup) / its limit, node allocatable as the "
    "kubelet enforces it",
    fn=_allocatable,
)


def _allocatable_unreclaimable(snap: NodeSnapshot, _h: History, _t: Target) -> float | None:
    k = snap.kubepods
    return None if k is None else k.unreclaimable_ratio


register(
    "node_allocatable_unreclaimable_ratio",
    scope="node",
    unit="ratio",
    valid=SHARE,
    help="unreclaimable memory of all pods (the kubepods cgroup: anon, shmem/tmpfs, "
    "unevictable, kernel memory but reclaimable slab; page cache left out) / its limit, node "
    "allocatable as the kubelet enforces it",
    fn=_allocatable_unreclaimable,
)
register(
    "node_memory_requests_allocatable_ratio",
    scope="node",
    unit="ratio",
    valid=ABOVE_ZERO,
    help="sum of pod memory requests / node allocatable",
    fn=_overcommit(lambda t: t.requests_bytes),
)
register(
    "node_memory_limits_allocatable_ratio",
    scope="node",
    unit="ratio",
    valid=ABOVE_ZERO,
    help="sum of pod memory limits / node allocatable (overcommit above 1)",
    fn=_overcommit(lambda t: t.limits_bytes),
)


def counter_rate(samples: Iterable[tuple[float, int]], *, window: float) -> float | None:
    """Per-second increase of a counter over the last ``window`` seconds of ``samples``
    (``(time, value)``, oldest first): the increases summed (a value below the one before is a
    reset and counts from 0) over the time they span. ``None`` with fewer than two points in
    the window or no time between them."""
    points = list(samples)
    if not points:
        return None
    recent = [(t, v) for t, v in points if t >= points[-1][0] - window]
    if len(recent) < 2 or recent[-1][0] <= recent[0][0]:
        return None
    total, prev = 0, recent[0][1]
    for _, v in recent[1:]:
        total += v - prev if v >= prev else v
        prev = v
    return total / (recent[-1][0] - recent[0][0])


def _direct_reclaim(snap: NodeSnapshot, h: History, _t: Target) -> float | None:
    return counter_rate(h.direct_reclaim(snap.node_name), window=RECLAIM_WINDOW)


def _outside_limits(snap: NodeSnapshot, _h: History, _t: Target) -> float | None:
    return stall_outside_limits(snap)


register(
    "node_direct_reclaim_bytes_per_second",
    scope="node",
    unit="bytes",
    valid=ABOVE_ZERO,
    help="memory scanned per second by direct (global) reclaim over the last 30 s: "
    "/proc/vmstat pgscan_direct x page size; reclaim at a cgroup's own limit is not counted",
    fn=_direct_reclaim,
)
register(
    "node_memory_stall_outside_limits_ratio",
    scope="node",
    unit="ratio",
    valid=SHARE,
    help="share of node PSI full avg10 not explained by cgroups stalling at their own limit",
    fn=_outside_limits,
)


# -- pod and container ---------------------------------------------------------------------------
def seconds_to_limit(samples: Iterable[tuple[float, int]], limit: int | None) -> float | None:
    """Seconds until the working set reaches ``limit`` at the growth of the last
    :data:`GROWTH_WINDOW` seconds (least-squares slope over at least 3 samples spanning 1 s or
    more); ``inf`` when the growth does not stand out of the working set's noise (see
    :func:`_growing`), 0 when growing at or past the limit,
    ``None`` without a limit or with too few samples."""
    points = list(samples)
    if limit is None or len(points) < 3:
        return None
    t_end, ws_end = points[-1]
    recent = [(t, v) for t, v in points if t >= t_end - GROWTH_WINDOW]
    if len(recent) < 3 or recent[-1][0] - recent[0][0] < 1.0:
        return None
    n = len(recent)
    mt = sum(t for t, _ in recent) / n
    mv = sum(v for _, v in recent) / n
    var = sum((t - mt) ** 2 for t, _ in recent)
    slope = sum((t - mt) * (v - mv) for t, v in recent) / var
    if not _growing(recent, slope=slope, mt=mt, mv=mv, var=var, limit=limit):
        return math.inf
    if ws_end >= limit:
        return 0.0
    return (limit - ws_end) / slope


# Student's t, two-sided 95 % (one-sided 97.5 %), by degrees of freedom: a random walk of
# noise is taken for growth in 2.5 % of windows at most (standard tables; 2.0 past 10).
_T_CRITICAL = {2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
#: Least growth over the window, as a share of the limit, that the noise test may count.
SLOW_GROWTH_FLOOR = 0.005


def _growing(
    recent: list[tuple[float, int]], *, slope: float, mt: float, mv: float, var: float, limit: int
) -> bool:
    """Whether the fitted growth is real: a flat working set that jitters (a runtime's
    allocator, page cache coming and going) is not a container heading for its limit, nor is
    one pinned at its limit by active page cache, nor one that stepped up once and stayed.

    Growth over the window of :data:`GROWTH_FLOOR` (1 %) of the limit or more counts. Slower
    growth counts when it stands out of the working set's own noise, with four samples or more
    (least squares, n - 2 degrees of freedom): the slope at least the two-sided 95 % Student's t
    quantile times its standard error, and at least :data:`SLOW_GROWTH_FLOOR` (0.5 %) of the
    limit over the window: a least-squares line through one step up and a plateau rises by
    about 1.5 times the step, so a step under 0.33 % of the limit is not taken for a trend.
    Growth down to about limit / 6,000 per second is caught this way; slower growth leaves more
    than the Alertmanager path's ~3 minutes to act (docs/benchmarks.md, "The rule gap")."""
    if slope <= 0:
        return False
    growth = slope * (recent[-1][0] - recent[0][0])
    if growth >= GROWTH_FLOOR * limit:
        return True
    n = len(recent)
    if n < 4 or growth < SLOW_GROWTH_FLOOR * limit:
        return False
    residuals = sum((v - mv - slope * (t - mt)) ** 2 for t, v in recent)
    critical = _T_CRITICAL.get(n - 2, 2.0)
    return slope >= critical * math.sqrt(residuals / (n - 2) / var)


def _request(t: Target) -> int | None:
    if t.meta is None:
        return None
    if t.container is None:
        return t.meta.memory_request_bytes or None
    name = t.meta.containers.get(t.container.container_id)
    return t.meta.container_requests.get(name) if name else None


def _working_set(_s: NodeSnapshot, _h: History, t: Target) -> float | None:
    return None if t.memory is None else t.memory.working_set_bytes


def _ws_limit(_s: NodeSnapshot, _h: History, t: Target) -> float | None:
    m = t.memory
    return None if m is None else m.limit_ratio


def _ws_request(_s: NodeSnapshot, _h: History, t: Target) -> float | None:
    m = t.memory
    return None if m is None else _ratio(m.working_set_bytes, _request(t))


def _eta(_s: NodeSnapshot, h: History, t: Target) -> float | None:
    m = t.memory
    return None if m is None else seconds_to_limit(h.working_set(t.key), m.effective_limit_bytes)


def _ooms(_s: NodeSnapshot, h: History, t: Target) -> float | None:
    if t.pod is None:
        return None
    if t.container is None:
        return h.ooms.pod_kills(pod_uid=t.pod.uid)
    return h.ooms.container_kills(pod_uid=t.pod.uid, container_id=t.container.container_id)


def _unreclaimable(_s: NodeSnapshot, _h: History, t: Target) -> float | None:
    return None if t.memory is None else t.memory.unreclaimable_bytes


def _un_limit(_s: NodeSnapshot, _h: History, t: Target) -> float | None:
    m = t.memory
    return None if m is None else m.unreclaimable_ratio


def _un_request(_s: NodeSnapshot, _h: History, t: Target) -> float | None:
    m = t.memory
    return None if m is None else _ratio(m.unreclaimable_bytes, _request(t))


def _un_eta(_s: NodeSnapshot, h: History, t: Target) -> float | None:
    m = t.memory
    return None if m is None else seconds_to_limit(h.unreclaimable(t.key), m.effective_limit_bytes)


def _refault_rate(_s: NodeSnapshot, h: History, t: Target) -> float | None:
    return counter_rate(h.refaults(t.key), window=REFAULT_WINDOW)


def _register_pod_and_container(
    *, pod: str, container: str, unit: str, valid: Range, help: str, fn: SignalFn
) -> None:
    """Register one function as a pod signal (its pod-level cgroup) and as a container signal
    (each of its containers): ``help`` names the scope where ``{scope}`` stands. Raises
    ``ValueError`` as :func:`register` does."""
    register(pod, scope="pod", unit=unit, valid=valid, help=help.format(scope="pod"), fn=fn)
    register(
        container,
        scope="container",
        unit=unit,
        valid=valid,
        help=help.format(scope="container"),
        fn=fn,
    )


_register_pod_and_container(
    pod="pod_working_set_bytes",
    container="container_working_set_bytes",
    unit="bytes",
    valid=ABOVE_ZERO,
    help="{scope} working set (usage - inactive_file)",
    fn=_working_set,
)
_register_pod_and_container(
    pod="pod_working_set_limit_ratio",
    container="container_working_set_limit_ratio",
    unit="ratio",
    valid=SHARE,
    help="{scope} working set / effective memory limit",
    fn=_ws_limit,
)
_register_pod_and_container(
    pod="pod_working_set_request_ratio",
    container="container_working_set_request_ratio",
    unit="ratio",
    valid=ABOVE_ZERO,
    help="{scope} working set / memory request (from the pod spec)",
    fn=_ws_request,
)
_register_pod_and_container(
    pod="pod_seconds_to_limit",
    container="container_seconds_to_limit",
    unit="seconds",
    valid=ABOVE_ZERO,
    help="{scope}: seconds until the working set reaches the limit at its recent growth",
    fn=_eta,
)
_register_pod_and_container(
    pod="pod_unreclaimable_bytes",
    container="container_unreclaimable_bytes",
    unit="bytes",
    valid=ABOVE_ZERO,
    help="{scope} memory the kernel cannot reclaim without killing: anon, shmem/tmpfs, "
    "unevictable, kernel memory but reclaimable slab (v2), less what fits in swap; page cache "
    "left out",
    fn=_unreclaimable,
)
_register_pod_and_container(
    pod="pod_unreclaimable_limit_ratio",
    container="container_unreclaimable_limit_ratio",
    unit="ratio",
    valid=SHARE,
    help="{scope} unreclaimable memory / effective memory limit (the kernel OOM-kills at 1)",
    fn=_un_limit,
)
_register_pod_and_container(
    pod="pod_unreclaimable_request_ratio",
    container="container_unreclaimable_request_ratio",
    unit="ratio",
    valid=ABOVE_ZERO,
    help="{scope} unreclaimable memory / memory request (from the pod spec): how far above "
    "its request a {scope} is by what does not free itself (page cache left out)",
    fn=_un_request,
)
_register_pod_and_container(
    pod="pod_unreclaimable_seconds_to_limit",
    container="container_unreclaimable_seconds_to_limit",
    unit="seconds",
    valid=ABOVE_ZERO,
    help="{scope}: seconds until unreclaimable memory reaches the limit at its recent growth",
    fn=_un_eta,
)
_register_pod_and_container(
    pod="pod_refault_bytes_per_second",
    container="container_refault_bytes_per_second",
    unit="bytes",
    valid=ABOVE_ZERO,
    help="{scope} page cache read back after reclaim dropped it (workingset_refault_file), "
    "bytes per second over the last 10 s: reclaim taking what the workload still reads",
    fn=_refault_rate,
)
# One function, but the two count differently (a pod's kills include its containers'
# restarts; a container's sum its IDs by name), so each says so in its own words.
register(
    "pod_oom_kills_10m",
    scope="pod",
    unit="count",
    valid=ABOVE_ZERO,
    help="pod OOM kills in the last 10 minutes, each victim once (cgroup counter and kernel "
    "log), its containers' restarts included",
    fn=_ooms,
)
register(
    "container_oom_kills_10m",
    scope="container",
    unit="count",
    valid=ABOVE_ZERO,
    help="container OOM kills in the last 10 minutes, each victim once (cgroup counter and "
    "kernel log), all its restarts (pod UID and container name) together",
    fn=_ooms,
)


def _cgroup_psi(kind: str) -> SignalFn:
    def fn(_s: NodeSnapshot, _h: History, t: Target) -> float | None:
        m = t.memory
        line = getattr(m.pressure, kind) if m is not None and m.pressure is not None else None
        return None if line is None else float(line.avg10)

    return fn


def _usage_limit(_s: NodeSnapshot, _h: History, t: Target) -> float | None:
    m = t.memory
    if m is None or m.usage_bytes is None or not m.effective_limit_bytes:
        return None
    return min(1.0, m.usage_bytes / m.effective_limit_bytes)


_register_pod_and_container(
    pod="pod_psi_full_avg10",
    container="container_psi_full_avg10",
    unit="ratio",
    valid=SHARE,
    help="{scope} cgroup memory PSI full avg10 (v2 memory.pressure; no data on v1)",
    fn=_cgroup_psi("full"),
)
_register_pod_and_container(
    pod="pod_psi_some_avg10",
    container="container_psi_some_avg10",
    unit="ratio",
    valid=SHARE,
    help="{scope} cgroup memory PSI some avg10 (v2 memory.pressure; no data on v1)",
    fn=_cgroup_psi("some"),
)
_register_pod_and_container(
    pod="pod_usage_limit_ratio",
    container="container_usage_limit_ratio",
    unit="ratio",
    valid=SHARE,
    help="{scope} usage (page cache included) / effective memory limit: 0.98 and more is at "
    "the limit, where the kernel reclaims inside the cgroup",
    fn=_usage_limit,
)


# -- GPU -----------------------------------------------------------------------------------------
def _gpu_used_ratio(_s: NodeSnapshot, _h: History, t: Target) -> float | None:
    # total - free: the same on drivers with memory info v1 (used includes reserved) and v2.
    m = t.gpu.memory if t.gpu else None
    return None if m is None else _ratio(m.total_bytes - m.free_bytes, m.total_bytes)


def _gpu_free(_s: NodeSnapshot, _h: History, t: Target) -> float | None:
    m = t.gpu.memory if t.gpu else None
    return None if m is None else m.free_bytes


def _pod_gpu(snap: NodeSnapshot, _h: History, t: Target) -> float | None:
    if snap.gpu is None or t.pod is None:
        return None
    if not all(d.processes_complete for d in snap.gpu.devices):
        # A GPU without a process list (lost, old driver) or with a list it could not read
        # (graphics; MPS clients of a server that runs there): any sum is a guess.
        return None
    mine = [u.used_bytes for u in snap.gpu_containers() if u.pod_uid == t.pod.uid]
    if None in mine:
        return None  # a process whose memory NVML does not give
    return float(sum(u for u in mine if u is not None))


register(
    "gpu_memory_used_ratio",
    scope="gpu",
    unit="ratio",
    valid=SHARE,
    help="GPU memory in use (used + reserved, i.e. total - free) / total",
    fn=_gpu_used_ratio,
)
register(
    "gpu_memory_free_bytes",
    scope="gpu",
    unit="bytes",
    valid=ABOVE_ZERO,
    help="GPU memory free",
    fn=_gpu_free,
)
register(
    "pod_gpu_memory_used_bytes",
    scope="pod",
    unit="bytes",
    valid=ABOVE_ZERO,
    help="GPU memory used by the pod's processes (NVML's compute, graphics and MPS lists), "
    "all GPUs together",
    fn=_pod_gpu,
)
