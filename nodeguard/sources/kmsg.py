"""OOM kills from the kernel log, read from ``/dev/kmsg`` as node-problem-detector reads it.

A fresh open of ``/dev/kmsg`` starts at the oldest record still in the ring buffer; a read at
the end fails with EAGAIN (non-blocking), and EPIPE means records were overwritten before we read
them (Documentation/ABI/testing/dev-kmsg; records: :mod:`nodeguard.sources.kmsg_record`). The
records of an OOM kill, in the format of every supported kernel, are assembled into kills by
:mod:`nodeguard.sources.oom_events`.

Each victim is counted once, also across agent restarts: the boot ID
(``/proc/sys/kernel/random/boot_id``), the last sequence number read and the counts are kept in
``<state>/kmsg-oom.json``. After a restart the records already counted are read again to rebuild
the OOM event in progress (a ``memory.oom.group`` kill whose header came before the restart),
and not counted again. Without a state directory a restarted agent counts again the kills still
in the ring buffer.

The reader is made of what it does: reading the device (:mod:`~nodeguard.sources.kmsg_device`),
the counts (:mod:`~nodeguard.sources.oom_counts`) and their state across restarts
(:mod:`~nodeguard.sources.oom_state`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from nodeguard.paths import HostPaths
from nodeguard.snapshot import OomLog
from nodeguard.sources.files import read_optional
from nodeguard.sources.kmsg_device import KmsgDevice
from nodeguard.sources.kmsg_record import KmsgRecord, parse_record
from nodeguard.sources.oom_counts import OomCounts
from nodeguard.sources.oom_events import OomEventParser, ParsedKill
from nodeguard.sources.oom_state import STATE_FILE, load_state, save_state

__all__ = ["KmsgRecord", "OomEventParser", "OomLogReader", "parse_record"]

_CONTAINER_TTL = 24 * 3600.0  # a pod's counts are dropped this long after its last kill
# The two reads of the clocks are not at the same instant.
_CLOCK_SLACK = 0.05


def _boot_time(paths: HostPaths) -> float:
    """Unix time of boot, to turn a kernel log record's microseconds since boot into a time.

    ``btime`` in ``<procfs>/stat`` is the kernel's boot time cut to the second
    (fs/proc/stat.c prints ``getboottime64()``'s ``tv_sec``): a kill would read up to a second
    early, before the samples that led to it. Where now less ``CLOCK_BOOTTIME`` agrees with it
    within that second, it is the same boot time to the microsecond and is used; otherwise
    (another host's ``/proc``, as in the tests' fixtures) ``btime``; now less uptime where
    there is no ``btime``."""
    precise = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    text = read_optional(paths.proc("stat")) or ""
    for line in text.splitlines():
        if line.startswith("btime "):
            btime = float(line.split()[1])
            return precise if 0 <= precise - btime < 1.0 + _CLOCK_SLACK else btime
    return precise


class OomLogReader:
    """Keeps reading the kernel log and counting OOM kills.

    ``read()`` drains the records that arrived since the last call and returns the running
    :class:`OomLog`. Raises :class:`~nodeguard.sources.NoDataError` when the log cannot be
    opened for lack of the file or of permission (``CAP_SYSLOG`` with
    ``kernel.dmesg_restrict=1``).
    """

    def __init__(self, *, paths: HostPaths, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock  # wall clock: a pod's counts expire a day after its last kill
        self._device = KmsgDevice(path=paths.kmsg)
        self._parser = OomEventParser()
        boot_id = read_optional(paths.proc("sys", "kernel", "random", "boot_id"))
        self._boot_id = (boot_id or "").strip()
        self._boot_time = _boot_time(paths)
        self._counts = OomCounts()
        self._started = clock()
        self._state: Path | None = None if paths.state is None else paths.state / STATE_FILE
        self._last_seq = -1
        if self._state is not None:
            self._last_seq = load_state(self._state, boot_id=self._boot_id, counts=self._counts)

    def read(self) -> OomLog:
        drained = self._device.drain()
        if drained.from_start:
            # A fixture tree's file, read whole: the parser starts over with it.
            self._parser = OomEventParser()
        changed = False
        counted_to = self._last_seq  # records up to this one were read (and counted) before
        for raw in drained.records:
            record = parse_record(raw)
            if record is None:
                continue
            kills = self._parser.feed(record=record, boot_time=self._boot_time)
            changed = self._count_new(kills, after=counted_to) or changed
            self._last_seq = max(self._last_seq, record.sequence)
        changed = self._count_new(self._parser.flush(), after=counted_to) or changed
        changed = self._counts.prune(cutoff=self._clock() - _CONTAINER_TTL) or changed
        if changed:
            self._save()
        return self._counts.oom_log()

    def _count_new(self, kills: list[ParsedKill], *, after: int) -> bool:
        """Count the kills whose record is numbered ``after`` the last one read before; whether
        there was one. Records read again (after a restart, or a fixture file read whole) only
        rebuild the OOM event in progress."""
        new = [p for p in kills if p.kill.sequence > after]
        for parsed in new:
            self._counts.count(parsed, now=self._clock(), started=self._started)
        return bool(new)

    def _save(self) -> None:
        if self._state is not None:
            save_state(
                self._state,
                boot_id=self._boot_id,
                last_sequence=self._last_seq,
                counts=self._counts,
            )

    def close(self) -> None:
        """Close the log device and keep the state."""
        self._device.close()
        self._save()
