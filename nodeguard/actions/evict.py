"""Evicting ranked victims through the policy/v1 Eviction subresource, never DELETE.

The plan comes from :func:`nodeguard.actions.ranking.plan_eviction`. Units are evicted in order
until the target memory is freed (the units' working sets on this node add up to it), within a
per-node limit of evictions per window. A 429 from a PodDisruptionBudget means "later": the unit
gets a capped exponential backoff and is skipped until it expires (an Event says so), and the
next unit is tried; nodeguard never falls back to DELETE. A gang's members elsewhere in the
cluster (same trial, job or PodGroup) are evicted with it.

Dry run sends the same Eviction requests with ``dryRun=All``: the API server runs the same
PodDisruptionBudget check and deletes nothing, so the dry-run plan and its blocks are the real
ones.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nodeguard.actions.audit import Auditor, ObjectRef
from nodeguard.actions.base import ActionResult, Outcome
from nodeguard.actions.ranking import EvictionPlan, Unit, gang_of, never_evicted
from nodeguard.kube.client import KubeClient
from nodeguard.kube.errors import KubeError, NotFound, ServerError, TooManyRequests
from nodeguard.kube.objects import pod_meta
from nodeguard.snapshot import PodMeta

__all__ = ["EvictionBackoff", "EvictionLimiter", "evict"]

Clock = Callable[[], float]


@dataclass(slots=True, kw_only=True)
class EvictionBackoff:
    """Per unit: after the n-th refusal wait ``min(base * 2**(n-1), cap)`` seconds."""

    base: float = 10.0
    cap: float = 300.0
    clock: Clock = time.monotonic
    _state: dict[str, tuple[int, float]] = field(default_factory=dict)

    def until(self, key: str) -> float | None:
        """When the unit may be tried again (clock time), ``None`` if now."""
        state = self._state.get(key)
        if state is None or state[1] <= self.clock():
            return None
        return float(state[1])

    def refused(self, key: str, *, retry_after: float | None = None) -> float:
        """Record a refusal; the delay before the next try, in seconds."""
        count = self._state.get(key, (0, 0.0))[0] + 1
        delay: float = min(self.base * 2.0 ** (count - 1), self.cap)
        if retry_after is not None:
            delay = min(max(delay, retry_after), self.cap)
        self._state[key] = (count, self.clock() + delay)
        return delay

    def succeeded(self, key: str) -> None:
        self._state.pop(key, None)


@dataclass(slots=True, kw_only=True)
class EvictionLimiter:
    """At most ``max_units`` units evicted per node per ``window`` seconds."""

    max_units: int = 5
    window: float = 600.0
    clock: Clock = time.monotonic
    _times: dict[str, deque[float]] = field(default_factory=dict)

    def allows(self, node: str) -> bool:
        times = self._times.setdefault(node, deque())
        while times and times[0] <= self.clock() - self.window:
            times.popleft()
        return len(times) < self.max_units

    def record(self, node: str) -> None:
        self._times.setdefault(node, deque()).append(self.clock())


async def _members(kube: KubeClient, unit: Unit) -> list[PodMeta]:
    """Every live pod of the unit, cluster-wide for a gang: the namespace's pods (by label where
    the gang has one) whose gang is this one."""
    if unit.kind == "pod":
        return list(unit.pods)
    items, _ = await kube.list_pods(namespace=unit.namespace, label_selector=unit.label_selector())
    found = {
        m.uid: m
        for m in (pod_meta(p) for p in items)
        if not m.terminating and gang_of(m) == (unit.kind, unit.name)
    }
    found.update({p.uid: p for p in unit.pods})
    return sorted(found.values(), key=lambda m: (m.node_name, m.name))


def _refusal(exc: KubeError) -> str | None:
    """Why the API refuses an eviction for now: a PodDisruptionBudget (429), or two budgets
    covering one pod (the API answers 500 and never evicts it until that is fixed)."""
    if isinstance(exc, TooManyRequests):
        return f"PodDisruptionBudget: {exc}" if exc.disruption_budget else f"429: {exc}"
    if isinstance(exc, ServerError) and "more than one PodDisruptionBudget" in str(exc):
        return f"more than one PodDisruptionBudget covers the pod: {exc}"
    return None


def _pod_ref(pod: PodMeta | None, namespace: str, name: str) -> ObjectRef:
    return ObjectRef(kind="Pod", name=name, namespace=namespace, uid=pod.uid if pod else "")


async def evict(
    *,
    kube: KubeClient,
    auditor: Auditor,
    node: str,
    plan: EvictionPlan,
    target_bytes: int,
    rule: str,
    dry_run: bool,
    limiter: EvictionLimiter,
    backoff: EvictionBackoff,
) -> ActionResult:
    """Evict units of ``plan`` in order until ``target_bytes`` are freed (0: just the first).
    With a target, units whose working set is unknown are skipped, never evicted blind.

    Outcomes: done (at least one unit evicted, or would be); blocked (every candidate refused
    by a PodDisruptionBudget or in backoff); refused (the per-node limit is spent); noop (no
    candidate); failed (an API error stopped it: what was evicted stays evicted, and the next
    try skips it because it is terminating).
    """
    verb = "would evict" if dry_run else "evicted"
    freed = 0
    done_units: list[dict[str, Any]] = []
    blocked: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    outcome: Outcome | None = None
    message = ""
    by_name = {(p.namespace, p.name): p for u, _ in plan.ranked for p in u.pods}
    for unit, why in plan.ranked:
        if done_units and freed >= target_bytes:
            break
        if not limiter.allows(node):
            outcome, message = (
                "refused",
                f"eviction limit reached ({limiter.max_units} per {limiter.window:.0f}s on {node})",
            )
            break
        if target_bytes > 0 and not unit.usage_known:
            # Without a working set the target cannot be measured: never evict blind.
            skipped.append({"unit": unit.key, "reason": "working set unknown"})
            continue
        wait_until = backoff.until(unit.key)
        if wait_until is not None:
            blocked.append(
                {
                    "unit": unit.key,
                    "reason": "in backoff after a PodDisruptionBudget refusal",
                    "retry_in_seconds": round(wait_until - backoff.clock(), 1),
                }
            )
            continue
        try:
            members = await _members(kube, unit)
            never = [(m, r) for m in members if (r := never_evicted(m))]
            if never:
                m, r = never[0]
                blocked.append(
                    {
                        "unit": unit.key,
                        "pod": f"{m.namespace}/{m.name}",
                        "reason": f"a member may not be evicted: {r}",
                    }
                )
                continue
            # Ask first (dryRun=All) for every member of a gang, so a budget that refuses one
            # member leaves the whole gang running rather than half of it dead.
            checks = members if (dry_run or len(members) > 1) else []
            refused = None
            for m in checks:
                try:
                    await kube.evict_pod(name=m.name, namespace=m.namespace, dry_run=True)
                except NotFound:
                    continue
                except KubeError as exc:
                    if (why_not := _refusal(exc)) is None:
                        raise
                    refused = (m, why_not, getattr(exc, "retry_after", None))
                    break
            evicted: list[str] = []
            if refused is None and not dry_run:
                for m in members:
                    try:
                        await kube.evict_pod(name=m.name, namespace=m.namespace, dry_run=False)
                    except NotFound:
                        continue  # gone meanwhile: nothing to do
                    except KubeError as exc:
                        if (why_not := _refusal(exc)) is None:
                            raise
                        refused = (m, why_not, getattr(exc, "retry_after", None))
                        break
                    evicted.append(f"{m.namespace}/{m.name}")
            elif refused is None:
                evicted = [f"{m.namespace}/{m.name}" for m in members]
            for pod_name in evicted:
                namespace, name = pod_name.split("/", 1)
                res = ActionResult(
                    action="evict",
                    node=node,
                    dry_run=dry_run,
                    outcome="done",
                    message=f"{verb} {pod_name} from {node} for rule {rule}: {why}",
                )
                await auditor.record(
                    result=res,
                    obj=_pod_ref(by_name.get((namespace, name)), namespace, name),
                    reason="NodeguardEvicted",
                    event_type="Warning",
                )
            if refused is not None:
                m, why_not, retry_after = refused
                delay = (
                    backoff.refused(unit.key, retry_after=retry_after)
                    if not dry_run
                    else backoff.base
                )
                blocked.append(
                    {
                        "unit": unit.key,
                        "pod": f"{m.namespace}/{m.name}",
                        "reason": why_not,
                        "retry_in_seconds": delay,
                        "partial": bool(evicted),
                    }
                )
                res = ActionResult(
                    action="evict",
                    node=node,
                    dry_run=dry_run,
                    outcome="blocked",
                    message=f"eviction of {m.namespace}/{m.name} refused "
                    f"({why_not}); retrying in {delay:.0f}s, never by DELETE"
                    + (f"; already evicted: {', '.join(evicted)}" if evicted else ""),
                )
                await auditor.record(
                    result=res,
                    obj=_pod_ref(m, m.namespace, m.name),
                    reason="NodeguardEvictionBlocked",
                    event_type="Warning",
                )
            if evicted:
                if not dry_run:
                    limiter.record(node)
                    if refused is None:
                        backoff.succeeded(unit.key)
                if refused is None:  # a half-evicted gang is not counted as freed memory
                    freed += unit.usage_bytes
                done_units.append(
                    {
                        "unit": unit.key,
                        "pods": evicted,
                        "usage_bytes": unit.usage_bytes,
                        "why": why,
                        "partial": refused is not None,
                    }
                )
        except KubeError as exc:
            outcome = "failed"
            message = f"eviction stopped by an API error: {type(exc).__name__}: {exc}"
            break

    if outcome is None:
        if done_units:
            outcome = "done"
        elif blocked:
            outcome = "blocked"
        else:
            outcome = "noop"
    if not message:
        names = ", ".join(u["unit"] for u in done_units) or "nothing"
        message = (
            f"{verb} {len(done_units)} unit(s) ({names}), {freed} B of memory "
            f"(target {target_bytes} B); {len(blocked)} blocked"
        )
        if skipped:
            message += f"; {len(skipped)} skipped: working set unknown"
    return ActionResult(
        action="evict",
        node=node,
        dry_run=dry_run,
        outcome=outcome,
        message=message,
        details={
            "evicted": done_units,
            "blocked": blocked,
            "skipped": skipped,
            "freed_bytes": freed,
            "target_bytes": target_bytes,
        },
    )
