"""When the remediation state is written: generations, one writer task, and what failed.

The rules of :mod:`nodeguard.statefile`'s module docstring ("Writing", "Off the event loop"):
every :meth:`Writer.save` asks for one more generation of the state; with an event loop
running one writer task serialises the state on the loop and writes it in a thread, a write
covering every generation asked for before its body was taken; without a loop the write is
made at once. A failed write is counted, logged once per spell, and tried again every
``retry_seconds``; :attr:`Writer.persisted` is False until a write succeeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from nodeguard.state_disk import AtomicFile

__all__ = ["Writer"]

# The state file's log lines keep the one logger name they had before it was split in modules.
log = logging.getLogger("nodeguard.statefile")


class Writer:
    """Writes ``body()`` (the whole state, as bytes) to ``file`` (``None``: the state is in
    memory only, and nothing is written). ``now``: the state clock, for :meth:`touch`;
    ``lazy_seconds``: how long a touched change may wait; ``retry_seconds``: the pause after
    a failed write."""

    def __init__(
        self,
        *,
        file: AtomicFile | None,
        body: Callable[[], bytes],
        now: Callable[[], float],
        lazy_seconds: float,
        retry_seconds: float,
    ) -> None:
        self._file, self._body, self._now = file, body, now
        self._lazy, self._retry = lazy_seconds, retry_seconds
        #: Failed writes since start (``nodeguard_state_save_failures_total``).
        self.save_failures = 0
        #: Whether the latest write succeeded (nothing asked for since then is lost by a kill).
        self.persisted = True
        #: Successful fsynced writes since start (a flood of changes costs a few).
        self.writes = 0
        self._dirty_since: float | None = None
        # Generations: every save() asks for one more; _durable is the last one fsynced.
        self._asked = self._durable = 0
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._waiters: list[tuple[int, asyncio.Future[bool]]] = []

    def touch(self) -> None:
        """Note a change that may be saved within ``lazy_seconds`` (or with the next save)."""
        if self._dirty_since is None:
            self._dirty_since = self._now()

    def flush(self) -> None:
        """Save if a :meth:`touch` is older than ``lazy_seconds``."""
        if self._dirty_since is not None and self._now() - self._dirty_since >= self._lazy:
            self.save()

    def save(self) -> None:
        """Ask for one more generation: written by the writer task when an event loop runs,
        else at once."""
        self._dirty_since = None
        if self._file is None:
            return
        self._asked += 1
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._write_and_account(self._body(), self._asked, durable=True)
            return
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._write_loop(), name="state-writer")
        assert self._wake is not None
        self._wake.set()

    async def persist(self) -> bool:
        """Wait until every generation asked for so far is fsynced: True, or False when the
        write that covered it failed."""
        if self._file is None or self._durable >= self._asked:
            return True
        target = self._asked
        if self._task is None or self._task.done():
            self.save()  # asked for without a loop, then a loop: start the writer
        elif self._wake is not None:
            # A generation asked for without a wake (whatever the path) is never waited on
            # for ever: the idle writer takes it now.
            self._wake.set()
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiters.append((target, waiter))
        return await waiter

    def checkpoint(self) -> bool:
        """Write a generation at once without the fsyncs, then ask for the fsynced write;
        whether the write went (when it did not, the writer's retry is asked for too)."""
        if self._file is None:
            return True
        self._asked += 1
        if self._write_and_account(self._body(), self._asked, durable=False):
            self.save()  # and fsynced soon
            return True
        with contextlib.suppress(RuntimeError):  # no loop: the caller's next save() retries
            asyncio.get_running_loop()
            # The writer's fsynced write is the retry (every retry_seconds until the disk has
            # room); it also answers persist(), which would otherwise wait for ever.
            self.save()
        return False

    def close(self) -> None:
        """Stop the writer task and write a last generation now (fsynced)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if self._file is not None:
            self._asked += 1
            self._write_and_account(self._body(), self._asked, durable=True)

    async def _write_loop(self) -> None:
        """The one writer: a write covers every request made before its body was taken."""
        assert self._wake is not None and self._file is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._durable < self._asked:
                generation = self._asked
                try:
                    body = self._body()  # on the loop: the sections change only there
                    ok = await asyncio.to_thread(self._file.write, body, generation, durable=True)
                except (TypeError, ValueError) as exc:  # a section holding what JSON cannot
                    log.exception("remediation state not serialisable")
                    self._file.error, ok = str(exc), False
                self._account(ok, generation)
                self._waiters = _answer(self._waiters, ok=ok, generation=generation)
                if not ok:
                    await asyncio.sleep(self._retry)

    def _write_and_account(self, body: bytes, generation: int, *, durable: bool) -> bool:
        assert self._file is not None
        ok = self._file.write(body, generation, durable=durable)
        self._account(ok, generation, durable=durable)
        return ok

    def _account(self, ok: bool, generation: int, *, durable: bool = True) -> None:
        assert self._file is not None
        if ok:
            if not self.persisted:
                log.warning("remediation state %s written again: acting again", self._file.path)
            self.persisted = True
            if durable:
                self._durable = max(self._durable, generation)
                self.writes += 1
            return
        self.save_failures += 1
        if self.persisted:
            log.error(
                "cannot write the remediation state %s (%s): the previous file is kept, and "
                "no new action starts until a write succeeds (tried every %.0fs)",
                self._file.path,
                self._file.error,
                self._retry,
            )
        self.persisted = False


def _answer(
    waiters: list[tuple[int, asyncio.Future[bool]]], *, ok: bool, generation: int
) -> list[tuple[int, asyncio.Future[bool]]]:
    """Answer ``ok`` to the waiters for ``generation`` or an earlier one (a write covers
    every generation asked for before it); the waiters left."""
    keep = []
    for target, waiter in waiters:
        if target <= generation:
            if not waiter.done():
                waiter.set_result(ok)
        else:
            keep.append((target, waiter))
    return keep
