"""The workload labels every series about the node, its pods and its GPUs carries, and the
families made with them; what several collectors share to fill them (a container's pod, a
PSI line's stall series), here so that no collector imports another.

Series carry ``namespace``, ``pod`` and ``container``; until pod metadata is known (no cluster),
``pod`` holds the pod UID, ``container`` the container ID and ``namespace`` is empty.

Target labels. Scraped with ``honor_labels: true``, a series gets every label of its target
that it does not have itself (Prometheus scrape/scrape.go ``mutateSampleLabels``: a target label
is added where the series lacks the name; a label whose value is empty is then no label). A
ServiceMonitor gives the agent's target ``namespace``, ``pod``, ``container`` (the agent's own
pod), ``service``, ``endpoint``, ``job`` and ``instance`` (prometheus-operator
pkg/prometheus/promcfg.go). So every series about the node, a GPU or a whole pod carries the
workload labels it has no value for, empty (:data:`WORKLOAD_LABELS`), as the kubelet's cAdvisor
endpoint does (pkg/kubelet/server/server.go ``containerPrometheusLabelsFunc``: "we arrange to
supply blank strings for missing labels"); stored, they have none of them. ``service``,
``endpoint``, ``job`` and ``instance`` name the scrape and apply to every series: they are left to
the target, as cAdvisor leaves them. The agent's own series (build info, collectors, rules,
actions) are the agent pod's, and keep its target labels too.
"""

from __future__ import annotations

from collections.abc import Sequence

from nodeguard.collectors.families import Families, Family
from nodeguard.snapshot import PodMemory, Pressure

__all__ = [
    "NO_WORKLOAD",
    "WORKLOAD_LABELS",
    "add_stall",
    "container_pods",
    "node_counter",
    "node_gauge",
]

#: The labels that name a workload, on every series about the node, its pods and its GPUs;
#: empty where they do not apply (see the module docstring).
WORKLOAD_LABELS = ("namespace", "pod", "container")
NO_WORKLOAD = ("", "", "")


def node_gauge(out: Families, name: str, help: str, labels: Sequence[str] = ()) -> Family:
    """A gauge about the node: the workload labels first, to be filled with
    :data:`NO_WORKLOAD`."""
    return out.gauge(name, help, [*WORKLOAD_LABELS, *labels])


def node_counter(out: Families, name: str, help: str, labels: Sequence[str] = ()) -> Family:
    """A counter about the node, as :func:`node_gauge`."""
    return out.counter(name, help, [*WORKLOAD_LABELS, *labels])


def container_pods(pods: tuple[PodMemory, ...]) -> dict[str, str]:
    """Container ID -> pod UID, from the cgroup walk: where a process's cgroup path shows only
    its container (a cgroup namespace), the walk knows the pod."""
    return {c.container_id: p.uid for p in pods for c in p.containers}


def add_stall(family: Family, values: tuple[str, ...], pressure: Pressure | None) -> None:
    """``total_seconds`` of the ``some`` and ``full`` lines, under a last label ``kind``."""
    if pressure is None:
        return
    for kind, line in (("some", pressure.some), ("full", pressure.full)):
        if line is not None:
            family.add((*values, kind), line.total_seconds)
