"""Every part of ``nodeguard run``, built from :class:`~nodeguard.agent.config.AgentConfig`
before anything runs: :func:`build` returns them as one :class:`Agent`.

The order is the flow's, from the bottom: the state file, the cluster, the sampler; the rule
engine and what every action is given (:class:`~nodeguard.actions.context.Env`); the webhook
receiver; with a cluster, the node's Lease (:class:`~nodeguard.remediation.actor.NodeActor`)
and the delivery claims; the remediator, which restores its journal; the kernel
notifications; what each snapshot decides (:class:`~nodeguard.agent.decide.Decisions`); the
metrics registry and the web application.

One part is used before it is made: the remediator takes the webhook's claims through the
receiver and asks the Lease whether this agent acts, so the receiver's way into it and the
Lease's mirror of its journal go through :class:`_Remediator`, which reaches it once it is made
(before anything runs).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from aiohttp import web
from prometheus_client import CollectorRegistry

from nodeguard.actions.audit import ActionMetrics, Auditor
from nodeguard.actions.context import Env
from nodeguard.actions.limits import EvictionBackoff, EvictionLimiter
from nodeguard.agent.config import STATE_FILE, AgentConfig
from nodeguard.agent.decide import Decisions, levels
from nodeguard.alerts.claims import AlertClaims
from nodeguard.alerts.metrics import NodeInfoCollector, WebhookCollector
from nodeguard.alerts.webhook import AlertDedupe, WebhookReceiver
from nodeguard.connections import ConnectionGuard, ConnectionsCollector
from nodeguard.firing import Firing
from nodeguard.kube.client import KubeClient
from nodeguard.kube.config import cluster_named
from nodeguard.kube.watch import PodWatcher
from nodeguard.remediation.actor import ActorCollector, ClaimantWatch, NodeActor, claimant_alive
from nodeguard.remediation.incidents import IncidentStore
from nodeguard.remediation.metrics import RemediationCollector, StateCollector
from nodeguard.remediation.worker import Remediator
from nodeguard.rules.engine import RuleEngine
from nodeguard.rules.load import RuleSource
from nodeguard.sampling.focus import FocusCollector, Notifications
from nodeguard.sampling.sampler import Sampler
from nodeguard.server import make_app
from nodeguard.statefile import StateFile

__all__ = ["Agent", "Cluster", "build"]

log = logging.getLogger("nodeguard")


class Cluster(NamedTuple):
    """The Kubernetes API and this node's pod watch."""

    kube: KubeClient
    pods: PodWatcher


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


def _cluster(cfg: AgentConfig) -> Cluster | None:
    if not cluster_named(kubeconfig=cfg.kubeconfig, home=False):
        log.info("no --kubeconfig, no $KUBECONFIG and not in a pod: running without a cluster")
        return None
    kube = KubeClient.load(kubeconfig=cfg.kubeconfig)
    return Cluster(kube=kube, pods=PodWatcher(kube=kube, node_name=cfg.sampler.node_name))


def _state_id(state: StateFile) -> str:
    """What tells this agent's state apart from another's on the node Lease: the state
    directory's device and inode, kept across restarts and a corrupt state file alike (so an
    agent restarted on its own state takes its Lease at once, and adopts nothing); two agents
    with their own ``--path.state`` (other hostPaths, even under the same path in their
    containers) differ. Without a state file: unique to this process."""
    if state.path is not None:
        try:
            st = state.path.parent.stat()
        except OSError:
            pass
        else:
            return f"{st.st_dev}:{st.st_ino}"
    return uuid.uuid4().hex


class _Remediator:
    """The remediator for the parts made before it (module docstring)."""

    made: Remediator | None = None

    def submit(self, firing: Firing) -> bool:
        assert self.made is not None  # made in build, before anything runs
        return self.made.submit(firing)

    def journal(self) -> dict[str, Any]:
        assert self.made is not None
        return self.made.journal


@dataclass(frozen=True, slots=True)
class _Feedback:
    """What the remediator tells the rule engine and the webhook's dedupe about a runbook."""

    engine: RuleEngine
    dedupe: AlertDedupe
    clock: Callable[[], float]

    def done(self, firing: Firing, _results: list[dict[str, Any]], applied: bool) -> None:
        if firing.source == "local":
            self.engine.finished(firing, at=self.clock(), applied=applied)

    def unplanned(self, firing: Firing, changed: bool) -> None:
        # Nothing was planned: no cooldown, the rule fires again; an alert's re-sent copy acts.
        if firing.source == "local":
            self.engine.unplanned(firing, changed=changed)
        elif firing.key:
            self.dedupe.forget(firing.key)


def _holder(actor: NodeActor) -> Callable[[], str | None]:
    """Who acts for the node when this agent does not (``None``: this agent does)."""

    def holder() -> str | None:
        if actor.is_actor():
            return None
        if actor.state == "observer" and actor.holder:
            return actor.holder
        return "no one confirmed: this agent's Lease is not renewed (the API server is silent)"

    return holder


