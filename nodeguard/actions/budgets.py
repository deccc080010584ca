"""A unit (a gang, or a lone pod) checked against its PodDisruptionBudgets as a whole.

The eviction API checks one pod at a time, and a dry run never writes its decrement of
``status.disruptionsAllowed`` (kubernetes pkg/registry/core/pod/storage/eviction.go v1.35,
``checkAndDecrement`` returns before ``UpdateStatus`` when ``dryRun``; descheduler#996). Asking
each member of a two-pod gang with ``dryRun=All`` under a budget that allows one disruption
passes twice, and the real run then evicts the first member and is refused on the second. So
the members are counted against every budget first, the way the handler would spend them:

- A member that is ``Pending``, finished (``Succeeded``/``Failed``) or terminating is evicted
  without a look at any budget (``canIgnorePDB``): it counts nowhere.
- A member that more than one budget selects is refused for good: the handler answers 500 "This
  pod has more than one PodDisruptionBudget, which the eviction subresource does not support".
- A member that is not Ready is evicted without a decrement when its budget says
  ``unhealthyPodEvictionPolicy: AlwaysAllow``, or (``IfHealthyBudget``, the default) when
  ``currentHealthy >= desiredHealthy`` and ``desiredHealthy > 0``; otherwise it counts.
- Every other member spends one of its budget's ``disruptionsAllowed``. A budget that members
  reach is refused whole when its status is stale (``observedGeneration < generation``: 429,
  "still being processed"), when ``disruptionsAllowed`` is negative or ``disruptedPods`` holds
  more than 2000 entries (403), or when it allows fewer disruptions than the members it counts.

The real API still decides each eviction (a budget can change between the check and the
eviction); this check only makes sure nodeguard never starts a gang a budget would cut short,
and that a dry run, which spends nothing on the server, says so where the real run would.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from nodeguard.kube.budgets import ALWAYS_ALLOW, Budget
from nodeguard.snapshot import PodMeta

__all__ = ["MAX_DISRUPTED_PODS", "STALE_RETRY_AFTER", "BudgetCheck", "Shortfall", "check_budgets"]

#: ``MaxDisruptedPodSize`` of the eviction handler: past it every eviction the budget covers is
#: refused (403) until the disruption controller catches up.
MAX_DISRUPTED_PODS = 2000
#: The Retry-After seconds the handler gives with its "still being processed" 429.
STALE_RETRY_AFTER = 10.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Shortfall:
    """Why a budget refuses the unit: ``budget`` (``namespace/name``; two of them, comma
    separated, for a pod under both), ``pod`` the first member concerned (``namespace/name``),
    ``reason`` in words ("budget NS/NAME allows N of M: why", N the disruptions it allows, M
    the members it counts), and ``retry_after`` seconds where the API would name them."""

    budget: str
    pod: str
    reason: str
    retry_after: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetCheck:
    """The unit's disruptions by budget (``namespace/name`` -> members it counts) and the first
    :class:`Shortfall`, ``None`` when every budget allows the unit."""

    needs: Mapping[str, int] = field(default_factory=dict)
    shortfall: Shortfall | None = None


def _ignores_budgets(pod: PodMeta) -> bool:
    """``canIgnorePDB``: Pending, Succeeded, Failed or terminating."""
    return pod.terminating or pod.finished or pod.phase == "Pending"


def _spends(pod: PodMeta, budget: Budget) -> bool:
    """Whether evicting ``pod`` (under ``budget`` alone) decrements the budget."""
    if pod.ready:
        return True
    if budget.unhealthy_pod_eviction_policy == ALWAYS_ALLOW:
        return False
    # IfHealthyBudget: the application is not disrupted now, so an unready pod goes for free.
    return not (budget.current_healthy >= budget.desired_healthy and budget.desired_healthy > 0)


def _ref(pod: PodMeta) -> str:
    return f"{pod.namespace}/{pod.name}"


def check_budgets(
    *, members: Sequence[PodMeta], budgets: Sequence[Budget], spent: Mapping[str, int]
) -> BudgetCheck:
    """Check every member of a unit (on every node) against ``budgets`` (those of the members'
    namespaces, as listed). ``spent``: disruptions by budget that this run already used and the
    server does not show (a dry run's, which it never writes). Pure; the rules are the module's.
    """
    needs: dict[str, int] = {}
    first: dict[str, str] = {}
    by_ref: dict[str, Budget] = {}
    for pod in members:
        if _ignores_budgets(pod):
            continue
        covering = [b for b in budgets if b.selects(namespace=pod.namespace, labels=pod.labels)]
        if len(covering) > 1:
            names = sorted(b.ref for b in covering)
            return BudgetCheck(
                needs=needs,
                shortfall=Shortfall(
                    budget=", ".join(names),
                    pod=_ref(pod),
                    reason=f"budgets {' and '.join(names)} both select {_ref(pod)}: the "
                    "eviction API refuses a pod under more than one PodDisruptionBudget (500) "
                    "until one of them goes",
                ),
            )
        if not covering or not _spends(pod, covering[0]):
            continue
        b = covering[0]
        by_ref[b.ref] = b
        needs[b.ref] = needs.get(b.ref, 0) + 1
        first.setdefault(b.ref, _ref(pod))
    for ref in sorted(needs):
        b, need = by_ref[ref], needs[ref]
        left = b.disruptions_allowed - spent.get(ref, 0)
        retry: float | None = None
        if b.stale:
            allowed, retry = 0, STALE_RETRY_AFTER
            why = (
                f"its status is stale (observedGeneration {b.observed_generation} < generation "
                f"{b.generation}): the eviction API answers 429 until the disruption "
                "controller has caught up"
            )
        elif b.disruptions_allowed < 0:
            allowed = 0
            why = "disruptionsAllowed is negative: the eviction API refuses (403)"
        elif b.disrupted_pods > MAX_DISRUPTED_PODS:
            allowed = 0
            why = (
                f"{b.disrupted_pods} evictions not yet confirmed by the disruption controller "
                f"(more than {MAX_DISRUPTED_PODS}): the eviction API refuses (403)"
            )
        elif left < need:
            allowed = max(left, 0)
            why = f"it needs {b.desired_healthy} healthy pods and has {b.current_healthy}"
            if spent.get(ref):
                why += f"; {spent[ref]} of its {b.disruptions_allowed} spent earlier in this run"
        else:
            continue
        return BudgetCheck(
            needs=needs,
            shortfall=Shortfall(
                budget=ref,
                pod=first[ref],
                reason=f"budget {ref} allows {allowed} of {need}: {why}",
                retry_after=retry,
            ),
        )
    return BudgetCheck(needs=needs)
