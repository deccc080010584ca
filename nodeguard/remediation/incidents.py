"""Incident records: the evidence of each firing that acted (or would have, in dry run), and
of each kernel OOM kill.

One JSON file per incident in a bounded directory (oldest removed first). A firing's: node,
time, rule, the values that decided, the node memory breakdown (total, used, available, page
cache, slab reclaimable and unreclaimable), the top containers by working set against limit
and request, the top processes by RSS, GPU memory by device, MIG instance and process (with
its container) where known, and each action's outcome. An OOM kill's: the same evidence as of
the sample before it, the victim and the timeline (:mod:`nodeguard.remediation.oom_incidents`).
Listed at ``/incidents`` and by ``nodeguard incidents``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from nodeguard.firing import Firing
from nodeguard.remediation.timeline import Timeline
from nodeguard.snapshot import NodeSnapshot, memory_breakdown

__all__ = ["FiringIndex", "IncidentStore", "evidence", "incident_id"]

log = logging.getLogger(__name__)
_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")


def incident_id(firing: Firing) -> str:
    """A sortable, file-safe id: UTC time, rule and a short target."""
    when = dt.datetime.fromtimestamp(firing.time, tz=dt.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    target = _SAFE.sub("-", firing.target)[:24]
    # The target is cut for readability; a hash of all of it keeps ids unique. surrogatepass: a
    # lone surrogate that got this far (the webhook refuses them) must not lose the incident.
    key = f"{firing.target}|{firing.source}".encode("utf-8", "surrogatepass")
    digest = hashlib.sha256(key).hexdigest()[:8]
    return f"{when}-{firing.rule}-{firing.kind}-{target}-{digest}"


def evidence(snapshot: NodeSnapshot | None, *, top: int = 10) -> dict[str, Any]:
    """The memory evidence of a snapshot, in bytes."""
    if snapshot is None:
        return {}
    mem = snapshot.meminfo
    memory = (
        None
        if mem is None
        else {**memory_breakdown(mem), "available_estimated": mem.available_estimated}
    )
    containers = []
    for pod, c in snapshot.containers():
        labels = snapshot.labels_for(pod.uid, c.container_id)
        meta = snapshot.pod_meta.get(pod.uid) if snapshot.pod_meta else None
        name = meta.containers.get(c.container_id) if meta else None
        containers.append(
            {
                "namespace": labels.namespace,
                "pod": labels.pod,
                "container": labels.container,
                "pod_uid": pod.uid,
                "container_id": c.container_id,
                "qos_class": pod.qos_class,
                "priority": meta.priority if meta else None,
                "working_set_bytes": c.memory.working_set_bytes,
                "unreclaimable_bytes": c.memory.unreclaimable_bytes,
                "limit_bytes": c.memory.effective_limit_bytes,
                "request_bytes": meta.container_requests.get(name) if meta and name else None,
                "oom_kills": c.memory.oom_kills,
            }
        )
    containers.sort(key=lambda c: c["working_set_bytes"] or 0, reverse=True)
    psi = snapshot.pressure
    return {
        "memory": memory,
        "pressure": None if psi is None else asdict(psi),
        "top_containers": containers[:top],
        "top_processes": [asdict(p) for p in snapshot.processes[:top]],
        "oom_kills_this_boot": snapshot.oom.total if snapshot.oom else None,
        "gpu": _gpu_evidence(snapshot, top=top),
    }


def _gpu_evidence(snapshot: NodeSnapshot, *, top: int) -> dict[str, Any] | None:
    """GPU memory by device and MIG instance, and each device's top processes by GPU memory
    with their containers, the NVML lists that have each and whether it is an MPS server (whose
    memory is its clients'); ``None`` without GPU data."""
    if snapshot.gpu is None:
        return None
    devices = []
    for dev in snapshot.gpu.devices:
        procs = []
        for p in dev.processes or ():
            labels = snapshot.labels_for(p.pod_uid, p.container_id) if p.pod_uid else None
            procs.append(
                {
                    "pid": p.pid,
                    "used_bytes": p.used_bytes,
                    "mig_gpu_instance_id": p.mig_gpu_instance_id,
                    "namespace": labels.namespace if labels else None,
                    "pod": labels.pod if labels else None,
                    "container": labels.container if labels else None,
                    "pod_uid": p.pod_uid,
                    "container_id": p.container_id,
                    "lists": list(p.lists),
                    "mps_server": p.mps_server,
                }
            )
        procs.sort(key=lambda p: p["used_bytes"] or 0, reverse=True)
        devices.append(
            {
                "index": dev.index,
                "uuid": dev.uuid,
                "name": dev.name,
                "lost": dev.lost,
                "mig_enabled": dev.mig_enabled,
                "memory": None if dev.memory is None else asdict(dev.memory),
                "mig_devices": [asdict(m) for m in dev.mig_devices],
                "processes": None if dev.processes is None else procs[:top],
                "processes_missing": list(dev.processes_missing),
                "errors": list(dev.errors),
            }
        )
    return {"driver_version": snapshot.gpu.driver_version, "devices": devices}


class FiringIndex:
    """The firings' records by target: ``(time, id)`` each, for an OOM kill's links."""

    def __init__(self) -> None:
        self._by_target: dict[str, list[tuple[float, str]]] = {}

    def add(self, record: Mapping[str, Any]) -> None:
        """Index ``record`` if it is a firing's."""
        if record.get("kind") == "firing":
            entry = (float(record.get("time", 0)), str(record["id"]))
            self._by_target.setdefault(str(record.get("target")), []).append(entry)

    def on(self, targets: set[str], *, since: float, held: set[str]) -> list[tuple[float, str]]:
        """The entries of ``targets`` at or after ``since`` whose id is in ``held``."""
        found = [e for t in targets for e in self._by_target.get(t, ()) if e[0] >= since]
        return sorted(e for e in found if e[1] in held)


class IncidentStore:
    """A directory of incident records, at most ``keep`` files (oldest removed first). With
    ``directory=None`` records are kept in memory only (the same bound). With ``timeline``
    each firing's record carries the node's memory history up to it."""

    def __init__(
        self, *, directory: Path | None, keep: int = 200, timeline: Timeline | None = None
    ) -> None:
        self.directory = directory
        self.keep = keep
        #: The node's memory history: a firing's record carries its points up to the firing.
        self.timeline = timeline
        # target -> [(time, id)] of the firings' records, for the OOM kills' links; read from
        # the directory once, on first use, then kept up to date by put().
        self._firings: FiringIndex | None = None
        self._memory: dict[str, dict[str, Any]] = {}
        self.written = 0
        if directory is not None:
            try:
                directory.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                log.warning(
                    "incident directory %s unusable (%s): keeping incidents in memory",
                    directory,
                    exc,
                )
                self.directory = None

    def write(
        self,
        *,
        firing: Firing,
        results: Sequence[Mapping[str, Any]],
        dry_run: bool | None = None,
        incident: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Record one incident; returns the record. ``results``: each action result as data
        (:meth:`~nodeguard.actions.base.ActionResult.to_record`); ``dry_run`` is the effective
        mode (the global one or the rule's), default the firing's own; ``incident``: its id
        (default :func:`incident_id`); ``extra``: more fields (a runbook resumed after a
        restart, or abandoned, says so)."""
        record: dict[str, Any] = {
            "id": incident or incident_id(firing),
            "node": firing.node,
            "time": firing.time,
            "time_utc": dt.datetime.fromtimestamp(firing.time, tz=dt.UTC).isoformat(),
            "rule": firing.rule,
            "kind": firing.kind,
            "source": firing.source,
            "scope": firing.scope,
            "target": firing.target,
            "dry_run": firing.dry_run if dry_run is None else dry_run,
            "summary": firing.summary,
            "values": {
                k: (v if v is not None and math.isfinite(v) else None)
                for k, v in firing.values.items()
            },
            "evidence": evidence(firing.snapshot),
            "timeline": self.timeline.window(until=firing.time) if self.timeline else [],
            "actions": [dict(r) for r in results],
            **(extra or {}),
        }
        return self.put(record)

    def put(self, record: dict[str, Any], *, update: bool = False) -> dict[str, Any]:
        """Store ``record`` (its ``id`` names it; one of that id is replaced); returns it. An
        OOM kill's record (:mod:`nodeguard.remediation.oom_incidents`) is written this way,
        and a firing's again (``update``: not counted as a new incident) when a kill is
        linked to it."""
        if not update:
            self.written += 1
            if self._firings is not None:
                self._firings.add(record)
        if self.directory is None:
            self._memory[record["id"]] = record
            for old in sorted(self._memory)[: max(0, len(self._memory) - self.keep)]:
                del self._memory[old]
            return record
        path = self.directory / f"{record['id']}.json"
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(record, indent=1, default=str))
            os.replace(tmp, path)
        except OSError as exc:
            log.error("cannot write incident %s: %s", path, exc)
        self._prune()
        return record

    def _prune(self) -> None:
        assert self.directory is not None
        files = sorted(self.directory.glob("*.json"))
        for old in files[: max(0, len(files) - self.keep)]:
            try:
                old.unlink()
            except OSError as exc:
                log.warning("cannot remove old incident %s: %s", old, exc)

    def firings_on(self, targets: set[str], *, since: float) -> list[tuple[float, str]]:
        """``(time, id)`` of the firings' records on ``targets`` at or after ``since``, oldest
        first; those the store still holds (the bound removes the oldest)."""
        if self._firings is None:
            self._firings = FiringIndex()
            for rec in self.list():
                self._firings.add(rec)
        return self._firings.on(targets, since=since, held=set(self.ids()))

    def find_suffix(self, suffix: str) -> str | None:
        """The id of a record that ends with ``suffix`` (an OOM kill's digest), if any."""
        return next((i for i in self.ids() if i.endswith(suffix)), None)

    def list(self) -> list[dict[str, Any]]:
        """All records, newest first."""
        if self.directory is None:
            return [self._memory[k] for k in sorted(self._memory, reverse=True)]
        found = (_listed(p) for p in sorted(self.directory.glob("*.json"), reverse=True))
        return [r for r in found if r is not None]

    def ids(self) -> tuple[str, ...]:
        """Every record's id, oldest first."""
        if self.directory is None:
            return tuple(sorted(self._memory))
        return tuple(sorted(p.name.removesuffix(".json") for p in self.directory.glob("*.json")))

    def matching(self, prefix: str) -> tuple[str, ...]:
        """The ids that start with ``prefix`` (an exact id alone, where one is), oldest first:
        ``nodeguard incidents ID`` takes any unique prefix, as git takes a commit's."""
        ids = self.ids()
        if prefix in ids:
            return (prefix,)
        return tuple(i for i in ids if i.startswith(prefix)) if prefix else ()

    def get(self, incident: str) -> dict[str, Any] | None:
        """One record by id, ``None`` if unknown."""
        if self.directory is None:
            return self._memory.get(incident)
        if not _ID.fullmatch(incident):
            return None  # never a path outside the directory
        path = self.directory / f"{incident}.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError, RecursionError):
            return None
        return data if isinstance(data, dict) else None


def _listed(path: Path) -> dict[str, Any] | None:
    """A stored record for the list; ``None`` (logged) when unreadable or edited by hand so
    that it lacks what the list shows (its file is kept)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        log.warning("unreadable incident %s: %s", path, exc)
        return None
    if not _listable(record):
        log.warning("incident %s is not a record as nodeguard writes it; left out", path)
        return None
    return dict(record)


def _listable(record: Any) -> bool:
    """Whether a stored record has what a list of incidents shows (an edited one may not)."""
    if not isinstance(record, dict) or not isinstance(record.get("id"), str):
        return False
    when = record.get("time")
    if isinstance(when, bool) or not isinstance(when, int | float) or not -1e11 < when < 1e11:
        return False  # the list says each one's time
    actions = record.get("actions", [])
    return isinstance(actions, list) and all(
        isinstance(a, dict)
        and isinstance(a.get("action"), str)
        and isinstance(a.get("outcome"), str)
        for a in actions
    )
