"""The cgroup v2 ``memory.events`` watches held, on one inotify instance
(:mod:`nodeguard.sampling.notify.events`), made when the first is wanted."""

from __future__ import annotations

import os
from collections.abc import Sequence

from nodeguard.sampling.notify.events import EventsWatch
from nodeguard.sampling.notify.kinds import NotifyStatus, Wakeup, WarnOnce, Watched
from nodeguard.sampling.notify.readers import LoopReaders

__all__ = ["EventsWatches"]


class EventsWatches:
    """``watch``: the inotify instance (``None`` until a cgroup is watched, or where inotify
    cannot be had). Keeps ``status`` (``registered``: files watched) up to date."""

    def __init__(self, *, status: NotifyStatus, readers: LoopReaders, warn: WarnOnce) -> None:
        self._status = status
        self._readers = readers
        self._warn = warn
        self.watch: EventsWatch | None = None

    def consume(self, fd: int) -> list[Wakeup] | None:
        """A wakeup per cgroup whose ``memory.events`` changed, by key, where ``fd`` is the
        inotify descriptor; ``None`` where it is not."""
        if self.watch is None or fd != self.watch.fd:
            return None
        return [Wakeup("events", key) for key in sorted(self.watch.changed())]

    def sync(self, watched: Sequence[Watched]) -> None:
        """Watch exactly these cgroups' ``memory.events``. No inotify instance (``EMFILE``) or
        a watch refused (``ENOSPC``: max_user_watches): the status says why, logged once; a
        cgroup gone meanwhile is skipped."""
        status = self._status
        if not watched and self.watch is None:
            return
        if self.watch is None:
            try:
                self.watch = EventsWatch()
            except OSError as exc:
                status.error = f"inotify: {exc}"
                self._warn.warn("events:inotify", "inotify not available (%s)", exc)
                return
            self._readers.watch(self.watch.fd)
        events = self.watch
        wanted = {w.key: w for w in watched}
        for key in events.keys() - set(wanted):
            events.remove(key)
        for w in wanted.values():
            try:
                events.add(key=w.key, path=os.path.join(w.directory, "memory.events"))
            except OSError as exc:
                status.error = f"{w.directory}: {exc}"
                if not isinstance(exc, FileNotFoundError):
                    self._warn.warn(
                        "events:add", "memory.events watch refused (%s): focus sampling only", exc
                    )
                    break
        status.registered = len(events)
        status.available = status.registered > 0

    def close(self) -> None:
        if self.watch is not None:
            self._readers.unwatch(self.watch.fd)
            self.watch.close()
            self.watch = None
