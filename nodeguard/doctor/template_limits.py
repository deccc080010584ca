"""Training jobs' pod templates that their namespace's LimitRanges refuse, for check
``quota-limitrange``. Admission of a pod (plugin/pkg/admission/limitranger/admission.go):

1. ``PodMutateLimitFunc`` gives each container (init containers too) that names no memory
   limit the first ``Container`` entry's ``default``, and one that names no request its
   ``defaultRequest`` (the LimitRanges in turn, in the order the admission plugin's lister
   gives them, which is none to rely on: with two defaults, either may win, and each order is
   weighed; a request the pod names no value for but whose limit it names was already set to
   that limit when the pod was decoded, pkg/apis/core/v1/defaults.go ``SetDefaults_Pod``).
2. ``PodValidateLimitFunc`` then refuses a container whose limit is above a ``Container``
   ``max`` or who has no limit at all where there is one ("No limit is specified"), and a pod
   whose limits, summed, are above a ``Pod`` ``max`` or who has none (``maxConstraint``; the
   pod's limit is its pod-level ``spec.resources`` one where set, else the app containers'
   and sidecars' summed, or a plain init container's with the sidecars where larger, as
   ``podLimits`` sums them).
3. The API server's validation refuses a container whose request ends above its limit
   (pkg/apis/core/validation ``ValidateResourceRequirements``): a ``default`` below a
   request the template names.

A job whose template is refused never starts those replicas: the operator's pod create fails,
over and over, and a distributed job waits for good on the replicas it has. The jobs are those
of :mod:`~nodeguard.doctor.training_workloads` (not finished, no Katib trial's job, and no
Experiment: check ``katib-fit`` weighs a trial template over its parameters); only the
templates are weighed: the pods a job already has were admitted.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from nodeguard.doctor.findings import Fact, Finding, ObjectRef, Severity
from nodeguard.doctor.inputs import Cluster, LimitRangeView
from nodeguard.doctor.training_inputs import ContainerSize, TemplateView
from nodeguard.doctor.training_workloads import job_ref

__all__ = ["ORDERS", "Refusal", "refusal", "refusal_in_some", "templates_above_max"]

#: The most orders of a namespace's defaulting LimitRanges tried (4 of them: 24).
ORDERS = 24


@dataclass(frozen=True, slots=True, kw_only=True)
class Refusal:
    """Why admission refuses a pod: the entry (``Container max``, ``Pod max``, or ``request
    above limit``), the LimitRange, the pod's or container's amount (``None``: no limit) and
    the bound (bytes)."""

    what: str
    limit_range: str
    size: int | None
    bound: int


def _defaulted(c: ContainerSize, ranges: Sequence[LimitRangeView]) -> tuple[int | None, int | None]:
    """The container's memory request and limit after LimitRanger's defaults."""
    request, limit = c.request, c.limit
    if request is None and limit is not None:
        request = limit  # the decoder's default, before admission
    for r in ranges:
        for item in r.items:
            if item.type != "Container":
                continue
            if limit is None and item.default is not None:
                limit = item.default
            if request is None and item.default_request is not None:
                request = item.default_request
    return request, limit


def _refusal_in(template: TemplateView, ordered: Sequence[LimitRangeView]) -> Refusal | None:
    """Why admission refuses a pod of ``template`` with the LimitRanges applied in this
    order; ``None`` when it admits it."""
    sizes = [(c, *_defaulted(c, ordered)) for c in template.containers]
    for r in ordered:
        for item in r.items:
            if item.type != "Container" or item.max is None:
                continue
            for _, request, limit in sizes:
                if limit is None or limit > item.max or (request or 0) > item.max:
                    size = limit if limit is None or limit > item.max else request
                    return Refusal(
                        what="Container max", limit_range=r.name, size=size, bound=item.max
                    )
    for c, request, limit in sizes:
        if request is not None and limit is not None and request > limit:
            return Refusal(
                what="request above limit",
                limit_range=_defaulting(c, ordered),
                size=request,
                bound=limit,
            )
    pod_limit = _pod_limit(template, [(c, limit) for c, _, limit in sizes])
    for r in ordered:
        for item in r.items:
            if (
                item.type == "Pod"
                and item.max is not None
                and (pod_limit is None or pod_limit > item.max)
            ):
                return Refusal(what="Pod max", limit_range=r.name, size=pod_limit, bound=item.max)
    return None


def _pod_limit(
    template: TemplateView, limits: Sequence[tuple[ContainerSize, int | None]]
) -> int | None:
    """The pod's memory limit as ``podLimits`` sums it: the pod-level ``spec.resources``
    limit where there is one, else the app containers and sidecars (restartable init
    containers, which run beside them) summed, or a plain init container with the sidecars
    when that is larger; ``None`` when no container has a limit."""
    if template.pod_limit is not None:
        return template.pod_limit
    known = [(c, lim) for c, lim in limits if lim is not None]
    if not known:
        return None
    sidecars = sum(lim for c, lim in known if c.sidecar)
    running = sum(lim for c, lim in known if not c.init) + sidecars
    inits = [lim + sidecars for c, lim in known if c.init and not c.sidecar]
    return max([running, *inits])


def refusal(template: TemplateView, ranges: Sequence[LimitRangeView]) -> Refusal | None:
    """Why admission refuses a pod of ``template`` in a namespace of ``ranges`` whatever
    order the LimitRanges are applied in; ``None`` when some order admits it
    (:func:`refusal_in_some` tells that case)."""
    outcomes = _outcomes(template, ranges)
    return outcomes[0] if all(o is not None for o in outcomes) else None


def refusal_in_some(template: TemplateView, ranges: Sequence[LimitRangeView]) -> Refusal | None:
    """Why admission refuses a pod of ``template`` in some order of the LimitRanges but not
    in every one: which ``default`` a container gets is the first LimitRange's that has one,
    and LimitRanger applies them in the order its lister gives, which is no order to rely on
    (a test that creates two LimitRanges with different defaults sees both outcomes)."""
    outcomes = _outcomes(template, ranges)
    refused = [o for o in outcomes if o is not None]
    return refused[0] if refused and len(refused) < len(outcomes) else None


def _outcomes(template: TemplateView, ranges: Sequence[LimitRangeView]) -> list[Refusal | None]:
    """The outcome under each order of the LimitRanges that give a ``Container`` default
    (their order alone changes the defaults; at most :data:`ORDERS` orders are tried)."""
    ordered = sorted(ranges, key=lambda r: r.name)
    defaulting = [
        r
        for r in ordered
        if any(i.type == "Container" and (i.default or i.default_request) for i in r.items)
    ]
    rest = [r for r in ordered if r not in defaulting]
    orders = list(itertools.islice(itertools.permutations(defaulting), ORDERS)) or [()]
    return [_refusal_in(template, [*order, *rest]) for order in orders]


def _defaulting(c: ContainerSize, ranges: Sequence[LimitRangeView]) -> str:
    """The LimitRange whose ``default`` gave the container its limit (``""``: its own)."""
    if c.limit is not None:
        return ""
    return next(
        (
            r.name
            for r in ranges
            for i in r.items
            if i.type == "Container" and i.default is not None
        ),
        "",
    )


def templates_above_max(
    cluster: Cluster, *, namespace: str, ranges: Sequence[LimitRangeView], check: str
) -> Iterator[Finding]:
    """One finding per job of ``namespace`` whose templates admission refuses (the first
    refusal of its first refused template named, with every refused role): an error when
    every order of the LimitRanges' defaults refuses them, a warning when some does."""
    jobs = [
        j
        for j in cluster.training.jobs
        if j.namespace == namespace
        and not j.finished
        and j.owner_kind != "Trial"
        and j.trial_kind is None
    ]
    for job in jobs:
        refused = [(t, why) for t in job.templates if (why := refusal(t, ranges)) is not None]
        severity: Severity = "error"
        if not refused:
            # Refused under some order of the LimitRanges' defaults only: a warning.
            refused = [
                (t, why) for t in job.templates if (why := refusal_in_some(t, ranges)) is not None
            ]
            severity = "warning"
        if not refused:
            continue
        roles = ", ".join(t.role or "its" for t, _ in refused)
        why = refused[0][1]
        ref = job_ref(job)
        shown = "no limit" if why.size is None else f"{-(-why.size // 2**20)}Mi"
        objects = [ref]
        if why.limit_range:
            objects.append(ObjectRef(kind="LimitRange", namespace=namespace, name=why.limit_range))
        maybe = "" if severity == "error" else ", with one order of its LimitRanges' defaults"
        yield Finding(
            check=check,
            severity=severity,
            title=(
                f"{ref.kind} {namespace}/{job.name}: {roles} pods refused at admission "
                f"({why.what}{f' of LimitRange {why.limit_range}' if why.limit_range else ''}"
                f"{maybe})"
            ),
            objects=tuple(objects),
            evidence=(
                Fact(label="templates", text=roles),
                Fact(label="after the LimitRange defaults", text=shown)
                if why.size is None
                else Fact(label="after the LimitRange defaults", bytes=why.size),
                Fact(label=why.what, bytes=why.bound),
            ),
            fix=(
                f"# give {roles} memory requests and limits within {why.bound // 2**20}Mi (in "
                "the manifest that creates the job), or change the LimitRange:\n"
                f"kubectl -n {namespace} edit limitrange {why.limit_range}"
                if why.limit_range
                else f"# set the memory request of {roles} at or below its limit (in the "
                "manifest that creates the job)"
            ),
        )
