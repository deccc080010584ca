"""The notifications, on one epoll set the event loop watches, and what they wake.

:class:`NotificationHub` holds every registered notification: v1 thresholds per container
(re-registered as containers come and go, :meth:`NotificationHub.sync`), v2 ``memory.events``
watches per pod and container, and PSI triggers (:meth:`NotificationHub.set_psi`). Eventfds and
the inotify descriptor are readable when they fire, so the asyncio loop watches them itself. A
PSI trigger reports ``POLLPRI``, which asyncio never asks for, and consumes its event on every
poll (``psi_trigger_poll``), so it cannot sit in a nested epoll set either (the outer poll would
eat the event); a small thread polls the triggers and hands their events to the loop. When any
fires, ``on_wakeup`` gets a :class:`Wakeup` per event, in the loop's thread.

What a kind cannot do here (cgroup v1 thresholds on a v2 host, PSI without the kernel's support
or the privilege for a window) is reported in :meth:`NotificationHub.statuses` and logged once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from nodeguard.sampling.notify.events import EventsWatch
from nodeguard.sampling.notify.psi import PsiTrigger, open_trigger
from nodeguard.sampling.notify.thresholds import Threshold, register

__all__ = ["KINDS", "NotificationHub", "NotifyStatus", "PsiSpec", "Wakeup", "Watched"]

log = logging.getLogger(__name__)

Kind = Literal["threshold", "psi", "events"]
KINDS: tuple[Kind, ...] = ("threshold", "psi", "events")


class Wakeup(NamedTuple):
    """What fired: ``kind``, and ``key`` (a container or pod key, or a PSI trigger's key)."""

    kind: Kind
    key: str


class Watched(NamedTuple):
    """A cgroup to watch: ``key`` (``<pod uid>/<container id>``, or a pod UID), its directory,
    its cgroup version and its effective limit in bytes (``None``: no thresholds)."""

    key: str
    directory: str
    version: int
    limit: int | None


class PsiSpec(NamedTuple):
    """A PSI trigger to keep: ``key``, the pressure file, ``some``/``full``, the stall share
    (0..1) and the window in seconds."""

    key: str
    path: str
    kind: Literal["some", "full"]
    stall: float
    window: float


@dataclass(slots=True)
class NotifyStatus:
    """How one kind fares: ``available`` (it is in use on this host), ``registered`` (how many
    notifications it holds), ``wakeups`` (how many it delivered), ``error`` (why it is not in
    use, or its last failure)."""

    available: bool = False
    registered: int = 0
    wakeups: int = 0
    error: str = ""


@dataclass(slots=True)
class _State:
    thresholds: dict[str, list[Threshold]] = field(default_factory=dict)
    by_fd: dict[int, Threshold] = field(default_factory=dict)
    psi: dict[int, PsiTrigger] = field(default_factory=dict)


class NotificationHub:
    """Every kernel notification of the agent. ``levels``: the shares of a container's limit
    at which thresholds are set (one eventfd each; e.g. the focus level and the rules' levels);
    ``max_thresholds``: at most this many registered at once (two descriptors and a little
    kernel memory each), the containers nearest their limits first (the order given to
    :meth:`sync`)."""

    def __init__(
        self,
        *,
        on_wakeup: Callable[[Wakeup], None],
        levels: Sequence[float] = (0.8, 0.95),
        max_thresholds: int = 512,
    ) -> None:
        self._on_wakeup = on_wakeup
        self.levels = tuple(sorted(set(levels)))
        self.max_thresholds = max_thresholds
        self._state = _State()
        self._events: EventsWatch | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.statuses: dict[Kind, NotifyStatus] = {k: NotifyStatus() for k in KINDS}
        self._logged: set[str] = set()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._psi_thread: threading.Thread | None = None
        self._closed = False

    def set_levels(self, levels: Sequence[float]) -> None:
        """Set thresholds at these shares of each limit from now on; those set at other
        levels are dropped, and set again at the next :meth:`sync`."""
        wanted = tuple(sorted(set(levels)))
        if wanted != self.levels:
            self.levels = wanted
            for key in list(self._state.thresholds):
                self._drop(key)
            self.statuses["threshold"].registered = 0

    # -- life ----------------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Deliver to ``loop`` (call in the loop's thread)."""
        self._loop = loop
        for fd in self._state.by_fd:
            loop.add_reader(fd, self._ready, fd)
        if self._events is not None:
            loop.add_reader(self._events.fd, self._ready, self._events.fd)
        if self._state.psi:
            self._start_psi_thread()

    def close(self) -> None:
        """Unregister everything and close every descriptor."""
        self._closed = True
        os.write(self._wake_w, b"x")
        if self._psi_thread is not None:
            self._psi_thread.join(timeout=5)
        for key in list(self._state.thresholds):
            self._drop(key)
        for trigger in self._state.psi.values():
            trigger.close()
        if self._events is not None:
            self._unwatch(self._events.fd)
            self._events.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
        self._state = _State()

    def _once(self, what: str, message: str, *args: object) -> None:
        if what not in self._logged:
            self._logged.add(what)
            log.warning(message, *args)

    def _watch(self, fd: int) -> None:
        if self._loop is not None:
            self._loop.add_reader(fd, self._ready, fd)

    def _unwatch(self, fd: int) -> None:
        if self._loop is not None:
            self._loop.remove_reader(fd)

    # -- delivering ----------------------------------------------------------------------------
    def _deliver(self, wakeups: Iterable[Wakeup]) -> None:
        for wakeup in wakeups:
            self.statuses[wakeup.kind].wakeups += 1
            try:
                self._on_wakeup(wakeup)
            except Exception:
                log.exception("wakeup %s failed", wakeup)

    def _ready(self, fd: int) -> None:
        self._deliver(self._consume(fd))

    def _consume(self, fd: int) -> list[Wakeup]:
        th = self._state.by_fd.get(fd)
        if th is not None:
            return [Wakeup("threshold", th.key)] if th.consume() else []
        trigger = self._state.psi.get(fd)
        if trigger is not None:
            return [Wakeup("psi", trigger.key)]  # the poll that reported it consumed it
        if self._events is not None and fd == self._events.fd:
            return [Wakeup("events", key) for key in sorted(self._events.changed())]
        return []

    def poll(self, timeout: float = 0.0) -> list[Wakeup]:
        """The notifications ready now (or within ``timeout`` seconds), without a loop: for
        tests and one-shot use. They are counted, and not passed to ``on_wakeup``."""
        poller = select.poll()
        for fd in self._state.by_fd:
            poller.register(fd, select.POLLIN)
        for fd in self._state.psi:
            poller.register(fd, select.POLLPRI)
        if self._events is not None:
            poller.register(self._events.fd, select.POLLIN)
        out: list[Wakeup] = []
        for fd, _mask in poller.poll(timeout * 1000):
            for wakeup in self._consume(fd):
                self.statuses[wakeup.kind].wakeups += 1
                out.append(wakeup)
        return out

    def _start_psi_thread(self) -> None:
        if self._psi_thread is None and self._loop is not None:
            self._psi_thread = threading.Thread(target=self._psi_loop, name="psi", daemon=True)
            self._psi_thread.start()
        else:
            os.write(self._wake_w, b"x")  # the thread picks up the new set of triggers

    def _psi_loop(self) -> None:
        loop = self._loop
        assert loop is not None
        while not self._closed:
            poller = select.poll()
            poller.register(self._wake_r, select.POLLIN)
            triggers = dict(self._state.psi)
            for fd in triggers:
                poller.register(fd, select.POLLPRI)
            for fd, mask in poller.poll():
                if fd == self._wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 64)
                elif mask & select.POLLPRI and fd in triggers:
                    wakeup = Wakeup("psi", triggers[fd].key)
                    loop.call_soon_threadsafe(self._deliver, [wakeup])

    # -- PSI -----------------------------------------------------------------------------------
    def set_psi(self, specs: Iterable[PsiSpec]) -> None:
        """Keep exactly these PSI triggers (reopened when their settings change)."""
        wanted = {s.key: s for s in specs}
        status = self.statuses["psi"]
        for fd, trigger in list(self._state.psi.items()):
            spec = wanted.get(trigger.key)
            if spec is None or (spec.path, spec.kind, spec.stall) != (
                trigger.path,
                trigger.kind,
                trigger.stall,
            ):
                del self._state.psi[fd]
                trigger.close()
        have = {t.key for t in self._state.psi.values()}
        for spec in wanted.values():
            if spec.key in have:
                continue
            try:
                trigger = open_trigger(
                    key=spec.key,
                    path=spec.path,
                    kind=spec.kind,
                    stall=spec.stall,
                    window=spec.window,
                )
            except (OSError, ValueError) as exc:
                status.error = f"{spec.path}: {exc}"
                self._once(
                    f"psi:{spec.path}", "PSI trigger on %s not available (%s)", spec.path, exc
                )
                continue
            if trigger.widened:
                self._once(
                    "psi:widened",
                    "PSI window %.3gs refused (no CAP_SYS_RESOURCE): using %.3gs",
                    spec.window,
                    trigger.window,
                )
            self._state.psi[trigger.fd] = trigger
        status.registered = len(self._state.psi)
        status.available = bool(self._state.psi)
        if self._state.psi:
            self._start_psi_thread()

    # -- cgroups -------------------------------------------------------------------------------
    def sync(self, watched: Sequence[Watched]) -> None:
        """Keep notifications on exactly these cgroups: v1 thresholds at each level of each
        limited container's limit (nearest its limit first, within ``max_thresholds``); v2
        ``memory.events`` watches. Gone cgroups lose theirs."""
        v1 = [w for w in watched if w.version == 1 and w.limit]
        v2 = [w for w in watched if w.version == 2]
        self._sync_thresholds(v1)
        self._sync_events(v2)

    def _sync_thresholds(self, watched: Sequence[Watched]) -> None:
        status = self.statuses["threshold"]
        state = self._state
        wanted = {w.key: w for w in watched}
        for key in [k for k in state.thresholds if k not in wanted]:
            self._drop(key)
        budget = self.max_thresholds // max(1, len(self.levels))
        for w in list(wanted.values())[: max(0, budget)]:
            current = state.thresholds.get(w.key)
            limit = w.limit or 0
            if (
                current
                and current[0].cgroup == w.directory
                and current[-1].level == int(limit * self.levels[-1])
            ):
                continue  # registered, and the limit has not moved
            if current:
                self._drop(w.key)
            made: list[Threshold] = []
            try:
                for level in self.levels:
                    made.append(register(key=w.key, cgroup=w.directory, level=int(limit * level)))
            except OSError as exc:
                for th in made:
                    th.close()
                status.error = f"{w.directory}: {exc}"
                self._once(
                    f"threshold:{type(exc).__name__}",
                    "cgroup v1 memory thresholds not available (%s): focus sampling only",
                    exc,
                )
                if not isinstance(exc, FileNotFoundError):
                    break  # a kernel or permission refusal: the others would fail alike
                continue
            state.thresholds[w.key] = made
            for th in made:
                state.by_fd[th.event_fd] = th
                self._watch(th.event_fd)
        status.registered = sum(len(t) for t in state.thresholds.values())
        status.available = status.registered > 0

    def _drop(self, key: str) -> None:
        for th in self._state.thresholds.pop(key, []):
            self._state.by_fd.pop(th.event_fd, None)
            self._unwatch(th.event_fd)
            th.close()

    def _sync_events(self, watched: Sequence[Watched]) -> None:
        status = self.statuses["events"]
        if not watched and self._events is None:
            return
        if self._events is None:
            try:
                self._events = EventsWatch()
            except OSError as exc:
                status.error = f"inotify: {exc}"
                self._once("events:inotify", "inotify not available (%s)", exc)
                return
            self._watch(self._events.fd)
        events = self._events
        wanted = {w.key: w for w in watched}
        for key in events.keys() - set(wanted):
            events.remove(key)
        for w in wanted.values():
            try:
                events.add(key=w.key, path=os.path.join(w.directory, "memory.events"))
            except OSError as exc:
                status.error = f"{w.directory}: {exc}"
                if not isinstance(exc, FileNotFoundError):
                    self._once(
                        "events:add", "memory.events watch refused (%s): focus sampling only", exc
                    )
                    break
        status.registered = len(events)
        status.available = status.registered > 0
