"""The descriptors the event loop watches for the hub (eventfds, the inotify descriptor)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

__all__ = ["LoopReaders"]


class LoopReaders:
    """Adds and removes loop readers; each readable descriptor is handed to ``ready`` in the
    loop's thread. Before :meth:`start` nothing is watched (the hub can register notifications
    before the loop runs: they are watched from :meth:`start` on)."""

    def __init__(self, *, ready: Callable[[int], None]) -> None:
        self._ready = ready
        self.loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop, fds: Iterable[int]) -> None:
        """Watch ``fds`` on ``loop``, and every descriptor watched from now on."""
        self.loop = loop
        for fd in fds:
            loop.add_reader(fd, self._ready, fd)

    def watch(self, fd: int) -> None:
        if self.loop is not None:
            self.loop.add_reader(fd, self._ready, fd)

    def unwatch(self, fd: int) -> None:
        if self.loop is not None:
            self.loop.remove_reader(fd)
