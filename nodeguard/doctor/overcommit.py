"""Check ``overcommit``: per node, memory requests and limits against allocatable.

The sums are ``kubectl describe node``'s "Allocated resources" (k8s.io/kubectl
pkg/describe/describe.go ``describeNodeResource`` / ``getPodsTotalRequestsAndLimits``: every
non-terminated pod's ``PodRequests`` and ``PodLimits``, component-helpers resource
helpers.go; a pod contributes to the limits what its containers name, nothing for one without
a limit), taken from nodeguard's one computation of them (:mod:`nodeguard.kube.resources`:
``PodMeta.memory_request_bytes`` and ``limits_sum``), against ``status.allocatable.memory``.

- Requests above allocatable: an **error**. The scheduler's NodeResourcesFit plugin
  (pkg/scheduler/framework/plugins/noderesources/fit.go ``fitsRequest``) never places a pod
  whose request does not fit what the node's pods already request, so this node got there
  some other way (pods bound by ``spec.nodeName``, static pods, allocatable lowered after
  they were placed) and has promised more than it has.
- Limits above allocatable: a **warning**. Overcommit is allowed ("Total limits may be over 100
  percent, i.e., overcommitted", kubectl's own words), but memory is not compressible: when the
  pods grow toward their limits together the kubelet evicts (``memory.available``) or the
  kernel OOM-kills, whoever is largest above its request, often the training job.

Exactly 100 % is not a finding. The largest contributors (three) are named. A node without an
allocatable memory is skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from nodeguard.doctor.findings import Fact, Finding, ObjectRef
from nodeguard.doctor.inputs import Cluster, NodeView, PodView
from nodeguard.doctor.registry import Check, register

__all__: list[str] = []

TOP = 3


def _findings(cluster: Cluster) -> Iterator[Finding]:
    for node in cluster.nodes:
        allocatable = node.meta.allocatable_memory_bytes
        if allocatable is None:
            continue
        pods = cluster.pods_on(node.name)
        requests = sum(p.meta.memory_request_bytes for p in pods)
        limits = sum(p.limits_sum for p in pods)
        if requests > allocatable:
            yield _finding(
                node,
                pods,
                what="requests",
                total=requests,
                allocatable=allocatable,
                of=lambda p: p.meta.memory_request_bytes,
            )
        if limits > allocatable:
            yield _finding(
                node,
                pods,
                what="limits",
                total=limits,
                allocatable=allocatable,
                of=lambda p: p.limits_sum,
            )


def _finding(
    node: NodeView,
    pods: list[PodView],
    *,
    what: str,
    total: int,
    allocatable: int,
    of: Callable[[PodView], int],
) -> Finding:
    top = sorted((p for p in pods if of(p)), key=lambda p: (-of(p), p.meta.namespace, p.meta.name))
    top = top[:TOP]
    percent = 100 * total / allocatable if allocatable else float("inf")
    largest = top[0]
    if what == "requests":
        if largest.controller is not None:
            move = (
                f"# move the largest away ({largest.controller} recreates it where it fits):\n"
                f"kubectl -n {largest.meta.namespace} delete pod {largest.meta.name}"
            )
        else:
            # A pod without a controller is never recreated: deleting it is losing it.
            move = (
                f"# the largest, {largest.meta.namespace}/{largest.meta.name}, has no controller "
                "(deleted, it is gone): lower its request in its manifest and re-create it, or "
                "move another"
            )
        fix = f"kubectl describe node {node.name}   # Allocated resources\n{move}"
    else:
        fix = (
            "# lower the largest limits toward their requests, in the template that makes "
            f"{largest.meta.namespace}/{largest.meta.name} "
            f"({largest.controller or 'its manifest: it has no controller'});\n"
            "# or keep new pods off this node until then (DaemonSets that tolerate every\n"
            f"# taint still come; undo: kubectl taint node {node.name} memory-overcommitted-):\n"
            f"kubectl taint node {node.name} memory-overcommitted=true:NoSchedule"
        )
    return Finding(
        check="overcommit",
        severity="error" if what == "requests" else "warning",
        title=f"memory {what} of node {node.name} at {percent:.0f} % of allocatable",
        objects=(
            ObjectRef(kind="Node", namespace="", name=node.name),
            *(ObjectRef(kind="Pod", namespace=p.meta.namespace, name=p.meta.name) for p in top),
        ),
        evidence=(
            Fact(label=f"{what} summed", bytes=total),
            Fact(label="allocatable", bytes=allocatable),
            Fact(label="over by", bytes=total - allocatable),
            *(Fact(label=f"{p.meta.namespace}/{p.meta.name} {what}", bytes=of(p)) for p in top),
        ),
        fix=fix,
    )


register(
    Check(
        id="overcommit",
        title="memory requests or limits summed past a node's allocatable",
        run=_findings,
        scope="node",
        severities=("warning", "error"),
    )
)
