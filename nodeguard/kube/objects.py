"""Pod and Node JSON (as the API returns them) into the snapshot's plain types.

Quantities are parsed with the client's ``kubernetes.utils.parse_quantity`` (``512Mi``, ``1.5G``,
``1e9``). A pod's memory request and limit are computed as the scheduler does
(k8s.io/component-helpers resource.PodRequests): the larger of the sum over app containers and
the largest init container, plus ``spec.overhead``.
"""

from __future__ import annotations

from typing import Any

from kubernetes.utils import parse_quantity

from nodeguard.snapshot import NodeMeta, OwnerRef, PodMeta

__all__ = ["node_meta", "parse_bytes", "pod_meta", "strip_container_id"]

JSON = dict[str, Any]
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


def _bytes(value: Any) -> int | None:
    if value is None:
        return None
    try:
        return int(parse_quantity(str(value)))
    except ValueError:
        return None


def parse_bytes(text: str, *, exact: bool = False) -> int:
    """A memory quantity (``8Gi``, ``500M``, ``1e9``, ``0``) in bytes; ``ValueError`` if not
    one, and with ``exact`` also for a fraction of a byte (``1m``, ``1.5``)."""
    value = parse_quantity(text)
    if exact and value != int(value):
        raise ValueError(f"not a whole number of bytes: {text!r}")
    return int(value)


def strip_container_id(value: str) -> str:
    """``containerd://<id>`` (containerStatuses[].containerID) -> ``<id>``."""
    return value.split("://", 1)[-1]


def _memory(containers: list[JSON], key: str) -> tuple[int, bool]:
    """Sum of ``resources.<key>.memory`` and whether every container had one."""
    total, complete = 0, True
    for c in containers:
        value = _bytes(((c.get("resources") or {}).get(key) or {}).get("memory"))
        if value is None:
            complete = False
        else:
            total += value
    return total, complete


def pod_meta(pod: JSON) -> PodMeta:
    """A :class:`PodMeta` from a Pod object."""
    meta, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status", {})
    containers = spec.get("containers") or []
    inits = spec.get("initContainers") or []
    overhead = _bytes((spec.get("overhead") or {}).get("memory")) or 0
    req, _ = _memory(containers, "requests")
    lim, lim_complete = _memory(containers, "limits")
    # Requests default to limits when only a limit is set (the API server defaults this).
    init_req = max((_memory([c], "requests")[0] for c in inits), default=0)
    init_lim = [_memory([c], "limits") for c in inits]
    limit: int | None = None
    if containers and lim_complete and all(ok for _, ok in init_lim):
        limit = max(lim, max((v for v, _ in init_lim), default=0)) + overhead
    ids: dict[str, str] = {}
    for key in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
        for cs in status.get(key) or []:
            if cs.get("containerID"):
                ids[strip_container_id(cs["containerID"])] = cs.get("name", "")
    owners = tuple(
        OwnerRef(
            kind=o.get("kind", ""), name=o.get("name", ""), controller=bool(o.get("controller"))
        )
        for o in meta.get("ownerReferences") or []
    )
    annotations = meta.get("annotations") or {}
    return PodMeta(
        uid=meta.get("uid", ""),
        name=meta.get("name", ""),
        namespace=meta.get("namespace", ""),
        node_name=spec.get("nodeName", ""),
        phase=status.get("phase", ""),
        priority=int(spec.get("priority") or 0),
        priority_class=spec.get("priorityClassName", ""),
        qos_class=str(status.get("qosClass", "")).lower(),
        memory_request_bytes=max(req, init_req) + overhead,
        memory_limit_bytes=limit,
        owners=owners,
        labels=dict(meta.get("labels") or {}),
        annotations=dict(annotations),
        containers=ids,
        container_requests={
            c.get("name", ""): v
            for c in [*inits, *containers]
            if (v := _bytes(((c.get("resources") or {}).get("requests") or {}).get("memory")))
            is not None
        },
        mirror=MIRROR_ANNOTATION in annotations,
        daemonset=any(o.kind == "DaemonSet" and o.controller for o in owners),
        terminating=bool(meta.get("deletionTimestamp")),
    )


def node_meta(node: JSON) -> NodeMeta:
    """A :class:`NodeMeta` from a Node object."""
    status = node.get("status", {})
    return NodeMeta(
        name=node.get("metadata", {}).get("name", ""),
        allocatable_memory_bytes=_bytes((status.get("allocatable") or {}).get("memory")),
        capacity_memory_bytes=_bytes((status.get("capacity") or {}).get("memory")),
        unschedulable=bool(node.get("spec", {}).get("unschedulable")),
    )
