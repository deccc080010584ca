"""PodDisruptionBudget JSON (policy/v1, as the API returns it) into a plain :class:`Budget`.

Which pods a budget selects is decided as the eviction handler decides it (kubernetes
pkg/registry/core/pod/storage/eviction.go ``getPodDisruptionBudgets``, v1.35): budgets of the
pod's own namespace whose ``spec.selector``, read by apimachinery's ``LabelSelectorAsSelector``,
matches the pod's labels. There, a missing selector matches nothing, an empty one (``{}``)
matches every pod of the namespace (policy/v1; v1beta1's "empty matches nothing" is gone from
the handler), and a selector that does not parse (an unknown operator, ``In`` without values,
``Exists`` with some) matches nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ALWAYS_ALLOW", "Budget", "budget_of"]

JSON = dict[str, Any]
#: ``spec.unhealthyPodEvictionPolicy``: a pod that is not Ready may be evicted whatever the
#: budget says. The other value, ``IfHealthyBudget``, is the default (the field unset).
ALWAYS_ALLOW = "AlwaysAllow"


@dataclass(frozen=True, slots=True, kw_only=True)
class Budget:
    """One PodDisruptionBudget: its ``spec.selector`` (``None``: none), ``metadata.generation``,
    ``spec.unhealthyPodEvictionPolicy`` (``""`` when unset: ``IfHealthyBudget``) and the
    status the disruption controller writes (pkg/controller/disruption/disruption.go
    ``updatePdbStatus``): ``observedGeneration``, ``disruptionsAllowed``, ``currentHealthy``,
    ``desiredHealthy`` (pod counts) and ``disrupted_pods``, the number of entries of
    ``disruptedPods`` (evictions approved and not yet seen by the controller). A budget the
    controller never synced has a zero status, as the API serves it."""

    namespace: str
    name: str
    selector: Mapping[str, Any] | None
    generation: int
    observed_generation: int
    disruptions_allowed: int
    current_healthy: int
    desired_healthy: int
    disrupted_pods: int
    unhealthy_pod_eviction_policy: str

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def stale(self) -> bool:
        """``status.observedGeneration < metadata.generation``: the spec changed since the
        controller last computed the status, and the eviction API answers 429 ("still being
        processed", ``checkAndDecrement``) to any eviction that reaches this budget."""
        return self.observed_generation < self.generation

    def selects(self, *, namespace: str, labels: Mapping[str, str]) -> bool:
        """Whether this budget covers a pod of ``namespace`` with ``labels``."""
        return namespace == self.namespace and _matches(self.selector, labels)


def budget_of(pdb: JSON) -> Budget:
    """A :class:`Budget` from a PodDisruptionBudget object (missing numbers read as 0, as the
    API's zero values)."""
    meta, spec, status = pdb.get("metadata", {}), pdb.get("spec", {}), pdb.get("status") or {}
    return Budget(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        selector=spec.get("selector"),
        generation=int(meta.get("generation") or 0),
        observed_generation=int(status.get("observedGeneration") or 0),
        disruptions_allowed=int(status.get("disruptionsAllowed") or 0),
        current_healthy=int(status.get("currentHealthy") or 0),
        desired_healthy=int(status.get("desiredHealthy") or 0),
        disrupted_pods=len(status.get("disruptedPods") or {}),
        unhealthy_pod_eviction_policy=str(spec.get("unhealthyPodEvictionPolicy") or ""),
    )


def _matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """apimachinery ``LabelSelectorAsSelector(selector).Matches(labels)``; an invalid selector
    matches nothing (the eviction handler skips it)."""
    if selector is None:
        return False  # labels.Nothing()
    match_labels: Mapping[str, str] = selector.get("matchLabels") or {}
    expressions: list[Mapping[str, Any]] = selector.get("matchExpressions") or []
    if not all(labels.get(k) == v for k, v in match_labels.items()):
        return False
    for expr in expressions:
        key, op, values = expr.get("key", ""), expr.get("operator"), expr.get("values") or []
        if op in ("In", "NotIn") and not values:
            return False
        if op in ("Exists", "DoesNotExist") and values:
            return False
        if op == "In":
            ok = key in labels and labels[key] in values
        elif op == "NotIn":
            ok = key not in labels or labels[key] not in values
        elif op == "Exists":
            ok = key in labels
        elif op == "DoesNotExist":
            ok = key not in labels
        else:
            return False  # not a valid operator
        if not ok:
            return False
    return True
