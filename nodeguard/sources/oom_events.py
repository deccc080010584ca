"""OOM kills as every supported kernel logs them, assembled from kernel log records into kills.

One OOM event is one pass of the OOM killer (``out_of_memory``, serialised by ``oom_lock``): a
header, one victim, and with ``memory.oom.group`` every other process of a cgroup. What each
kernel prints (mm/oom_kill.c ``dump_header``, ``oom_kill_process``, ``__oom_kill_process``;
mm/memcontrol.c ``mem_cgroup_print_oom_info`` before 4.19, ``mem_cgroup_print_oom_context`` and
``mem_cgroup_print_oom_group`` since):

=========================  =====================================================================
every version              ``<comm> invoked oom-killer: gfp_mask=...`` opens the header
                           (``dump_header``; the header is rate limited, the kill records not)
3.10 to 4.18               ``Task in <task cgroup> killed as a result of limit of <memcg>`` (a
                           memory cgroup OOM only; ``mem_cgroup_print_oom_info``)
4.19 and later             ``oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,``
                           ``mems_allowed=0,oom_memcg=<memcg>,task_memcg=<task cgroup>,``
                           ``task=<comm>,pid=<pid>,uid=<uid>`` (``,global_oom`` instead of
                           ``,oom_memcg=...`` for the node), the header's last line
3.10 to 5.0                ``<prefix>: Kill process <pid> (<comm>) score <n> or sacrifice child``
                           then ``Killed process <pid> (<comm>) total-vm:...kB, anon-rss:...kB,
                           file-rss:...kB[, shmem-rss:...kB]``: the process killed may be a
                           child of the one chosen, with another PID
5.1 and later              ``<prefix>: Killed process <pid> (<comm>) total-vm:...kB, anon-rss:
                           ...kB, file-rss:...kB, shmem-rss:...kB[, UID:<uid> pgtables:...kB
                           oom_score_adj:<n>]`` (commit bbbe48029720, "mm, oom: remove 'prefer
                           children over parent' heuristic", moved the prefix to the kill record)
2.6.32 (RHEL 6)            ``Killed process <pid>, UID <uid>, (<comm>) total-vm:...``
4.19 and later, group      after the first kill, ``Tasks in <cgroup> are going to be killed due
                           to memory.oom.group set``, then a kill record for every process of
                           that cgroup (``oom_kill_memcg_member``; memory.oom.group came with
                           commit 3d8b38eb81ca, "mm, oom: introduce memory.oom.group")
=========================  =====================================================================

``<prefix>`` is ``Memory cgroup out of memory`` for a cgroup's limit (``mem_cgroup_out_of_memory``)
and ``Out of memory`` for the node (``out_of_memory``; ``Out of memory (oom_kill_allocating_task)``
with that sysctl). Before 4.19 the constraint is not printed: the prefix gives
``CONSTRAINT_MEMCG`` or, for the node, ``CONSTRAINT_NONE`` (such a kernel does not say whether a
cpuset or a memory policy narrowed a node OOM). The same prefix gives the constraint of a kill
whose header was rate limited away, and no cgroup.

Counting. Each victim counts once per event: the group scan meets the first victim again, and
where that process still has its memory ``__oom_kill_process`` kills it a second time, prints a
second kill record and counts it again in ``memory.events`` ``oom_kill`` (it raises the event
before it prints). That second record is a *repeat*: not a new victim, but reported, so that
victims plus repeats equal the cgroup's own counter. A kill record whose process is already
exiting prints ``OOM victim <pid> (<comm>) is already exiting. Skip`` instead and counts nowhere.

Attribution. The first victim belongs to ``task_memcg`` (or the "Task in" cgroup); every other
victim of a group kill belongs to the group's cgroup, which the kubelet (1.28 and later, cgroup
v2) sets on each container. The paths are absolute in the cgroup hierarchy whatever the reader's
cgroup namespace (``pr_cont_cgroup_path`` prints ``kernfs_path``).

Records split. The header's lines are built with ``pr_cont``; on a busy machine another CPU's
record can land between the pieces, which then come as records of their own (``,oom_memcg=``,
``/kubepods/...``, `` killed as a result of limit of ``). A line being assembled takes the next
records that continue it (starting with ``,`` or a space, a path after ``=`` or a space, or the
``+`` continuation flag) and skips unrelated ones; the next OOM record ends it, complete or not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from nodeguard.snapshot import OomKill
from nodeguard.sources.cgroup_paths import parse_kubepods_path
from nodeguard.sources.kmsg_record import KmsgRecord

__all__ = ["CONSTRAINTS", "OomEventParser", "ParsedKill", "constraint_of_prefix"]

#: mm/oom_kill.c ``enum oom_constraint``, as ``oom_constraint_text[]`` prints it.
CONSTRAINTS = (
    "CONSTRAINT_NONE",
    "CONSTRAINT_CPUSET",
    "CONSTRAINT_MEMORY_POLICY",
    "CONSTRAINT_MEMCG",
)

_INVOKED_RE = re.compile(r" invoked oom-killer: ")
_CONTEXT_START = "oom-kill:"
_TASK_IN_START = "Task in "
_GROUP_START = "Tasks in "
#: How the later pieces of a "Task in" (3.10: " as a result..."; 4.x: " killed as a result...")
#: and a "Tasks in" line begin.
_LINE_TAILS = {
    "task_in": (" killed", " as a result of limit of "),
    "group": (" are going to be killed due to memory.oom.group set",),
}
_CONTEXT_DONE_RE = re.compile(r",pid=\d+,uid=\d+\s*$")
_TASK_IN_RE = re.compile(
    r"^Task in (?P<task>\S.*?) killed as a result of limit of (?P<memcg>\S.*)$"
)
_GROUP_RE = re.compile(
    r"^Tasks in (?P<group>\S.*?) are going to be killed due to memory\.oom\.group set$"
)
_CONSTRAINT_RE = re.compile(r"^oom-kill:constraint=(?P<v>[A-Z_]+)")
_OOM_MEMCG_RE = re.compile(r",oom_memcg=(?P<v>.*?)(?=,task_memcg=|,task=|$)")
_TASK_MEMCG_RE = re.compile(r",task_memcg=(?P<v>.*?)(?=,task=|$)")
_TASK_PID_RE = re.compile(r",task=.*,pid=(?P<v>\d+),uid=\d+\s*$")
_CHOSEN_RE = re.compile(
    r"^(?P<prefix>.*?): Kill process (?P<pid>\d+) \((?P<comm>.*)\) score \d+ or sacrifice child"
)
_KILLED_RE = re.compile(
    r"^(?:(?P<prefix>.*?): )?Killed process (?P<pid>\d+)(?:, UID \d+,)? \((?P<comm>.*)\)"
    r"(?: total-vm:(?P<rest>.*))?$"
)
_RSS_RE = {
    "anon": re.compile(r"anon-rss:(\d+)kB"),
    "file": re.compile(r"file-rss:(\d+)kB"),
    "shmem": re.compile(r"shmem-rss:(\d+)kB"),
}


def constraint_of_prefix(prefix: str | None) -> str | None:
    """The constraint a kill record's prefix stands for (see the module docstring): a memory
    cgroup's limit, or the node; ``None`` for no prefix or another one."""
    if prefix is None:
        return None
    if prefix == "Memory cgroup out of memory":
        return "CONSTRAINT_MEMCG"
    if prefix == "Out of memory" or prefix.startswith("Out of memory ("):
        return "CONSTRAINT_NONE"
    return None