def _claims(cfg: AgentConfig, *, kube: KubeClient, identity: str) -> AlertClaims:
    """The delivery claims on the Node, a claimant being alive while its Lease is."""
    watch = ClaimantWatch()

    async def alive(claimant: str) -> bool:
        return await claimant_alive(
            kube=kube, namespace=cfg.actor_namespace, claimant=claimant, watch=watch
        )

    return AlertClaims(kube=kube, claimant=f"{cfg.sampler.node_name}/{identity}", alive=alive)


def _env(
    cfg: AgentConfig,
    *,
    state: StateFile,
    cluster: Cluster | None,
    sampler: Sampler,
    auditor: Auditor,
) -> Env:
    """What every action is given; durations on the state's clock."""
    return Env(
        kube=cluster.kube if cluster else None,
        auditor=auditor,
        node=cfg.sampler.node_name,
        cordon=cfg.cordon,
        limiter=EvictionLimiter(
            max_units=cfg.evictions_per_window,
            window=cfg.eviction_window,
            clock=state.now,
            store=state.section("evictions"),
            changed=state.save,
        ),
        backoff=EvictionBackoff(
            clock=state.now, store=state.section("backoff"), changed=state.save
        ),
        # An eviction plans on the snapshot's pods: it waits for the watch's first LIST.
        pods_synced=cluster.pods.is_synced if cluster else None,
        latest=lambda: sampler.latest,
    )


def _receiver(
    cfg: AgentConfig,
    *,
    state: StateFile,
    source: RuleSource | None,
    sampler: Sampler,
    dedupe: AlertDedupe,
    submit: Callable[[Firing], bool],
) -> WebhookReceiver:
    return WebhookReceiver(
        node_name=cfg.sampler.node_name,
        rules=lambda: source.current.alerts if source else (),
        submit=submit,
        latest=lambda: sampler.latest,
        global_dry_run=cfg.dry_run,
        token=cfg.webhook_token,
        node_label=cfg.webhook_node_label,
        dedupe=dedupe,
        unauthenticated=cfg.webhook_unauthenticated,
        body_timeout=cfg.limits.body_timeout,
        state=state,
    )


def _actor(
    cfg: AgentConfig, *, kube: KubeClient, env: Env, state: StateFile, journal: Callable[[], Any]
) -> NodeActor:
    """The node's Lease; the API client writes only while it is held (its fence)."""
    node = cfg.sampler.node_name
    actor = NodeActor(
        kube=kube,
        node=node,
        namespace=cfg.actor_namespace,
        identity=env.identity,
        duration=max(1, cfg.actor_lease_seconds),
        dry_run=cfg.dry_run,
        state_id=_state_id(state),
        mirror=lambda: {"journal": journal(), "evictions": list(env.limiter.store.get(node, []))},
    )
    kube.fence = actor.fence
    return actor


def _remediator(
    cfg: AgentConfig,
    *,
    env: Env,
    state: StateFile,
    incidents: IncidentStore,
    feedback: _Feedback,
    receiver: WebhookReceiver,
    claims: AlertClaims | None,
    actor: NodeActor | None,
) -> Remediator:
    async def claim_done(firing: Firing) -> None:
        if claims is not None:
            await claims.finish(node=firing.node, key=firing.key)

    return Remediator(
        env=env,
        incidents=incidents,
        global_dry_run=cfg.dry_run,
        state=state,
        queue_size=cfg.queue_size,
        concurrency=cfg.concurrency,
        on_done=feedback.done,
        on_unplanned=feedback.unplanned,
        pods_wait=cfg.pods_wait(),
        claim=receiver.claimer(claims) if claims is not None else None,
        acting=_holder(actor) if actor is not None else None,
        claim_done=claim_done,
        claim_release=(
            (lambda f: claims.release(node=f.node, key=f.key)) if claims is not None else None
        ),
    )


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
    cluster = _cluster(cfg)
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
    incidents = IncidentStore(directory=cfg.incidents_dir, keep=cfg.incidents_keep)
    # Durations on the state's clock: a step of the wall clock moves no cooldown or window.
    engine = RuleEngine(rules=source.current.rules if source else (), state=state, clock=state.now)
    env = _env(cfg, state=state, cluster=cluster, sampler=sampler, auditor=auditor)
    if state.recovered is not None:
        # What was done just before is unknown: act less, never more.
        engine.assume_recent(now=state.now())
        env.limiter.exhaust(node)
    dedupe = AlertDedupe(clock=state.now, store=state.section("alerts"), changed=state.save)
    later = _Remediator()
    receiver = _receiver(
        cfg, state=state, source=source, sampler=sampler, dedupe=dedupe, submit=later.submit
    )
    actor: NodeActor | None = None
    if kube is not None:
        actor = lease = _actor(cfg, kube=kube, env=env, state=state, journal=later.journal)
        # Refused only where another agent is known to hold the node: with the API server down
        # a delivery is queued, and waits in the journal until this agent holds it again.
        receiver.set_acting(lambda: lease.state != "observer")
    claims = _claims(cfg, kube=kube, identity=env.identity) if kube is not None else None
    remediator = later.made = _remediator(
        cfg,
        env=env,
        state=state,
        incidents=incidents,
        feedback=_Feedback(engine=engine, dedupe=dedupe, clock=state.now),
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
