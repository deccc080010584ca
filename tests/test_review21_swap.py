"""Review of issue 21, point 1 (swap form): a container's swap bound is not its pod's or the
kubepods cgroup's.

The kubelet writes ``memory.swap.max`` per *container* (0 under ``NoSwap``, the default
``swapBehavior`` since 1.30, and for Guaranteed/BestEffort pods under ``LimitedSwap``; KEP-2400,
pkg/kubelet/kuberuntime/kuberuntime_container_linux.go); the pod and kubepods cgroups keep the
kernel's default ``max``. cgroup-v2.rst, "memory.swap.max": once a cgroup's swap usage reaches
it, "anonymous memory of the cgroup will not be swapped out". So the anon of a pod whose only
container has ``memory.swap.max`` 0 cannot go to swap whatever the node's SwapFree: the pod's
(and kubepods') unreclaimable memory is that anon, as the container's is.
"""

from __future__ import annotations

from pathlib import Path

from nodeguard.sources.cgroups import CgroupReader
from tests.test_unreclaimable import _host, _stat

MiB = 1 << 20
GiB = 1 << 30


def test_review21_noswap_container_anon_is_unreclaimable_in_its_pod_and_kubepods(
    tmp_path: Path,
) -> None:
    anon = 800 * MiB
    stat = _stat(anon=anon, active_anon=anon)
    paths, _uid, _cid = _host(
        tmp_path, container=stat, current=anon, swap=(0, 0), pod_swap=("max", 0)
    )
    reader = CgroupReader(paths=paths)
    _, pods = reader.read(mem_total=64 * GiB, swap_free=8 * GiB)  # a node with swap, NoSwap
    container = pods[0].containers[0].memory
    assert container.unreclaimable_bytes == anon  # right today: its own swap.max is 0
    # The pod is nothing but that container: its anon cannot be swapped either. Today 0 (the
    # node's 8 GiB of SwapFree taken as room for it): pod_unreclaimable_limit_ratio reads 0
    # and evict's plan values the pod at 0 bytes freed.
    assert pods[0].memory.unreclaimable_bytes == anon
    # The kubepods cgroup, against node allocatable (pods-near-allocatable): the same.
    assert reader.kubepods is not None
    assert reader.kubepods.unreclaimable_bytes == anon


def test_review21_noswap_node_pods_at_allocatable_are_seen_at_it(tmp_path: Path) -> None:
    """Four NoSwap pods of 7.25 GiB anon each (29 GiB) in a 30 GiB kubepods cgroup on a node
    with 8 GiB of swap free: the kernel OOM-kills at the kubepods limit (no pod's anon can go to
    swap), so node_allocatable_unreclaimable_ratio is 29/30 and pods-near-allocatable (>= 0.95)
    must see it. Today it reads (29 - 8) / 30 = 0.70."""
    from tests.test_unreclaimable import _cgroup

    cg = tmp_path / "sys/fs/cgroup"
    cg.mkdir(parents=True)
    (cg / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (cg / "memory.stat").write_text("anon 0\nfile 0\n")
    vm = tmp_path / "proc/sys/vm"
    vm.mkdir(parents=True)
    (vm / "swappiness").write_text("60\n")
    each = 7 * GiB + 256 * MiB
    total = 4 * each
    kp = cg / "kubepods.slice"
    _cgroup(kp, current=total, stat=_stat(anon=total, active_anon=total), limit=30 * GiB)
    qos = kp / "kubepods-burstable.slice"
    _cgroup(qos, current=total, stat=_stat(anon=total, active_anon=total), swap=("max", 0))
    for i in range(4):
        uid = f"0000000{i}-0000-4000-8000-000000000000"
        pod = qos / f"kubepods-burstable-pod{uid.replace('-', '_')}.slice"
        st = _stat(anon=each, active_anon=each)
        _cgroup(pod, current=each, stat=st, limit=8 * GiB, swap=("max", 0))
        _cgroup(
            pod / f"cri-containerd-{str(i) * 64}.scope",
            current=each,
            stat=st,
            limit=8 * GiB,
            swap=(0, 0),
        )
    from nodeguard.paths import HostPaths

    reader = CgroupReader(paths=HostPaths(procfs=tmp_path / "proc", sysfs=tmp_path / "sys"))
    _, pods = reader.read(mem_total=64 * GiB, swap_free=8 * GiB)
    assert len(pods) == 4
    assert all(c.memory.unreclaimable_bytes == each for p in pods for c in p.containers)
    assert reader.kubepods is not None
    ratio = reader.kubepods.unreclaimable_ratio
    assert ratio is not None
    assert ratio >= 0.95  # 29/30
