"""The checks of scope ``node`` on one node, as the agent runs them: a
:class:`~nodeguard.doctor.inputs.Cluster` of that node and its pods alone, built from the
:func:`~nodeguard.doctor.read.node_view` / :func:`~nodeguard.doctor.read.pod_view` of the objects
the agent already reads (its Node, and its node's pods from the watch with field selector
``spec.nodeName``), and the count of their findings by check and severity.

Pure: no API, no clock. A check of scope ``node`` finds on this cluster exactly what it finds
for that node on the whole cluster (its findings follow from the node and the pods bound to it;
tests/unit/test_doctor_node_scope.py holds every node check to that).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from nodeguard.doctor.findings import Severity
from nodeguard.doctor.inputs import Cluster, NodeView, PodView
from nodeguard.doctor.registry import node_checks

__all__ = ["PostureKey", "node_cluster", "posture_counts"]


class PostureKey(NamedTuple):
    """One series of ``nodeguard_posture_findings``: a check id and a severity."""

    check: str
    severity: Severity


def node_cluster(*, node: NodeView, pods: Iterable[PodView]) -> Cluster:
    """The cluster the node checks see on ``node``: that node, those of ``pods`` bound to it (a
    pod of another node or not yet bound is left out), no quota and no LimitRange, every
    namespace in scope."""
    return Cluster(
        nodes=(node,),
        pods=tuple(p for p in pods if p.meta.node_name == node.name),
        quotas=(),
        limit_ranges=(),
    )


def posture_counts(cluster: Cluster) -> dict[PostureKey, int]:
    """How many findings each registered check of scope ``node`` makes on ``cluster``, by
    severity: a key for every such check and every severity it can report (``Check.severities``),
    0 where it found none, in registration then severity order. A finding of a severity its
    check did not declare is counted too (under its own key), never dropped."""
    counts: dict[PostureKey, int] = {}
    for check in node_checks():
        for severity in check.severities:
            counts[PostureKey(check.id, severity)] = 0
        for finding in check.run(cluster):
            key = PostureKey(check.id, finding.severity)
            counts[key] = counts.get(key, 0) + 1
    return counts
