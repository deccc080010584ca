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
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from nodeguard.paths import HostPaths
from nodeguard.snapshot import OomKill, OomLog
from nodeguard.sources import NoDataError
from nodeguard.sources.files import read_optional
from nodeguard.sources.kmsg_record import KmsgRecord, parse_record
from nodeguard.sources.oom_events import CONSTRAINTS, OomEventParser, ParsedKill

__all__ = ["KmsgRecord", "OomEventParser", "OomLogReader", "parse_record"]

log = logging.getLogger(__name__)

_RECENT_MAX = 256
_CONTAINER_TTL = 24 * 3600.0  # a pod's counts are dropped this long after its last kill
_STATE_FILE = "kmsg-oom.json"


def _boot_time(paths: HostPaths) -> float:
    """Unix time of boot from ``btime`` in ``<procfs>/stat``; now minus uptime as a fallback."""
    text = read_optional(paths.proc("stat")) or ""
    for line in text.splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return time.time() - time.monotonic()


class _ContainerCount:
    """A container's victims and repeated kills, and when it was last counted (Unix time, for
    pruning; never a boot-time estimate)."""

    __slots__ = ("last", "repeats", "victims")

    def __init__(self, *, victims: int = 0, repeats: int = 0, last: float = 0.0) -> None:
        self.victims, self.repeats, self.last = victims, repeats, last


