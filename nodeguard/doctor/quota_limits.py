"""Check ``quota-limitrange``: a namespace's ResourceQuota and LimitRanges that together refuse
pods, per namespace in scope (Kubernetes v1.35 sources).

Admission of a pod runs LimitRanger, then ResourceQuota:

- LimitRanger (plugin/pkg/admission/limitranger/admission.go) applies every LimitRange of the
  namespace in turn: ``PodMutateLimitFunc`` gives each container and init container that names
  no memory limit (request) the ``Container`` entry's ``default`` (``defaultRequest``), then
  ``PodValidateLimitFunc`` refuses a container whose request is below a ``Container`` ``min``
  or whose limit is above its ``max``, and a pod whose summed request or limit is outside a
  ``Pod`` entry's ``min``/``max``. The API server refuses ``min > max`` inside one entry
  (pkg/apis/core/validation ``ValidateLimitRange``), so **min above max** is a contradiction
  across entries or LimitRanges: the largest ``Container`` ``min`` above the smallest
  ``Container`` or ``Pod`` ``max`` refuses every pod.
- The quota's pod evaluator (pkg/quota/v1/evaluator/core/pods.go) counts a pod's
  ``limits.memory`` as ``PodLimits`` and ``requests.memory`` (or ``memory``) as
  ``PodRequests``, and refuses a pod that would take the namespace past ``spec.hard``. A
  ``default`` above ``hard`` ``limits.memory`` (a ``defaultRequest`` above ``requests.memory``)
  refuses every pod with a container that relies on it, whatever else runs there.
- ``Constraints``: with a quota on ``limits.memory`` (``requests.memory``) every container and
  init container must name one ("must specify limits.memory for: <containers>"), unless the
  pod sets pod-level resources. With no LimitRange ``default`` (``defaultRequest``) to give
  one, every pod without it is refused. (A container's request defaults to its own limit at
  decoding, pkg/apis/core/v1/defaults.go ``SetDefaults_Pod``, so a LimitRange ``default`` also
  satisfies ``requests.memory``: its ``defaultRequest`` is filled from it.)

A scoped quota (``spec.scopes``, ``scopeSelector``) is admitted against, and constrains, only
the pods its scopes match (:mod:`~nodeguard.doctor.quota_scopes`, the API server's
``podMatchesScopeFunc``). Its findings are about the namespace's pods it counts, evaluated as
their next copies would be: for a LimitRange default, a copy whose container relies on it
(given a memory default, it is not BestEffort); for a missing default, the pod as it is. A
scoped quota that counts none of the namespace's pods yields no finding (a ``PriorityClass In
[high]`` quota says nothing about the ``low`` pods it never sees). Not known here: a
PriorityClass with ``globalDefault`` that the Priority admission plugin writes into pods
without one (the pods read already carry it).

A training job's pod template above a LimitRange ``Container`` or ``Pod`` ``max`` is refused
the same way, each time its operator makes the pod (:mod:`~nodeguard.doctor.template_limits`).

Not a finding: defaults that fit the quota, a quota whose namespace gives defaults.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterator, Sequence

from nodeguard.doctor.findings import Fact, Finding, ObjectRef
from nodeguard.doctor.inputs import Cluster, LimitItem, LimitRangeView, PodView, QuotaView
from nodeguard.doctor.quota_scopes import quota_matches
from nodeguard.doctor.registry import Check, register
from nodeguard.doctor.template_limits import templates_above_max

__all__ = ["FALLBACK_LIMIT", "starting_defaults"]

Bound = tuple[int, LimitRangeView, str]  # bytes, the LimitRange, "Container max" ...


def _findings(cluster: Cluster) -> Iterator[Finding]:
    namespaces = {q.namespace for q in cluster.quotas} | {r.namespace for r in cluster.limit_ranges}
    for ns in sorted(n for n in namespaces if cluster.in_scope(n)):
        quotas = [q for q in cluster.quotas if q.namespace == ns and not q.scoped]
        ranges = sorted(
            (r for r in cluster.limit_ranges if r.namespace == ns), key=lambda r: r.name
        )
        yield from _defaults_above_quota(ns, quotas, ranges)
        yield from _min_above_max(ns, ranges)
        yield from templates_above_max(
            cluster, namespace=ns, ranges=ranges, check="quota-limitrange"
        )
        pods = [p for p in cluster.pods if p.meta.namespace == ns and not p.meta.finished]
        yield from _quota_without_defaults(ns, quotas, ranges, pods=pods)
        scoped = sorted((q for q in cluster.quotas if q.namespace == ns and q.scoped), key=_name)
        for quota in scoped:
            defaulted = _counted(quota, pods, defaulted=True)
            if defaulted:
                yield from _defaults_above_quota(ns, [quota], ranges, counted=defaulted)
            as_they_are = _counted(quota, pods, defaulted=False)
            if as_they_are:
                yield from _quota_without_defaults(ns, [quota], ranges, counted=as_they_are)


def _name(quota: QuotaView) -> str:
    return quota.name


def _counted(quota: QuotaView, pods: list[PodView], *, defaulted: bool) -> list[PodView]:
    """The pods a scoped quota counts; with ``defaulted``, as copies given a LimitRange memory
    default (so not BestEffort, pkg/apis/core/v1/helper/qos ``GetPodQOS``)."""
    counted = []
    for pod in pods:
        if pod.scope is None:
            continue
        scope = dataclasses.replace(pod.scope, best_effort=False) if defaulted else pod.scope
        if quota_matches(quota.scopes, scope):
            counted.append(pod)
    return sorted(counted, key=lambda p: p.meta.name)


#: Pods named in a scoped quota's finding, at most.
SHOWN_PODS = 5


def _scope_facts(
    quota: QuotaView, counted: Sequence[PodView]
) -> tuple[str, tuple[Fact, ...], tuple[ObjectRef, ...]]:
    """For a scoped quota: the title's tail, the evidence and the pods named."""
    if not quota.scoped:
        return "", (), ()
    shown = counted[:SHOWN_PODS]
    more = f" (+{len(counted) - len(shown)})" if len(counted) > len(shown) else ""
    scope = ", ".join(str(r) for r in quota.scopes)
    return (
        f" (pods of scope {scope})",
        (
            Fact(label="quota scope", text=scope),
            Fact(label="pods it counts", text=", ".join(p.meta.name for p in shown) + more),
        ),
        tuple(_ref("Pod", p.meta.namespace, p.meta.name) for p in shown),
    )


