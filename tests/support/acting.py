"""Running one action the way the agent and ``nodeguard act`` do: through the registry's
dispatch (its Events, log line and metric included), against the test control plane."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from nodeguard.actions import registry
from nodeguard.actions.audit import ActionMetrics, Auditor
from nodeguard.actions.base import ActionResult
from nodeguard.actions.context import Call, Env
from nodeguard.actions.evict import evict
from nodeguard.actions.limits import EvictionBackoff, EvictionLimiter
from nodeguard.actions.ranking import EvictionPlan
from nodeguard.firing import Firing, Source, Step
from nodeguard.kube.client import KubeClient
from nodeguard.snapshot import NodeSnapshot


def env_for(kube: KubeClient | None, node: str, **kw: Any) -> Env:
    """An agent's means on ``node`` (fresh limits unless given)."""
    auditor = Auditor(kube=kube, node_name=node, metrics=ActionMetrics(registry=None))
    return Env(kube=kube, auditor=auditor, node=node, **kw)


async def run_action(
    *,
    env: Env,
    node: str,
    action: str,
    args: Mapping[str, Any] | None = None,
    dry_run: bool = False,
    rule: str = "manual",
    source: Source = "act",
    scope: str = "node",
    target: str | None = None,
    pod_uid: str | None = None,
    snapshot: NodeSnapshot | None = None,
    kind: str = "firing",
) -> list[ActionResult]:
    """Dispatch one step of a firing of ``rule`` about ``node``."""
    step = Step(action=action, args=registry.get(action).parse(args))
    firing = Firing(
        rule=rule,
        kind="resolved" if kind == "resolved" else "firing",
        scope=scope,
        target=target or node,
        node=node,
        time=time.time(),
        steps=(step,),
        dry_run=dry_run,
        source=source,
        pod_uid=pod_uid,
        summary=f"test of {action}",
        snapshot=snapshot,
    )
    call = Call(env=env, firing=firing, dry_run=dry_run, note=f"test ({rule})")
    return await registry.dispatch(call, step)


async def evict_plan(
    kube: KubeClient,
    node: str,
    plan: EvictionPlan,
    *,
    target: int = 0,
    dry_run: bool = False,
    rule: str = "r",
    limiter: EvictionLimiter | None = None,
    backoff: EvictionBackoff | None = None,
) -> ActionResult:
    """:func:`nodeguard.actions.evict.evict` of ``plan`` on ``node`` until ``target`` bytes are
    freed (0: the first unit only), straight, not through the registry: fresh limits and
    backoff unless given (a test that tries again passes the same ones)."""
    return await evict(
        kube=kube,
        node=node,
        plan=plan,
        target_bytes=target,
        rule=rule,
        dry_run=dry_run,
        limiter=EvictionLimiter() if limiter is None else limiter,
        backoff=EvictionBackoff() if backoff is None else backoff,
    )
