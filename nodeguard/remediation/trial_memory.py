"""Katib trials' real memory: each trial pod's peaks on this node, recorded in the cluster
when the pod ends, so ``nodeguard trials`` can say what each kind of trial needs.

A trial pod is one with the labels Katib's Trial controller puts on its job's pods,
``katib.kubeflow.org/trial`` and ``katib.kubeflow.org/experiment``. For each one
:class:`TrialMemory` keeps, from every sample (focused ones included, where they re-read the
pod or its containers):

- ``peak_working_set_bytes`` / ``peak_anon_bytes``: the largest working set and anonymous
  memory sampled, the pod's cgroup (all its containers) and each container's;
- ``kernel_peak_bytes``: the kernel's own high-water mark of the cgroup's usage (v2
  ``memory.peak``, v1 ``memory.max_usage_in_bytes``: :mod:`nodeguard.sources.cgroup_peak`),
  read at full samples; it covers the whole life of the cgroup, also what came between two
  samples or before this agent started; ``None`` where the kernel has none (v2 before 5.19);
- ``oom_kills``: the most the pod's cgroup counted (v2 ``memory.events`` ``oom_kill``; v1 the
  pod's and its containers' summed, :class:`~nodeguard.sources.cgroups.CgroupReader`), and each
  container's;
- ``limit_bytes`` / ``request_bytes``: the pod's, as the API has them (component-helpers
  ``PodLimits``/``PodRequests``); ``phase``: its last phase (``Succeeded``, ``Failed``; or
  ``Deleted`` when the pod went before a terminal phase was seen).

When the pod ends (a terminal phase, or gone from the pod list) its record is written by
``write`` (:class:`~nodeguard.kube.trial_records.TrialRecords`), off the sampling path in a
task of its own, retried with capped exponential backoff while the API fails; a Trial that is
gone drops it. The records under way and those not yet written are kept in the state file
(section ``trial_memory``), saved when a pod starts or ends and when a peak grows by
:data:`SAVE_GROWTH`: an agent killed and started again goes on from them, and the kernel's
peak covers what it did not see. Writing a record twice writes the same key with the same
value (the merge patch changes nothing), so a restart between the write and the state's save
costs nothing.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from nodeguard.kube.client import KubeClient
from nodeguard.kube.trial_records import TrialRecords
from nodeguard.snapshot import CgroupMemory, NodeSnapshot, PodMeta
from nodeguard.sources.cgroup_peak import kernel_peak_bytes

__all__ = [
    "EXPERIMENT_LABEL",
    "SAVE_GROWTH",
    "TRIAL_LABEL",
    "RecordWriter",
    "TrialMemory",
    "TrialMemoryCollector",
    "Write",
    "trial_writer",
    "whole_count",
]

log = logging.getLogger(__name__)

TRIAL_LABEL = "katib.kubeflow.org/trial"
EXPERIMENT_LABEL = "katib.kubeflow.org/experiment"
#: A peak this much above the one last saved saves the state again.
SAVE_GROWTH = 0.05
_TERMINAL = frozenset({"Succeeded", "Failed"})
_BACKOFF_FIRST, _BACKOFF_MAX = 1.0, 300.0
#: The most ended records kept while the API cannot take them (the oldest go first).
PENDING_KEPT = 1000

#: Writes one ended pod's record; raises ``LookupError`` (TrialGone) when its Trial is gone,
#: anything else when the API failed.
Write = Callable[[dict[str, Any]], Awaitable[None]]


def _raise(into: dict[str, Any], key: str, value: int | None, *, saved: dict[str, int]) -> bool:
    """Raise ``into[key]`` to ``value``; whether it is now :data:`SAVE_GROWTH` above the value
    last saved (``saved``, by key, updated then: the state is saved when this is true). Against
    the last *saved* value, not the last one: a peak that creeps up a little each sample is
    saved once it has grown that much in all."""
    old = into.get(key)
    if value is None or (old is not None and value <= old):
        return False
    into[key] = value
    last = saved.get(key)
    if last is not None and value <= last * (1 + SAVE_GROWTH):
        return False
    saved[key] = value
    return True


def _peaks(into: dict[str, Any], memory: CgroupMemory, *, saved: dict[str, int]) -> bool:
    """Raise ``into``'s peaks to ``memory``'s (:func:`_raise`); whether one grew enough to
    save, or an OOM kill is new."""
    grew = _raise(into, "peak_working_set_bytes", memory.working_set_bytes, saved=saved)
    grew |= _raise(into, "peak_anon_bytes", memory.anon_bytes, saved=saved)
    kills = into.get("oom_kills")
    if memory.oom_kills is not None and (kills is None or memory.oom_kills > kills):
        into["oom_kills"] = memory.oom_kills
        grew = True
    if memory.effective_limit_bytes:
        into["limit_bytes"] = memory.effective_limit_bytes
    return grew


class RecordWriter:
    """Writes the ended pods' records (``pending``: UID -> record, the state's dict) with
    ``write``, oldest first, in a task of its own; after a failure it waits (capped, jittered
    exponential backoff) and the rest wait for a later :meth:`soon`. ``changed`` saves the
    state after each record written or dropped."""

    def __init__(
        self, *, pending: dict[str, dict[str, Any]], write: Write, changed: Callable[[], None]
    ) -> None:
        self._pending, self._write, self._changed = pending, write, changed
        self._task: asyncio.Task[None] | None = None
        self._retry_at, self._backoff = 0.0, _BACKOFF_FIRST
        self.written = 0

    def soon(self) -> None:
        """Start writing, unless a write is under way, there is nothing to write, or the
        backoff is not over."""
        if not self._pending or time.monotonic() < self._retry_at:
            return
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        for uid, record in list(self._pending.items()):
            try:
                await self._write(record)
            except LookupError as exc:  # the Trial is gone: its record has nowhere to go
                log.info("trial memory: %s; record of pod %s dropped", exc, record["pod"])
            except Exception as exc:
                if getattr(exc, "transient", True):  # retried later, never lost
                    # To the back of the queue: a record the API keeps failing never holds
                    # up the others.
                    if uid in self._pending:  # (it may have been dropped meanwhile)
                        self._pending[uid] = self._pending.pop(uid)
                    self._backoff = min(_BACKOFF_MAX, self._backoff * 2)
                    wait = self._backoff * random.uniform(0.5, 1.0)
                    self._retry_at = time.monotonic() + wait
                    log.warning(
                        "trial memory: writing the record of %s/%s failed (%s); retry in %.0f s",
                        record["namespace"],
                        record["pod"],
                        exc,
                        wait,
                    )
                    self._changed()
                    return
                # Refused for good (RBAC, an admission policy, validation): said, and dropped.
                log.warning(
                    "trial memory: the API refused the record of %s/%s (%s); dropped",
                    record["namespace"],
                    record["pod"],
                    exc,
                )
            else:
                self.written += 1
            self._pending.pop(uid, None)
            self._backoff = _BACKOFF_FIRST
            self._changed()


#: A record's fields and their types, as the agent writes them (what a hand-edited state file
#: must hold to be kept).
_TEXT = ("namespace", "pod", "uid", "trial", "experiment", "node")
_COUNTS = (
    "peak_working_set_bytes",
    "peak_anon_bytes",
    "kernel_peak_bytes",
    "oom_kills",
    "limit_bytes",
    "request_bytes",
)


def whole_count(value: Any) -> int | None:
    """``value`` where it is a byte size or count as the agent writes one (a whole number of 0
    or more; not a bool), else ``None``: no data. For records read back (the state file, the
    ConfigMaps), which a person may have edited."""
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return value if ok else None


def _kept(records: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``records`` (the state's, maybe hand-edited) cleaned in place: a record that is not an
    object or lacks a name field goes (logged); a count that is not a whole number of 0 or
    more is left out (no data, not a crash)."""
    for uid in list(records):
        record = records[uid]
        if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in _TEXT):
            log.warning("trial memory: the state's record %r is malformed; dropped", uid)
            del records[uid]
            continue
        containers = record.get("containers")
        if not isinstance(containers, dict) or not all(
            isinstance(c, dict) for c in containers.values()
        ):
            containers = record["containers"] = {}
        for part in (record, *containers.values()):
            for key in _COUNTS:
                if key in part and whole_count(part[key]) is None:
                    del part[key]
    return records


