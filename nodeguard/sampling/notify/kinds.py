"""What the notification hub and its parts share: the kinds, what fires, what is watched, how
each kind fares, and the warnings logged once."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal, NamedTuple

__all__ = ["NOTIFY_KINDS", "NotifyKind", "NotifyStatus", "PsiSpec", "Wakeup", "WarnOnce", "Watched"]

NotifyKind = Literal["threshold", "psi", "events"]
NOTIFY_KINDS: tuple[NotifyKind, ...] = ("threshold", "psi", "events")


class Wakeup(NamedTuple):
    """What fired: ``kind``, and ``key`` (a container or pod key, or a PSI trigger's key)."""

    kind: NotifyKind
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


class WarnOnce:
    """Warns on ``log`` the first time a key is seen only: what a kind cannot do on this host
    (no thresholds on cgroup v2, no inotify instance left) lasts, and is said once."""

    def __init__(self, *, log: logging.Logger) -> None:
        self._log = log
        self._done: set[str] = set()

    def warn(self, key: str, message: str, *args: object) -> None:
        """``message`` and ``args`` as :meth:`logging.Logger.warning`'s."""
        if key not in self._done:
            self._done.add(key)
            self._log.warning(message, *args)