def _smallest(quotas: list[QuotaView], hard_name: str) -> tuple[int, QuotaView] | None:
    """The smallest ``spec.hard`` of ``hard_name`` (``limits.memory``, ``requests.memory``)
    among the quotas, and its quota; ``None`` when none sets it."""
    present = [
        (v, q)
        for q in quotas
        if (v := q.hard_limits_memory if hard_name == "limits.memory" else q.hard_requests_memory)
        is not None
    ]
    return min(present, key=lambda t: t[0]) if present else None


def _defaults_above_quota(
    ns: str,
    quotas: list[QuotaView],
    ranges: list[LimitRangeView],
    *,
    counted: Sequence[PodView] = (),
) -> Iterator[Finding]:
    pairs = (
        ("default", "limits.memory", "limit"),
        ("defaultRequest", "requests.memory", "request"),
    )
    for api_field, hard_name, word in pairs:
        hard = _smallest(quotas, hard_name)
        if hard is None:
            continue
        for lr in ranges:
            for item in lr.items:
                value = item.default if api_field == "default" else item.default_request
                if item.type != "Container" or value is None or value <= hard[0]:
                    continue
                tail, facts, pods = _scope_facts(hard[1], counted)
                yield Finding(
                    check="quota-limitrange",
                    severity="error",
                    title=f"LimitRange default {word} above the quota's {hard_name} in {ns}{tail}",
                    objects=(
                        _ref("LimitRange", lr.namespace, lr.name),
                        _ref("ResourceQuota", ns, hard[1].name),
                        *pods,
                    ),
                    evidence=(
                        Fact(label=f"Container {api_field} memory", bytes=value),
                        Fact(label=f"quota hard {hard_name}", bytes=hard[0]),
                        *facts,
                    ),
                    fix=(
                        f"# lower spec.limits[{lr.items.index(item)}].{api_field}.memory to at "
                        f"most {hard[0] // 2**20}Mi (or raise the quota):\n"
                        f"kubectl -n {ns} edit limitrange {lr.name}"
                    ),
                )


def _min_above_max(ns: str, ranges: list[LimitRangeView]) -> Iterator[Finding]:
    mins: list[Bound] = [
        (i.min, lr, "Container min")
        for lr in ranges
        for i in lr.items
        if i.type == "Container" and i.min is not None
    ]
    maxes: list[Bound] = [
        (i.max, lr, f"{i.type} max")
        for lr in ranges
        for i in lr.items
        if i.type in ("Container", "Pod") and i.max is not None
    ]
    if not mins or not maxes:
        return
    low, high = max(mins, key=lambda b: b[0]), min(maxes, key=lambda b: b[0])
    if low[0] <= high[0]:
        return
    refs = {(b[1].name): _ref("LimitRange", ns, b[1].name) for b in (low, high)}
    yield Finding(
        check="quota-limitrange",
        severity="error",
        title=f"LimitRange {low[2]} above {high[2]} in {ns}: every pod is refused",
        objects=tuple(refs.values()),
        evidence=(
            Fact(label=f"{low[2]} memory ({low[1].name})", bytes=low[0]),
            Fact(label=f"{high[2]} memory ({high[1].name})", bytes=high[0]),
        ),
        fix=(
            f"# lower min.memory to at most {high[0] // 2**20}Mi (or raise the max):\n"
            f"kubectl -n {ns} edit limitrange {low[1].name}"
        ),
    )


