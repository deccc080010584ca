"""``nodeguard run`` serving: listen, handle signals, run the tasks until SIGTERM or SIGINT,
and shut down within ``--shutdown.timeout``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from typing import Any

from aiohttp import web

from nodeguard import __version__
from nodeguard.agent.build import Agent
from nodeguard.logs import AUDIT, report_dropped
from nodeguard.remediation.recovery import adopt_from_cluster

__all__ = ["serve"]

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


def _handle_signals(agent: Agent, stop: asyncio.Event) -> None:
    """SIGINT and SIGTERM stop; SIGHUP has the rule files read at the next sample."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    def on_hup() -> None:
        agent.decisions.request_reload()
        log.info("SIGHUP: rules reload at the next sample")

    loop.add_signal_handler(signal.SIGHUP, on_hup)


def _say_started(agent: Agent) -> None:
    """The webhook's warnings, then the first line: what the agent runs with."""
    cfg, source = agent.cfg, agent.source
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
    alerts = source.current.alerts if source else ()
    log.info(
        "nodeguard %s serving on %s:%d node=%s interval=%.3gs focus=%s notify=%s dry_run=%s "
        "cluster=%s rules=%d alert_rules=%d state=%s max_connections=%d",
        __version__,
        cfg.host or "*",
        cfg.port,
        cfg.sampler.node_name,
        cfg.sampler.interval,
        f"{cfg.sampler.focus_interval:.3g}s" if cfg.sampler.focus_interval else "off",
        ",".join(cfg.notify.flags_on()) or "off",
        cfg.dry_run,
        "yes" if agent.cluster else "no",
        len(agent.engine.rules),
        len(alerts),
        agent.state.path or "memory",
        cfg.limits.max_connections,
    )


def _tasks(agent: Agent, stop: asyncio.Event) -> list[asyncio.Task[Any]]:
    """The sampler and the remediator; with a cluster, the Lease, the pod watch, the search
    of the cluster objects for undos the state file lost, and the doctor's node checks."""
    tasks: list[asyncio.Task[Any]] = [
        asyncio.create_task(agent.sampler.run(stop=stop), name="sampler"),
        asyncio.create_task(agent.remediator.run(stop=stop), name="remediator"),
    ]
    if agent.actor is not None:
        tasks.append(asyncio.create_task(agent.actor.run(stop=stop), name="actor"))
    cluster = agent.cluster
    if cluster is not None:
        tasks.append(asyncio.create_task(cluster.pods.run(stop=stop), name="pod-watch"))
        adopt = adopt_from_cluster(
            kube=cluster.kube, engine=agent.engine, node=agent.cfg.sampler.node_name, stop=stop
        )
        tasks.append(asyncio.create_task(adopt, name="adopt"))
        if agent.cfg.posture_interval > 0:
            posture = cluster.posture.run(stop=stop, interval=agent.cfg.posture_interval)
            tasks.append(asyncio.create_task(posture, name="posture"))
    return tasks


async def serve(agent: Agent) -> int:
    """Listen, run the tasks until SIGTERM/SIGINT, shut down; the exit status (2: cannot
    listen)."""
    cfg = agent.cfg
    # Bodies are never decompressed by aiohttp: the webhook does it within its bounds, so a
    # body that is not what its Content-Encoding says is a 400, not an error in aiohttp.
    runner = web.AppRunner(
        agent.app, access_log=None, keepalive_timeout=cfg.limits.idle_timeout, auto_decompress=False
    )
    await runner.setup()
    assert runner.server is not None  # set up just above
    try:
        listener = await agent.guard.listen(server=runner.server, host=cfg.host, port=cfg.port)
    except (OSError, OverflowError) as exc:
        await runner.cleanup()
        log.error("cannot listen on %s:%d: %s", cfg.host or "*", cfg.port, exc)
        return 2
    stop = asyncio.Event()
    _handle_signals(agent, stop)
    _say_started(agent)
    if agent.notifications is not None:
        agent.notifications.start()
    try:
        await _until_stopped(_tasks(agent, stop), stop=stop, timeout=cfg.shutdown_timeout)
    finally:
        if agent.notifications is not None:
            agent.notifications.close()
        agent.sampler.close()
        agent.state.close()
        agent.decisions.close()
        listener.close()
        await runner.cleanup()
        if agent.cluster is not None:
            agent.cluster.kube.close()
    report_dropped()  # what the rate limiter still holds is said before the last line
    log.info("nodeguard stopped")
    return 0