class OomLogReader:
    """Keeps reading the kernel log and counting OOM kills.

    ``read()`` drains the records that arrived since the last call and returns the running
    :class:`OomLog`. Raises :class:`NoDataError` when the log cannot be opened for lack of the
    file or of permission (``CAP_SYSLOG`` with ``kernel.dmesg_restrict=1``).
    """

    def __init__(self, *, paths: HostPaths, clock: Callable[[], float] = time.time) -> None:
        self._paths = paths
        self._clock = clock  # wall clock: a pod's counts expire a day after its last kill
        self._fd: int | None = None
        self._is_device = False
        self._parser = OomEventParser()
        boot_id = read_optional(paths.proc("sys", "kernel", "random", "boot_id"))
        self._boot_id = (boot_id or "").strip()
        self._boot_time = _boot_time(paths)
        self._last_seq = -1
        self._total = 0
        self._by_constraint: dict[str, int] = dict.fromkeys(CONSTRAINTS, 0)
        self._by_container: dict[str, _ContainerCount] = {}
        self._started = clock()
        self._recent: deque[OomKill] = deque(maxlen=_RECENT_MAX)
        self._load_state()

    # -- state across restarts -------------------------------------------------------------
    def _state_path(self) -> Path | None:
        return None if self._paths.state is None else self._paths.state / _STATE_FILE

    def _load_state(self) -> None:
        path = self._state_path()
        if path is None or not path.exists():
            return
        try:
            data: dict[str, Any] = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable OOM state %s: %s", path, exc)
            return
        if data.get("boot_id") != self._boot_id or not self._boot_id:
            return  # a new boot: the ring buffer and its sequence numbers start over
        self._last_seq = int(data.get("last_sequence", -1))
        self._total = int(data.get("total", 0))
        self._by_constraint.update(
            {str(k): int(v) for k, v in data.get("by_constraint", {}).items()}
        )
        # [victims, last counted] (before repeats were kept) or [victims, last, repeats]
        self._by_container = {
            str(k): _ContainerCount(
                victims=int(v[0]), last=float(v[1]), repeats=int(v[2]) if len(v) > 2 else 0
            )
            for k, v in data.get("by_container", {}).items()
        }
        for item in data.get("recent", []):
            self._recent.append(OomKill(**item))

    def _save_state(self) -> None:
        path = self._state_path()
        if path is None:
            return
        data = {
            "boot_id": self._boot_id,
            "last_sequence": self._last_seq,
            "total": self._total,
            "by_constraint": self._by_constraint,
            "by_container": {
                k: [c.victims, c.last, c.repeats] for k, c in self._by_container.items()
            },
            "recent": [asdict(k) for k in self._recent],
        }
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data))
            os.replace(tmp, path)  # atomic: a crash mid-write never loses the old state
        except OSError as exc:
            log.warning("cannot keep OOM state in %s: %s", path, exc)

    # -- reading -----------------------------------------------------------------------------
    def _open(self) -> int:
        if self._fd is None:
            path = self._paths.kmsg
            try:
                self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            except FileNotFoundError as exc:
                raise NoDataError(f"{path} does not exist") from exc
            except PermissionError as exc:
                raise NoDataError(
                    f"{path}: permission denied (needs CAP_SYSLOG, and in a container the "
                    "device allowed by the runtime: see the DaemonSet's kernel-log component)"
                ) from exc
            self._is_device = stat.S_ISCHR(os.fstat(self._fd).st_mode)
        return self._fd

    def _records(self) -> list[str]:
        fd = self._open()
        if not self._is_device:
            # A fixture tree: a regular file of records, one per line, read whole every time,
            # so the parser starts over with it.
            self._parser = OomEventParser()
            os.lseek(fd, 0, os.SEEK_SET)
            chunks = []
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
            return b"".join(chunks).decode("utf-8", "replace").splitlines()
        out: list[str] = []
        while True:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # records overwritten before we read them; go on from the next
                raise
            if not chunk:
                break
            out.append(chunk.decode("utf-8", "replace"))
        return out

    def read(self) -> OomLog:
        changed = False
        counted_to = self._last_seq  # records up to this one were read (and counted) before
        for raw in self._records():
            record = parse_record(raw)
            if record is None:
                continue
            kills = self._parser.feed(record=record, boot_time=self._boot_time)
            changed = self._count_new(kills, after=counted_to) or changed
            self._last_seq = max(self._last_seq, record.sequence)
        changed = self._count_new(self._parser.flush(), after=counted_to) or changed
        changed = self._prune(cutoff=self._clock() - _CONTAINER_TTL) or changed
        if changed:
            self._save_state()
        return OomLog(
            total=self._total,
            by_constraint=dict(self._by_constraint),
            by_container={k: c.victims for k, c in self._by_container.items() if c.victims},
            recent=tuple(self._recent),
            repeats_by_container={k: c.repeats for k, c in self._by_container.items() if c.repeats},
        )

    def _prune(self, *, cutoff: float) -> bool:
        """Drop the counts of the pods whose last kill was counted before ``cutoff``, all of a
        pod's containers at once: the exposition sums a container's IDs under its name (a
        container restarted after a kill has a new ID), and a sum that loses one ID while
        another stays would go down, which Prometheus takes for a counter reset."""
        last: dict[str, float] = {}
        for ckey, c in self._by_container.items():
            uid = ckey.partition("/")[0]
            last[uid] = max(last.get(uid, c.last), c.last)
        gone = [k for k in self._by_container if last[k.partition("/")[0]] < cutoff]
        for ckey in gone:
            del self._by_container[ckey]
        return bool(gone)

    def _count_new(self, kills: list[ParsedKill], *, after: int) -> bool:
        """Count the kills whose record is numbered ``after`` the last one read before; whether
        there was one. Records read again (after a restart, or a fixture file read whole) only
        rebuild the OOM event in progress."""
        new = [p for p in kills if p.kill.sequence > after]
        for parsed in new:
            self._count(parsed)
        return bool(new)

    def _count(self, parsed: ParsedKill) -> None:
        kill = parsed.kill
        count = None
        if kill.pod_uid:
            ckey = f"{kill.pod_uid}/{kill.container_id or ''}"
            count = self._by_container.setdefault(ckey, _ContainerCount())
            count.last = self._clock()
        if parsed.repeat:
            if count is not None:
                count.repeats += 1
            log.info("kernel OOM kill of pid %d again (memory.oom.group)", kill.pid)
            return
        self._total += 1
        key = kill.constraint or "unknown"
        self._by_constraint[key] = self._by_constraint.get(key, 0) + 1
        self._recent.append(kill)
        if count is not None:
            count.victims += 1
        # Kills from before this agent started are the ring buffer's backlog, not news.
        level = logging.WARNING if kill.time >= self._started - 60 else logging.INFO
        log.log(
            level,
            "kernel OOM kill%s: pid=%d process=%s cgroup=%s group=%s anon_rss_bytes=%s",
            "" if level == logging.WARNING else " (earlier this boot)",
            kill.pid,
            kill.process,
            kill.task_memcg,
            kill.oom_group,
            kill.anon_rss_bytes,
        )

    def close(self) -> None:
        """Close the log device and keep the state."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._save_state()
