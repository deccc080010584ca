"""OOM kills in the last window per pod and per container, from every source that saw them.

An OOM kill leaves three traces, each partial:

- the victim cgroup's counter (v2 ``memory.events`` ``oom_kill``, hierarchical, so a pod's
  counts its containers'; v1 ``memory.oom_control`` ``oom_kill`` since 4.13, the cgroup's own,
  folded into the pod by :class:`nodeguard.sources.cgroups.CgroupReader`). The kubelet restarts
  an OOM-killed container within a second in a new container: a new ID, a new cgroup whose
  counters start at 0 (mm/memcontrol.c allocates a cgroup's event counters zeroed). A sample
  every 5 s rarely reads the old cgroup after the kill, so a container's own counter loses it;
- the kernel log (:class:`~nodeguard.snapshot.OomLog`): each victim once, by the ID of the
  container that was killed, also after its cgroup is gone; and the repeats of a
  ``memory.oom.group`` kill, which the cgroup counter counts as kills of their own;
- the pod object: ``lastState.terminated.containerID`` names the container that was replaced
  (:attr:`~nodeguard.snapshot.PodMeta.containers`).

So a container's history is kept by pod UID and container *name* (all the IDs its name had in
the window), a pod's by its UID, and never across pods: a pod deleted and recreated under the
same name has a new UID and a history of its own. For each container ID the kills in the window
are the larger of the two counts that see the same victims: the cgroup counter's increase less
the kernel log's repeats (one victim is one kill on v1 and v2 alike; the repeats stay visible in
``oom.repeats_by_container``, as the README says), and the kernel log's victims. Each is a
lower bound of the truth (the counter misses what came after its last read, the log what its
ring buffer lost), and neither counts a victim twice.

A cgroup or a kernel-log key first seen after the first sample was born since the last one
(its counter started at 0 then): its first value counts. Those present at the first sample are
the baseline, as any counter's first value is. A key not seen is kept until it has not been
seen for the window (a container gone is still a kill in the window; a file skipped in one
sample loses nothing).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping

from nodeguard.snapshot import NodeSnapshot

__all__ = ["OomHistory", "kills_in_window", "push_change"]

Series = deque[tuple[float, int]]


def push_change(
    store: dict[str, Series], key: str, now: float, value: int, *, keep: float, thin: float
) -> None:
    """Keep a counter's changes only: a counter that stays (most OOM counters, most of the
    time) holds one point, not one per sample for ``keep`` seconds. The newest point older
    than ``keep`` stays as the value the window starts from; a change within ``thin`` seconds
    of the point before the last takes the last one's place (a counter that changes every
    sample)."""
    series = store.setdefault(key, deque())
    if not series or series[-1][1] != value:
        if len(series) >= 2 and now - series[-2][0] < thin:
            series[-1] = (now, value)
        else:
            series.append((now, value))
    while len(series) > 1 and series[1][0] <= now - keep:
        series.popleft()


def kills_in_window(samples: list[tuple[float, int]] | Series) -> float | None:
    """Kills since the value in effect when the window began: the counter's changes kept by
    :func:`push_change`, the first of them the window's starting value; ``None`` for none."""
    if not samples:
        return None
    total, prev = 0, samples[0][1]
    for _, v in list(samples)[1:]:
        total += v - prev if v >= prev else v  # a reset (new cgroup) counts from 0
        prev = v
    return float(total)


class _Counters:
    """Counters by key, each kept by its changes, with when each key was last seen."""

    def __init__(self, *, keep: float, thin: float) -> None:
        self.series: dict[str, Series] = {}
        self._seen: dict[str, float] = {}
        self._keep, self._thin = keep, thin

    def push(self, key: str, now: float, value: int, *, born_at: float | None) -> None:
        """``value`` at ``now``; a key new since ``born_at`` (the last sample) starts at 0."""
        if born_at is not None and key not in self.series:
            push_change(self.series, key, born_at, 0, keep=self._keep, thin=self._thin)
        push_change(self.series, key, now, value, keep=self._keep, thin=self._thin)
        self._seen[key] = now

    def kills(self, key: str) -> float | None:
        series = self.series.get(key)
        return None if series is None else kills_in_window(series)

    def forget_unseen(self, now: float) -> None:
        """Drop the keys not seen for the window: nothing of theirs is left in it."""
        for key in [k for k, t in self._seen.items() if t < now - self._keep]:
            del self._seen[key]
            self.series.pop(key, None)


