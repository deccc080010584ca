"""A container's swap bound is not its pod's or the kubepods cgroup's, on cgroup v2 fixture trees.

The kubelet writes ``memory.swap.max`` per *container*: 0 under ``NoSwap`` (the default
``swapBehavior``), and under ``LimitedSwap`` a Burstable container's share of the node's swap
in proportion to its memory request (0 for Guaranteed and BestEffort pods and for a container
without a request); KEP-2400, kubernetes.io "Swap memory management". The pod and kubepods
cgroups keep the kernel's default ``max``. cgroup-v2.rst, "memory.swap.max": once a cgroup's
swap usage reaches it, "anonymous memory of the cgroup will not be swapped out"; the swap
charge is checked up the whole tree (mm/memcontrol.c ``__mem_cgroup_try_charge_swap()``). So a
pod's swappable anon is the sum of what each container can swap, bounded by the pod's own room
and the node's SwapFree, and the kubepods cgroup's the sum over its pods: the right values below.
"""

from __future__ import annotations

from pathlib import Path

from nodeguard.paths import HostPaths
from nodeguard.sources.cgroups import CgroupReader
from tests.support.memory_host import memory_cgroup, memory_host, memory_stat

MiB = 1 << 20
GiB = 1 << 30


def _v2_root(tmp: Path) -> Path:
    cg = tmp / "sys/fs/cgroup"
    cg.mkdir(parents=True)
    (cg / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (cg / "memory.stat").write_text("anon 0\nfile 0\n")
    vm = tmp / "proc/sys/vm"
    vm.mkdir(parents=True)
    (vm / "swappiness").write_text("60\n")
    return cg


def _anon(n: int) -> str:
    return memory_stat(anon=n, active_anon=n)


def _pod_of(
    tmp: Path,
    *,
    containers: list[tuple[int, tuple[int | str, int] | None]],
    pod_swap: tuple[int | str, int] | None = ("max", 0),
    extra_pod_anon: int = 0,
) -> tuple[HostPaths, Path, list[Path]]:
    """One burstable pod under a 30 GiB kubepods cgroup: ``containers`` as (anon bytes,
    (memory.swap.max, memory.swap.current) or ``None`` for no swap files); the pod and its
    ancestors hold the sum, plus ``extra_pod_anon`` charged to the pod beyond its containers."""
    cg = _v2_root(tmp)
    total = sum(a for a, _ in containers) + extra_pod_anon
    kp = cg / "kubepods.slice"
    memory_cgroup(kp, current=total, stat=_anon(total), limit=30 * GiB)
    qos = kp / "kubepods-burstable.slice"
    memory_cgroup(qos, current=total, stat=_anon(total), swap=("max", 0))
    pod = qos / "kubepods-burstable-pod0000000a_0000_4000_8000_000000000000.slice"
    memory_cgroup(pod, current=total, stat=_anon(total), limit=8 * GiB, swap=pod_swap)
    dirs = []
    for i, (anon, swap) in enumerate(containers):
        d = pod / f"cri-containerd-{str(i) * 64}.scope"
        memory_cgroup(d, current=anon, stat=_anon(anon), limit=4 * GiB, swap=swap)
        dirs.append(d)
    return HostPaths(procfs=tmp / "proc", sysfs=tmp / "sys"), kp, dirs


def _unreclaimable(paths: HostPaths, *, swap_free: int) -> tuple[int | None, int | None]:
    """The pod's and the kubepods cgroup's unreclaimable bytes."""
    reader = CgroupReader(paths=paths)
    _, pods = reader.read(mem_total=64 * GiB, swap_free=swap_free)
    assert reader.kubepods is not None
    return pods[0].memory.unreclaimable_bytes, reader.kubepods.unreclaimable_bytes


def test_noswap_container_anon_is_unreclaimable_in_its_pod_and_kubepods(tmp_path: Path) -> None:
    anon = 800 * MiB
    paths, _uid, _cid = memory_host(
        tmp_path, container=_anon(anon), current=anon, swap=(0, 0), pod_swap=("max", 0)
    )
    reader = CgroupReader(paths=paths)
    _, pods = reader.read(mem_total=64 * GiB, swap_free=8 * GiB)  # a node with swap, NoSwap
    assert pods[0].containers[0].memory.unreclaimable_bytes == anon  # its own swap.max is 0
    # The pod is nothing but that container: its anon cannot be swapped either (before: 0,
    # the node's 8 GiB of SwapFree taken as room for it, and evict valued the pod at 0 freed).
    assert pods[0].memory.unreclaimable_bytes == anon
    # The kubepods cgroup, against node allocatable (pods-near-allocatable): the same.
    assert reader.kubepods is not None
    assert reader.kubepods.unreclaimable_bytes == anon


def test_noswap_node_pods_at_allocatable_are_seen_at_it(tmp_path: Path) -> None:
    """Four NoSwap pods of 7.25 GiB anon each (29 GiB) in a 30 GiB kubepods cgroup on a node
    with 8 GiB of swap free: the kernel OOM-kills at the kubepods limit (no pod's anon can go to
    swap), so node_allocatable_unreclaimable_ratio is 29/30 and pods-near-allocatable (>= 0.95)
    sees it (before: (29 - 8) / 30 = 0.70)."""
    cg = _v2_root(tmp_path)
    each = 7 * GiB + 256 * MiB
    total = 4 * each
    kp = cg / "kubepods.slice"
    memory_cgroup(kp, current=total, stat=_anon(total), limit=30 * GiB)
    qos = kp / "kubepods-burstable.slice"
    memory_cgroup(qos, current=total, stat=_anon(total), swap=("max", 0))
    for i in range(4):
        pod = qos / f"kubepods-burstable-pod0000000{i}_0000_4000_8000_000000000000.slice"
        memory_cgroup(pod, current=each, stat=_anon(each), limit=8 * GiB, swap=("max", 0))
        memory_cgroup(
            pod / f"cri-containerd-{str(i) * 64}.scope",
            current=each,
            stat=_anon(each),
            limit=8 * GiB,
            swap=(0, 0),
        )
    reader = CgroupReader(paths=HostPaths(procfs=tmp_path / "proc", sysfs=tmp_path / "sys"))
    _, pods = reader.read(mem_total=64 * GiB, swap_free=8 * GiB)
    assert len(pods) == 4
    assert all(c.memory.unreclaimable_bytes == each for p in pods for c in p.containers)
    assert all(p.memory.unreclaimable_bytes == each for p in pods)
    assert reader.kubepods is not None
    assert reader.kubepods.unreclaimable_bytes == total
    assert reader.kubepods.unreclaimable_ratio == total / (30 * GiB)


def test_limitedswap_pod_swaps_only_its_containers_shares(tmp_path: Path) -> None:
    # LimitedSwap, a Burstable pod: one container with a memory request got 512 MiB of swap
    # and uses 412 (100 MiB left), its sidecar without a request got 0.
    paths, _, _ = _pod_of(
        tmp_path, containers=[(600 * MiB, (512 * MiB, 412 * MiB)), (200 * MiB, (0, 0))]
    )
    assert _unreclaimable(paths, swap_free=8 * GiB) == (700 * MiB, 700 * MiB)


def test_pod_and_node_bounds_hold_over_the_containers(tmp_path: Path) -> None:
    # Containers without a bound of their own ("max": UnlimitedSwap of 1.22-1.27, or a
    # runtime that writes none), the pod's own memory.swap.max 64 MiB.
    paths, _, _ = _pod_of(
        tmp_path / "a", containers=[(800 * MiB, ("max", 0))], pod_swap=(64 * MiB, 0)
    )
    pod, kubepods = _unreclaimable(paths, swap_free=8 * GiB)
    assert pod == 736 * MiB
    assert kubepods == 736 * MiB
    # The same containers, the pod without a bound: the node's 300 MiB of SwapFree bounds it.
    paths, _, _ = _pod_of(tmp_path / "b", containers=[(800 * MiB, ("max", 0))])
    assert _unreclaimable(paths, swap_free=300 * MiB) == (500 * MiB, 500 * MiB)


def test_swappable_pods_still_read_as_swappable(tmp_path: Path) -> None:
    # The look-alike that must not trip: containers whose anon may go to swap (no bound, or
    # swap accounting off, no memory.swap.* files at all) on a node with 8 GiB free.
    paths, _, _ = _pod_of(tmp_path / "a", containers=[(800 * MiB, ("max", 0))])
    assert _unreclaimable(paths, swap_free=8 * GiB) == (0, 0)
    paths, _, _ = _pod_of(tmp_path / "b", containers=[(800 * MiB, None)], pod_swap=None)
    assert _unreclaimable(paths, swap_free=8 * GiB) == (0, 0)
    # No swap free on the node: every level counts all its anon, the files unread.
    paths, _, _ = _pod_of(tmp_path / "c", containers=[(800 * MiB, ("max", 0))])
    assert _unreclaimable(paths, swap_free=0) == (800 * MiB, 800 * MiB)


def test_anon_beyond_the_containers_has_only_the_pods_bounds(tmp_path: Path) -> None:
    # 100 MiB charged to the pod beyond its NoSwap container's 800 (a container cgroup removed
    # whose pages still count in the pod): no container bound holds it, SwapFree does.
    paths, _, _ = _pod_of(tmp_path, containers=[(800 * MiB, (0, 0))], extra_pod_anon=100 * MiB)
    assert _unreclaimable(paths, swap_free=8 * GiB) == (800 * MiB, 800 * MiB)


def test_a_focused_refresh_bounds_the_pod_by_its_containers_now(tmp_path: Path) -> None:
    # A LimitedSwap container with 100 MiB of swap left; then it fills its share: re-read
    # alone (refresh, refresh_kubepods), pod and kubepods follow the container's room now.
    paths, _, dirs = _pod_of(tmp_path, containers=[(800 * MiB, (512 * MiB, 412 * MiB))])
    reader = CgroupReader(paths=paths)
    _, pods = reader.read(mem_total=64 * GiB, swap_free=8 * GiB)
    assert pods[0].memory.unreclaimable_bytes == 700 * MiB
    (dirs[0] / "memory.swap.current").write_text(f"{512 * MiB}\n")
    cid = pods[0].containers[0].container_id
    again, done = reader.refresh(
        pods, keys=frozenset({f"{pods[0].uid}/{cid}"}), mem_total=64 * GiB, swap_free=8 * GiB
    )
    assert done == {f"{pods[0].uid}/{cid}", pods[0].uid}
    assert again[0].containers[0].memory.unreclaimable_bytes == 800 * MiB
    assert again[0].memory.unreclaimable_bytes == 800 * MiB
    kubepods = reader.refresh_kubepods(mem_total=64 * GiB, swap_free=8 * GiB)
    assert kubepods is not None and kubepods.unreclaimable_bytes == 800 * MiB
