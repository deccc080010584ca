"""The agent's remediation state on disk: one JSON file, written whole and atomically.

Everything that must outlive the process lives here, in named sections: the rule engine's
firing state, cooldowns and ``maxFirings`` windows; the eviction limiter and the
PodDisruptionBudget backoff; the journal of runbooks under way; the webhook's handled
deliveries. An agent restarts most often when its node is short of memory, so a kill -9 at any
moment must leave a file that says what was done: each :meth:`StateFile.save` writes a
temporary file, fsyncs it, renames it over the old one and fsyncs the directory (POSIX
``rename(2)`` is atomic), so a reader sees the old state or the new one, never a mix.

A file that cannot be used — not JSON, not nodeguard's, another node's, or written by a newer
nodeguard — is set aside (renamed ``<name>.bad-<time>``, never deleted), warned about once, and
replaced by a fresh state; :attr:`StateFile.recovered` says why, so the owners of the sections
can choose the safe default: act less, never more (what was done just before is unknown).
Without a path (``--path.state`` unusable) the state lives in memory only, and a warning says
restarts reset it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["FORMAT", "StateFile"]

log = logging.getLogger(__name__)

#: Version of the file's layout; a file of a higher version is set aside, never read.
FORMAT = 1
#: A state file larger than this is set aside unread (a healthy one holds kilobytes: bounded
#: sections, a journal bounded by the queue).
MAX_BYTES = 16 << 20
_MAGIC = "nodeguard-remediation-state"


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number a state file holds")


class StateFile:
    """The remediation state of the agent on ``node``, at ``path`` (``None``: in memory).

    :meth:`section` gives a section's dict (created empty); owners change it in place and call
    :meth:`save` (or :meth:`touch` for changes that may wait up to ``lazy_seconds``).
    ``recovered``: ``None`` for a normal start (no file, or a good one), else why the file on
    disk was set aside (``"corrupt: ..."``, ``"foreign: ..."``, ``"newer: ..."``).
    ``saved_at``: Unix time of the last save of the loaded file (``None`` for a fresh state).
    """

    def __init__(
        self,
        *,
        path: Path | None,
        node: str,
        clock: Callable[[], float] = time.time,
        lazy_seconds: float = 10.0,
    ) -> None:
        self.path, self.node, self._clock, self._lazy = path, node, clock, lazy_seconds
        self.recovered: str | None = None
        self.saved_at: float | None = None
        self._data: dict[str, Any] = {}
        self._dirty_since: float | None = None
        self._warned = False
        self._lock_fd: int | None = None
        if path is None:
            log.warning(
                "no state directory: cooldowns, limits and runbooks under way are kept in "
                "memory and reset when the agent restarts (set --path.state)"
            )
            return
        self._lock(path)
        self._load(path)

    def _lock(self, path: Path) -> None:
        """One agent per state directory: a second one would interleave its writes with the
        first's. ``RuntimeError`` when another process holds the lock."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path.with_name(f"{path.name}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
        except OSError as exc:
            log.warning("cannot lock the state directory %s: %s", path.parent, exc)
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RuntimeError(
                f"another nodeguard uses the state directory {path.parent} (its lock "
                f"{path.name}.lock is held): give each agent its own --path.state"
            ) from None
        self._lock_fd = fd

    def close(self) -> None:
        """Save and let the state directory go."""
        self.save()
        self.release()

    def release(self) -> None:
        """Let the state directory go without saving (as a killed process does)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _load(self, path: Path) -> None:
        try:
            size = path.stat().st_size
            if size > MAX_BYTES:
                self._set_aside(path, f"too large: {size} bytes, over {MAX_BYTES}")
                return
            raw = path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as exc:
            self._set_aside(path, f"unreadable: {exc}")
            return
        try:
            data = json.loads(raw, parse_constant=_no_constant)
        except ValueError as exc:
            self._set_aside(path, f"corrupt: not JSON ({exc})")
            return
        if not isinstance(data, dict) or data.get("kind") != _MAGIC:
            self._set_aside(path, "foreign: not a nodeguard remediation state")
            return
        version = data.get("format")
        if not isinstance(version, int) or version > FORMAT:
            self._set_aside(path, f"newer: format {version!r}, this nodeguard reads {FORMAT}")
            return
        if data.get("node") != self.node:
            self._set_aside(path, f"foreign: the state of node {data.get('node')!r}")
            return
        sections = data.get("sections")
        if not isinstance(sections, dict) or not all(
            isinstance(v, dict) for v in sections.values()
        ):
            self._set_aside(path, "corrupt: sections are not objects")
            return
        self._data = sections
        saved = data.get("saved_at")
        self.saved_at = float(saved) if isinstance(saved, int | float) else None

    def _set_aside(self, path: Path, why: str) -> None:
        self.recovered = why
        aside = path.with_name(f"{path.name}.bad-{int(self._clock())}")
        try:
            os.replace(path, aside)
        except OSError as exc:
            aside = path
            log.error("cannot set the state file %s aside: %s", path, exc)
        log.warning(
            "remediation state %s not used (%s), kept as %s; starting cautious: rules wait a "
            "cooldown and the eviction limit counts as spent for one window",
            path,
            why,
            aside,
        )

    def now(self) -> float:
        """The state's clock (Unix seconds)."""
        return self._clock()

    def section(self, name: str) -> dict[str, Any]:
        """The named section, created empty when missing; a section that is not an object
        (a hand-edited file) is replaced by an empty one."""
        value = self._data.get(name)
        if not isinstance(value, dict):
            value = self._data[name] = {}
        return value

    def touch(self) -> None:
        """Note a change that may be saved later (within ``lazy_seconds``, or with the next
        :meth:`save`): the rule engine's ``for`` windows, which change often."""
        if self._dirty_since is None:
            self._dirty_since = self._clock()

    def flush(self) -> None:
        """Save if a :meth:`touch` is older than ``lazy_seconds``."""
        if self._dirty_since is not None and self._clock() - self._dirty_since >= self._lazy:
            self.save()

    def save(self) -> None:
        """Write the whole state now (atomic, fsynced). A failure is logged once and the state
        kept in memory; the next save tries again."""
        self._dirty_since = None
        if self.path is None:
            return
        now = self._clock()
        body = json.dumps(
            {
                "kind": _MAGIC,
                "format": FORMAT,
                "node": self.node,
                "saved_at": now,
                "sections": self._data,
            },
            separators=(",", ":"),
            sort_keys=True,
        ).encode()
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, body)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            with contextlib.suppress(OSError):  # the rename itself durable (not on every fs)
                dfd = os.open(self.path.parent, os.O_RDONLY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
        except OSError as exc:
            if not self._warned:
                log.error("cannot write the remediation state %s: %s", self.path, exc)
                self._warned = True
            return
        self._warned = False
