"""After a restart: which runbooks cut short resume, and which undos the cluster says are owed.

Two sources of truth meet here. The state file's journal says which runbooks were under way
(:class:`~nodeguard.remediation.worker.Remediator`); :func:`resume_check` decides, on the first
sample, whether a local rule's runbook still applies: its rule is unchanged (same digest) and
its condition still holds on its target. The cluster says what nodeguard did that an undo is
owed for: a node cordoned by a rule (annotation ``nodeguard.io/cordon-rule``) and experiments
paused by ``<node>/<rule>`` (their pause quota's annotation). :func:`adopt_from_cluster` marks
such rules as firing, so their resolve still runs when they clear, even when the state file
was lost or set aside.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from nodeguard.actions.cordon import cordoned_by_rule
from nodeguard.actions.katib import paused_experiments
from nodeguard.firing import Firing
from nodeguard.kube.client import KubeClient
from nodeguard.kube.errors import KubeError
from nodeguard.remediation.worker import Check
from nodeguard.rules.engine import RuleEngine, rule_digest
from nodeguard.snapshot import NodeSnapshot

__all__ = ["adopt_from_cluster", "resume_check"]

log = logging.getLogger(__name__)


def resume_check(engine: RuleEngine) -> Check:
    """The check :meth:`~nodeguard.remediation.worker.Remediator.resume` applies to a local
    rule's firing: ``None`` to resume, else why it is abandoned."""

    def check(firing: Firing, snapshot: NodeSnapshot | None) -> str | None:
        rule = engine.rule(firing.rule)
        if rule is None:
            return f"rule {firing.rule} is no longer in the rule files"
        if firing.rule_digest and rule_digest(rule) != firing.rule_digest:
            return f"rule {firing.rule} was changed since it fired"
        if snapshot is None:
            return "no sample to check its condition on"
        holds = engine.holds(rule=firing.rule, target=firing.target, snapshot=snapshot)
        if holds is None:
            return f"its target {firing.target} is gone"
        if not holds:
            return "its condition no longer holds (" + " and ".join(str(c) for c in rule.when) + ")"
        return None

    return check


async def adopt_from_cluster(
    *, kube: KubeClient, engine: RuleEngine, node: str, stop: asyncio.Event, attempts: int = 5
) -> list[str]:
    """Mark as firing each node rule whose undo the cluster shows is owed on ``node`` (its
    cordon, its Katib pauses); the rules adopted. The API server may be down at start: tried
    ``attempts`` times with backoff, then given up with a warning."""
    delay = 2.0
    for attempt in range(attempts):
        try:
            return await _adopt(kube=kube, engine=engine, node=node)
        except KubeError as exc:
            if attempt == attempts - 1:
                log.warning("cannot look for undos owed on %s (%s): not adopted", node, exc)
                return []
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=delay)
        if stop.is_set():
            return []
        delay = min(delay * 2, 60.0)
    return []


async def _adopt(*, kube: KubeClient, engine: RuleEngine, node: str) -> list[str]:
    rules = [r for r in engine.rules if r.scope == "node" and r.resolve]
    if not rules:
        return []
    adopted = []
    current = await kube.get_node(name=node)
    cordon_rule = cordoned_by_rule(current)
    for rule in rules:
        undo = {a.action for a in rule.resolve}
        owed = "uncordon" in undo and cordon_rule == rule.name
        if not owed and "resume_katib" in undo:
            owed = bool(await paused_experiments(kube, by=f"{node}/{rule.name}"))
        if owed and engine.adopt(rule=rule.name, target=node):
            adopted.append(rule.name)
    if adopted:
        log.warning(
            "the cluster shows undos owed by rule(s) %s on %s: they resolve when they clear",
            ", ".join(adopted),
            node,
        )
    return adopted
