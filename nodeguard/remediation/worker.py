"""The remediator: an asyncio worker pool over a bounded queue of firings.

Local rule firings and Alertmanager alerts take this one path. The sampler and the web server
only ever enqueue (``submit`` never waits): a slow action — an API server timing out, a
PodDisruptionBudget backoff — never blocks sampling or ``/metrics``. A full queue refuses the
firing (the caller counts it and, for Alertmanager, answers 503 so it retries). Each firing's
actions run in order; its incident record and the result feedback (``on_done``) follow.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from nodeguard.actions.base import ActionResult
from nodeguard.remediation.incidents import IncidentStore, incident_id
from nodeguard.remediation.runbook import Runbook
from nodeguard.rules.engine import Firing

__all__ = ["Remediator"]

log = logging.getLogger(__name__)

Done = Callable[[Firing, list[ActionResult]], None]


class Remediator:
    """Runs firings' actions with at most ``concurrency`` firings at once.

    ``global_dry_run`` always wins over a firing's own setting (a rule can only add dry run).
    ``on_done(firing, results)`` is called after each firing (the rule engine's feedback).
    ``counts`` holds ``(rule, outcome)`` counters of action results.
    """

    def __init__(
        self,
        *,
        runbook: Runbook,
        incidents: IncidentStore,
        global_dry_run: bool,
        queue_size: int = 64,
        concurrency: int = 2,
        on_done: Done | None = None,
    ) -> None:
        self.runbook = runbook
        self.incidents = incidents
        self.global_dry_run = global_dry_run
        self.queue: asyncio.Queue[Firing] = asyncio.Queue(maxsize=queue_size)
        self.concurrency = concurrency
        self.on_done = on_done
        self.in_flight = 0
        self.completed = 0

    def submit(self, firing: Firing) -> bool:
        """Queue a firing without waiting; False when the queue is full."""
        try:
            self.queue.put_nowait(firing)
        except asyncio.QueueFull:
            log.error(
                "remediation queue full (%d): dropping %s %s on %s",
                self.queue.maxsize,
                firing.kind,
                firing.rule,
                firing.target,
            )
            return False
        return True

    async def handle(self, firing: Firing) -> list[ActionResult]:
        """Run one firing now: its actions in order, then the incident record."""
        dry = self.global_dry_run or firing.dry_run
        note = f"incident {incident_id(firing)}: {firing.summary}"
        log.warning(
            "%s %s%s",
            "resolving" if firing.kind == "resolved" else "acting on",
            firing.summary,
            " (dry run)" if dry else "",
        )
        results: list[ActionResult] = []
        for spec in firing.actions:
            results += await self.runbook.run(spec, firing=firing, dry_run=dry, note=note)
        self.incidents.write(firing=firing, results=results, dry_run=dry)
        return results

    async def _worker(self) -> None:
        while True:
            firing = await self.queue.get()
            self.in_flight += 1
            try:
                results = await self.handle(firing)
            except Exception:
                log.exception("remediation of %s failed", firing.rule)
                results = []
            finally:
                self.in_flight -= 1
                self.completed += 1
                self.queue.task_done()
            if self.on_done is not None:
                try:
                    self.on_done(firing, results)
                except Exception:
                    log.exception("remediation feedback for %s failed", firing.rule)

    async def run(self, *, stop: asyncio.Event) -> None:
        """Run the workers until ``stop`` is set; firings still queued then are dropped."""
        workers = [
            asyncio.create_task(self._worker(), name=f"remediator-{i}")
            for i in range(self.concurrency)
        ]
        await stop.wait()
        for w in workers:
            w.cancel()
        for w in workers:
            with contextlib.suppress(asyncio.CancelledError):
                await w

    @staticmethod
    def now() -> float:
        return time.time()
