"""Every part of ``nodeguard run``, built from :class:`~nodeguard.agent.config.AgentConfig`
before anything runs: :func:`build` returns them as one :class:`Agent`.

The order is the flow's, from the bottom: the state file, the cluster, the sampler; the rule
engine and what every action is given (:class:`~nodeguard.actions.context.Env`); the webhook
receiver; with a cluster, the node's Lease (:class:`~nodeguard.remediation.actor.NodeActor`)
and the delivery claims; the remediator, which restores its journal; the kernel
notifications; what each snapshot decides (:class:`~nodeguard.agent.decide.Decisions`); the
metrics registry and the web application. The parts that act (the cluster, the actions'
``Env``, the receiver, the Lease, the claims, the remediator) are built by
:mod:`nodeguard.agent.acting`, which says how the remediator is used before it is made.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CollectorRegistry

from nodeguard.actions.audit import ActionMetrics, Auditor
from nodeguard.agent.acting import (
    Cluster,
    Feedback,
    PendingRemediator,
    connect,
    make_actor,
    make_claims,
    make_env,
    make_receiver,
    make_remediator,
)
from nodeguard.agent.config import STATE_FILE, AgentConfig
from nodeguard.agent.decide import Decisions, levels
from nodeguard.agent.posture import PostureCollector
from nodeguard.alerts.metrics import NodeInfoCollector, WebhookCollector
from nodeguard.alerts.webhook import AlertDedupe
from nodeguard.connections import ConnectionGuard, ConnectionsCollector
from nodeguard.remediation.actor import ActorCollector, NodeActor
from nodeguard.remediation.incidents import IncidentStore
from nodeguard.remediation.metrics import RemediationCollector, StateCollector
from nodeguard.remediation.oom_incidents import OomIncidents
from nodeguard.remediation.timeline import Timeline, TimelineCollector
from nodeguard.remediation.trial_memory import TrialMemory, TrialMemoryCollector, trial_writer
from nodeguard.remediation.worker import Remediator
from nodeguard.rules.engine import RuleEngine
from nodeguard.rules.load import RuleSource
from nodeguard.sampling.focus import FocusCollector, Notifications
from nodeguard.sampling.sampler import Sampler
from nodeguard.server import make_app
from nodeguard.state_clock import read_boot_id
from nodeguard.statefile import StateFile

__all__ = ["Agent", "build"]

log = logging.getLogger("nodeguard")


@dataclass(frozen=True, slots=True, kw_only=True)
class Agent:
    """The parts of ``nodeguard run``, built and wired, none of them running yet.
    ``cluster`` and ``actor`` are ``None`` without a cluster, ``source`` without rule files,
    ``notifications`` with every kernel notification turned off."""

    cfg: AgentConfig
    state: StateFile
    source: RuleSource | None
    cluster: Cluster | None
    sampler: Sampler
    engine: RuleEngine
    remediator: Remediator
    actor: NodeActor | None
    notifications: Notifications | None
    decisions: Decisions
    guard: ConnectionGuard
    app: web.Application


def build(cfg: AgentConfig) -> Agent | None:
    """Every part of the agent (module docstring); ``None`` when another agent holds the
    state directory (logged)."""
    node = cfg.sampler.node_name
    state_dir = cfg.sampler.paths.state
    try:
        state = StateFile(path=state_dir / STATE_FILE if state_dir else None, node=node)
    except RuntimeError as exc:  # another agent holds the state directory
        log.error("%s", exc)
        return None
    source = RuleSource(paths=list(cfg.rules)) if cfg.rules else None
    cluster = connect(cfg)
    kube = cluster.kube if cluster else None
    sampler = Sampler(config=cfg.sampler, cluster=cluster.pods if cluster else None)
    registry = CollectorRegistry(auto_describe=True)
    auditor = Auditor(
        kube=kube,
        node_name=node,
        metrics=ActionMetrics(registry=registry),
        store=state.section("events"),
        changed=state.save,
    )
    timeline = Timeline()
    incidents = IncidentStore(
        directory=cfg.incidents_dir, keep=cfg.incidents_keep, timeline=timeline
    )
    oom = OomIncidents(
        store=incidents,
        timeline=timeline,
        node=node,
        boot_id=read_boot_id(),
        recorded=state.section("oom_incidents"),
        changed=state.save,
    )
    registry.register(TimelineCollector(timeline=timeline))
    trials = TrialMemory(
        node=node,
        state=state.section("trial_memory"),
        changed=state.save,
        write=trial_writer(kube) if kube is not None else None,
    )
    registry.register(TrialMemoryCollector(trials=trials))
    # Durations on the state's clock: a step of the wall clock moves no cooldown or window.
    engine = RuleEngine(rules=source.current.rules if source else (), state=state, clock=state.now)
    env = make_env(cfg=cfg, state=state, cluster=cluster, sampler=sampler, auditor=auditor)
    if state.recovered is not None:
        # What was done just before is unknown: act less, never more.
        engine.assume_recent(now=state.now())
        env.limiter.exhaust(node)
    dedupe = AlertDedupe(clock=state.now, store=state.section("alerts"), changed=state.save)
    later = PendingRemediator()
    receiver = make_receiver(
        cfg=cfg, state=state, source=source, sampler=sampler, dedupe=dedupe, submit=later.submit
    )
    actor: NodeActor | None = None
    if kube is not None:
        actor = lease = make_actor(cfg=cfg, kube=kube, env=env, state=state, journal=later.journal)
        # Refused only where another agent is known to hold the node: with the API server down
        # a delivery is queued, and waits in the journal until this agent holds it again.
        receiver.set_acting(lambda: lease.state != "observer")
    claims = make_claims(cfg=cfg, kube=kube, identity=env.identity) if kube is not None else None
    remediator = later.made = make_remediator(
        cfg=cfg,
        env=env,
        state=state,
        incidents=incidents,
        feedback=Feedback(engine=engine, dedupe=dedupe, clock=state.now),
        receiver=receiver,
        claims=claims,
        actor=actor,
    )
    remediator.restore()
    for rule, target in engine.busy_targets():
        if (rule, target) not in remediator.restored_targets():
            # Marked under way, but no runbook in the journal (saved apart): nothing to wait for.
            engine.release(rule=rule, target=target)
    if source is not None:
        registry.register(RemediationCollector(engine=engine, source=source, remediator=remediator))
    if actor is not None:
        registry.register(ActorCollector(actor=actor))
    if cluster is not None and cfg.posture_interval > 0:
        registry.register(PostureCollector(posture=cluster.posture))
    notifications = (
        Notifications(
            sampler=sampler,
            config=cfg.notify,
            levels=levels(engine, focus_share=cfg.sampler.focus_share),
            procfs=str(cfg.sampler.paths.procfs),
        )
        if cfg.notify.any
        else None
    )
    if notifications is not None:
        sampler.add_statuses(notifications.statuses)
    registry.register(FocusCollector(sampler=sampler, notifications=notifications))
    decisions = Decisions(
        engine=engine,
        source=source,
        remediator=remediator,
        actor=actor,
        env=env,
        state=state,
        sampler=sampler,
        notifications=notifications,
        dry_run=cfg.dry_run,
        oom=oom,
        trials=trials,
    )
    sampler.add_listener(decisions)
    registry.register(WebhookCollector(receiver=receiver))
    registry.register(StateCollector(state=state))
    registry.register(NodeInfoCollector(node_name=node))
    guard = ConnectionGuard(limits=cfg.limits)
    registry.register(ConnectionsCollector(guard=guard))
    app = make_app(
        sampler=sampler,
        registry=registry,
        incidents=incidents,
        webhook=receiver.handle,
        max_body=cfg.webhook_max_body,
        guard=guard,
        metric_filter=cfg.metric_filter,
    )
    return Agent(
        cfg=cfg,
        state=state,
        source=source,
        cluster=cluster,
        sampler=sampler,
        engine=engine,
        remediator=remediator,
        actor=actor,
        notifications=notifications,
        decisions=decisions,
        guard=guard,
        app=app,
    )
