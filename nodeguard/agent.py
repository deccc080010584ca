"""``nodeguard run``: the agent's tasks wired together.

One sampler task builds a snapshot every interval; after each, the rule engine evaluates it and
its firings go to the remediator's queue (never awaited). The pod watch (with a cluster) keeps
pod metadata current; the web server serves the latest snapshot, within the bounds of
:mod:`nodeguard.connections`. Rule files reload when they change (checked every sample, read and
parsed in a thread of their own) and on SIGHUP; SIGTERM and SIGINT stop everything.

At start the remediation state (``<path.state>/remediation-state.json``) is read: the engine's
firing state, cooldowns and caps, the eviction limits, the webhook's handled deliveries and the
journal of runbooks under way (:mod:`nodeguard.remediation.recovery` decides, on the first
sample, which of those resume); with a cluster, undos the state file lost are found on the
cluster objects.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import logging
import os
import signal
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from nodeguard import __version__
from nodeguard.actions.audit import ActionMetrics, Auditor
from nodeguard.actions.context import Env
from nodeguard.actions.cordon import CordonConfig
from nodeguard.actions.limits import EvictionBackoff, EvictionLimiter
from nodeguard.alerts.claims import AlertClaims
from nodeguard.alerts.metrics import NodeInfoCollector, WebhookCollector
from nodeguard.alerts.webhook import AlertDedupe, WebhookReceiver
from nodeguard.connections import ConnectionGuard, ConnectionLimits, ConnectionsCollector
from nodeguard.exposition.metric_filter import MetricFilter
from nodeguard.firing import Firing
from nodeguard.kube.client import REQUEST_TIMEOUT_SECONDS, KubeClient
from nodeguard.kube.watch import PodWatcher
from nodeguard.logs import AUDIT, report_dropped
from nodeguard.remediation.actor import (
    ActorCollector,
    ClaimantWatch,
    NodeActor,
    claimant_alive,
)
from nodeguard.remediation.incidents import IncidentStore
from nodeguard.remediation.metrics import RemediationCollector, StateCollector
from nodeguard.remediation.recovery import adopt_from_cluster, resume_check
from nodeguard.remediation.worker import Remediator
from nodeguard.rules.engine import RuleEngine
from nodeguard.rules.load import RuleSource
from nodeguard.sampling.focus import FocusCollector, Notifications, NotifyConfig, threshold_levels
from nodeguard.sampling.sampler import Sampler, SamplerConfig
from nodeguard.server import make_app
from nodeguard.snapshot import NodeSnapshot
from nodeguard.statefile import StateFile

__all__ = ["AgentConfig", "run_agent"]

log = logging.getLogger("nodeguard")


async def _until_stopped(
    tasks: list[asyncio.Task[Any]], *, stop: asyncio.Event, timeout: float
) -> None:
    """Run ``tasks`` until ``stop`` is set (SIGTERM), then give them ``timeout`` seconds to
    end; the ones still running then (inside an API call the API server does not answer) are
    cancelled, said in an audit line. A task that fails before ``stop`` raises here. The
    remediator's journal holds what is under way whatever the moment (it is written ahead),
    so the next start resumes it: the kubelet's SIGKILL at the end of the grace period would
    lose nothing more, but an agent that overstays it is killed with no last word."""
    gathered: asyncio.Future[Any] = asyncio.gather(*tasks)
    stopping: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({gathered, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if gathered.done():
            gathered.result()
            return
        done, pending = await asyncio.wait(tasks, timeout=timeout)
        if pending:
            log.warning(
                "stopping: %s still waiting after %.0fs (the API server does not answer): "
                "cancelled; what is under way stays in the journal for the next start",
                ", ".join(sorted(t.get_name() for t in pending)),
                timeout,
                extra=AUDIT,
            )
            for task in pending:
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
    finally:
        stopping.cancel()
        if not gathered.done():
            gathered.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await gathered


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentConfig:
    """Everything ``nodeguard run`` was told. ``host=None`` listens on every address."""

    sampler: SamplerConfig
    host: str | None
    port: int
    dry_run: bool
    kubeconfig: Path | None
    rules: tuple[Path, ...] = ()
    incidents_dir: Path | None = None
    incidents_keep: int = 200
    cordon: CordonConfig = field(default_factory=CordonConfig)
    actor_namespace: str = "kube-system"
    actor_lease_seconds: int = 30
    evictions_per_window: int = 5
    eviction_window: float = 600.0
    concurrency: int = 2
    queue_size: int = 64
    webhook_token: str | None = None
    webhook_unauthenticated: bool = False
    webhook_node_label: str = "node"
    webhook_max_body: int = 1 << 20
    limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    metric_filter: MetricFilter = field(default_factory=MetricFilter)
    notify: NotifyConfig = field(default_factory=NotifyConfig)
    #: Seconds after SIGTERM to wait for the tasks before cancelling them (``--shutdown.timeout``).
    shutdown_timeout: float = 20.0
    pod_list_wait: float | None = None

    def pods_wait(self) -> float:
        """How long a step that plans from pods (an eviction) waits for this node's pod list
        and a sample that names the cgroups from it, seconds: ``pod_list_wait``, by default two
        sampling intervals and one API call's timeout (the watch's first LIST)."""
        if self.pod_list_wait is not None:
            return self.pod_list_wait
        return 2 * self.sampler.interval + REQUEST_TIMEOUT_SECONDS


STATE_FILE = "remediation-state.json"


def _cluster(cfg: AgentConfig) -> tuple[KubeClient, PodWatcher] | None:
    if cfg.kubeconfig is None and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        log.info("no --kubeconfig and not in a pod: running without a cluster")
        return None
    kube = KubeClient.load(kubeconfig=cfg.kubeconfig)
    return kube, PodWatcher(kube=kube, node_name=cfg.sampler.node_name)


def _loopback(host: str | None) -> bool:
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


async def _adopt(*, kube: KubeClient, engine: RuleEngine, node: str, stop: asyncio.Event) -> None:
    await adopt_from_cluster(kube=kube, engine=engine, node=node, stop=stop)


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


async def run_agent(cfg: AgentConfig) -> int:
    """Run until SIGTERM/SIGINT; the exit status."""
    if cfg.webhook_unauthenticated and cfg.webhook_token is None and not _loopback(cfg.host):
        log.error(
            "--webhook.allow-unauthenticated takes deliveries from anyone who reaches the port: "
            "only with --listen-address on loopback (127.0.0.1:PORT), not %s",
            cfg.host or "every address",
        )
        return 2
    node = cfg.sampler.node_name
    state_dir = cfg.sampler.paths.state
    try:
        state = StateFile(path=state_dir / STATE_FILE if state_dir else None, node=node)
    except RuntimeError as exc:  # another agent holds the state directory
        log.error("%s", exc)
        return 1
    source = RuleSource(paths=list(cfg.rules)) if cfg.rules else None
    cluster = _cluster(cfg)
    kube = cluster[0] if cluster else None
    sampler = Sampler(config=cfg.sampler, cluster=cluster[1] if cluster else None)
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
    env = Env(
        kube=kube,
        auditor=auditor,
        node=node,
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
        pods_synced=cluster[1].is_synced if cluster else None,
        latest=lambda: sampler.latest,
    )
    if state.recovered is not None:
        # What was done just before is unknown: act less, never more.
        engine.assume_recent(now=state.now())
        env.limiter.exhaust(node)

    def feedback(firing: Firing, _results: list[dict[str, Any]], applied: bool) -> None:
        if firing.source == "local":
            engine.finished(firing, at=state.now(), applied=applied)

    def unplanned(firing: Firing, changed: bool) -> None:
        # Nothing was planned: no cooldown, the rule fires again; an alert's re-sent copy acts.
        if firing.source == "local":
            engine.unplanned(firing, changed=changed)
        elif firing.key:
            dedupe.forget(firing.key)

    dedupe = AlertDedupe(clock=state.now, store=state.section("alerts"), changed=state.save)

    def submit(firing: Firing) -> bool:  # the remediator is made below, with the claimer
        return remediator.submit(firing)

    receiver = WebhookReceiver(
        node_name=node,
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
    actor: NodeActor | None = None
    if kube is not None:
        state_id = _state_id(state)
        actor = NodeActor(
            kube=kube,
            node=node,
            namespace=cfg.actor_namespace,
            identity=env.identity,
            duration=max(1, cfg.actor_lease_seconds),
            dry_run=cfg.dry_run,
            state_id=state_id,
            mirror=lambda: {
                "journal": remediator.journal,
                "evictions": list(env.limiter.store.get(node, [])),
            },
        )
        kube.fence = actor.fence
        # Refused only where another agent is known to hold the node: with the API server down
        # a delivery is queued, and waits in the journal until this agent holds it again.
        receiver.set_acting(lambda: actor is None or actor.state != "observer")

    def holder() -> str | None:
        if actor is None or actor.is_actor():
            return None
        if actor.state == "observer" and actor.holder:
            return actor.holder
        return "no one confirmed: this agent's Lease is not renewed (the API server is silent)"

    watch = ClaimantWatch()

    async def alive(claimant: str) -> bool:
        assert kube is not None
        return await claimant_alive(
            kube=kube, namespace=cfg.actor_namespace, claimant=claimant, watch=watch
        )

    claims = (
        AlertClaims(kube=kube, claimant=f"{node}/{env.identity}", alive=alive)
        if kube is not None
        else None
    )

    async def claim_done(firing: Firing) -> None:
        if claims is not None:
            await claims.finish(node=firing.node, key=firing.key)

    remediator = Remediator(
        env=env,
        incidents=incidents,
        global_dry_run=cfg.dry_run,
        state=state,
        queue_size=cfg.queue_size,
        concurrency=cfg.concurrency,
        on_done=feedback,
        on_unplanned=unplanned,
        pods_wait=cfg.pods_wait(),
        claim=receiver.claimer(claims) if claims is not None else None,
        acting=holder if actor is not None else None,
        claim_done=claim_done,
        claim_release=(
            (lambda f: claims.release(node=f.node, key=f.key)) if claims is not None else None
        ),
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
    reload_requested = False
    first = True
    # Reading and parsing a rule file is bounded (nodeguard.rules.load) but takes up to a second
    # of CPU: off the event loop, in one thread so that two reloads never overlap.
    rules_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rules")
    loop = asyncio.get_running_loop()

    def levels() -> list[float]:
        conditions = [(c.signal, c.op, c.value) for r in engine.rules for c in r.when]
        return threshold_levels(conditions=conditions, focus=cfg.sampler.focus_share)

    notifications = (
        Notifications(
            sampler=sampler,
            config=cfg.notify,
            levels=levels(),
            procfs=str(cfg.sampler.paths.procfs),
        )
        if cfg.notify.any
        else None
    )
    if notifications is not None:
        sampler.add_statuses(notifications.statuses)
    registry.register(FocusCollector(sampler=sampler, notifications=notifications))

    async def evaluate(snapshot: NodeSnapshot) -> None:
        nonlocal reload_requested, first
        full = snapshot.focused is None
        if full:  # rule files are looked at every interval, not every focused sample
            force, reload_requested = reload_requested, False
            if source is not None and await loop.run_in_executor(
                rules_thread, functools.partial(source.maybe_reload, force=force)
            ):
                engine.set_rules(source.current.rules)
                if notifications is not None:
                    notifications.set_levels(levels())
            if notifications is not None:
                notifications.sync(snapshot)
                sampler.refresh_statuses()  # /metrics says what is registered now
        if first:
            # Runbooks cut short by the last stop resume (or are abandoned, with why) before
            # anything new is decided.
            first = False
            remediator.resume(snapshot=snapshot, check=resume_check(engine))
        if actor is not None and not actor.is_actor():
            return  # an observer decides nothing: the actor's engine does, once
        if actor is not None and actor.inherited is not None:
            inherit(actor, snapshot)
        for firing in engine.evaluate(snapshot, global_dry_run=cfg.dry_run):
            if not remediator.submit(firing):
                engine.dropped(firing, reason=remediator.refusal() or "queue_full")

    def inherit(actor: NodeActor, snapshot: NodeSnapshot) -> None:
        """Just took the node over from another agent: finish what it left under way."""
        got, actor.inherited = actor.inherited, None
        if got is None or got.same_state:
            return
        env.limiter.store[node] = sorted(
            {*map(float, env.limiter.store.get(node, [])), *got.evictions}
        )
        state.save()
        if got.lapsed:
            # It was cut off, not stopped: what it did after its last write is unknown.
            engine.assume_recent(now=time.time())
        for key in remediator.adopt(got.journal):
            firing = remediator.restored_firing(key)
            if firing is not None and firing.source == "local":
                engine.adopt(rule=firing.rule, target=firing.target)
        remediator.resume(snapshot=snapshot, check=resume_check(engine))

    sampler.add_listener(evaluate)
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
    # Bodies are never decompressed by aiohttp: the webhook does it within its bounds, so a
    # body that is not what its Content-Encoding says is a 400, not an error in aiohttp.
    runner = web.AppRunner(
        app, access_log=None, keepalive_timeout=cfg.limits.idle_timeout, auto_decompress=False
    )
    await runner.setup()
    assert runner.server is not None  # set up just above
    try:
        listener = await guard.listen(server=runner.server, host=cfg.host, port=cfg.port)
    except (OSError, OverflowError) as exc:
        await runner.cleanup()
        log.error("cannot listen on %s:%d: %s", cfg.host or "*", cfg.port, exc)
        return 2

    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    def on_hup() -> None:
        nonlocal reload_requested
        reload_requested = True
        log.info("SIGHUP: rules reload at the next sample")

    loop.add_signal_handler(signal.SIGHUP, on_hup)
    if cfg.webhook_token is None and cfg.webhook_unauthenticated:
        log.warning(
            "the Alertmanager webhook takes deliveries without a token: anyone who "
            "reaches port %d can make nodeguard act (set --webhook.token-file)",
            cfg.port,
        )
    elif cfg.webhook_token is None and source is not None and source.current.alerts:
        log.warning(
            "alert rules are loaded but the webhook is off: no --webhook.token-file",
        )
    rules = engine.rules
    alerts = source.current.alerts if source else ()
    log.info(
        "nodeguard %s serving on %s:%d node=%s interval=%.3gs focus=%s notify=%s dry_run=%s "
        "cluster=%s rules=%d alert_rules=%d state=%s max_connections=%d",
        __version__,
        cfg.host or "*",
        cfg.port,
        node,
        cfg.sampler.interval,
        f"{cfg.sampler.focus_interval:.3g}s" if cfg.sampler.focus_interval else "off",
        ",".join(cfg.notify.flags_on()) or "off",
        cfg.dry_run,
        "yes" if cluster else "no",
        len(rules),
        len(alerts),
        state.path or "memory",
        cfg.limits.max_connections,
    )
    if notifications is not None:
        notifications.start()
    tasks = [
        asyncio.create_task(sampler.run(stop=stop), name="sampler"),
        asyncio.create_task(remediator.run(stop=stop), name="remediator"),
    ]
    if actor is not None:
        tasks.append(asyncio.create_task(actor.run(stop=stop), name="actor"))
    if cluster is not None:
        tasks.append(asyncio.create_task(cluster[1].run(stop=stop), name="pod-watch"))
        tasks.append(
            asyncio.create_task(
                _adopt(kube=cluster[0], engine=engine, node=node, stop=stop), name="adopt"
            )
        )
    try:
        await _until_stopped(tasks, stop=stop, timeout=cfg.shutdown_timeout)
    finally:
        if notifications is not None:
            notifications.close()
        sampler.close()
        state.close()
        rules_thread.shutdown(wait=False)
        listener.close()
        await runner.cleanup()
        if kube is not None:
            kube.close()
    report_dropped()  # what the rate limiter still holds is said before the last line
    log.info("nodeguard stopped")
    return 0
