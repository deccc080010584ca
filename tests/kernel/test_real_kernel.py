"""On the real kernel: a process in a kubelet-shaped cgroup grows past its 64 MiB limit. nodeguard
must show its working set rising toward the limit while it runs, and count exactly one OOM kill
for that container afterwards, from the cgroup counter and from the kernel log."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

from nodeguard.paths import HostPaths
from nodeguard.rules.signals import SIGNALS, History, targets
from nodeguard.sampling.sampler import Sampler, SamplerConfig
from nodeguard.snapshot import PodMemory
from nodeguard.sources.cgroups import CgroupReader
from tests.support.agent import get, running_agent, wait_until
from tests.support.kernel_cgroup import (
    PrivateKubepods,
    hog_in,
    kubelet_cgroup,
)
from tests.support.pod_list import PodList, status

MiB = 1 << 20
LIMIT = 64 * MiB


def _container(snapshot: dict[str, Any], cid: str) -> dict[str, Any] | None:
    for pod in snapshot["pods"]:
        for c in pod["containers"]:
            if c["container_id"] == cid:
                found: dict[str, Any] = c
                return found
    return None


def _kernel_log_kills(snapshot: dict[str, Any], cid: str) -> int:
    return sum(1 for k in (snapshot["oom"] or {}).get("recent", []) if k["container_id"] == cid)


def test_oom_kill_in_kubelet_cgroup(pods: PrivateKubepods, tmp_path: Path) -> None:
    with kubelet_cgroup(pods, limit_bytes=LIMIT) as cg:
        args = [
            f"--path.sysfs={pods.sysfs}",
            "--interval=100ms",
            f"--path.state={tmp_path / 'state'}",
            "--no-collector.processes",
        ]
        with running_agent(args=args, log_path=tmp_path / "agent.log") as base:
            seen: list[int] = []
            limits: set[int | None] = set()
            with hog_in(cg, step=1 * MiB, pause=0.03, up_to=4 * LIMIT) as hog:

                def sample() -> bool:
                    """The container's working set and limit as the agent sees them now."""
                    c = _container(json.loads(get(f"{base}/snapshot")[1]), cg.container_id)
                    if c is not None and c["memory"]["working_set_bytes"] is not None:
                        seen.append(c["memory"]["working_set_bytes"])
                        limits.add(c["memory"]["effective_limit_bytes"])
                    return hog.poll() is not None

                wait_until("the hog's end, sampling it", sample, timeout=60)
                hog.wait(timeout=10)
                assert hog.returncode == -9, "the kernel should have OOM-killed the hog"

            # Rising toward the limit while it ran: several distinct, growing samples.
            assert limits == {LIMIT}
            rising = sorted(set(seen))
            assert len(rising) >= 3, seen
            assert max(seen) >= LIMIT // 2, seen
            assert max(seen) <= LIMIT
            assert seen.index(max(seen)) > seen.index(min(seen))

            # Exactly one kill, from both the cgroup counter and the kernel log.
            def counted() -> dict[str, Any] | None:
                snap: dict[str, Any] = json.loads(get(f"{base}/snapshot")[1])
                c = _container(snap, cg.container_id)
                counter = c["memory"]["oom_kills"] if c else None
                return snap if counter and _kernel_log_kills(snap, cg.container_id) else None

            snap = wait_until("the kill in the counter and in the kernel log", counted, timeout=30)
            c = _container(snap, cg.container_id)
            assert c is not None and c["memory"]["oom_kills"] == 1
            assert _kernel_log_kills(snap, cg.container_id) == 1
            kill = next(k for k in snap["oom"]["recent"] if k["container_id"] == cg.container_id)
            assert kill["pod_uid"] == cg.pod_uid
            assert kill["constraint"] == "CONSTRAINT_MEMCG"
            assert kill["process"].startswith("python")
            # The killed process held the limit in anonymous memory, plus what the interpreter
            # had faulted in before it was moved into the cgroup (charged to its old cgroup).
            assert LIMIT // 2 <= kill["anon_rss_bytes"] <= LIMIT + 16 * MiB

            metrics = get(f"{base}/metrics")[1]
            pod_label = f'pod="{cg.pod_uid}"'
            for name in (
                "nodeguard_container_memory_oom_kills_total",
                "nodeguard_container_kernel_oom_kills_total",
            ):
                line = next(
                    ln
                    for ln in metrics.splitlines()
                    if ln.startswith(name + "{") and cg.container_id in ln
                )
                assert pod_label in line
                assert re.search(r" 1\.0$", line), line