class TrialMemory:
    """The trial pods' peaks (module docstring). :meth:`observe` takes every snapshot;
    ``state`` is the state file's section (changed in place, ``changed`` saves it)."""

    def __init__(
        self,
        *,
        node: str,
        state: dict[str, Any],
        changed: Callable[[], None],
        write: Write | None,
    ) -> None:
        self._node, self._changed = node, changed
        for key in ("pods", "pending"):
            if not isinstance(state.get(key), dict):  # absent, or hand-edited
                state[key] = {}
        if not isinstance(state.get("ended"), list):
            state["ended"] = []
        state["ended"][:] = [u for u in state["ended"] if isinstance(u, str)]
        self._pods: dict[str, dict[str, Any]] = _kept(state["pods"])
        self._pending: dict[str, dict[str, Any]] = _kept(state["pending"])
        # The UIDs of the pods ended (bounded): an ended pod's cgroup and pod-list entry stay a
        # while, and must not start a second record that would replace the first.
        self._ended: list[str] = state["ended"]
        self._writer = (
            RecordWriter(pending=self._pending, write=write, changed=changed) if write else None
        )
        # The peaks as last saved, by pod UID (and container): a peak that creeps up by less
        # than SAVE_GROWTH a sample is saved once it has grown that much in all.
        self._saved: dict[str, dict[str, int]] = {}

    @property
    def written(self) -> int:
        """Records written since the start."""
        return self._writer.written if self._writer is not None else 0

    @property
    def tracked(self) -> int:
        """Trial pods whose peaks are being kept."""
        return len(self._pods)

    @property
    def pending(self) -> int:
        """Ended trial pods whose records are not written yet."""
        return len(self._pending)

    def observe(self, snapshot: NodeSnapshot) -> None:
        """Raise the peaks from ``snapshot``; at a full sample, end the pods that ended and
        start writing their records."""
        meta = snapshot.pod_meta
        if meta is None:
            return  # no cluster: no pod is known to be a trial's
        save = False
        root = Path(snapshot.cgroup_root) if snapshot.cgroup_root else None
        for pod in snapshot.pods:
            m = meta.get(pod.uid)
            if m is None or TRIAL_LABEL not in m.labels:
                continue
            record = self._pods.get(pod.uid)
            if record is None and (pod.uid in self._pending or pod.uid in self._ended):
                continue  # ended: recorded, or being written
            if record is None:
                record = self._pods[pod.uid] = self._start(m, snapshot.timestamp)
                log.info(
                    "trial memory: tracking %s/%s of trial %s (%d tracked, %d to write)",
                    m.namespace,
                    m.name,
                    record["trial"],
                    len(self._pods),
                    len(self._pending),
                )
                save = True
            record["last_sampled"] = snapshot.timestamp
            if snapshot.is_current(pod.uid):
                save |= _peaks(record, pod.memory, saved=self._saved.setdefault(pod.uid, {}))
            for c in pod.containers:
                key = f"{pod.uid}/{c.container_id}"
                if not snapshot.is_current(key):
                    continue
                name = m.containers.get(c.container_id, c.container_id)
                into = record["containers"].setdefault(name, {})
                save |= _peaks(into, c.memory, saved=self._saved.setdefault(key, {}))
            if snapshot.focused is None and root is not None:
                peak = kernel_peak_bytes(
                    cgroup_dir=root / pod.memory.path.lstrip("/"),
                    version=pod.memory.cgroup_version,
                )
                saved = self._saved.setdefault(pod.uid, {})
                save |= _raise(record, "kernel_peak_bytes", peak, saved=saved)
        if snapshot.focused is None:
            save |= self._end(meta, now=snapshot.timestamp)
        if save:
            self._changed()
        if self._writer is not None:
            self._writer.soon()

    def _start(self, meta: PodMeta, now: float) -> dict[str, Any]:
        return {
            "namespace": meta.namespace,
            "pod": meta.name,
            "uid": meta.uid,
            "trial": meta.labels[TRIAL_LABEL],
            "experiment": meta.labels.get(EXPERIMENT_LABEL, ""),
            "node": self._node,
            "request_bytes": meta.memory_request_bytes,
            "limit_bytes": meta.memory_limit_bytes,
            "qos_class": meta.qos_class,
            "phase": meta.phase,
            "first_sampled": now,
            "containers": {},
        }

    def _end(self, meta: Any, *, now: float) -> bool:
        """Move the pods that ended to the records to write; whether any did."""
        ended = False
        for uid in list(self._pods):
            m: PodMeta | None = meta.get(uid)
            if m is not None and m.phase not in _TERMINAL:
                continue
            record = self._pods.pop(uid)
            self._saved = {k: v for k, v in self._saved.items() if not k.startswith(uid)}
            record["phase"] = m.phase if m is not None else "Deleted"
            record["ended"] = now
            self._pending[uid] = record
            self._ended.append(uid)
            ended = True
        del self._ended[: max(0, len(self._ended) - PENDING_KEPT)]
        while len(self._pending) > PENDING_KEPT:
            dropped = self._pending.pop(next(iter(self._pending)))
            log.warning(
                "trial memory: dropped the record of %s/%s", dropped["namespace"], dropped["pod"]
            )
        return ended


