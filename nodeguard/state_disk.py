"""The remediation state file on disk: its lock, its reading, its atomic writes.

The file format and the rules of :mod:`nodeguard.statefile`'s module docstring: one JSON
object ``{"kind": "nodeguard-remediation-state", "format": FORMAT, "node", "saved_at",
"clock", "sections"}``; a file that cannot be used is renamed ``<name>.bad-<time>`` (never
deleted); a write goes to a temporary file of the same directory, every byte checked
(``write(2)`` may write less than asked on a full filesystem), fsynced, renamed over the old
file (POSIX ``rename(2)`` is atomic) and the directory fsynced.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["FORMAT", "MAGIC", "MAX_BYTES", "AtomicFile", "Loaded", "load", "lock_directory"]

# The state file's log lines keep the one logger name they had before it was split in modules.
log = logging.getLogger("nodeguard.statefile")

#: Version of the file's layout; a file of a higher version is set aside, never read.
FORMAT = 1
#: A state file larger than this is set aside unread (a healthy one holds kilobytes: bounded
#: sections, a journal bounded by the queue).
MAX_BYTES = 16 << 20
MAGIC = "nodeguard-remediation-state"


def lock_directory(path: Path) -> int | None:
    """Lock the state directory of ``path`` for this process (``flock`` on ``<name>.lock``):
    one agent per state directory, as a second would interleave its writes with the first's.
    The lock's descriptor (``None`` with a warning when the lock file cannot be made);
    ``RuntimeError`` when another process holds the lock."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.with_name(f"{path.name}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
    except OSError as exc:
        log.warning("cannot lock the state directory %s: %s", path.parent, exc)
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RuntimeError(
            f"another nodeguard uses the state directory {path.parent} (its lock "
            f"{path.name}.lock is held): give each agent its own --path.state"
        ) from None
    return fd


@dataclass(slots=True, kw_only=True)
class Loaded:
    """What :func:`load` found: ``sections`` (name -> dict; empty for a fresh state),
    ``saved_at`` (its state-clock time, ``None`` when absent) and ``stamp`` (its ``clock``
    record, to continue the state clock from); ``recovered``: why the file was set aside
    (``None``: no file, or a good one)."""

    sections: dict[str, Any] = field(default_factory=dict)
    saved_at: float | None = None
    stamp: Any = None
    recovered: str | None = None


def load(path: Path, *, node: str, wall: Callable[[], float]) -> Loaded:
    """Read the state file of ``node`` at ``path``; one that cannot be used is set aside
    (renamed ``<name>.bad-<wall time>``) and reported in ``recovered``."""
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            return _set_aside(path, f"too large: {size} bytes, over {MAX_BYTES}", wall=wall)
        raw = path.read_bytes()
    except FileNotFoundError:
        return Loaded()
    except OSError as exc:
        return _set_aside(path, f"unreadable: {exc}", wall=wall)
    try:
        data = json.loads(raw, parse_constant=_no_constant)
    except ValueError as exc:
        return _set_aside(path, f"corrupt: not JSON ({exc})", wall=wall)
    why = _unusable(data, node=node)
    if why is not None:
        return _set_aside(path, why, wall=wall)
    saved = data.get("saved_at")
    if not isinstance(saved, int | float) or isinstance(saved, bool):
        return Loaded(sections=data["sections"])
    return Loaded(sections=data["sections"], saved_at=float(saved), stamp=data.get("clock"))


def _unusable(data: Any, *, node: str) -> str | None:
    """Why the parsed file ``data`` is not a usable state of ``node``; ``None``: it is."""
    if not isinstance(data, dict) or data.get("kind") != MAGIC:
        return "foreign: not a nodeguard remediation state"
    version = data.get("format")
    if not isinstance(version, int) or version > FORMAT:
        return f"newer: format {version!r}, this nodeguard reads {FORMAT}"
    if data.get("node") != node:
        return f"foreign: the state of node {data.get('node')!r}"
    sections = data.get("sections")
    if not isinstance(sections, dict) or not all(isinstance(v, dict) for v in sections.values()):
        return "corrupt: sections are not objects"
    return None


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number a state file holds")


def _set_aside(path: Path, why: str, *, wall: Callable[[], float]) -> Loaded:
    aside = path.with_name(f"{path.name}.bad-{int(wall())}")
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
    return Loaded(recovered=why)


class AtomicFile:
    """Atomic writes of numbered generations of the state to ``path`` (see the module
    docstring); a later generation already in place is never replaced by an earlier one.
    :attr:`error`: what the last failed write said."""

    def __init__(self, *, path: Path) -> None:
        self.path = path
        self.error = ""
        self._on_disk = 0  # the last generation renamed into place
        self._rename = threading.Lock()

    def write(self, body: bytes, generation: int, *, durable: bool) -> bool:
        """Write ``body`` (state generation ``generation``) over the file, fsynced when
        ``durable``; False on failure (the old file is kept, the temporary file removed).
        Safe from any thread."""
        path = self.path
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                _write_all(fd, body)
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            with self._rename:  # a later generation already in place is never replaced
                if generation > self._on_disk:
                    os.replace(tmp, path)
                    self._on_disk = generation
            if durable:
                with contextlib.suppress(OSError):  # the rename itself durable (not on every fs)
                    dfd = os.open(path.parent, os.O_RDONLY)
                    try:
                        os.fsync(dfd)
                    finally:
                        os.close(dfd)
        except OSError as exc:
            self.error = str(exc)
            with contextlib.suppress(OSError):
                tmp.unlink()
            return False
        with contextlib.suppress(OSError):
            tmp.unlink()  # not renamed: a later generation was already in place
        return True


def _write_all(fd: int, body: bytes) -> None:
    """Write every byte of ``body`` or raise ``OSError``: ``write(2)`` returns fewer bytes
    than asked when the filesystem fills up, and 0 means no progress."""
    view = memoryview(body)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(f"short write: {len(body) - len(view)} of {len(body)} bytes")
        view = view[n:]
