"""The notifications, on one epoll set the event loop watches, and what they wake.

:class:`NotificationHub` holds every registered notification: v1 thresholds per container
(re-registered as containers come and go, :meth:`NotificationHub.sync`), v2 ``memory.events``
watches per pod and container, and PSI triggers (:meth:`NotificationHub.set_psi`). Eventfds and
the inotify descriptor are readable when they fire, so the asyncio loop watches them itself. A
PSI trigger reports ``POLLPRI``, which asyncio never asks for, and consumes its event on every
poll (``psi_trigger_poll``), so it cannot sit in a nested epoll set either (the outer poll would
eat the event); a small thread polls the triggers and hands their events to the loop. When any
fires, ``on_wakeup`` gets a :class:`Wakeup` per event, in the loop's thread.

The hub is made of its kinds: the v1 thresholds held (:mod:`.threshold_set`), the
``memory.events`` watches (:mod:`.events_watches`) and the PSI triggers with their thread
(:mod:`.psi_triggers`), over the loop's readers (:mod:`.readers`) and the types they share
(:mod:`.kinds`), all in :mod:`nodeguard.sampling.notify`.

What a kind cannot do here (cgroup v1 thresholds on a v2 host, PSI without the kernel's support
or the privilege for a window) is reported in :meth:`NotificationHub.statuses` and logged once.
"""

from __future__ import annotations

import asyncio
import logging
import select
from collections.abc import Callable, Iterable, Sequence

from nodeguard.sampling.notify.events_watches import EventsWatches
from nodeguard.sampling.notify.kinds import (
    NOTIFY_KINDS,
    NotifyKind,
    NotifyStatus,
    PsiSpec,
    Wakeup,
    WarnOnce,
    Watched,
)
from nodeguard.sampling.notify.psi_triggers import PsiTriggers
from nodeguard.sampling.notify.readers import LoopReaders
from nodeguard.sampling.notify.threshold_set import ThresholdSet

__all__ = [
    "NOTIFY_KINDS",
    "NotificationHub",
    "NotifyKind",
    "NotifyStatus",
    "PsiSpec",
    "Wakeup",
    "Watched",
]

log = logging.getLogger(__name__)


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
        self.statuses: dict[NotifyKind, NotifyStatus] = {k: NotifyStatus() for k in NOTIFY_KINDS}
        warn = WarnOnce(log=log)
        self._readers = LoopReaders(ready=self._ready)
        self._thresholds = ThresholdSet(
            status=self.statuses["threshold"], readers=self._readers, warn=warn
        )
        self._events = EventsWatches(
            status=self.statuses["events"], readers=self._readers, warn=warn
        )
        self._psi = PsiTriggers(status=self.statuses["psi"], deliver=self._deliver, warn=warn)

    def set_levels(self, levels: Sequence[float]) -> None:
        """Set thresholds at these shares of each limit from now on; those set at other
        levels are dropped, and set again at the next :meth:`sync`."""
        wanted = tuple(sorted(set(levels)))
        if wanted != self.levels:
            self.levels = wanted
            self._thresholds.drop_all()
            self.statuses["threshold"].registered = 0

    # -- life ----------------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Deliver to ``loop`` (call in the loop's thread)."""
        events = self._events.watch
        fds = [*self._thresholds.by_fd, *([events.fd] if events is not None else [])]
        self._readers.start(loop, fds)
        self._psi.start(loop)

    def close(self) -> None:
        """Unregister everything and close every descriptor."""
        self._psi.close()
        self._thresholds.drop_all()
        self._events.close()

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
        fired = self._thresholds.consume(fd)
        if fired is not None:
            return fired
        trigger = self._psi.by_fd.get(fd)
        if trigger is not None:
            return [Wakeup("psi", trigger.key)]  # the poll that reported it consumed it
        return self._events.consume(fd) or []

    def poll(self, timeout: float = 0.0) -> list[Wakeup]:
        """The notifications ready now (or within ``timeout`` seconds), without a loop: for
        tests and one-shot use. They are counted, and not passed to ``on_wakeup``."""
        poller = select.poll()
        for fd in self._thresholds.by_fd:
            poller.register(fd, select.POLLIN)
        for fd in self._psi.by_fd:
            poller.register(fd, select.POLLPRI)
        if self._events.watch is not None:
            poller.register(self._events.watch.fd, select.POLLIN)
        out: list[Wakeup] = []
        for fd, _mask in poller.poll(timeout * 1000):
            for wakeup in self._consume(fd):
                self.statuses[wakeup.kind].wakeups += 1
                out.append(wakeup)
        return out

    # -- what is registered ----------------------------------------------------------------------
    def set_psi(self, specs: Iterable[PsiSpec]) -> None:
        """Keep exactly these PSI triggers (reopened when their settings change)."""
        self._psi.keep(specs)

    def sync(self, watched: Sequence[Watched]) -> None:
        """Keep notifications on exactly these cgroups: v1 thresholds at each level of each
        limited container's limit (nearest its limit first, within ``max_thresholds``); v2
        ``memory.events`` watches. Gone cgroups lose theirs."""
        v1 = [w for w in watched if w.version == 1 and w.limit]
        v2 = [w for w in watched if w.version == 2]
        self._thresholds.sync(v1, levels=self.levels, max_thresholds=self.max_thresholds)
        self._events.sync(v2)