def trial_writer(kube: KubeClient) -> Write:
    """The :data:`Write` of the agent with a cluster: the record as the value of the pod's key
    in its Trial's ConfigMap (:class:`~nodeguard.kube.trial_records.TrialRecords`)."""
    records = TrialRecords(kube=kube)

    async def write(record: dict[str, Any]) -> None:
        await records.put(
            namespace=record["namespace"],
            trial=record["trial"],
            experiment=record["experiment"],
            pod=record["pod"],
            record=record,
        )

    return write


class TrialMemoryCollector(Collector):
    """``nodeguard_trial_pods{state}`` (``tracked``: peaks kept; ``pending``: ended, record not
    written yet) and ``nodeguard_trial_records_written_total``."""

    def __init__(self, *, trials: TrialMemory) -> None:
        self._trials = trials

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        pods = GaugeMetricFamily(
            "nodeguard_trial_pods",
            "Katib trial pods of this node: tracked (peaks kept), pending (ended, its record "
            "not yet written to its Trial's ConfigMap)",
            labels=["state"],
        )
        pods.add_metric(["tracked"], self._trials.tracked)
        pods.add_metric(["pending"], self._trials.pending)
        written = CounterMetricFamily(
            "nodeguard_trial_records_written",
            "trial pods' memory records written to their Trials' ConfigMaps",
        )
        written.add_metric([], self._trials.written)
        yield from (pods, written)
