"""The remediator's workers: at most ``concurrency`` runbooks at once, and a stop that lets a
step under way finish.

Each worker takes a journal key from the queue and runs it (:meth:`Steps.handle
<nodeguard.remediation.steps.Steps.handle>`). The stop is the one of the module docstring of
:mod:`nodeguard.remediation.worker`: nothing new starts, a step under way may finish within the
grace, and what is cut short stays in the journal with an audit line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from nodeguard.actions.context import Env
from nodeguard.logs import AUDIT
from nodeguard.remediation.endings import Endings
from nodeguard.remediation.journal import Journal
from nodeguard.remediation.waits import Waits

__all__ = ["Workers"]

# The remediator's log lines keep the one logger name they had before it was split in modules.
log = logging.getLogger("nodeguard.remediation.worker")


class Workers:
    """``concurrency`` workers taking keys from ``waits``' queue and running each with
    ``handle(key)`` while it is in ``journal``; a bug raised by ``handle`` ends the runbook as
    failed (``endings``). ``env``'s auditor flushes the Events an earlier process kept."""

    def __init__(
        self,
        *,
        env: Env,
        journal: Journal,
        waits: Waits,
        endings: Endings,
        handle: Callable[[str], Awaitable[object]],
        concurrency: int,
    ) -> None:
        self._env, self._journal, self._waits, self._endings = env, journal, waits, endings
        self._handle, self._concurrency = handle, concurrency
        # Set by run(): once set, no step starts (the one under way may finish).
        self._stop: asyncio.Event | None = None
        # The entry each busy worker handles (for the audit line of a step cut short).
        self._handling: dict[asyncio.Task[Any], str] = {}
        #: Runbooks a worker is running now.
        self.in_flight = 0

    @property
    def stopping(self) -> bool:
        """Whether :meth:`run` was told to stop: no step starts any more."""
        return self._stop is not None and self._stop.is_set()

    async def run(self, *, stop: asyncio.Event, grace: float | None) -> None:
        """Run the workers until ``stop`` is set. Then nothing new starts: idle workers and
        waiting firings end at once, and a step under way may finish (its API calls answered,
        its Events written) for ``grace`` seconds (``None``: until this task is cancelled, as
        the agent does after ``--shutdown.timeout``); what is still under way then is
        cancelled, with an audit line. What is queued or under way stays in the journal, for
        the next start."""
        self._stop = stop
        # Events an earlier process kept for a later try (its last calls timed out): now,
        # beside the workers (an API server that is away does not hold them up).
        self._waits.spawn(self._env.auditor.flush(), name="events-flush")
        waiting = self._waits.tasks
        workers = [
            asyncio.create_task(self._worker(), name=f"remediator-{i}")
            for i in range(self._concurrency)
        ]
        try:
            await stop.wait()
            busy = set(self._handling)
            for w in [*waiting, *(w for w in workers if w not in busy)]:
                w.cancel()
            if busy:
                await asyncio.wait(busy, timeout=grace)
        finally:
            for w in [*workers, *waiting]:
                w.cancel()
            for w in [*workers, *waiting]:
                with contextlib.suppress(asyncio.CancelledError):
                    await w
            self._journal.state.save()

    async def _worker(self) -> None:
        queue = self._waits.queue
        while not self.stopping:
            key = await queue.get()
            if self.stopping:
                queue.task_done()  # taken as the stop came: the journal keeps it
                return
            self.in_flight += 1
            task = asyncio.current_task()
            assert task is not None
            self._handling[task] = key
            try:
                if self._journal.running(key):
                    await self._handle(key)
            except asyncio.CancelledError:
                self._cut_short(key)
                raise
            except Exception:
                # A bug in an action: record the entry as failed rather than retry it forever.
                log.exception("remediation %s failed", key)
                self._endings.internal_error(key)
            finally:
                self._handling.pop(task, None)
                self.in_flight -= 1
                queue.task_done()

    def _cut_short(self, key: str) -> None:
        """The audit line of a step cancelled under way (the stop's grace is over, or the
        process is going down): its journal entry stays, for the next start."""
        entry, firing = self._journal.entries.get(key), self._journal.firings.get(key)
        if entry is None or firing is None:
            return
        index = min(int(entry.get("next", 0)), len(firing.steps) - 1)
        log.warning(
            "%s (%s): step %d (%s) cut short by the stop; it stays in the journal and is "
            "finished at the next start",
            key,
            firing.rule,
            index + 1,
            firing.steps[index].action,
            extra=AUDIT,
        )
