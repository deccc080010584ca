"""A pod's memory request and limit as Kubernetes computes them, from the Pod as stored.

The rules are k8s.io/component-helpers/resource (helpers.go, v0.35, the version the test
kube-apiserver is built from): ``PodRequests``, ``PodLimits`` and their
``AggregateContainerRequests`` / ``AggregateContainerLimits``, which the scheduler's
NodeResourcesFit plugin (pkg/scheduler/framework/types.go ``PodInfo.CalculateResource``), the
kubelet's admission and its pod cgroups use:

- App containers add up.
- Init containers, in order: a restartable one (``restartPolicy: Always``, a native sidecar,
  on by default since 1.29) adds to that sum and to the sidecars started so far; a plain one
  needs its own value plus the sidecars started before it. The largest of those needs is the
  init containers' value, and the pod's is the larger of it and the sum (the KEP-753
  "InitContainerUse").
- Pod-level resources (``spec.resources``, PodLevelResources, beta and on by default since
  1.34): a memory value there replaces the containers' (requests when ``spec.resources.requests``
  names memory; limits when ``spec.resources.limits`` does). The API server defaults pod-level
  requests from the containers' or from the pod-level limit (pkg/apis/core/v1/defaults.go
  ``defaultPodRequests``), so a stored Pod carries them.
- ``spec.overhead`` (set from the RuntimeClass) is added to the request, and to a limit that is
  set (non-zero).
- In-place resize (InPlacePodVerticalScaling, GA in 1.35; the scheduler passes
  ``UseStatusResources``): an app container's or sidecar's value is the largest of its spec, its
  ``status.containerStatuses[].resources`` (what the kubelet applied) and, for requests, its
  ``allocatedResources``; while the ``PodResizePending`` condition says ``Infeasible``, its spec
  is left out. (Pod-level status values need InPlacePodLevelResourcesVerticalScaling, alpha and
  off: not read.)

A pod has a memory limit only where the kubelet gives its pod cgroup one
(pkg/kubelet/cm/helpers_linux.go ``ResourceConfigForPod``): every container's value as
``PodLimits`` passes it to its ``ContainerFn`` (for an init container, with the sidecars before
it) has a non-zero memory limit, or the pod-level limits name memory. Otherwise the pod is
unbounded and its limit is ``None``.

Quantities are parsed with the client's ``kubernetes.utils.parse_quantity``; one that cannot be
parsed counts as absent (the API server validates them, so a stored Pod has none).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from kubernetes.utils import parse_quantity

__all__ = ["PodMemory", "memory_bytes", "pod_memory"]

JSON = dict[str, Any]
ResourceKind = Literal["requests", "limits"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PodMemory:
    """A pod's memory in bytes: ``request`` (``PodRequests``; 0 when nothing requests memory),
    ``limit`` (``PodLimits``, ``None`` when the pod cgroup has no limit), ``limits_sum``
    (``PodLimits`` whether or not the pod cgroup is bounded: what ``kubectl describe node``
    adds up under "Allocated resources", k8s.io/kubectl pkg/describe
    ``getPodsTotalRequestsAndLimits``; 0 when nothing names a limit) and each container's own
    request by name (app, sidecar and init containers that have one)."""

    request: int
    limit: int | None
    limits_sum: int
    container_requests: dict[str, int]


def memory_bytes(resources: JSON | None) -> int | None:
    """``memory`` of a ResourceList (``{"memory": "512Mi"}``) in bytes; ``None`` if absent."""
    value = (resources or {}).get("memory")
    if value is None:
        return None
    try:
        return int(parse_quantity(str(value)))
    except ValueError:
        return None


def pod_memory(pod: JSON) -> PodMemory:
    """The memory request, limit and container requests of a Pod object (JSON as the API
    returns it), by the rules of the module docstring."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    infeasible = any(
        c.get("type") == "PodResizePending" and c.get("reason") == "Infeasible"
        for c in status.get("conditions") or []
    )
    statuses = {
        cs.get("name", ""): cs
        for key in ("containerStatuses", "initContainerStatuses")
        for cs in status.get(key) or []
    }

    def effective(kind: ResourceKind) -> Callable[[JSON, bool], int | None]:
        def value(container: JSON, with_status: bool) -> int | None:
            own = memory_bytes((container.get("resources") or {}).get(kind))
            cs = statuses.get(container.get("name", "")) if with_status else None
            if cs is None or cs.get("resources") is None:
                return own
            applied = memory_bytes(cs["resources"].get(kind))
            allocated = memory_bytes(cs.get("allocatedResources")) if kind == "requests" else None
            return _largest([applied, allocated] if infeasible else [own, applied, allocated])

        return value

    containers, inits = spec.get("containers") or [], spec.get("initContainers") or []
    pod_level = spec.get("resources") or {}
    overhead = memory_bytes(spec.get("overhead"))

    request = _aggregate(containers, inits, effective("requests"))
    if _names_memory(pod_level.get("requests")):
        request = memory_bytes(pod_level["requests"])
    request = _plus(request, overhead)

    declared: list[int | None] = []
    limit = _aggregate(containers, inits, effective("limits"), seen=declared.append)
    pod_limit = memory_bytes(pod_level.get("limits"))
    if pod_limit is not None:
        limit = pod_limit
    if limit and overhead is not None:
        limit += overhead
    bounded = bool(pod_limit) or all(declared)

    requests_of = effective("requests")
    own = [(c, _restartable(c)) for c in inits] + [(c, True) for c in containers]
    return PodMemory(
        request=request or 0,
        limit=limit if bounded else None,
        limits_sum=limit or 0,
        container_requests={
            c.get("name", ""): v
            for c, with_status in own
            if (v := requests_of(c, with_status)) is not None
        },
    )


def _aggregate(
    containers: list[JSON],
    inits: list[JSON],
    value: Callable[[JSON, bool], int | None],
    *,
    seen: Callable[[int | None], None] = lambda _: None,
) -> int | None:
    """``AggregateContainerRequests``/``Limits`` for memory: ``None`` when no container names
    it. ``seen`` gets each container's value as ``ContainerFn`` would (an init container's with
    the sidecars before it)."""
    total: int | None = None
    for c in containers:
        v = value(c, True)
        seen(v)
        total = _plus(total, v)
    sidecars: int | None = None
    init_need: int | None = None
    for c in inits:
        if _restartable(c):
            v = value(c, True)
            total = _plus(total, v)
            sidecars = _plus(sidecars, v)
            need = sidecars
        else:
            need = _plus(value(c, False), sidecars)
        seen(need)
        init_need = _largest([init_need, need])
    return _largest([total, init_need])


def _restartable(container: JSON) -> bool:
    return container.get("restartPolicy") == "Always"


def _names_memory(resources: JSON | None) -> bool:
    return memory_bytes(resources) is not None


def _plus(a: int | None, b: int | None) -> int | None:
    """Sum of two optional amounts; ``None`` only when both are absent (``addResourceList``)."""
    if a is None:
        return b
    return a if b is None else a + b


def _largest(values: Iterable[int | None]) -> int | None:
    """The largest present amount, ``None`` if none is (``maxResourceList``)."""
    present = [v for v in values if v is not None]
    return max(present) if present else None
