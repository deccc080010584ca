"""The parts of ``nodeguard run`` that act, for :func:`nodeguard.agent.build.build`: the
connection to the cluster, what every action is given (:class:`~nodeguard.actions.context.Env`),
the webhook receiver, the node's Lease (:class:`~nodeguard.remediation.actor.NodeActor`), the
delivery claims and the remediator, each built from
:class:`~nodeguard.agent.config.AgentConfig` and the parts made before it; nothing here runs.

One part is used before it is made: the remediator takes the webhook's claims through the
receiver and asks the Lease whether this agent acts, so the receiver's way into it and the
Lease's mirror of its journal go through :class:`PendingRemediator`, which reaches it once it is
made (before anything runs).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from nodeguard.actions.audit import Auditor
from nodeguard.actions.context import Env
from nodeguard.actions.limits import EvictionBackoff, EvictionLimiter
from nodeguard.agent.config import AgentConfig
from nodeguard.agent.posture import NodePosture
from nodeguard.alerts.claims import AlertClaims
from nodeguard.alerts.webhook import AlertDedupe, WebhookReceiver
from nodeguard.firing import Firing
from nodeguard.kube.client import KubeClient
from nodeguard.kube.config import cluster_named
from nodeguard.kube.watch import PodWatcher
from nodeguard.remediation.actor import ClaimantWatch, NodeActor, claimant_alive
from nodeguard.remediation.incidents import IncidentStore
from nodeguard.remediation.worker import Remediator
from nodeguard.rules.engine import RuleEngine
from nodeguard.rules.load import RuleSource
from nodeguard.sampling.sampler import Sampler
from nodeguard.statefile import StateFile

__all__ = [
    "Cluster",
    "Feedback",
    "PendingRemediator",
    "connect",
    "make_actor",
    "make_claims",
    "make_env",
    "make_receiver",
    "make_remediator",
    "state_id",
]

# The log lines of the agent's build keep the one logger name they had before it was split.
log = logging.getLogger("nodeguard")


class Cluster(NamedTuple):
    """The Kubernetes API, this node's pod watch and the doctor's views it keeps."""

    kube: KubeClient
    pods: PodWatcher
    posture: NodePosture


def connect(cfg: AgentConfig) -> Cluster | None:
    """The API client and this node's pod watch, the config found as every command finds it
    (:func:`nodeguard.kube.config.cluster_named`, without ``~/.kube/config``: ``--kubeconfig``,
    ``$KUBECONFIG``, the pod's ServiceAccount); ``None`` without any (logged: the agent samples
    and exports, and acts on nothing in the cluster)."""
    if not cluster_named(kubeconfig=cfg.kubeconfig, home=False):
        log.info("no --kubeconfig, no $KUBECONFIG and not in a pod: running without a cluster")
        return None
    kube = KubeClient.load(kubeconfig=cfg.kubeconfig)
    posture = NodePosture()
    # The doctor's views are kept only when something evaluates them.
    watcher = PodWatcher(
        kube=kube,
        node_name=cfg.sampler.node_name,
        listener=posture if cfg.posture_interval > 0 else None,
    )
    return Cluster(kube=kube, pods=watcher, posture=posture)


def make_env(
    *,
    cfg: AgentConfig,
    state: StateFile,
    cluster: Cluster | None,
    sampler: Sampler,
    auditor: Auditor,
) -> Env:
    """What every action is given: the API (``None`` without a cluster), the auditor, the
    node's eviction limits and backoff kept in ``state`` (durations on its clock, so a step of
    the wall clock moves no window), the pod watch's sync and the latest snapshot."""
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


def make_receiver(
    *,
    cfg: AgentConfig,
    state: StateFile,
    source: RuleSource | None,
    sampler: Sampler,
    dedupe: AlertDedupe,
    submit: Callable[[Firing], bool],
) -> WebhookReceiver:
    """``POST /webhook/alertmanager`` for this node: the alert rules of ``source``'s files as
    they are now, each firing handed to ``submit`` (False: the queue refused it), deliveries
    remembered in ``dedupe``."""
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


def state_id(state: StateFile) -> str:
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


def make_actor(
    *, cfg: AgentConfig, kube: KubeClient, env: Env, state: StateFile, journal: Callable[[], Any]
) -> NodeActor:
    """The node's Lease (``leaseDurationSeconds``: ``--actor.lease-duration``, at least 1),
    mirroring ``journal()`` and the node's eviction times on it; the API client writes only
    while it is held (its fence)."""
    node = cfg.sampler.node_name
    actor = NodeActor(
        kube=kube,
        node=node,
        namespace=cfg.actor_namespace,
        identity=env.identity,
        duration=max(1, cfg.actor_lease_seconds),
        dry_run=cfg.dry_run,
        state_id=state_id(state),
        mirror=lambda: {"journal": journal(), "evictions": list(env.limiter.store.get(node, []))},
    )
    kube.fence = actor.fence
    return actor


def make_claims(*, cfg: AgentConfig, kube: KubeClient, identity: str) -> AlertClaims:
    """The delivery claims on the Node for ``<node>/<identity>``, a claimant being alive while
    its Lease is (:func:`~nodeguard.remediation.actor.claimant_alive`)."""
    watch = ClaimantWatch()

    async def alive(claimant: str) -> bool:
        return await claimant_alive(
            kube=kube, namespace=cfg.actor_namespace, claimant=claimant, watch=watch
        )

    return AlertClaims(kube=kube, claimant=f"{cfg.sampler.node_name}/{identity}", alive=alive)


class PendingRemediator:
    """The remediator for the parts made before it (module docstring)."""

    made: Remediator | None = None

    def submit(self, firing: Firing) -> bool:
        assert self.made is not None  # made in build, before anything runs
        return self.made.submit(firing)

    def journal(self) -> dict[str, Any]:
        assert self.made is not None
        return self.made.journal


@dataclass(frozen=True, slots=True)
class Feedback:
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


def make_remediator(
    *,
    cfg: AgentConfig,
    env: Env,
    state: StateFile,
    incidents: IncidentStore,
    feedback: Feedback,
    receiver: WebhookReceiver,
    claims: AlertClaims | None,
    actor: NodeActor | None,
) -> Remediator:
    """The remediator, its journal not yet restored; with a cluster (``claims`` and ``actor``)
    it claims each alert's delivery before its first step, marks it done or gives it back, and
    asks the Lease who acts."""

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


def _holder(actor: NodeActor) -> Callable[[], str | None]:
    """Who acts for the node when this agent does not (``None``: this agent does)."""

    def holder() -> str | None:
        if actor.is_actor():
            return None
        if actor.state == "observer" and actor.holder:
            return actor.holder
        return "no one confirmed: this agent's Lease is not renewed (the API server is silent)"

    return holder
