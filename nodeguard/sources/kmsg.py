"""OOM kills from the kernel log, read from ``/dev/kmsg`` as node-problem-detector reads it.

Each ``/dev/kmsg`` read returns one record ``<prio>,<seq>,<usec since boot>,<flags>;<text>``
(Documentation/ABI/testing/dev-kmsg). A fresh open starts at the oldest record still in the ring
buffer; a read at the end fails with EAGAIN (non-blocking), and EPIPE means records were
overwritten before we read them. An OOM kill prints (mm/oom_kill.c, dump_oom_victim and
__oom_kill_process)::

    oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,
        oom_memcg=/kubepods/burstable/pod<uid>,task_memcg=/kubepods/burstable/pod<uid>/<id>,
        task=python3,pid=4242,uid=0
    Memory cgroup out of memory: Killed process 4242 (python3) total-vm:123456kB,
        anon-rss:65000kB, file-rss:1200kB, shmem-rss:0kB, UID:0 pgtables:200kB oom_score_adj:0

Each kill is counted once, also across agent restarts: the boot ID
(``/proc/sys/kernel/random/boot_id``), the last sequence number read and the counts are kept in
``<state>/kmsg-oom.json``. Without a state directory a restarted agent counts again the kills
still in the ring buffer.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import stat
import time
from collections import deque
from dataclasses import asdict
from pathlib import Path
from typing import Any

from nodeguard.paths import HostPaths
from nodeguard.snapshot import OomKill, OomLog
from nodeguard.sources import NoDataError
from nodeguard.sources.cgroup_paths import parse_kubepods_path
from nodeguard.sources.files import read_optional

__all__ = ["KmsgRecord", "OomKillParser", "OomLogSource", "parse_record"]

NAME = "kmsg"
log = logging.getLogger(__name__)

_RECENT_MAX = 256
_CONTAINER_TTL = 24 * 3600.0  # a container's count is dropped this long after its last kill
# mm/oom_kill.c enum oom_constraint, as printed by oom_constraint_text[].
_CONSTRAINTS = (
    "CONSTRAINT_NONE",
    "CONSTRAINT_CPUSET",
    "CONSTRAINT_MEMORY_POLICY",
    "CONSTRAINT_MEMCG",
)
_STATE_FILE = "kmsg-oom.json"
_OOM_CONTEXT_RE = re.compile(r"^oom-kill:(?P<body>.*)$")
# "Memory cgroup out of memory: Killed process ..." (>= 5.1) or, on older kernels, a record of
# its own, "Killed process ..." after "Out of memory: Kill process ... or sacrifice child".
_KILLED_RE = re.compile(
    r"(?:^|: )Killed process (?P<pid>\d+) \((?P<comm>.*?)\)"
    r"(?:.*?anon-rss:(?P<anon>\d+)kB)?(?:.*?file-rss:(?P<file>\d+)kB)?"
    r"(?:.*?shmem-rss:(?P<shmem>\d+)kB)?"
)


class KmsgRecord:
    """One kernel log record: sequence number, microseconds since boot, message text."""

    __slots__ = ("message", "sequence", "usec")

    def __init__(self, *, sequence: int, usec: int, message: str) -> None:
        self.sequence = sequence
        self.usec = usec
        self.message = message


def parse_record(raw: str) -> KmsgRecord | None:
    """Parse one ``/dev/kmsg`` record; ``None`` for a malformed one. Continuation lines
    (starting with a space, carrying ``KEY=value`` device properties) are dropped."""
    header, sep, message = raw.partition(";")
    if not sep:
        return None
    fields = header.split(",")
    if len(fields) < 3:
        return None
    try:
        sequence = int(fields[1])
        usec = int(fields[2])
    except ValueError:
        return None
    first_line = message.split("\n", 1)[0]
    return KmsgRecord(sequence=sequence, usec=usec, message=first_line)


class OomKillParser:
    """Turns the two records of a kill into one :class:`OomKill`.

    The ``oom-kill:`` record (constraint, cgroups, pid) comes first; the ``Killed process``
    record (RSS figures) completes it. A ``Killed process`` without a context (older kernels,
    or a context lost to the ring buffer) is still a kill, with the cgroup unknown.
    """

    def __init__(self) -> None:
        self._pending: dict[int, dict[str, str]] = {}

    def feed(self, *, record: KmsgRecord, boot_time: float) -> OomKill | None:
        """Feed one record; returns a kill when the record completes one."""
        m = _OOM_CONTEXT_RE.match(record.message)
        if m:
            context: dict[str, str] = {}
            for part in m.group("body").split(","):
                key, sep, value = part.partition("=")
                if sep:
                    context[key.strip()] = value.strip()
            ctx_pid = context.get("pid", "")
            if ctx_pid.isdigit():
                # Bounded: a context whose kill record never came is dropped at the next one.
                self._pending = {int(ctx_pid): context}
            return None
        k = _KILLED_RE.search(record.message)
        if not k:
            return None
        pid = int(k.group("pid"))
        ctx = self._pending.pop(pid, {})
        memcg = ctx.get("task_memcg")
        ident = parse_kubepods_path(memcg) if memcg else None

        def kb(group: str) -> int | None:
            v = k.group(group)
            return None if v is None else int(v) * 1024

        return OomKill(
            sequence=record.sequence,
            time=boot_time + record.usec / 1e6,
            pid=pid,
            process=k.group("comm"),
            constraint=ctx.get("constraint"),
            task_memcg=memcg,
            anon_rss_bytes=kb("anon"),
            file_rss_bytes=kb("file"),
            shmem_rss_bytes=kb("shmem"),
            pod_uid=ident.pod_uid if ident else None,
            container_id=ident.container_id if ident else None,
        )


def _boot_time(paths: HostPaths) -> float:
    """Unix time of boot from ``btime`` in ``<procfs>/stat``; now minus uptime as a fallback."""
    text = read_optional(paths.proc("stat")) or ""
    for line in text.splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return time.time() - time.monotonic()


class OomLogSource:
    """Keeps reading the kernel log and counting OOM kills.

    ``read()`` drains the records that arrived since the last call and returns the running
    :class:`OomLog`. Raises :class:`NoDataError` when the log cannot be opened for lack of the
    file or of permission (``CAP_SYSLOG`` with ``kernel.dmesg_restrict=1``).
    """

    def __init__(self, *, paths: HostPaths) -> None:
        self._paths = paths
        self._fd: int | None = None
        self._is_device = False
        self._parser = OomKillParser()
        boot_id = read_optional(paths.proc("sys", "kernel", "random", "boot_id"))
        self._boot_id = (boot_id or "").strip()
        self._boot_time = _boot_time(paths)
        self._last_seq = -1
        self._total = 0
        self._by_constraint: dict[str, int] = dict.fromkeys(_CONSTRAINTS, 0)
        self._by_container: dict[str, tuple[int, float]] = {}
        self._started = time.time()
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
        self._by_container = {
            str(k): (int(v[0]), float(v[1])) for k, v in data.get("by_container", {}).items()
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
            "by_container": self._by_container,
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
            # A fixture tree: a regular file of records, one per line, read whole every time.
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
        for raw in self._records():
            record = parse_record(raw)
            if record is None or record.sequence <= self._last_seq:
                continue
            self._last_seq = record.sequence
            kill = self._parser.feed(record=record, boot_time=self._boot_time)
            if kill is None:
                continue
            changed = True
            self._total += 1
            key = kill.constraint or "unknown"
            self._by_constraint[key] = self._by_constraint.get(key, 0) + 1
            self._recent.append(kill)
            if kill.pod_uid:
                ckey = f"{kill.pod_uid}/{kill.container_id or ''}"
                self._by_container[ckey] = (
                    self._by_container.get(ckey, (0, 0.0))[0] + 1,
                    time.time(),  # when counted: pruning never depends on boot-time estimates
                )
            # Kills from before this agent started are the ring buffer's backlog, not news.
            level = logging.WARNING if kill.time >= self._started - 60 else logging.INFO
            log.log(
                level,
                "kernel OOM kill%s: pid=%d process=%s cgroup=%s anon_rss_bytes=%s",
                "" if level == logging.WARNING else " (earlier this boot)",
                kill.pid,
                kill.process,
                kill.task_memcg,
                kill.anon_rss_bytes,
            )
        cutoff = time.time() - _CONTAINER_TTL
        for ckey in [k for k, (_, last) in self._by_container.items() if last < cutoff]:
            del self._by_container[ckey]
            changed = True
        if changed:
            self._save_state()
        return OomLog(
            total=self._total,
            by_constraint=dict(self._by_constraint),
            by_container={k: n for k, (n, _) in self._by_container.items()},
            recent=tuple(self._recent),
        )

    def close(self) -> None:
        """Close the log device and keep the state."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._save_state()
