"""The memory history that incident records carry: what a point keeps (the largest containers
and any near its limit, not every one), its bounds (age, bytes, spacing), and a record's
window (the last points as they are, the older ones thinned)."""

from __future__ import annotations

import dataclasses

from nodeguard.remediation.timeline import NEAR_LIMIT, TOP, Timeline, point_of
from nodeguard.snapshot import ContainerMemory, NodeSnapshot, PodMemory
from tests.support.hosts import cgroup_memory

MiB = 1 << 20


def _snap(t: float, sizes: dict[str, tuple[int, int | None]]) -> NodeSnapshot:
    """Containers ``c`` of working set and limit ``sizes[c]``, each in a pod of its own."""
    pods = []
    for c, (used, limit) in sizes.items():
        memory = dataclasses.replace(
            cgroup_memory(f"/p{c}/{c}", used=used), limit_bytes=limit, effective_limit_bytes=limit
        )
        pods.append(
            PodMemory(
                uid=f"pod-{c}",
                qos_class="burstable",
                memory=cgroup_memory(f"/p{c}", used=used),
                containers=(ContainerMemory(container_id=c, runtime="", memory=memory),),
            )
        )
    return NodeSnapshot(
        timestamp=t,
        node_name="n",
        meminfo=None,
        pressure=None,
        pods=tuple(pods),
        oom=None,
        processes=(),
        collectors=(),
    )


def test_a_point_keeps_the_largest_and_those_near_their_limit() -> None:
    sizes: dict[str, tuple[int, int | None]] = {
        f"big{i}": ((100 + i) * MiB, None) for i in range(8)
    }
    sizes["near"] = (9 * MiB, 10 * MiB)  # small, but at 90 % of its limit
    sizes["far"] = (5 * MiB, 10 * MiB)  # small and at 50 %: not kept
    kept = [c["key"] for c in point_of(_snap(0, sizes))["containers"]]
    assert len([k for k in kept if "/big" in k]) == TOP and "pod-near/near" in kept
    assert "pod-far/far" not in kept and NEAR_LIMIT == 0.8
    assert kept[0] == "pod-big7/big7"  # largest first


def test_bounded_by_age_size_and_spacing() -> None:
    timeline = Timeline(seconds=10, max_bytes=10_000, spacing=1.0)
    for i in range(40):
        timeline.push(_snap(i * 0.5, {"a": (i * MiB, None)}))  # every 0.5 s: every other kept
    assert len(timeline) == 11 and timeline.window(until=100)[0]["time"] == 9.0  # 10 s of them
    small = Timeline(seconds=600, max_bytes=1_000, spacing=0)
    for i in range(100):
        small.push(_snap(i, {"a": (i * MiB, None)}))
    assert small.bytes <= 1_000 and len(small) < 100
    assert small.window(until=1e9)[-1]["time"] == 99  # the newest stay


def test_a_records_window_keeps_the_last_points_and_thins_the_rest() -> None:
    timeline = Timeline(seconds=1e6, max_bytes=1 << 30, spacing=0)
    for i in range(1000):
        timeline.push(_snap(i, {"a": (MiB, None)}))
    window = timeline.window(until=899.5, most=100)
    times = [p["time"] for p in window]
    assert len(times) == 100 and times[-50:] == list(range(850, 900))
    assert times[0] == 0 and times == sorted(times)  # the older half, thinned, from the start
    assert timeline.window(until=899.5, most=10_000)[-1]["time"] == 899  # nothing after