class ParsedKill(NamedTuple):
    """A kill record made into a kill: ``repeat`` when the event already counted its victim."""

    kill: OomKill
    repeat: bool


_LineKind = Literal["context", "task_in", "group"]


@dataclass(slots=True)
class _Line:
    """A header line being assembled from its pieces: ``context`` (``oom-kill:``), ``task_in``
    (``Task in``) or ``group`` (``Tasks in``)."""

    kind: _LineKind
    text: str

    def complete(self) -> bool:
        if self.kind == "context":
            return bool(_CONTEXT_DONE_RE.search(self.text))
        if self.kind == "task_in":
            return bool(_TASK_IN_RE.match(self.text))
        return bool(_GROUP_RE.match(self.text))

    def continued_by(self, record: KmsgRecord) -> bool:
        """Whether ``record`` is a piece of this line: what the kernel's ``pr_cont`` calls for
        it print (see the module docstring), or a record flagged ``+`` (continues the last)."""
        piece = record.message
        if record.flags == "+":
            return True
        if piece.startswith("/") and " " not in piece:
            return self.text.endswith(("=", " "))  # a cgroup path after ``...memcg=`` or ``in ``
        if self.kind == "context":
            return piece.startswith(",")
        return piece.startswith(_LINE_TAILS[self.kind])


