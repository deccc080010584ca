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
from nodeguard.actions.ranking import EvictionPlan, Unit
from nodeguard.kube.client import KubeClient
from nodeguard.kube.errors import KubeError, NotFound, TooManyRequests
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


async def _members(kube: KubeClient, unit: Unit) -> list[tuple[str, str]]:
    """``(namespace, name)`` of every live pod of the unit, cluster-wide for a gang."""
    names = {(p.namespace, p.name) for p in unit.pods}
    selector = unit.label_selector()
    if selector:
        items, _ = await kube.list_pods(namespace=unit.namespace, label_selector=selector)
        names |= {
            (unit.namespace, p["metadata"]["name"])
            for p in items
            if not p["metadata"].get("deletionTimestamp")
        }
    return sorted(names)


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
            evicted: list[str] = []
            for namespace, name in members:
                pod = by_name.get((namespace, name))
                try:
                    await kube.evict_pod(name=name, namespace=namespace, dry_run=dry_run)
                except NotFound:
                    continue  # gone meanwhile: nothing to do
                except TooManyRequests as exc:
                    delay = backoff.refused(unit.key, retry_after=exc.retry_after)
                    blocked.append(
                        {
                            "unit": unit.key,
                            "pod": f"{namespace}/{name}",
                            "reason": str(exc),
                            "retry_in_seconds": delay,
                        }
                    )
                    res = ActionResult(
                        action="evict",
                        node=node,
                        dry_run=dry_run,
                        outcome="blocked",
                        message=f"eviction of {namespace}/{name} refused "
                        f"({'PodDisruptionBudget' if exc.disruption_budget else '429'}): "
                        f"{exc}; retrying in {delay:.0f}s, never by DELETE",
                    )
                    await auditor.record(
                        result=res,
                        obj=_pod_ref(pod, namespace, name),
                        reason="NodeguardEvictionBlocked",
                        event_type="Warning",
                    )
                    break
                evicted.append(f"{namespace}/{name}")
                res = ActionResult(
                    action="evict",
                    node=node,
                    dry_run=dry_run,
                    outcome="done",
                    message=f"{verb} {namespace}/{name} from {node} for rule {rule}: {why}",
                )
                await auditor.record(
                    result=res,
                    obj=_pod_ref(pod, namespace, name),
                    reason="NodeguardEvicted",
                    event_type="Warning",
                )
            else:
                backoff.succeeded(unit.key)
                limiter.record(node)
                freed += unit.usage_bytes
                done_units.append(
                    {"unit": unit.key, "pods": evicted, "usage_bytes": unit.usage_bytes, "why": why}
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
            f"{verb} {len(done_units)} unit(s) ({names}), {freed} B of working set "
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
