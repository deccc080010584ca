"""The agent's remediation state on disk: one JSON file, written whole and atomically.

Everything that must outlive the process lives here, in named sections: the rule engine's
firing state, cooldowns and ``maxFirings`` windows; the eviction limiter and the
PodDisruptionBudget backoff; the journal of runbooks under way; the webhook's handled
deliveries. An agent restarts most often when its node is short of memory, so a kill -9 at any
moment must leave a file that says what was done.

**Writing.** Each write puts the whole state in a temporary file of the same directory, checks
that every byte went (``write(2)`` may write less than asked: "if there is insufficient space"
it writes what fits and returns that count, and the next call fails with ``ENOSPC``), fsyncs
it, renames it over the old file and fsyncs the directory (POSIX ``rename(2)`` is atomic), so
a reader sees the old state or the new one, never a mix. A write that fails (``ENOSPC``,
``EIO``, a short write) keeps the old file, is counted (:attr:`StateFile.save_failures`) and
logged, and :attr:`StateFile.persisted` turns False until a write succeeds: the remediator
takes no new firing and starts no step meanwhile (acting on a decision the next start would not
know of is acting more, never less). Writes are tried again every ``retry_seconds``.

**Off the event loop.** :meth:`StateFile.save` only asks for a write: with an event loop
running, one writer task serialises the state and writes it in a thread, and requests made
while a write is under way are covered by the next one (a flood of alerts costs a few writes,
not one each). A caller that must know its change is on disk before it acts awaits
:meth:`StateFile.persist` (the remediator before every step; the webhook before it answers
2xx). :meth:`StateFile.checkpoint` writes at once without the fsyncs (a kill -9 loses nothing
that ``write(2)`` put in the page cache; the fsynced write follows), for the write-ahead
records an action makes between two API calls. Without an event loop (tests, the command
line) :meth:`StateFile.save` writes at once.

**The state's clock.** Durations (``for`` windows, cooldowns, ``maxFirings`` windows, limits,
backoffs, deduplication) are measured on :meth:`StateFile.now`: seconds that run with
``CLOCK_BOOTTIME`` (clock_gettime(2): "not affected by discontinuous jumps in the system time
(e.g., if the system administrator manually changes the clock)", and counting suspend), started
at the wall clock when there is no file. Each write stores the state clock, the wall clock, the
kernel's boot ID (random(4): ``/proc/sys/kernel/random/boot_id``, new at every boot) and
``CLOCK_BOOTTIME``; the next start on the same boot continues the state clock by the boot time
that passed, whatever the wall clock did meanwhile. After a reboot (another boot ID) the wall
clock is all there is: its time since the write counts, never less than 0 (a step back across
the reboot counts as no time, so a cooldown is at most its full length; a step forward across
a reboot cannot be told from downtime). A container in its own time namespace
(time_namespaces(7)) would see offset boot times: Kubernetes does not make one.

A file that cannot be used — not JSON, not nodeguard's, another node's, or written by a newer
nodeguard — is set aside (renamed ``<name>.bad-<time>``, never deleted), warned about once, and
replaced by a fresh state; :attr:`StateFile.recovered` says why, so the owners of the sections
can choose the safe default: act less, never more (what was done just before is unknown).
Without a path (``--path.state`` unusable) the state lives in memory only, and a warning says
restarts reset it.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nodeguard.state_clock import StateClock, boottime, read_boot_id
from nodeguard.state_disk import FORMAT, MAGIC, MAX_BYTES, AtomicFile, load, lock_directory
from nodeguard.state_writer import Writer

__all__ = ["FORMAT", "MAX_BYTES", "StateFile", "StateNotPersisted"]

log = logging.getLogger(__name__)


class StateNotPersisted(RuntimeError):
    """:meth:`StateFile.checkpoint` could not write: the action must not go on to its next
    API call (its write-ahead record is not on disk)."""


class StateFile:
    """The remediation state of the agent on ``node``, at ``path`` (``None``: in memory).

    :meth:`section` gives a section's dict (created empty); owners change it in place and call
    :meth:`save` (or :meth:`touch` for changes that may wait up to ``lazy_seconds``).
    ``recovered``: ``None`` for a normal start (no file, or a good one), else why the file on
    disk was set aside (``"corrupt: ..."``, ``"foreign: ..."``, ``"newer: ..."``).
    ``saved_at``: state-clock time of the last save of the loaded file (``None`` for a fresh
    state). ``clock``: the wall clock (Unix seconds); ``uptime``: seconds since boot
    (``CLOCK_BOOTTIME``); ``boot_id``: this boot's ID (default: read from the kernel) — the
    three are injectable for tests. ``retry_seconds``: pause between a failed write and the
    next try.

    Its parts, each in a module named for what it does: the clock
    (:mod:`nodeguard.state_clock`), the file on disk (:mod:`nodeguard.state_disk`: lock,
    reading, atomic writes) and when it is written (:mod:`nodeguard.state_writer`).
    """

    def __init__(
        self,
        *,
        path: Path | None,
        node: str,
        clock: Callable[[], float] = time.time,
        lazy_seconds: float = 10.0,
        uptime: Callable[[], float] = boottime,
        boot_id: str | None = None,
        retry_seconds: float = 2.0,
    ) -> None:
        self.path, self.node = path, node
        boot = boot_id if boot_id is not None else read_boot_id()
        self._clock = StateClock(wall=clock, uptime=uptime, boot=boot)
        self.recovered: str | None = None
        self.saved_at: float | None = None
        self._data: dict[str, Any] = {}
        self._lock_fd: int | None = None
        self._writer = Writer(
            file=AtomicFile(path=path) if path is not None else None,
            body=self._body,
            now=self.now,
            lazy_seconds=lazy_seconds,
            retry_seconds=retry_seconds,
        )
        if path is None:
            log.warning(
                "no state directory: cooldowns, limits and runbooks under way are kept in "
                "memory and reset when the agent restarts (set --path.state)"
            )
            return
        self._lock_fd = lock_directory(path)
        loaded = load(path, node=node, wall=clock)
        self.recovered, self._data = loaded.recovered, loaded.sections
        if loaded.saved_at is not None:
            self.saved_at = loaded.saved_at
            self._clock.resume(saved_at=loaded.saved_at, stamp=loaded.stamp)

    @property
    def save_failures(self) -> int:
        """Failed writes since start (``nodeguard_state_save_failures_total``)."""
        return self._writer.save_failures

    @property
    def persisted(self) -> bool:
        """Whether the latest write succeeded (nothing asked for since then is lost by a
        kill)."""
        return self._writer.persisted

    @property
    def writes(self) -> int:
        """Successful fsynced writes since start (a flood of changes costs a few)."""
        return self._writer.writes

    def close(self) -> None:
        """Write the state now (also with an event loop running: the last write of a process
        that is stopping), stop the writer and let the state directory go."""
        self._writer.close()
        self.release()

    def release(self) -> None:
        """Let the state directory go without saving (as a killed process does)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def now(self) -> float:
        """The state's clock (seconds): runs with the boot clock, continued across restarts
        (see the module's docstring); about Unix time, but never stepped with the wall clock."""
        return self._clock.now()

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
        self._writer.touch()

    def flush(self) -> None:
        """Save if a :meth:`touch` is older than ``lazy_seconds``."""
        self._writer.flush()

    def save(self) -> None:
        """Ask for the whole state to be written (atomic, fsynced): in the writer task when an
        event loop runs (never blocking it), else at once. A failure is counted and logged,
        :attr:`persisted` is False until a write succeeds, and the write is tried again."""
        self._writer.save()

    async def persist(self) -> bool:
        """Wait until everything asked for so far is on disk, fsynced: True, or False when the
        write that covered it failed (the state is kept in memory and written later)."""
        return await self._writer.persist()

    def checkpoint(self) -> None:
        """Write the whole state at once, without the fsyncs (a kill -9 keeps what
        ``write(2)`` put in the page cache), and ask for the fsynced write: for a write-ahead
        record before an API call. Raises :class:`StateNotPersisted` when the write fails."""
        if not self._writer.checkpoint():
            raise StateNotPersisted(f"cannot write the remediation state {self.path}")

    def _body(self) -> bytes:
        return json.dumps(
            {
                "kind": MAGIC,
                "format": FORMAT,
                "node": self.node,
                "saved_at": self.now(),
                "clock": self._clock.stamp(),
                "sections": self._data,
            },
            separators=(",", ":"),
            sort_keys=True,
        ).encode()