@dataclass(slots=True)
class _Event:
    """What is known of the OOM event in progress."""

    constraint: str | None = None
    oom_memcg: str | None = None
    task_memcg: str | None = None
    task_pid: int | None = None
    group: str | None = None
    victims: set[int] = field(default_factory=set)
    kills: int = 0

    def fresh(self) -> bool:
        """Nothing of this event has been seen but, at most, its ``invoked oom-killer`` line."""
        return self.kills == 0 and self.constraint is None and self.task_memcg is None


@dataclass(frozen=True, slots=True)
class _Held:
    """A kill record read, kept until the next OOM record says what it was: a victim of
    ``event`` in ``memcg`` (``member``: one of the event's group), unless that next record is a
    ``Tasks in <cgroup>`` line that makes it the first kill of a new event whose header was rate
    limited away (a member comes after its group's line, never before another one)."""

    match: re.Match[str]
    record: KmsgRecord
    boot_time: float
    event: _Event
    memcg: str | None
    member: bool
    repeat: bool


# The records that begin a line that the kernel may print in pieces, by kind.
_LINE_STARTS: tuple[tuple[_LineKind, str], ...] = (
    ("context", _CONTEXT_START),
    ("task_in", _TASK_IN_START),
    ("group", _GROUP_START),
)


class OomEventParser:
    """Feeds kernel log records, in order, and turns kill records into :class:`ParsedKill`.

    One parser follows one stream of records; records it has seen before (a re-read after an
    agent restart) may be fed again to rebuild the event in progress, as long as they come in
    order. A kill comes out with the next OOM record (which may say that it began a new event,
    see :class:`_Held`), or from :meth:`flush` after the last record read.
    """

    def __init__(self) -> None:
        self._event = _Event()
        self._line: _Line | None = None
        self._held: _Held | None = None
        self._out: list[ParsedKill] = []

    def feed(self, *, record: KmsgRecord, boot_time: float) -> list[ParsedKill]:
        """Feed one record; the kills it makes known, in log order."""
        self._feed(record, boot_time)
        out, self._out = self._out, []
        return out

    def flush(self) -> list[ParsedKill]:
        """The kill still held (call after the last record read)."""
        self._release()
        out, self._out = self._out, []
        return out

    def _feed(self, record: KmsgRecord, boot_time: float) -> None:
        text = record.message
        if self._line is not None:
            if self._line.continued_by(record):
                self._line.text += text
                if self._line.complete():
                    self._finish_line()
                return
            if not _is_oom_record(text):
                return  # another CPU's record between the pieces of a line
            self._finish_line()  # the pieces that never came are lost
        if not _is_oom_record(text):
            return
        if not text.startswith(_GROUP_START):
            self._release()
        if _INVOKED_RE.search(text):
            self._event = _Event()
            return
        for kind, start in _LINE_STARTS:
            if text.startswith(start):
                self._line = _Line(kind=kind, text=text)
                if self._line.complete():
                    self._finish_line()
                return
        if m := _CHOSEN_RE.match(text):
            if self._event.kills:
                self._event = _Event()  # this event's header was rate limited away
            if self._event.constraint is None:
                self._event.constraint = constraint_of_prefix(m.group("prefix"))
            return
        if m := _KILLED_RE.match(text):
            self._kill(m, record=record, boot_time=boot_time)

    def _finish_line(self) -> None:
        line, self._line = self._line, None
        if line is None:
            return
        if line.kind == "group":
            g = _GROUP_RE.match(line.text)
            self._group(g.group("group") if g else None)
            return
        self._release()
        event = self._event
        if not event.fresh():
            self._event = event = _Event()
        if line.kind == "task_in":
            t = _TASK_IN_RE.match(line.text)
            event.constraint = "CONSTRAINT_MEMCG"
            if t:
                event.task_memcg, event.oom_memcg = t.group("task"), t.group("memcg")
            return
        event.constraint = _search(_CONSTRAINT_RE, line.text)
        event.oom_memcg = _search(_OOM_MEMCG_RE, line.text)
        event.task_memcg = _search(_TASK_MEMCG_RE, line.text)
        pid = _search(_TASK_PID_RE, line.text)
        event.task_pid = int(pid) if pid else None

    def _group(self, cgroup: str | None) -> None:
        """A ``Tasks in <cgroup>`` line: the group of the event of the kill held."""
        held, self._held = self._held, None
        if cgroup is None:
            self._held = held
            self._release()
            return
        if held is not None and held.member:
            # The held kill was no member: it began a new event, its header rate limited away.
            pid = int(held.match.group("pid"))
            event = _Event(group=cgroup, victims={pid}, kills=1)
            self._event = event
            self._emit(held, event=event, memcg=cgroup, repeat=False)
            return
        if self._event.group is not None:
            self._event = _Event()  # one group line an event: this is a new one's
        self._event.group = cgroup
        if held is not None:
            self._emit(held, event=held.event, memcg=held.memcg or cgroup, repeat=held.repeat)

    def _kill(self, m: re.Match[str], *, record: KmsgRecord, boot_time: float) -> None:
        pid = int(m.group("pid"))
        event = self._event
        if event.kills and event.group is None:
            self._event = event = _Event()  # a new event whose header was rate limited away
        member = event.kills > 0 and pid != event.task_pid
        repeat = pid in event.victims
        event.kills += 1
        event.victims.add(pid)
        self._held = _Held(
            match=m,
            record=record,
            boot_time=boot_time,
            event=event,
            memcg=event.group if member else event.task_memcg,
            member=member,
            repeat=repeat,
        )

    def _release(self) -> None:
        """Emit the held kill as what it was taken for."""
        held, self._held = self._held, None
        if held is not None:
            self._emit(held, event=held.event, memcg=held.memcg, repeat=held.repeat)

    def _emit(self, held: _Held, *, event: _Event, memcg: str | None, repeat: bool) -> None:
        m, record = held.match, held.record
        ident = parse_kubepods_path(memcg) if memcg else None
        rest = m.group("rest") or ""
        kill = OomKill(
            sequence=record.sequence,
            time=held.boot_time + record.usec / 1e6,
            pid=int(m.group("pid")),
            process=m.group("comm"),
            constraint=event.constraint or constraint_of_prefix(m.group("prefix")),
            task_memcg=memcg,
            anon_rss_bytes=_kb(_RSS_RE["anon"], rest),
            file_rss_bytes=_kb(_RSS_RE["file"], rest),
            shmem_rss_bytes=_kb(_RSS_RE["shmem"], rest),
            pod_uid=ident.pod_uid if ident else None,
            container_id=ident.container_id if ident else None,
            oom_memcg=event.oom_memcg,
            oom_group=event.group,
        )
        self._out.append(ParsedKill(kill=kill, repeat=repeat))


def _is_oom_record(text: str) -> bool:
    """Whether a record belongs to the OOM killer's own output (ends a line in assembly)."""
    return bool(
        _INVOKED_RE.search(text)
        or text.startswith((_CONTEXT_START, _TASK_IN_START, _GROUP_START))
        or _CHOSEN_RE.match(text)
        or _KILLED_RE.match(text)
    )


def _search(pattern: re.Pattern[str], text: str) -> str | None:
    m = pattern.search(text)
    return m.group("v") if m else None


def _kb(pattern: re.Pattern[str], text: str) -> int | None:
    m = pattern.search(text)
    return None if m is None else int(m.group(1)) * 1024
