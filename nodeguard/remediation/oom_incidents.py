"""Every kernel OOM kill an incident record of its own, with no rule needed: the victim, the
node as it stood just before, the minutes that led there, and what nodeguard had done about
it.

The kills are the kernel log's (:class:`~nodeguard.snapshot.OomLog` ``recent``: each victim of
each OOM event once, also across agent restarts, :mod:`nodeguard.sources.oom_events`). For each
new one :class:`OomIncidents` writes a record (kind ``oom_kill``, rule ``oom-kill``, source
``kernel``) to the same store as the firings' (:class:`~nodeguard.remediation.incidents.
IncidentStore`), with:

- ``victim``: the process (PID, name, RSS at the kill from the kill record), the constraint
  (``CONSTRAINT_MEMCG``: a cgroup at its limit; ``CONSTRAINT_NONE``: the node), the cgroups,
  and where it is a pod's: namespace, pod, container, its limit and request, QoS class and
  priority, as the sample before the kill had them;
- ``evidence``: that sample's memory evidence (the node's breakdown, PSI, the largest
  containers and processes, GPU memory), ``evidence_time`` its time;
- ``timeline``: the points of the :class:`~nodeguard.remediation.timeline.Timeline` up to the
  kill (empty when the agent was not running then: a kill read from the log after a restart);
- ``linked``: the firings recorded on the victim's container or pod in the ten minutes
  before, each with how long before the kill it was and whether it acted; the firing's own
  record gets ``killed_later`` (the kill's id and how long after).

The record's id is the kill's time and a digest of the boot and the kill record's sequence
number; the digests recorded are kept in the state file, so a kill is recorded once even when
the agent restarts and reads it again, and also when the store's bound has removed its
record. The links are found through the store's index of firings by target, not a read of
every record.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from nodeguard.remediation.incidents import IncidentStore, evidence
from nodeguard.remediation.timeline import Timeline
from nodeguard.snapshot import NodeSnapshot, OomKill
from nodeguard.units import format_bytes

__all__ = ["LINK_WINDOW", "RECORDED_KEPT", "OomIncidents", "kill_digest", "kill_id"]

log = logging.getLogger(__name__)

#: How long before a kill a firing on its victim counts as about it (seconds).
LINK_WINDOW = 600.0
#: The recorded kills' digests kept in the state (the kernel log's recent kills are 256).
RECORDED_KEPT = 512


def kill_digest(kill: OomKill, *, boot_id: str) -> str:
    """The kill's stable name: a digest of the boot and the kill record's sequence number
    (unique per boot; the kill's time is an estimate that moves by microseconds from one
    agent process to the next, so it is no part of it)."""
    return hashlib.sha256(f"{boot_id}|{kill.sequence}".encode()).hexdigest()[:12]


def kill_id(kill: OomKill, *, boot_id: str) -> str:
    """A sortable, file-safe id: the kill's UTC time, ``oom-kill``, the PID and
    :func:`kill_digest` (what a kill is known by once recorded)."""
    when = dt.datetime.fromtimestamp(kill.time, tz=dt.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    return f"{when}-oom-kill-{kill.pid}-{kill_digest(kill, boot_id=boot_id)}"


class OomIncidents:
    """Writes an incident for each new OOM kill (module docstring). :meth:`observe` takes
    every snapshot, full or focused, in order."""

    def __init__(
        self,
        *,
        store: IncidentStore,
        timeline: Timeline,
        node: str,
        boot_id: str | None,
        recorded: dict[str, Any] | None = None,
        changed: Callable[[], None] | None = None,
    ) -> None:
        self._store, self._timeline, self._node = store, timeline, node
        self._boot = boot_id or ""
        # The digests of the kills recorded (the state file's section, kept across restarts:
        # a record the store's bound removed is not written again when the kernel log's
        # recent kills are read back after a restart).
        self._recorded = recorded if recorded is not None else {}
        self._changed = changed or (lambda: None)
        self._seen: set[int] = set()
        # The last full sample and the focused ones since: the kernel log is read in full
        # samples, so a kill it shows happened after the last one began, maybe after a
        # focused one too; the latest of them before the kill is the node just before it.
        self._since_full: deque[NodeSnapshot] = deque(maxlen=64)
        self.recorded = 0

    def observe(self, snapshot: NodeSnapshot) -> list[dict[str, Any]]:
        """Record the kills ``snapshot`` shows that are new; returns their records."""
        records = []
        recent = snapshot.oom.recent if snapshot.oom else ()
        for kill in recent:
            if kill.sequence in self._seen:
                continue
            self._seen.add(kill.sequence)
            digest = kill_digest(kill, boot_id=self._boot)
            if not isinstance(self._recorded.get("kills"), list):  # absent, or hand-edited
                self._recorded["kills"] = []
            done: list[str] = self._recorded["kills"]
            if digest in done:
                continue  # recorded before a restart
            if self._store.find_suffix(f"-{digest}") is None:  # recorded, the state not saved
                records.append(
                    self._record(kill, incident=kill_id(kill, boot_id=self._boot), now=snapshot)
                )
            done.append(digest)
            del done[: max(0, len(done) - RECORDED_KEPT)]
            self._changed()
        # Bounded: the log's recent kills are.
        self._seen &= {k.sequence for k in recent}
        self._timeline.push(snapshot)
        if snapshot.focused is None:
            self._since_full.clear()
        self._since_full.append(snapshot)
        return records

    def _before(self, kill: OomKill) -> NodeSnapshot | None:
        """The latest sample taken before the kill (``None``: none is kept, e.g. a kill read
        from the log after a restart)."""
        earlier = [s for s in self._since_full if s.timestamp <= kill.time]
        return earlier[-1] if earlier else None

    def _record(self, kill: OomKill, *, incident: str, now: NodeSnapshot) -> dict[str, Any]:
        before = self._before(kill)
        victim = _victim(kill, before or now)
        scope, target = _target(kill)
        linked = self._link(kill, incident=incident, targets=_targets(kill))
        record: dict[str, Any] = {
            "id": incident,
            "node": self._node,
            "time": kill.time,
            "time_utc": dt.datetime.fromtimestamp(kill.time, tz=dt.UTC).isoformat(),
            "rule": "oom-kill",
            "kind": "oom_kill",
            "source": "kernel",
            "scope": scope,
            "target": target,
            "dry_run": None,
            "summary": _summary(victim),
            "values": {},
            "victim": victim,
            "evidence": evidence(before),
            "evidence_time": before.timestamp if before else None,
            # A kill read from the log with no sample of this agent before it (it was not
            # running then): no evidence, no timeline, and no firing could have seen it.
            "sampled_before": before is not None,
            "timeline": self._timeline.window(until=kill.time, keys=frozenset(_targets(kill))),
            "linked": linked,
            "actions": [],
        }
        self._store.put(record)
        self.recorded += 1
        log.warning("recorded OOM kill %s: %s", incident, record["summary"])
        return record

    def _link(self, kill: OomKill, *, incident: str, targets: set[str]) -> list[dict[str, Any]]:
        """The firings on ``targets`` in the :data:`LINK_WINDOW` before the kill; each gets
        ``killed_later`` in its own record."""
        if not targets:
            return []
        linked = []
        for _, firing in self._store.firings_on(targets, since=kill.time - LINK_WINDOW):
            rec = self._store.get(firing)
            if rec is None:
                continue
            ahead = kill.time - float(rec.get("time", 0))
            if not 0 <= ahead <= LINK_WINDOW:
                continue
            acted = [a for a in rec.get("actions") or [] if a.get("outcome") == "done"]
            linked.append(
                {
                    "id": rec["id"],
                    "rule": rec.get("rule"),
                    "seconds_before_kill": round(ahead, 3),
                    "dry_run": rec.get("dry_run"),
                    "acted": bool(acted) and not rec.get("dry_run"),
                    "actions": [
                        f"{a.get('action')}: {a.get('outcome')}" for a in rec.get("actions") or []
                    ],
                }
            )
            if "killed_later" not in rec:  # the first kill after it is the one it was about
                later = {"id": incident, "seconds_after": round(ahead, 3)}
                self._store.put({**rec, "killed_later": later}, update=True)
        return sorted(linked, key=lambda x: x["seconds_before_kill"])


def _targets(kill: OomKill) -> set[str]:
    """The firing targets that are about the victim: its container and its pod."""
    out = set()
    if kill.pod_uid:
        out.add(kill.pod_uid)
        if kill.container_id:
            out.add(f"{kill.pod_uid}/{kill.container_id}")
    return out


def _target(kill: OomKill) -> tuple[str, str]:
    if kill.pod_uid and kill.container_id:
        return "container", f"{kill.pod_uid}/{kill.container_id}"
    if kill.pod_uid:
        return "pod", kill.pod_uid
    return "node", kill.task_memcg or f"pid {kill.pid}"


def _victim(kill: OomKill, snapshot: NodeSnapshot) -> dict[str, Any]:
    """The kill's victim with its pod's and container's facts from ``snapshot``."""
    victim: dict[str, Any] = {
        "pid": kill.pid,
        "process": kill.process,
        "constraint": kill.constraint,
        "task_memcg": kill.task_memcg,
        "oom_memcg": kill.oom_memcg,
        "oom_group": kill.oom_group,
        "anon_rss_bytes": kill.anon_rss_bytes,
        "file_rss_bytes": kill.file_rss_bytes,
        "shmem_rss_bytes": kill.shmem_rss_bytes,
        "pod_uid": kill.pod_uid,
        "container_id": kill.container_id,
    }
    if not kill.pod_uid:
        return victim
    labels = snapshot.labels_for(kill.pod_uid, kill.container_id)
    meta = snapshot.pod_meta.get(kill.pod_uid) if snapshot.pod_meta else None
    pod = next((p for p in snapshot.pods if p.uid == kill.pod_uid), None)
    container = (
        next((c for c in pod.containers if c.container_id == kill.container_id), None)
        if pod
        else None
    )
    name = meta.containers.get(kill.container_id) if meta and kill.container_id else None
    victim.update(
        namespace=labels.namespace or None,
        pod=labels.pod,
        container=labels.container or None,
        limit_bytes=container.memory.effective_limit_bytes if container else None,
        working_set_bytes=container.memory.working_set_bytes if container else None,
        request_bytes=meta.container_requests.get(name) if meta and name else None,
        qos_class=pod.qos_class if pod else None,
        priority=meta.priority if meta else None,
        priority_class=meta.priority_class or None if meta else None,
    )
    return victim


def _summary(victim: dict[str, Any]) -> str:
    """One line for people: who was killed, and why (a limit, or the node)."""
    who = f"{victim['process']} (pid {victim['pid']})"
    if victim.get("pod"):
        where = "/".join(str(victim[k]) for k in ("namespace", "pod", "container") if victim.get(k))
        who += f" of {where}"
    if victim.get("constraint") == "CONSTRAINT_MEMCG":
        limit = victim.get("limit_bytes")
        at = f" at its limit {format_bytes(limit)}" if limit else " at a cgroup limit"
        return f"the kernel OOM-killed {who}{at}"
    why = victim.get("constraint") or "constraint unknown"
    return f"the kernel OOM-killed {who}: the node ran out ({why})"
