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

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["FORMAT", "StateFile", "StateNotPersisted"]

log = logging.getLogger(__name__)

#: Version of the file's layout; a file of a higher version is set aside, never read.
FORMAT = 1
#: A state file larger than this is set aside unread (a healthy one holds kilobytes: bounded
#: sections, a journal bounded by the queue).
MAX_BYTES = 16 << 20
_MAGIC = "nodeguard-remediation-state"
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


class StateNotPersisted(RuntimeError):
    """:meth:`StateFile.checkpoint` could not write: the action must not go on to its next
    API call (its write-ahead record is not on disk)."""


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number a state file holds")


def _boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def _read_boot_id() -> str | None:
    """This kernel's boot ID (random(4)); ``None`` where it cannot be read."""
    try:
        return _BOOT_ID.read_text().strip() or None
    except OSError:
        return None


def _write_all(fd: int, body: bytes) -> None:
    """Write every byte of ``body`` or raise ``OSError``: ``write(2)`` returns fewer bytes
    than asked when the filesystem fills up, and 0 means no progress."""
    view = memoryview(body)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(f"short write: {len(body) - len(view)} of {len(body)} bytes")
        view = view[n:]


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
    """

    def __init__(
        self,
        *,
        path: Path | None,
        node: str,
        clock: Callable[[], float] = time.time,
        lazy_seconds: float = 10.0,
        uptime: Callable[[], float] = _boottime,
        boot_id: str | None = None,
        retry_seconds: float = 2.0,
    ) -> None:
        self.path, self.node, self._clock, self._lazy = path, node, clock, lazy_seconds
        self._uptime, self._retry = uptime, retry_seconds
        self._boot = boot_id if boot_id is not None else _read_boot_id()
        self.recovered: str | None = None
        self.saved_at: float | None = None
        #: Failed writes since start (``nodeguard_state_save_failures_total``).
        self.save_failures = 0
        #: Whether the latest write succeeded (nothing asked for since then is lost by a kill).
        self.persisted = True
        #: Successful fsynced writes since start (a flood of changes costs a few).
        self.writes = 0
        self._data: dict[str, Any] = {}
        self._dirty_since: float | None = None
        self._lock_fd: int | None = None
        self._error = ""
        # The state clock: _base at _up0, then running with the boot clock.
        self._base, self._up0 = clock(), uptime()
        # Generations: every save() asks for one more; _durable is the last one fsynced,
        # _on_disk the last one renamed into place (by a write or a checkpoint).
        self._asked = self._durable = self._on_disk = 0
        self._rename = threading.Lock()
        self._writer: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._waiters: list[tuple[int, asyncio.Future[bool]]] = []
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
        """Write the state now (also with an event loop running: the last write of a process
        that is stopping), stop the writer and let the state directory go."""
        if self._writer is not None:
            self._writer.cancel()
            self._writer = None
        if self.path is not None:
            self._asked += 1
            self._write_and_account(self._body(), self._asked, durable=True)
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
        if isinstance(saved, int | float) and not isinstance(saved, bool):
            self.saved_at = float(saved)
            self._base = self.saved_at + self._since(data.get("clock"), wall=self.saved_at)

    def _since(self, stamp: Any, *, wall: float) -> float:
        """Seconds since the loaded file was written: by the boot clock on the same boot, else
        by the wall clock (``wall``: its wall time, for a file without ``stamp``), never < 0."""
        if isinstance(stamp, dict):
            up, boot = stamp.get("uptime"), stamp.get("boot")
            if isinstance(up, int | float) and boot is not None and boot == self._boot:
                return max(0.0, self._up0 - float(up))
            if isinstance(stamp.get("wall"), int | float):
                wall = float(stamp["wall"])
        return max(0.0, self._clock() - wall)

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
        """The state's clock (seconds): runs with the boot clock, continued across restarts
        (see the module's docstring); about Unix time, but never stepped with the wall clock."""
        return self._base + (self._uptime() - self._up0)

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
            self._dirty_since = self.now()

    def flush(self) -> None:
        """Save if a :meth:`touch` is older than ``lazy_seconds``."""
        if self._dirty_since is not None and self.now() - self._dirty_since >= self._lazy:
            self.save()

    def save(self) -> None:
        """Ask for the whole state to be written (atomic, fsynced): in the writer task when an
        event loop runs (never blocking it), else at once. A failure is counted and logged,
        :attr:`persisted` is False until a write succeeds, and the write is tried again."""
        self._dirty_since = None
        if self.path is None:
            return
        self._asked += 1
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._write_and_account(self._body(), self._asked, durable=True)
            return
        if self._writer is None or self._writer.done():
            self._wake = asyncio.Event()
            self._writer = loop.create_task(self._write_loop(), name="state-writer")
        assert self._wake is not None
        self._wake.set()

    async def persist(self) -> bool:
        """Wait until everything asked for so far is on disk, fsynced: True, or False when the
        write that covered it failed (the state is kept in memory and written later)."""
        if self.path is None or self._durable >= self._asked:
            return True
        target = self._asked
        if self._writer is None or self._writer.done():
            self.save()  # asked for without a loop, then a loop: start the writer
        elif self._wake is not None:
            # A generation asked for without a wake (whatever the path) is never waited on
            # for ever: the idle writer takes it now.
            self._wake.set()
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiters.append((target, waiter))
        return await waiter

    def checkpoint(self) -> None:
        """Write the whole state at once, without the fsyncs (a kill -9 keeps what
        ``write(2)`` put in the page cache), and ask for the fsynced write: for a write-ahead
        record before an API call. Raises :class:`StateNotPersisted` when the write fails."""
        if self.path is None:
            return
        self._asked += 1
        if self._write_and_account(self._body(), self._asked, durable=False):
            self.save()  # and fsynced soon
            return
        with contextlib.suppress(RuntimeError):  # no loop: the caller's next save() retries
            asyncio.get_running_loop()
            # The writer's fsynced write is the retry (every retry_seconds until the disk has
            # room); it also answers persist(), which would otherwise wait for ever.
            self.save()
        raise StateNotPersisted(f"cannot write the remediation state {self.path}")

    def _body(self) -> bytes:
        return json.dumps(
            {
                "kind": _MAGIC,
                "format": FORMAT,
                "node": self.node,
                "saved_at": self.now(),
                "clock": {"wall": self._clock(), "boot": self._boot, "uptime": self._uptime()},
                "sections": self._data,
            },
            separators=(",", ":"),
            sort_keys=True,
        ).encode()

    async def _write_loop(self) -> None:
        """The one writer: a write covers every request made before its body was taken."""
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._durable < self._asked:
                generation = self._asked
                try:
                    body = self._body()  # on the loop: the sections change only there
                    ok = await asyncio.to_thread(self._write, body, generation, durable=True)
                except (TypeError, ValueError) as exc:  # a section holding what JSON cannot
                    log.exception("remediation state not serialisable")
                    self._error, ok = str(exc), False
                self._account(ok, generation)
                self._answer(ok, generation)
                if not ok:
                    await asyncio.sleep(self._retry)

    def _answer(self, ok: bool, generation: int) -> None:
        keep = []
        for target, waiter in self._waiters:
            if target <= generation:
                if not waiter.done():
                    waiter.set_result(ok)
            else:
                keep.append((target, waiter))
        self._waiters = keep

    def _write_and_account(self, body: bytes, generation: int, *, durable: bool) -> bool:
        ok = self._write(body, generation, durable=durable)
        self._account(ok, generation, durable=durable)
        return ok

    def _account(self, ok: bool, generation: int, *, durable: bool = True) -> None:
        if ok:
            if not self.persisted:
                log.warning("remediation state %s written again: acting again", self.path)
            self.persisted = True
            if durable:
                self._durable = max(self._durable, generation)
                self.writes += 1
            return
        self.save_failures += 1
        if self.persisted:
            log.error(
                "cannot write the remediation state %s (%s): the previous file is kept, and "
                "no new action starts until a write succeeds (tried every %.0fs)",
                self.path,
                self._error,
                self._retry,
            )
        self.persisted = False

    def _write(self, body: bytes, generation: int, *, durable: bool) -> bool:
        """Write ``body`` (state generation ``generation``) over the file; False on failure
        (the old file is kept, the temporary file removed). Safe from any thread."""
        assert self.path is not None
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                _write_all(fd, body)
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            with self._rename:  # a later generation already in place is never replaced
                if generation > self._on_disk:
                    os.replace(tmp, self.path)
                    self._on_disk = generation
            if durable:
                with contextlib.suppress(OSError):  # the rename itself durable (not on every fs)
                    dfd = os.open(self.path.parent, os.O_RDONLY)
                    try:
                        os.fsync(dfd)
                    finally:
                        os.close(dfd)
        except OSError as exc:
            self._error = str(exc)
            with contextlib.suppress(OSError):
                tmp.unlink()
            return False
        with contextlib.suppress(OSError):
            tmp.unlink()  # not renamed: a later generation was already in place
        return True
