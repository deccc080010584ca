"""What the agent remembers is bounded in bytes, whatever the interval or the input: the rule
engine's per-target history, and the pod watch's copy of each pod."""

from __future__ import annotations

import math
from collections import deque

from nodeguard.kube.objects import pod_meta
from nodeguard.kube.watch import MAX_ANNOTATION_CHARS, trimmed
from nodeguard.rules.oom_history import push_change
from nodeguard.rules.signals import (
    GROWTH_WINDOW,
    MAX_POINTS,
    OOM_WINDOW,
    _push,
    seconds_to_limit,
)


def test_history_at_the_shortest_interval_is_bounded_and_fits_the_same_growth() -> None:
    store: dict[str, deque[tuple[float, int]]] = {}
    plain: list[tuple[float, int]] = []
    t = 0.0
    while t < 4 * GROWTH_WINDOW:  # 50 ms: the shortest --interval
        value = int(1e9 + 2e6 * t)  # 2 MB/s
        _push(store, "c", t, value, GROWTH_WINDOW * 2)
        plain.append((t, value))
        t += 0.05
    kept = store["c"]
    assert len(kept) <= MAX_POINTS + 2
    assert kept[-1] == plain[-1]  # the newest is always there
    limit = 2 << 30
    full = [p for p in plain if p[0] >= plain[-1][0] - GROWTH_WINDOW * 2]
    ours, all_points = seconds_to_limit(kept, limit), seconds_to_limit(full, limit)
    assert ours is not None and all_points is not None
    assert math.isclose(ours, all_points, rel_tol=0.01)


def test_an_oom_counter_that_changes_every_sample_is_bounded_too() -> None:
    store: dict[str, deque[tuple[float, int]]] = {}
    for i in range(20 * 60 * 10):  # a kill every 50 ms for 10 minutes
        push_change(store, "c", i * 0.05, i, keep=OOM_WINDOW, thin=OOM_WINDOW / MAX_POINTS)
    assert len(store["c"]) <= MAX_POINTS + 3  # and the window's baseline, just before it
    assert store["c"][-1] == (11999 * 0.05, 11999)


def test_a_pod_with_huge_annotations_is_kept_small() -> None:
    pod = {
        "metadata": {
            "uid": "u",
            "name": "p",
            "namespace": "n",
            "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": "x" * 200_000,
                "scheduling.k8s.io/group-name": "gang-1",
                "kubernetes.io/config.source": "api",
            },
        },
        "spec": {"containers": []},
        "status": {},
    }
    meta = trimmed(pod_meta(pod))
    assert dict(meta.annotations) == {
        "scheduling.k8s.io/group-name": "gang-1",
        "kubernetes.io/config.source": "api",
    }
    assert all(len(v) <= MAX_ANNOTATION_CHARS for v in meta.annotations.values())
