"""The remediator's queue, and the tasks that put a runbook back on it later.

A runbook that cannot go on now (a retry's backoff, a state file that cannot be written, a node
held by another agent, pods not listed yet) never holds a worker: its journal entry stays, and
a small task queues its key again when its time comes. :class:`Waits` keeps those tasks, so
that the remediator's stop cancels them all.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

__all__ = ["Timing", "Waits"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Timing:
    """How long the remediator tries and waits, in seconds.

    ``resume_window``: an alert's or a command's firing is resumed after a restart, and a
    transient failure retried, until this long after the firing was queued. ``retry_base`` ..
    ``retry_cap``: the capped exponential backoff of a retry (``retry_base`` is also the pause
    of a runbook waiting for the state file or for its node). ``pods_wait``: the longest a step
    that plans from pods waits for them, looking every ``pods_poll``.
    """

    resume_window: float
    retry_base: float
    retry_cap: float
    pods_wait: float
    pods_poll: float

    def backoff(self, attempts: int) -> float:
        """Seconds before try ``attempts + 1`` (``attempts`` >= 1 tries failed)."""
        return min(self.retry_base * 2.0 ** (attempts - 1), self.retry_cap)


class Waits:
    """The queue of journal keys the workers take, and the tasks that queue a key later.

    ``clock`` (seconds) and ``sleep`` are the remediator's (injectable for tests). Must be used
    inside a running event loop (the tasks are created on it).
    """

    def __init__(
        self, *, clock: Callable[[], float], sleep: Callable[[float], Awaitable[None]]
    ) -> None:
        self.queue: asyncio.Queue[str] = asyncio.Queue()
        #: The waits (and the Events flush) under way: cancelled by the remediator's stop.
        self.tasks: set[asyncio.Task[None]] = set()
        self._clock, self._sleep = clock, sleep

    def put(self, key: str) -> None:
        """Queue ``key`` now (the queue has no bound of its own: the remediator's is checked
        before a firing is journaled)."""
        self.queue.put_nowait(key)

    def spawn(self, coro: Coroutine[Any, Any, None], *, name: str) -> None:
        """Run ``coro`` as a task kept in :attr:`tasks` until it ends."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def later(self, key: str, *, delay: float) -> None:
        """Queue ``key`` again in ``delay`` seconds."""

        async def wait() -> None:
            await self._sleep(delay)
            self.put(key)

        self.spawn(wait(), name=f"retry-{key}")

    def until(self, key: str, *, deadline: float, done: Callable[[], bool], poll: float) -> None:
        """Queue ``key`` again as soon as ``done()`` (looked at every ``poll`` seconds), or at
        ``deadline`` (clock seconds) if it never is."""

        async def wait() -> None:
            while self._clock() < deadline and not done():
                await self._sleep(poll)
            self.put(key)

        self.spawn(wait(), name=f"pods-{key}")
