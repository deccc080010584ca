"""The kernel's notifications wired to the sampler: what to watch, and what a wake-up samples.

After every full sample, :class:`Notifications` keeps the kernel notifications
(:mod:`nodeguard.sampling.notify`) on what the snapshot shows:

- cgroup v1 memory thresholds on every pod and container cgroup with a limit, at the focus share
  of the limit and at each level the rules compare a working set with (``*_working_set_limit_
  ratio >= x``); the containers nearest their limits first, within ``max_thresholds``;
- cgroup v2 ``memory.events`` watches on every pod and container cgroup;
- PSI triggers on the node's ``/proc/pressure/memory`` and, on cgroup v2, on each pod's
  ``memory.pressure``.

A threshold or a ``memory.events`` change wakes the sampler for a focused sample of that cgroup
(:meth:`nodeguard.sampling.sampler.Sampler.wake`): the rules then see it within milliseconds, not at
the next interval. A usage threshold fires no later than the working set crosses the same level
(usage includes the page cache the working set leaves out), so the focused sample that follows
decides on the working set, as always. A pod's PSI trigger wakes a focused sample of the pod; the
node's, a full sample.

What the kernel or the agent's privileges refuse is logged once and reported in every snapshot
as ``nodeguard_collector_available{collector="notify_<kind>"} 0`` with its reason; the agent
then relies on focus sampling, which needs no privilege.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from nodeguard.sampling.notify.hub import (
    NOTIFY_KINDS,
    NotificationHub,
    NotifyKind,
    PsiSpec,
    Wakeup,
    Watched,
)
from nodeguard.sampling.sampler import Sampler
from nodeguard.snapshot import CollectorStatus, NodeSnapshot

__all__ = ["FocusCollector", "Notifications", "NotifyConfig", "threshold_levels"]

log = logging.getLogger(__name__)

#: The signals whose ``>=``/``>`` thresholds become v1 memory thresholds. A v1 threshold is on
#: usage, which is at least the working set and the unreclaimable memory: usage crosses the
#: level first, so the sample it wakes is never late for either share.
LEVEL_SIGNALS = (
    "container_working_set_limit_ratio",
    "pod_working_set_limit_ratio",
    "container_unreclaimable_limit_ratio",
    "pod_unreclaimable_limit_ratio",
)
#: Levels kept per cgroup at most (each an eventfd and an open file).
MAX_LEVELS = 4
#: Pod PSI triggers kept at most (each a kernel trigger polled with its window).
MAX_POD_TRIGGERS = 256
#: Each kind's ``--notify.<flag>`` name.
FLAG: dict[NotifyKind, str] = {"threshold": "thresholds", "psi": "psi", "events": "events"}


@dataclass(frozen=True, slots=True, kw_only=True)
class NotifyConfig:
    """Which notifications to use: ``thresholds`` (v1), ``psi``, ``events`` (v2); the PSI
    trigger's ``psi_stall`` within ``psi_window`` (seconds; kernel: 0.5-10 s window);
    ``max_thresholds`` registered at once."""

    thresholds: bool = True
    psi: bool = True
    events: bool = True
    psi_stall: float = 0.2
    psi_window: float = 2.0
    max_thresholds: int = 512

    @property
    def any(self) -> bool:
        return self.thresholds or self.psi or self.events

    def flags_on(self) -> list[str]:
        """The ``--notify.<flag>`` names turned on, in :data:`NOTIFY_KINDS` order."""
        return [FLAG[kind] for kind, on in self.by_kind() if on]

    def by_kind(self) -> zip[tuple[NotifyKind, bool]]:
        """Each kind of :data:`NOTIFY_KINDS` and whether it is on."""
        return zip(NOTIFY_KINDS, (self.thresholds, self.psi, self.events), strict=True)


def threshold_levels(*, conditions: Iterable[tuple[str, str, float]], focus: float) -> list[float]:
    """The shares of a limit to set thresholds at: ``focus`` and the values of the
    ``(signal, op, value)`` conditions on :data:`LEVEL_SIGNALS` with ``>=`` or ``>`` (within
    0..1), the highest :data:`MAX_LEVELS` of them."""
    levels = {focus} if 0 < focus <= 1 else set()
    for signal, op, value in conditions:
        if signal in LEVEL_SIGNALS and op in (">=", ">") and 0 < value <= 1:
            levels.add(value)
    return sorted(levels)[-MAX_LEVELS:]


class Notifications:
    """The hub of ``config``'s notifications, kept on ``sampler``'s snapshots; wake-ups go to
    ``sampler.wake``. :meth:`sync` after each full sample; :meth:`statuses` for the snapshot;
    :meth:`close` at the end."""

    def __init__(
        self, *, sampler: Sampler, config: NotifyConfig, levels: Sequence[float], procfs: str
    ) -> None:
        self.config = config
        self._sampler = sampler
        self._procfs = procfs
        self.hub = NotificationHub(
            on_wakeup=self._on_wakeup, levels=levels, max_thresholds=config.max_thresholds
        )
        self._psi_set = False
        for kind, on in config.by_kind():
            if not on:
                self.hub.statuses[kind].error = f"turned off (--no-notify.{FLAG[kind]})"

    def start(self) -> None:
        """Deliver wake-ups (call in the event loop's thread)."""
        self.hub.start(asyncio.get_running_loop())

    def set_levels(self, levels: Sequence[float]) -> None:
        """New threshold levels (the rules changed): thresholds are set again at the next
        :meth:`sync`."""
        self.hub.set_levels(levels)

    def _on_wakeup(self, wakeup: Wakeup) -> None:
        self._sampler.wake(None if wakeup.key == "node" else wakeup.key)

    def sync(self, snapshot: NodeSnapshot) -> None:
        """Keep the notifications on the cgroups of a full ``snapshot``."""
        if snapshot.focused is not None:
            return
        cfg = self.config
        if cfg.psi and not self._psi_set:
            self._psi_set = True
            self.hub.set_psi([self._node_psi()])
        root = snapshot.cgroup_root
        version = snapshot.cgroup_version
        if root is None or version is None:
            return
        other = {
            1: ("events", "cgroup v1 has no memory.events (thresholds instead)"),
            2: ("threshold", "cgroup v2 has no memory thresholds (memory.events instead)"),
        }
        if version in other:
            kind, why = other[version]
            if (kind == "events" and cfg.events) or (kind == "threshold" and cfg.thresholds):
                self.hub.statuses[kind].error = why  # type: ignore[index]
        watched: list[tuple[float, Watched]] = []
        pod_psi: list[PsiSpec] = []
        for pod in snapshot.pods:
            members = [(pod.uid, pod.memory)]
            members += [(f"{pod.uid}/{c.container_id}", c.memory) for c in pod.containers]
            for key, mem in members:
                watched.append(
                    (
                        mem.limit_ratio or 0.0,
                        Watched(
                            key=key,
                            directory=root + mem.path,
                            version=version,
                            limit=mem.effective_limit_bytes,
                        ),
                    )
                )
            if cfg.psi and version == 2 and len(pod_psi) < MAX_POD_TRIGGERS:
                pod_psi.append(
                    PsiSpec(
                        key=pod.uid,
                        path=os.path.join(root + pod.memory.path, "memory.pressure"),
                        kind="some",
                        stall=cfg.psi_stall / cfg.psi_window,
                        window=cfg.psi_window,
                    )
                )
        watched.sort(key=lambda rw: -rw[0])  # nearest their limits first
        keep = [
            w
            for _, w in watched
            if (w.version == 1 and cfg.thresholds) or (w.version == 2 and cfg.events)
        ]
        self.hub.sync(keep)
        if cfg.psi and version == 2:
            self.hub.set_psi([self._node_psi(), *pod_psi])

    def _node_psi(self) -> PsiSpec:
        cfg = self.config
        return PsiSpec(
            key="node",
            path=os.path.join(self._procfs, "pressure", "memory"),
            kind="some",
            stall=cfg.psi_stall / cfg.psi_window,
            window=cfg.psi_window,
        )

    def statuses(self) -> list[CollectorStatus]:
        """A status per kind, as ``notify_threshold``, ``notify_psi``, ``notify_events``:
        available when in use; the error says why not."""
        out = []
        for kind in NOTIFY_KINDS:
            st = self.hub.statuses[kind]
            out.append(
                CollectorStatus(
                    name=f"notify_{kind}",
                    success=True,
                    available=st.available,
                    duration_seconds=0.0,
                    error=None if st.available else (st.error or "nothing to watch"),
                )
            )
        return out

    def close(self) -> None:
        self.hub.close()


class FocusCollector(Collector):
    """``nodeguard_sampler_samples_total{kind="full"|"focused"}``, ``nodeguard_focus_targets``
    (pods and containers focused now), ``nodeguard_focus_node`` (1 while the node is), and
    per notification kind ``nodeguard_notify_registered{kind}`` and
    ``nodeguard_notify_wakeups_total{kind}``."""

    def __init__(self, *, sampler: Sampler, notifications: Notifications | None) -> None:
        self._sampler = sampler
        self._notifications = notifications

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        s = self._sampler
        samples = CounterMetricFamily(
            "nodeguard_sampler_samples",
            "samples taken: full (every cgroup, every interval) and focused (meminfo, PSI and "
            "the cgroups near their limits or named by a kernel notification)",
            labels=["kind"],
        )
        for kind in ("full", "focused"):
            samples.add_metric([kind], s.samples[kind])
        targets = GaugeMetricFamily(
            "nodeguard_focus_targets",
            f"pods and containers at {s.config.focus_share:.0%} of their limit or more, "
            "sampled every focus interval",
        )
        targets.add_metric([], len(s.focus))
        node = GaugeMetricFamily(
            "nodeguard_focus_node",
            f"1 while MemAvailable is below {s.config.node_focus_share:.0%} of usable "
            "memory (the node sampled every focus interval)",
        )
        node.add_metric([], int(s.node_focused))
        yield from (samples, targets, node)
        if self._notifications is None:
            return
        registered = GaugeMetricFamily(
            "nodeguard_notify_registered",
            "kernel notifications held: v1 thresholds (eventfds), PSI triggers, v2 "
            "memory.events watches",
            labels=["kind"],
        )
        wakeups = CounterMetricFamily(
            "nodeguard_notify_wakeups",
            "kernel notifications received, each a sample at once",
            labels=["kind"],
        )
        for kind, st in self._notifications.hub.statuses.items():
            registered.add_metric([kind], st.registered)
            wakeups.add_metric([kind], st.wakeups)
        yield from (registered, wakeups)
