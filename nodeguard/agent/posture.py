"""``nodeguard_posture_findings{check,severity}``: ``nodeguard doctor``'s checks of scope
``node`` (:func:`nodeguard.doctor.registry.node_checks`) run by the agent on its own node.

What they read is what the agent already reads with its own RBAC (daemonset/base/rbac.yaml:
get its Node, list and watch the pods with ``spec.nodeName=<node>``), nothing more: no
ResourceQuota or LimitRange, which are namespaced and would need a cluster-wide list for checks
that are not about one node. :class:`NodePosture` listens to the pod watch
(:class:`~nodeguard.kube.pod_store.PodListener`) and keeps each pod's
:func:`~nodeguard.doctor.read.pod_view` and the Node's :func:`~nodeguard.doctor.read.node_view`
(small frozen values, never the documents), so an evaluation reads no API.

When: every ``--posture.interval`` (default 60 s), and only when a pod or the Node changed since
the last evaluation. Findings are about configuration, which changes when something is deployed,
not from second to second; a posture alert waits minutes (its ``for``) and Prometheus scrapes
every 15 to 60 s, so a finding up to a minute late costs nothing, and a node whose pods churn
(a Job per second) is still evaluated at most once a minute. The Node is read again every 60 s by
the watch too (``node_refresh``).

No data, never 0, until there is something to count: without a cluster (no collector is
registered), before the first pod list and Node read, and with ``--posture.interval=0``. After
that, a pod watch that fails keeps the last pods it saw (as the snapshot does).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
from collections.abc import Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from nodeguard.doctor.inputs import NodeView, PodView
from nodeguard.doctor.node_scope import PostureKey, node_cluster, posture_counts
from nodeguard.doctor.read import node_view, pod_view
from nodeguard.kube.calls import JSON
from nodeguard.kube.pod_store import trimmed

__all__ = ["NodePosture", "PostureCollector"]

log = logging.getLogger(__name__)


class NodePosture:
    """The doctor's views of this node and its pods, kept from the pod watch, and the counts of
    the node checks' findings as last evaluated (:meth:`counts`; ``None`` before the first)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pods: dict[str, PodView] = {}
        self._node: NodeView | None = None
        self._listed = False
        self._changes = 0  # bumped on every list, event and Node read that changed a view
        self._evaluated_at_change = -1
        self._counts: dict[PostureKey, int] | None = None

    # The watch's listener (nodeguard.kube.pod_store.PodListener): the pods from its thread.
    def pods_listed(self, items: Sequence[JSON]) -> None:
        views = {v.meta.uid: v for v in (_view(p) for p in items)}
        with self._lock:
            self._pods, self._listed = views, True
            self._changes += 1

    def pod_changed(self, pod: JSON) -> None:
        view = _view(pod)
        with self._lock:
            if self._pods.get(view.meta.uid) != view:  # an event that changes no view is none
                self._pods[view.meta.uid] = view
                self._changes += 1

    def pod_deleted(self, uid: str) -> None:
        with self._lock:
            if self._pods.pop(uid, None) is not None:
                self._changes += 1

    def node_read(self, node: JSON) -> None:
        view = node_view(node)
        with self._lock:
            if view != self._node:
                self._node = view
                self._changes += 1

    def evaluate(self) -> bool:
        """Run the node checks if a pod or the Node changed since the last time (and the pods
        were listed and the Node read); whether they ran."""
        with self._lock:
            node, changes = self._node, self._changes
            if node is None or not self._listed or changes == self._evaluated_at_change:
                return False
            pods = list(self._pods.values())
        counts = posture_counts(node_cluster(node=node, pods=pods))
        with self._lock:
            self._counts, self._evaluated_at_change = counts, changes
        return True

    def counts(self) -> dict[PostureKey, int] | None:
        """Findings by check and severity as last evaluated; ``None`` before the first."""
        with self._lock:
            return self._counts

    async def run(self, *, stop: asyncio.Event, interval: float) -> None:
        """Evaluate every ``interval`` seconds until ``stop`` is set; the first time as soon as
        the pods are listed and the Node read (polled each second until then)."""
        while not stop.is_set():
            try:
                self.evaluate()
            except Exception:  # a check's bug costs the metric, never the agent
                log.exception("posture checks failed; the last findings are kept")
            wait = interval if self.counts() is not None else min(1.0, interval)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=wait)


def _view(pod: JSON) -> PodView:
    """The doctor's view of a pod, with the store's bound on what is kept of its annotations."""
    view = pod_view(pod)
    return dataclasses.replace(view, meta=trimmed(view.meta))


class PostureCollector(Collector):
    """Renders ``nodeguard_posture_findings{check,severity}`` from :class:`NodePosture`: one
    series per node check and severity it can report, nothing before the first evaluation."""

    def __init__(self, *, posture: NodePosture) -> None:
        self._posture = posture

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        counts = self._posture.counts()
        if counts is None:
            return
        family = GaugeMetricFamily(
            "nodeguard_posture_findings",
            "findings of nodeguard doctor's node checks on this node and its pods, by check "
            "and severity (evaluated every --posture.interval when something changed)",
            labels=["check", "severity"],
        )
        for key, n in sorted(counts.items()):
            family.add_metric([key.check, key.severity], n)
        yield family
