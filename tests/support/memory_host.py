"""A host made in a test directory for the memory signals: a v2 container cgroup of a given
``memory.stat`` under kubepods, a ``/proc/meminfo`` and ``/proc/vmstat``, read by nodeguard's
sources into a snapshot."""

from __future__ import annotations

from pathlib import Path

from nodeguard.paths import HostPaths
from nodeguard.snapshot import CgroupMemory, NodeSnapshot
from nodeguard.sources.cgroups import CgroupReader

MiB = 1 << 20
GiB = 1 << 30
LIMIT = 1 * GiB


_KEYS = (
    "anon file kernel kernel_stack pagetables sec_pagetables percpu sock vmalloc shmem "
    "file_mapped file_dirty file_writeback swapcached anon_thp inactive_anon active_anon "
    "inactive_file active_file unevictable slab_reclaimable slab_unreclaimable slab "
    "workingset_refault_anon workingset_refault_file workingset_activate_anon "
    "workingset_activate_file pgscan pgsteal"
)


def memory_stat(**kv: int) -> str:
    """A v2 memory.stat as a 6.x kernel writes it (every key, in its order)."""
    keys = _KEYS.split()
    return "".join(f"{k} {kv.get(k, 0)}\n" for k in keys)


def memory_cgroup(
    d: Path,
    *,
    current: int,
    stat: str,
    limit: int | str = "max",
    swap: tuple[int | str, int] | None = None,
) -> None:
    """A v2 memory cgroup at ``d``: ``memory.current``, ``memory.max`` (``limit``), ``memory.stat``
    (``stat``), no events, and ``memory.swap.{max,current}`` when ``swap`` is given."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "memory.current").write_text(f"{current}\n")
    (d / "memory.max").write_text(f"{limit}\n")
    (d / "memory.stat").write_text(stat)
    (d / "memory.events").write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
    if swap is not None:
        (d / "memory.swap.max").write_text(f"{swap[0]}\n")
        (d / "memory.swap.current").write_text(f"{swap[1]}\n")


def memory_host(
    tmp: Path,
    *,
    container: str,
    current: int,
    swappiness: int = 60,
    swap: tuple[int | str, int] | None = None,
    pod_swap: tuple[int | str, int] | None = None,
    uid: str = "5b5c5d5e-6061-4263-b4b5-b6b7b8b9babb",
) -> tuple[HostPaths, str, str]:
    """A v2 host with kubepods (30 GiB, allocatable), one burstable pod and one container of
    ``current`` bytes and memory.stat ``container`` at a 1 GiB limit."""
    cg = tmp / "sys/fs/cgroup"
    cg.mkdir(parents=True)
    (cg / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (cg / "memory.stat").write_text("anon 0\nfile 0\n")
    vm = tmp / "proc/sys/vm"
    vm.mkdir(parents=True)
    (vm / "swappiness").write_text(f"{swappiness}\n")
    cid = "ab" * 32
    kp = cg / "kubepods.slice"
    memory_cgroup(kp, current=current, stat=container, limit=30 * GiB)
    qos = kp / "kubepods-burstable.slice"
    memory_cgroup(qos, current=current, stat=container)
    pod = qos / f"kubepods-burstable-pod{uid.replace('-', '_')}.slice"
    memory_cgroup(pod, current=current, stat=container, swap=pod_swap)
    memory_cgroup(
        pod / f"cri-containerd-{cid}.scope",
        current=current,
        stat=container,
        limit=LIMIT,
        swap=swap,
    )
    return HostPaths(procfs=tmp / "proc", sysfs=tmp / "sys"), uid, cid


def read_host(
    paths: HostPaths, *, swap_free: int | None = None
) -> tuple[CgroupMemory, CgroupMemory]:
    """The container's and the kubepods cgroup's memory."""
    reader = CgroupReader(paths=paths)
    _, pods = reader.read(mem_total=64 * GiB, swap_free=swap_free)
    assert reader.kubepods is not None
    return pods[0].containers[0].memory, reader.kubepods


def memory_snapshot(t: float, mem: CgroupMemory, uid: str, cid: str) -> NodeSnapshot:
    """A snapshot at time ``t`` of one burstable pod ``uid`` whose one container ``cid`` has
    ``mem``, nothing else read."""
    from nodeguard.snapshot import ContainerMemory, PodMemory

    pod = PodMemory(
        uid=uid,
        qos_class="burstable",
        memory=mem,
        containers=(ContainerMemory(container_id=cid, runtime="containerd", memory=mem),),
    )
    return NodeSnapshot(
        timestamp=t,
        node_name="n",
        meminfo=None,
        pressure=None,
        pods=(pod,),
        oom=None,
        processes=(),
        collectors=(),
        kubepods=mem,
    )
