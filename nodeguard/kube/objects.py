"""Pod and Node JSON (as the API returns them) into the snapshot's plain types.

Quantities are parsed with the client's ``kubernetes.utils.parse_quantity`` (``512Mi``, ``1.5G``,
``1e9``). A pod's memory request and limit are computed as the scheduler and the kubelet do
(k8s.io/component-helpers resource ``PodRequests`` / ``PodLimits``: :mod:`nodeguard.kube.resources`,
the one place every request and limit metric, overcommit signal and eviction ranking takes them
from).
"""

from __future__ import annotations

from typing import Any

from kubernetes.utils import parse_quantity

from nodeguard.kube.resources import memory_bytes, pod_memory
from nodeguard.snapshot import NodeMeta, OwnerRef, PodMeta

__all__ = [
    "container_ids",
    "hugepages_bytes",
    "node_meta",
    "parse_bytes",
    "pod_meta",
    "strip_container_id",
]

JSON = dict[str, Any]
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
CONFIG_HASH_ANNOTATION = "kubernetes.io/config.hash"


def parse_bytes(text: str, *, exact: bool = False) -> int:
    """A memory quantity (``8Gi``, ``500M``, ``1e9``, ``0``) in bytes; ``ValueError`` if not
    one, and with ``exact`` also for a fraction of a byte (``1m``, ``1.5``)."""
    value = parse_quantity(text)
    if exact and value != int(value):
        raise ValueError(f"not a whole number of bytes: {text!r}")
    return int(value)


def strip_container_id(value: str) -> str:
    """``<type>://<id>`` (``containerd://``, ``cri-o://``, ``docker://``: the kubelet's
    ``kubecontainer.ContainerID.String()`` in ``containerStatuses[].containerID`` and
    ``lastState.terminated.containerID``) -> ``<id>``."""
    return value.split("://", 1)[-1]


def container_ids(status: JSON) -> dict[str, str]:
    """Container ID (runtime prefix stripped) -> container name, from a pod's ``status``: each
    status's ``containerID`` and its ``lastState.terminated.containerID``, app, init and
    ephemeral containers alike.

    The kubelet restarts an OOM-killed container within a second, in a new container with a
    new ID; the dead one's ID stays only in ``lastState.terminated`` (pkg/kubelet/kubelet_pods.go
    ``convertToAPIContainerStatuses`` copies the previous status into ``LastTerminationState``,
    ``containerID`` included; kube-state-metrics#570 is the same loss, fixed by reading
    ``lastState``). Without it, the kernel log's victim of that kill has no name."""
    ids: dict[str, str] = {}
    for key in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
        for cs in status.get(key) or []:
            name = cs.get("name", "")
            last = ((cs.get("lastState") or {}).get("terminated") or {}).get("containerID")
            for cid in (last, cs.get("containerID")):
                if cid:
                    ids[strip_container_id(cid)] = name
    return ids


def pod_meta(pod: JSON) -> PodMeta:
    """A :class:`PodMeta` from a Pod object."""
    meta, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status", {})
    memory = pod_memory(pod)
    ids = container_ids(status)
    owners = tuple(
        OwnerRef(
            kind=o.get("kind", ""), name=o.get("name", ""), controller=bool(o.get("controller"))
        )
        for o in meta.get("ownerReferences") or []
    )
    annotations = meta.get("annotations") or {}
    mirror = MIRROR_ANNOTATION in annotations
    # The kubelet writes the static pod's UID (its config hash) into both annotations of the
    # mirror (pkg/kubelet/pod/mirror_client.go CreateMirrorPod); other pods carry neither.
    config_hash = None
    if mirror:
        config_hash = annotations.get(CONFIG_HASH_ANNOTATION) or annotations[MIRROR_ANNOTATION]
    return PodMeta(
        uid=meta.get("uid", ""),
        name=meta.get("name", ""),
        namespace=meta.get("namespace", ""),
        node_name=spec.get("nodeName", ""),
        phase=status.get("phase", ""),
        priority=int(spec.get("priority") or 0),
        priority_class=spec.get("priorityClassName", ""),
        qos_class=str(status.get("qosClass", "")).lower(),
        memory_request_bytes=memory.request,
        memory_limit_bytes=memory.limit,
        owners=owners,
        labels=dict(meta.get("labels") or {}),
        annotations=dict(annotations),
        containers=ids,
        container_requests=memory.container_requests,
        mirror=mirror,
        daemonset=any(o.kind == "DaemonSet" and o.controller for o in owners),
        terminating=bool(meta.get("deletionTimestamp")),
        config_hash=str(config_hash) if config_hash else None,
        ready=any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or []
        ),
    )


def node_meta(node: JSON) -> NodeMeta:
    """A :class:`NodeMeta` from a Node object."""
    status = node.get("status", {})
    return NodeMeta(
        name=node.get("metadata", {}).get("name", ""),
        allocatable_memory_bytes=memory_bytes(status.get("allocatable")),
        capacity_memory_bytes=memory_bytes(status.get("capacity")),
        unschedulable=bool(node.get("spec", {}).get("unschedulable")),
        capacity_hugepages_bytes=hugepages_bytes(status.get("capacity")),
    )


def hugepages_bytes(resources: JSON | None) -> int:
    """The ``hugepages-<size>`` resources of a ResourceList (``{"hugepages-1Gi": "8Gi"}``),
    summed, in bytes; 0 when there are none. The kubelet reports each size's pre-allocated pool
    there (v1helper.IsHugePageResourceName: the ``hugepages-`` prefix); an unparsable value is
    left out."""
    total = 0
    for name, value in (resources or {}).items():
        if not str(name).startswith("hugepages-"):
            continue
        try:
            total += int(parse_quantity(str(value)))
        except ValueError:
            continue
    return max(0, total)