def _pod(reader: CgroupReader, uid: str) -> PodMemory:
    _, pods = reader.read(mem_total=None)
    return next(p for p in pods if p.uid == uid)


def test_a_pods_oom_kills_count_its_containers_also_those_gone(pods: PrivateKubepods) -> None:
    # v2's memory.events counts a pod's kills hierarchically and keeps them when a child goes;
    # v1's oom_control counts only the victim's own cgroup, a container's: the reader sums it.
    uid = str(uuid.uuid4())
    reader = CgroupReader(paths=HostPaths(sysfs=pods.sysfs))
    with kubelet_cgroup(pods, limit_bytes=LIMIT, pod_uid=uid) as sidecar:
        with kubelet_cgroup(pods, limit_bytes=LIMIT, pod_uid=uid) as first:
            assert _pod(reader, uid).memory.oom_kills == 0
            with hog_in(first, step=MiB, pause=0.005, up_to=4 * LIMIT) as hog:
                assert hog.wait(timeout=30) == -9
            pod = _pod(reader, uid)
            assert pod.memory.oom_kills == 1
            assert {c.container_id: c.memory.oom_kills for c in pod.containers} == {
                first.container_id: 1,
                sidecar.container_id: 0,
            }
        # The kubelet restarts an OOM-killed container in a new cgroup; the old one goes.
        pod = _pod(reader, uid)
        assert [c.container_id for c in pod.containers] == [sidecar.container_id]
        assert pod.memory.oom_kills == 1
        with hog_in(sidecar, step=MiB, pause=0.005, up_to=4 * LIMIT) as hog:
            assert hog.wait(timeout=30) == -9
        assert _pod(reader, uid).memory.oom_kills == 2


def test_an_oom_kill_stays_the_containers_after_the_kubelet_replaces_it(
    pods: PrivateKubepods,
) -> None:
    """The kernel OOM-kills a container's process; the container's cgroup is removed and a new
    one made for its restart (a new ID, counters at 0), the pod status naming the old ID in
    ``lastState.terminated``, as the kubelet does within a second, before any sample read the
    old cgroup's count. The kill stays the container's (pod UID, name) and the pod's: one."""
    uid = str(uuid.uuid4())
    pod_list = PodList()
    sampler = Sampler(
        config=SamplerConfig(
            paths=HostPaths(sysfs=pods.sysfs),
            node_name="n",
            collectors=frozenset({"meminfo", "cgroups", "kmsg"}),
        ),
        cluster=pod_list,
    )
    history = History()

    def kills(signal: str, key: str) -> float | None:
        snap = sampler.sample_once()
        history.observe(snap)
        sig = SIGNALS[signal]
        return sig.fn(snap, history, next(t for t in targets(snap, sig.scope) if t.key == key))

    try:
        with kubelet_cgroup(pods, limit_bytes=LIMIT, pod_uid=uid) as sidecar:
            with kubelet_cgroup(pods, limit_bytes=LIMIT, pod_uid=uid) as first:
                pod_list.set(
                    uid=uid,
                    name="trainer",
                    statuses=[
                        status("app", first.container_id),
                        status("side", sidecar.container_id),
                    ],
                )
                assert kills("container_oom_kills_10m", f"{uid}/{first.container_id}") == 0
                with hog_in(first, step=MiB, pause=0.005, up_to=4 * LIMIT) as hog:
                    assert hog.wait(timeout=30) == -9
            with kubelet_cgroup(pods, limit_bytes=LIMIT, pod_uid=uid) as second:
                pod_list.set(
                    uid=uid,
                    name="trainer",
                    statuses=[
                        status("app", second.container_id, last=first.container_id),
                        status("side", sidecar.container_id),
                    ],
                )
                key = f"{uid}/{second.container_id}"
                # The kernel log's record may come a moment after the victim's death.
                wait_until(
                    "the kill in the kernel log",
                    lambda: kills("container_oom_kills_10m", key) == 1,
                    timeout=10,
                )
                assert kills("pod_oom_kills_10m", uid) == 1
                assert kills("container_oom_kills_10m", f"{uid}/{sidecar.container_id}") == 0
    finally:
        sampler.close()
