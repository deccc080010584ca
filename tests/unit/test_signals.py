"""The real signals on a fixture host, and the time-to-limit prediction."""

from __future__ import annotations

import math
import random
from collections import deque

import pytest

from nodeguard.rules.oom_history import kills_in_window, push_change
from nodeguard.rules.signals import (
    MAX_POINTS,
    OOM_WINDOW,
    SIGNALS,
    History,
    seconds_to_limit,
    targets,
)
from nodeguard.sampling.sampler import Sampler, SamplerConfig
from tests.fixtures.make_hosts import CID, UID_G
from tests.support.hosts import host_paths

MiB = 1 << 20
GiB = 1 << 30


def test_seconds_to_limit() -> None:
    growing = [(t, 40 * MiB + int(t * MiB)) for t in range(0, 21, 5)]  # 1 MiB/s, 60 MiB now
    assert seconds_to_limit(growing, 100 * MiB) == pytest.approx(40.0)
    flat = [(t, 60 * MiB) for t in range(0, 21, 5)]
    assert seconds_to_limit(flat, 100 * MiB) == math.inf
    assert seconds_to_limit(growing[:2], 100 * MiB) is None  # too few samples
    assert seconds_to_limit(growing, None) is None  # no limit
    assert seconds_to_limit([*growing, (25, 100 * MiB)], 100 * MiB) == 0.0
    # Jitter of +-0.5 % on a flat working set at 98 % is not growth; nor is sitting at the limit.
    noisy = [(t, int(98 * MiB + (MiB // 2 if t % 10 else -MiB // 2))) for t in range(0, 31, 5)]
    assert seconds_to_limit(noisy, 100 * MiB) == math.inf
    assert seconds_to_limit([(t, 100 * MiB) for t in range(0, 31, 5)], 100 * MiB) == math.inf
    # A slow, steady leak near the limit is growth however slow: 0.125 MiB/s at 98.5 % of
    # 512 MiB reaches the limit in about a minute (the 1 %-of-limit floor called this noise).
    leak = [(t, int(504.3 * MiB + t * MiB / 8)) for t in range(0, 31, 5)]
    assert seconds_to_limit(leak, 512 * MiB) == pytest.approx((512 - 504.3 - 30 / 8) * 8, 0.01)
    # The same trend under +-2 MiB of jitter does not stand out of the noise: not growth.
    jittery = [(t, v + (2 * MiB if t % 10 else -2 * MiB)) for t, v in leak]
    assert seconds_to_limit(jittery, 512 * MiB) == math.inf
    # Three samples leave no noise to judge by: growth under 1 % of the limit is not counted.
    assert seconds_to_limit(leak[:3], 512 * MiB) == math.inf
    assert seconds_to_limit([(0, 400 * MiB), (5, 410 * MiB), (10, 420 * MiB)], 512 * MiB) == (
        pytest.approx(46.0)
    )
    # Only the last 30 s count: an old plateau does not dilute a recent climb.
    old = [(t, 10 * MiB) for t in range(0, 60, 5)]
    climb = [(60 + t, 10 * MiB + 2 * t * MiB) for t in range(0, 31, 5)]
    assert seconds_to_limit(old + climb, 100 * MiB) == pytest.approx((100 - 70) / 2, rel=0.05)


def test_seconds_to_limit_does_not_take_noise_near_the_limit_for_growth() -> None:
    """A container that sits just under its limit must not be predicted to reach it: the
    default rule (>= 95 % and <= 60 s) would evict it at once. Each case is every 7-sample
    window (30 s at 5 s) of an hour at a 4 GiB limit."""
    limit = 4 * GiB

    def windows(series: list[tuple[float, int]]) -> list[float | None]:
        return [seconds_to_limit(series[i - 6 : i + 1], limit) for i in range(6, len(series))]

    rng = random.Random(1)
    jitter = [(5.0 * i, int(limit - 3 * MiB + rng.gauss(0, MiB))) for i in range(720)]
    wave = [
        (5.0 * i, int(limit - 3 * MiB + 2 * MiB * math.sin(2 * math.pi * 5 * i / 120)))
        for i in range(720)
    ]
    step = [(5.0 * i, limit - 12 * MiB if i < 10 else limit - 4 * MiB) for i in range(30)]
    page = [(5.0 * i, limit - 4096 if i < 10 else limit) for i in range(30)]
    for name, series in (("jitter", jitter), ("wave", wave), ("step", step), ("page", page)):
        assert set(windows(series)) == {math.inf}, name


def test_oom_kills_in_the_last_ten_minutes_from_the_counters_changes() -> None:
    store: dict[str, deque[tuple[float, int]]] = {}

    def at(now: float, value: int) -> float | None:
        push_change(store, "c", now, value, keep=OOM_WINDOW, thin=OOM_WINDOW / MAX_POINTS)
        return kills_in_window(list(store["c"]))

    assert at(0, 0) == 0.0
    for t in range(5, 305, 5):
        assert at(t, 0) == 0.0
    assert len(store["c"]) == 1  # a counter that stays holds one point, not 60
    assert at(305, 1) == 1.0
    assert at(700, 3) == 3.0  # 1 at 305 and 2 at 700, both within 600 s
    assert at(910, 3) == 2.0  # the window starts at 310, when the counter read 1
    assert at(1300, 3) == 0.0  # starts at 700, after the last kill
    assert len(store["c"]) == 1
    assert at(1305, 1) == 1.0  # a reset (a new cgroup under the same key) counts from 0


def test_real_signals_on_a_fixture_host() -> None:
    snap = Sampler(
        config=SamplerConfig(paths=host_paths("v2-systemd-containerd"), node_name="n")
    ).sample_once()
    history = History()
    history.observe(snap)

    def value(name: str, key: str) -> float | None:
        sig = SIGNALS[name]
        target = next(t for t in targets(snap, sig.scope) if t.key == key)
        return sig.fn(snap, history, target)

    # Shares of usable memory: MemTotal less the 16 MiB hugetlb pool of the fixture.
    usable = 32 * GiB - 16 * MiB
    assert value("node_memory_available_ratio", "n") == pytest.approx(6 * GiB / usable)
    assert value("node_memory_available_bytes", "n") == 6 * GiB
    assert value("node_slab_unreclaimable_ratio", "n") == pytest.approx(10 * GiB / usable)
    assert value("node_page_cache_ratio", "n") == pytest.approx(2.5 * GiB / usable)
    assert value("node_psi_full_avg10", "n") == pytest.approx(0.04)
    assert value("node_psi_some_avg60", "n") == pytest.approx(0.08)
    # kubepods.slice: 20 GiB used, 1 GiB of it inactive file, against its 30 GiB limit.
    assert value("node_allocatable_working_set_ratio", "n") == pytest.approx(19 / 30)
    # No pod list without a cluster: overcommit is unknown, not 0.
    assert value("node_memory_requests_allocatable_ratio", "n") is None
    key = f"{UID_G}/{CID[1]}"
    assert value("container_working_set_limit_ratio", key) == pytest.approx(
        (3 * GiB + 412 * MiB) / (4 * GiB)
    )
    assert value("container_working_set_request_ratio", key) is None
    assert value("container_seconds_to_limit", key) is None  # one sample: no growth yet
    assert value("pod_working_set_bytes", UID_G) == 3 * GiB + 600 * MiB - 100 * MiB