def _one_victim_one_kill(
    counter: float | None, victims: float | None, repeats: float | None
) -> float | None:
    """The kills of one cgroup in the window from its counter and the kernel log (see the
    module docstring); ``None`` when neither saw it."""
    if counter is None and victims is None:
        return None
    return max((counter or 0.0) - (repeats or 0.0), victims or 0.0)


class OomHistory:
    """The OOM counters of the pods and containers of recent snapshots, and the kernel log's
    counts, over ``window`` seconds (changes within ``thin`` seconds thinned). ``observe``
    each snapshot; :meth:`pod_kills` and :meth:`container_kills` count a target's kills."""

    def __init__(self, *, window: float, thin: float) -> None:
        self._window = window
        self._cgroups = _Counters(keep=window, thin=thin)  # pod uid, "<pod uid>/<container id>"
        self._victims = _Counters(keep=window, thin=thin)  # OomLog keys
        self._repeats = _Counters(keep=window, thin=thin)
        self._names: dict[str, dict[str, str]] = {}  # pod uid -> container id -> name
        self._pod_seen: dict[str, float] = {}
        self._last_read: float | None = None  # the last full sample that read the cgroups
        self._last_log: float | None = None  # the last sample with the kernel log

    def observe(self, snapshot: NodeSnapshot, *, current: Callable[[str], bool]) -> None:
        """Record one snapshot; of a focused one only the keys ``current`` accepts (the others'
        values are the last sample's)."""
        now, full = snapshot.timestamp, snapshot.focused is None
        born = self._last_read if full else None
        for pod in snapshot.pods:
            if current(pod.uid) and pod.memory.oom_kills is not None:
                self._cgroups.push(pod.uid, now, pod.memory.oom_kills, born_at=born)
            for c in pod.containers:
                key = f"{pod.uid}/{c.container_id}"
                if current(key) and c.memory.oom_kills is not None:
                    self._cgroups.push(key, now, c.memory.oom_kills, born_at=born)
        oom = snapshot.oom
        if oom is not None:
            born = self._last_log
            for key, count in oom.by_container.items():
                self._victims.push(key, now, count, born_at=born)
            for key, count in oom.repeats_by_container.items():
                self._repeats.push(key, now, count, born_at=born)
            self._last_log = now
        if not full:
            return
        if _read_cgroups(snapshot):
            self._last_read = now
        for uid, meta in (snapshot.pod_meta or {}).items():
            # The names of earlier IDs stay while the pod is here: the pod list may drop one.
            self._names.setdefault(uid, {}).update(meta.containers)
        for pod in snapshot.pods:
            self._pod_seen[pod.uid] = now
        for store in (self._cgroups, self._victims, self._repeats):
            store.forget_unseen(now)
        for uid in [u for u, t in self._pod_seen.items() if t < now - self._window]:
            del self._pod_seen[uid]
            self._names.pop(uid, None)

    def container_kills(self, *, pod_uid: str, container_id: str) -> float | None:
        """Kills in the window of the container named as ``container_id`` is in its pod, all
        its IDs together (one ID alone where its name is not known); ``None`` without data."""
        names = self._names.get(pod_uid, {})
        name = names.get(container_id)
        ids = {container_id} | {cid for cid, n in names.items() if name is not None and n == name}
        counts = [self._kills_of(f"{pod_uid}/{cid}") for cid in sorted(ids)]
        known = [c for c in counts if c is not None]
        return sum(known) if known else None

    def pod_kills(self, *, pod_uid: str) -> float | None:
        """Kills in the window of the pod, all its containers' (gone ones too) and its own."""
        prefix = f"{pod_uid}/"
        return _one_victim_one_kill(
            self._cgroups.kills(pod_uid),
            _sum_of(self._victims.series, prefix),
            _sum_of(self._repeats.series, prefix),
        )

    def _kills_of(self, key: str) -> float | None:
        return _one_victim_one_kill(
            self._cgroups.kills(key), self._victims.kills(key), self._repeats.kills(key)
        )


def _sum_of(series: Mapping[str, Series], prefix: str) -> float | None:
    counts = [kills_in_window(s) for k, s in series.items() if k.startswith(prefix)]
    known = [c for c in counts if c is not None]
    return sum(known) if known else None


def _read_cgroups(snapshot: NodeSnapshot) -> bool:
    """Whether the cgroups collector read the kubepods hierarchy in this snapshot: only then
    does a cgroup missing from it mean one that did not exist."""
    return any(c.name == "cgroups" and c.success and c.available for c in snapshot.collectors)
