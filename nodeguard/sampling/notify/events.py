"""cgroup v2 ``memory.events`` change notifications through inotify.

"Unless specified otherwise, a value change in this file generates a file modified event"
(kernel Documentation/admin-guide/cgroup-v2.rst, ``memory.events``: ``low``, ``high``, ``max``,
``oom``, ``oom_kill``, ``oom_group_kill``): kernfs raises it with ``fsnotify`` (``kernfs_notify``),
which inotify delivers as ``IN_MODIFY``. A ``max`` or ``oom`` increment is the cgroup hitting its
limit: the container needs a look now, not at the next interval. The watch uses the inotify_simple
library (a ctypes wrapper of inotify(7)).
"""

from __future__ import annotations

import contextlib

from inotify_simple import INotify, flags

__all__ = ["EventsWatch"]


class EventsWatch:
    """One inotify instance watching ``memory.events`` files, each under a key. :attr:`fd` is
    readable when one changed; :meth:`changed` gives the keys of those that did. Raises
    ``OSError`` when inotify cannot be had (``EMFILE``: the per-user instance limit)."""

    def __init__(self) -> None:
        self._inotify = INotify(nonblocking=True)
        self._keys: dict[int, str] = {}
        self._wds: dict[str, int] = {}

    @property
    def fd(self) -> int:
        return int(self._inotify.fileno())

    def __len__(self) -> int:
        return len(self._wds)

    def add(self, *, key: str, path: str) -> None:
        """Watch ``path`` (a ``memory.events`` file) under ``key``. Raises ``OSError``
        (``ENOENT`` when it is gone, ``ENOSPC`` at the user's watch limit)."""
        if key in self._wds:
            return
        wd = self._inotify.add_watch(path, flags.MODIFY)
        self._keys[wd], self._wds[key] = key, wd

    def remove(self, key: str) -> None:
        """Stop watching ``key`` (a cgroup gone removes its watch by itself: ``IN_IGNORED``)."""
        wd = self._wds.pop(key, None)
        if wd is None:
            return
        self._keys.pop(wd, None)
        with contextlib.suppress(OSError):  # already gone with its cgroup
            self._inotify.rm_watch(wd)

    def keys(self) -> set[str]:
        return set(self._wds)

    def changed(self) -> set[str]:
        """The keys whose file was modified since the last call (empty when none)."""
        out: set[str] = set()
        try:
            events = self._inotify.read(timeout=0)
        except BlockingIOError:
            return out
        for event in events:
            if event.mask & flags.IGNORED:
                key = self._keys.pop(event.wd, None)
                if key is not None:
                    self._wds.pop(key, None)
            elif event.wd in self._keys:
                out.add(self._keys[event.wd])
        return out

    def close(self) -> None:
        self._inotify.close()
