"""The PSI triggers held (:mod:`nodeguard.sampling.notify.psi`), and the thread that polls them.

A PSI trigger reports ``POLLPRI``, which asyncio never asks for, and consumes its event on every
poll (``psi_trigger_poll``), so it cannot sit in a nested epoll set either (the outer poll would
eat the event): a small thread polls the triggers and hands their events to the loop. A pipe
wakes the thread when the set of triggers changes or the hub closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import threading
from collections.abc import Callable, Iterable

from nodeguard.sampling.notify.kinds import NotifyStatus, PsiSpec, Wakeup, WarnOnce
from nodeguard.sampling.notify.psi import PsiTrigger, open_trigger

__all__ = ["PsiTriggers"]


class PsiTriggers:
    """Triggers by descriptor (``by_fd``); their events go to ``deliver`` in the loop's thread
    once :meth:`start` was called. Keeps ``status`` (``registered``: triggers held) up to
    date."""

    def __init__(
        self,
        *,
        status: NotifyStatus,
        deliver: Callable[[list[Wakeup]], None],
        warn: WarnOnce,
    ) -> None:
        self._status = status
        self._deliver = deliver
        self._warn = warn
        self.by_fd: dict[int, PsiTrigger] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._thread: threading.Thread | None = None
        self._closed = False

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Deliver to ``loop`` (its thread) from now on."""
        self._loop = loop
        if self.by_fd:
            self._start_thread()

    def keep(self, specs: Iterable[PsiSpec]) -> None:
        """Keep exactly these triggers (reopened when their settings change). One the kernel
        refuses (``OSError``: no PSI, no such file; ``ValueError``: a window out of range) is
        left out, the status says why, logged once per file."""
        wanted = {s.key: s for s in specs}
        for fd, trigger in list(self.by_fd.items()):
            spec = wanted.get(trigger.key)
            if spec is None or (spec.path, spec.kind, spec.stall) != (
                trigger.path,
                trigger.kind,
                trigger.stall,
            ):
                del self.by_fd[fd]
                trigger.close()
        have = {t.key for t in self.by_fd.values()}
        for spec in wanted.values():
            if spec.key not in have:
                self._open(spec)
        self._status.registered = len(self.by_fd)
        self._status.available = bool(self.by_fd)
        if self.by_fd:
            self._start_thread()

    def _open(self, spec: PsiSpec) -> None:
        try:
            trigger = open_trigger(
                key=spec.key,
                path=spec.path,
                kind=spec.kind,
                stall=spec.stall,
                window=spec.window,
            )
        except (OSError, ValueError) as exc:
            self._status.error = f"{spec.path}: {exc}"
            self._warn.warn(
                f"psi:{spec.path}", "PSI trigger on %s not available (%s)", spec.path, exc
            )
            return
        if trigger.widened:
            self._warn.warn(
                "psi:widened",
                "PSI window %.3gs refused (no CAP_SYS_RESOURCE): using %.3gs",
                spec.window,
                trigger.window,
            )
        self.by_fd[trigger.fd] = trigger

    def close(self) -> None:
        """Stop the thread (within 5 s) and close every trigger and the pipe."""
        self._closed = True
        os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(timeout=5)
        for trigger in self.by_fd.values():
            trigger.close()
        self.by_fd = {}
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _start_thread(self) -> None:
        if self._thread is None and self._loop is not None:
            self._thread = threading.Thread(target=self._poll_loop, name="psi", daemon=True)
            self._thread.start()
        else:
            os.write(self._wake_w, b"x")  # the thread picks up the new set of triggers

    def _poll_loop(self) -> None:
        loop = self._loop
        assert loop is not None
        while not self._closed:
            poller = select.poll()
            poller.register(self._wake_r, select.POLLIN)
            triggers = dict(self.by_fd)
            for fd in triggers:
                poller.register(fd, select.POLLPRI)
            for fd, mask in poller.poll():
                if fd == self._wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 64)
                elif mask & select.POLLPRI and fd in triggers:
                    wakeup = Wakeup("psi", triggers[fd].key)
                    loop.call_soon_threadsafe(self._deliver, [wakeup])
