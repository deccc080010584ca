"""The snapshot as metric families: every collector's (:mod:`nodeguard.collectors`, each
rendering its own part) and the snapshot's own: build info, the sample time, how each collector
fared, and the pods' requests and limits against the node's allocatable (from the pod list).

Every family is built from the snapshot the sampler last made, so a scrape never reads the host
and never disagrees with what the rule engine saw; HELP texts say "(from the latest snapshot)".
Names follow Prometheus conventions: ``nodeguard_`` prefix, base units (bytes, seconds, ratios
0..1), ``_total`` for counters. Absent data is absent, never exported as 0. Families are in
name order, as node_exporter's registry gathers them, whichever collector wrote them.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterator

from nodeguard import __version__
from nodeguard.collectors.base import ordered
from nodeguard.collectors.families import Families, Family
from nodeguard.collectors.labels import NO_WORKLOAD, node_gauge
from nodeguard.snapshot import NodeSnapshot

__all__ = ["PREFIX", "snapshot_families"]

PREFIX = "nodeguard_"
_NOTE = " (from the latest snapshot)"


def snapshot_families(
    snapshot: NodeSnapshot | None, *, keep: Callable[[str], bool] | None = None
) -> list[Family]:
    """The families of ``snapshot`` in name order (build info alone before the first
    snapshot); ``keep(exposed name)`` says which the metric filter keeps."""
    info = Families(keep=keep, prefix=PREFIX).gauge(
        "build_info", "nodeguard version and Python", ["version", "python_version"]
    )
    info.add((__version__, platform.python_version()), 1)
    families = [info]
    if snapshot is not None:
        out = Families(keep=keep, prefix=PREFIX, note=_NOTE)
        families.extend(_own(snapshot, out))
        families.extend(_overcommit(snapshot, out))
        for collector in ordered():
            families.extend(collector.render(snapshot, out))
    return sorted((f for f in families if type(f) is Family), key=lambda f: f.name)


def _own(snapshot: NodeSnapshot, out: Families) -> Iterator[Family]:
    """When the snapshot was taken and how each collector fared."""
    ts = out.gauge("snapshot_timestamp_seconds", "Unix time the snapshot was taken")
    ts.add((), snapshot.timestamp)
    yield ts
    labels = ["collector"]
    success = out.gauge("collector_success", "1 if the collector ran without error", labels)
    available = out.gauge(
        "collector_available",
        "1 if the collector found its data on this host (0: absent, e.g. PSI off)",
        labels,
    )
    duration = out.gauge("collector_duration_seconds", "time the collector took", labels)
    errors = out.counter(
        "collector_errors",
        "entries a collector left out since the agent started, by reason (unreadable, "
        "not_text, too_large, malformed, duplicate): a bad file costs that entry only; absent "
        "until one",
        [*labels, "reason"],
    )
    for st in snapshot.collectors:
        success.add((st.name,), 1 if st.success else 0)
        available.add((st.name,), 1 if st.available else 0)
        duration.add((st.name,), st.duration_seconds)
        for reason, n in sorted(st.skipped.items()):
            errors.add((st.name, reason), n)
    yield from (success, available, duration)
    if errors.values:
        yield errors


def _overcommit(snapshot: NodeSnapshot, out: Families) -> Iterator[Family]:
    """Requests and limits of this node's pods summed, against allocatable (the pod list)."""
    node = snapshot.node_meta
    if node is not None and node.allocatable_memory_bytes is not None:
        alloc = node_gauge(
            out, "node_memory_allocatable_bytes", "node status.allocatable memory (from the API)"
        )
        alloc.add(NO_WORKLOAD, node.allocatable_memory_bytes)
        yield alloc
    totals = snapshot.pod_memory_totals()
    if totals is None:
        return
    for name, doc, value in (
        (
            "node_memory_requests_bytes",
            "sum of the memory requests of this node's running pods, as the scheduler counts "
            "them (PodRequests)",
            totals.requests_bytes,
        ),
        (
            "node_memory_limits_bytes",
            "sum of the memory limits of this node's running pods that have one (PodLimits)",
            totals.limits_bytes,
        ),
        (
            "node_pods_without_memory_limit",
            "running pods of this node without a memory limit (unbounded)",
            totals.pods_without_limit,
        ),
    ):
        family = node_gauge(out, name, doc)
        family.add(NO_WORKLOAD, value)
        yield family