def _quota_without_defaults(
    ns: str,
    quotas: list[QuotaView],
    ranges: list[LimitRangeView],
    *,
    pods: Sequence[PodView] = (),
    counted: Sequence[PodView] = (),
) -> Iterator[Finding]:
    """One finding for a namespace whose quota needs a memory limit (request) that no
    LimitRange gives: both hard names in it when both are missing, so its one fix (a single
    LimitRange, applied once) gives both defaults."""
    items = [i for lr in ranges for i in lr.items if i.type == "Container"]
    missing = []
    for hard_name, given in (
        ("limits.memory", any(i.default is not None for i in items)),
        (
            "requests.memory",
            any(i.default_request is not None or i.default is not None for i in items),
        ),
    ):
        hard = _smallest(quotas, hard_name)
        if hard is not None and not given:
            missing.append((hard_name, hard))
    if not missing:
        return
    names = " and ".join(name for name, _ in missing)
    fragments = " and ".join(
        "default" if name == "limits.memory" else "defaultRequest" for name, _ in missing
    )
    quota = missing[0][1][1]
    tail, facts, refs = _scope_facts(quota, counted)
    starting = starting_defaults(
        pods=counted or pods,
        items=items,
        hard_limits=next((h[0] for n, h in missing if n == "limits.memory"), None),
        hard_requests=next((h[0] for n, h in missing if n == "requests.memory"), None),
    )
    lines = "".join(f"    {field}: {{memory: {value // 2**20}Mi}}\n" for field, value in starting)
    yield Finding(
        check="quota-limitrange",
        severity="error",
        title=(
            f"quota on {names} in {ns} and no LimitRange {fragments}: "
            f"pods without one are refused{tail}"
        ),
        objects=tuple(
            {
                str(r): r
                for r in (*(_ref("ResourceQuota", ns, h[1].name) for _, h in missing), *refs)
            }.values()
        ),
        evidence=(
            *(Fact(label=f"quota hard {name}", bytes=h[0]) for name, h in missing),
            Fact(label=f"LimitRange {fragments}", text="none"),
            *facts,
        ),
        fix=(
            f"# starting values ({_basis(pods=counted or pods)}): size them to the workload\n"
            f"kubectl -n {ns} apply -f - <<EOF\napiVersion: v1\nkind: LimitRange\n"
            f"metadata: {{name: memory-defaults}}\nspec:\n  limits:\n  - type: Container\n"
            f"{lines}EOF"
        ),
    )


#: The default limit given when no container of the namespace sets one: a small service's
#: size, to be replaced by a measured one.
FALLBACK_LIMIT = 2**30


def _typical(pods: Sequence[PodView], *, limit: bool) -> int | None:
    """The median (the lower middle one) of the memory limits (requests) the namespace's
    containers set: a default is for the containers that name none, a typical one's size
    rather than the largest's."""
    values = [
        v
        for p in pods
        for c in p.containers
        if (v := c.memory_limit_bytes if limit else c.memory_request_bytes) is not None
    ]
    return statistics.median_low(values) if values else None


def _basis(*, pods: Sequence[PodView]) -> str:
    if _typical(pods, limit=True) is None and _typical(pods, limit=False) is None:
        return f"no container here sets memory: {FALLBACK_LIMIT // 2**20}Mi"
    return "the median of what containers here set"


def starting_defaults(
    *,
    pods: Sequence[PodView],
    items: Sequence[LimitItem],
    hard_limits: int | None,
    hard_requests: int | None,
) -> list[tuple[str, int]]:
    """The ``default`` and ``defaultRequest`` (bytes, whole MiB) to put in a new LimitRange's
    ``Container`` entry so that a namespace's quota admits pods that name no memory: the
    median limit (request) its containers set now, else :data:`FALLBACK_LIMIT`, within
    what the namespace allows: at most the smallest quota ``hard`` and ``Container``/``Pod``
    ``max``, at least the largest ``Container`` ``min`` (LimitRanger's
    ``PodValidateLimitFunc`` refuses a defaulted container outside them), and the request at
    most the limit (``ValidateLimitRange``: "default request value must be less than or equal
    to default limit value"). ``default`` only when ``hard_limits`` is given,
    ``defaultRequest`` only when ``hard_requests`` is (with only ``default`` the API server
    fills ``defaultRequest`` from it)."""
    caps = [i.max for i in items if i.max is not None]
    floor = max((i.min for i in items if i.min is not None), default=0)

    def clamp(value: int, *hard: int | None) -> int:
        ceiling = min([*caps, *(h for h in hard if h is not None)], default=value)
        return max(floor, min(value, ceiling)) // 2**20 * 2**20

    typical_limit = _typical(pods, limit=True)
    typical_request = _typical(pods, limit=False)
    out: list[tuple[str, int]] = []
    limit = clamp(typical_limit or typical_request or FALLBACK_LIMIT, hard_limits)
    if hard_limits is not None:
        out.append(("default", limit))
    if hard_requests is not None:
        request = clamp(typical_request or typical_limit or FALLBACK_LIMIT, hard_requests)
        out.append(("defaultRequest", min(request, limit) if hard_limits is not None else request))
    return out


def _ref(kind: str, namespace: str, name: str) -> ObjectRef:
    return ObjectRef(kind=kind, namespace=namespace, name=name)


register(
    Check(
        id="quota-limitrange",
        title="ResourceQuota and LimitRange that together refuse pods",
        run=_findings,
    )
)
