"""Which pods a scoped ResourceQuota counts, as the API server's pod evaluator decides it
(kubernetes pkg/quota/v1/evaluator/core/pods.go ``podMatchesScopeFunc``, v1.35).

A quota's scopes are ``spec.scopes`` (each read as ``{scopeName, operator: Exists}``) and
``spec.scopeSelector.matchExpressions`` (pkg/quota/v1/resources.go
``getScopeSelectorsFromQuota``); the quota counts, and its admission checks, a pod only when
every one of them matches it (pkg/quota/v1/generic ``Matches``; the ResourceQuota admission
controller, plugin/pkg/admission/resourcequota/controller.go ``checkRequest``, keeps only the
quotas that match the pod, for both the ``hard`` sums and the "must specify" constraints):

- ``Terminating``: ``spec.activeDeadlineSeconds`` set and >= 0; ``NotTerminating`` the rest;
- ``BestEffort`` / ``NotBestEffort``: the pod's QoS class (``GetPodQOS``) is / is not
  BestEffort;
- ``PriorityClass``: ``Exists`` is ``spec.priorityClassName`` non-empty; otherwise the
  requirement is a label requirement on the one-label set ``{PriorityClass:
  <priorityClassName>}`` (``podMatchesSelector``): ``In``/``NotIn`` compare the name (an empty
  one too), and ``DoesNotExist`` never matches, the key being always there;
- ``CrossNamespacePodAffinity``: a pod (anti-)affinity term with ``namespaceSelector`` or
  ``namespaces`` (``usesCrossNamespacePodAffinity``).

An unknown scope matches no pod (the function's ``return false``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["PodScope", "ScopeRequirement", "pod_scope", "quota_matches", "scope_requirements"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ScopeRequirement:
    """One scope of a quota: ``scope`` (``PriorityClass``, ``Terminating``...), ``operator``
    (``In``, ``NotIn``, ``Exists``, ``DoesNotExist``) and ``values``."""

    scope: str
    operator: str = "Exists"
    values: tuple[str, ...] = ()

    def __str__(self) -> str:
        if self.operator == "Exists" and not self.values:
            return self.scope
        shown = f" [{', '.join(self.values)}]" if self.values else ""
        return f"{self.scope} {self.operator}{shown}"


@dataclass(frozen=True, slots=True, kw_only=True)
class PodScope:
    """What the scopes look at in a pod: ``activeDeadlineSeconds`` set and >= 0
    (``terminating``), BestEffort QoS, ``spec.priorityClassName`` (``""``: none) and
    cross-namespace pod affinity."""

    terminating: bool
    best_effort: bool
    priority_class: str
    cross_namespace_affinity: bool


def scope_requirements(spec: dict[str, Any]) -> tuple[ScopeRequirement, ...]:
    """A ResourceQuota ``spec``'s scopes and scope selector as requirements."""
    plain = [ScopeRequirement(scope=str(s)) for s in spec.get("scopes") or []]
    selector = (spec.get("scopeSelector") or {}).get("matchExpressions") or []
    return (
        *plain,
        *(
            ScopeRequirement(
                scope=str(e.get("scopeName", "")),
                operator=str(e.get("operator", "")),
                values=tuple(str(v) for v in e.get("values") or []),
            )
            for e in selector
        ),
    )


def _cross_namespace(affinity: dict[str, Any]) -> bool:
    for kind in ("podAffinity", "podAntiAffinity"):
        rules = affinity.get(kind) or {}
        terms = list(rules.get("requiredDuringSchedulingIgnoredDuringExecution") or [])
        terms += [
            (w.get("podAffinityTerm") or {})
            for w in rules.get("preferredDuringSchedulingIgnoredDuringExecution") or []
        ]
        if any(t.get("namespaceSelector") is not None or t.get("namespaces") for t in terms):
            return True
    return False


def pod_scope(pod: dict[str, Any], *, best_effort: bool) -> PodScope:
    """The :class:`PodScope` of a Pod object; ``best_effort`` is its QoS as the caller
    computed it (the stored ``status.qosClass``, or ``False`` for a copy whose container gets a
    LimitRange memory default)."""
    spec = pod.get("spec") or {}
    deadline = spec.get("activeDeadlineSeconds")
    return PodScope(
        terminating=isinstance(deadline, int) and deadline >= 0,
        best_effort=best_effort,
        priority_class=str(spec.get("priorityClassName") or ""),
        cross_namespace_affinity=_cross_namespace(spec.get("affinity") or {}),
    )


def _matches(req: ScopeRequirement, pod: PodScope) -> bool:
    simple = {
        "Terminating": pod.terminating,
        "NotTerminating": not pod.terminating,
        "BestEffort": pod.best_effort,
        "NotBestEffort": not pod.best_effort,
        "CrossNamespacePodAffinity": pod.cross_namespace_affinity,
    }
    if req.scope in simple:
        return simple[req.scope]
    if req.scope != "PriorityClass":
        return False
    if req.operator == "Exists":
        return pod.priority_class != ""
    if req.operator == "In":
        return pod.priority_class in req.values
    if req.operator == "NotIn":
        return pod.priority_class not in req.values
    return False  # DoesNotExist: the label set always has the key


def quota_matches(requirements: Sequence[ScopeRequirement], pod: PodScope) -> bool:
    """Whether a quota with these scopes counts ``pod`` (no scope: every pod)."""
    return all(_matches(r, pod) for r in requirements)
