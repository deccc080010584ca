"""The cgroup collector on committed fixture trees: v1 and v2, cgroupfs and systemd, containerd,
CRI-O and docker-nested layouts."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from nodeguard.paths import HostPaths
from nodeguard.snapshot import CgroupMemory, ContainerMemory, PodMemory
from nodeguard.sources import NoDataError
from nodeguard.sources.cgroups import CgroupReader, normalise_limit
from nodeguard.sources.pod_kills import PodKillTally as _PodKillTally
from tests.fixtures.make_hosts import (
    CID,
    CID_CONMON,
    HOSTS,
    UID_B,
    UID_BE,
    UID_G,
    UID_STATIC,
    V1_UNLIMITED,
)
from tests.support.hosts import cgroup_memory, host_paths

GiB = 1 << 30
MiB = 1 << 20
MEM_TOTAL = 32 * GiB


def read(name: str) -> tuple[int, dict[str, PodMemory], dict[str, ContainerMemory]]:
    version, pods = CgroupReader(paths=host_paths(name)).read(mem_total=MEM_TOTAL)
    by_uid = {p.uid: p for p in pods}
    by_cid = {c.container_id: c for p in pods for c in p.containers}
    return version, by_uid, by_cid


def test_normalise_limit() -> None:
    assert normalise_limit(V1_UNLIMITED, mem_total=MEM_TOTAL) is None
    assert normalise_limit(1 << 62, mem_total=None) is None
    assert normalise_limit(MEM_TOTAL, mem_total=MEM_TOTAL) is None
    assert normalise_limit(MEM_TOTAL - 1, mem_total=MEM_TOTAL) == MEM_TOTAL - 1
    assert normalise_limit(None, mem_total=MEM_TOTAL) is None


def test_v2_systemd_containerd() -> None:
    version, pods, ctrs = read("v2-systemd-containerd")
    assert version == 2
    assert set(pods) == {UID_G, UID_B, UID_BE, UID_STATIC}
    assert pods[UID_G].qos_class == "guaranteed"
    assert pods[UID_B].qos_class == "burstable"
    assert pods[UID_BE].qos_class == "besteffort"
    assert pods[UID_STATIC].qos_class == "burstable"
    # Only real container scopes; init.scope inside the besteffort pod is skipped.
    assert [c.container_id for c in pods[UID_BE].containers] == [CID[6]]
    assert all(c.runtime == "containerd" for c in ctrs.values())

    g = ctrs[CID[1]].memory
    assert g.usage_bytes == 3 * GiB + 512 * MiB
    assert g.working_set_bytes == 3 * GiB + 412 * MiB
    assert g.anon_bytes == 3 * GiB
    assert g.file_bytes == 512 * MiB
    assert g.limit_bytes == 4 * GiB
    assert g.effective_limit_bytes == 4 * GiB
    assert g.limit_hits == 3
    assert g.oom_kills == 0
    assert g.pressure is not None and g.pressure.some is not None
    assert g.pressure.some.total_seconds == pytest.approx(2.0)

    # memory.max = max everywhere up to kubepods.slice (30 GiB, the node allocatable).
    b = ctrs[CID[3]].memory
    assert b.limit_bytes is None
    assert b.effective_limit_bytes == 30 * GiB
    assert b.working_set_bytes == 10 * GiB - 256 * MiB
    assert b.oom_kills == 1
    assert b.high_events == 7
    assert b.high_bytes is None  # it has been over memory.high, which is `max` now
    # inactive_file larger than usage: working set clamps at 0.
    assert ctrs[CID[4]].memory.working_set_bytes == 0
    assert ctrs[CID[4]].memory.effective_limit_bytes == 2 * GiB
    # A container without memory.pressure has no pressure, not zero pressure.
    assert ctrs[CID[6]].memory.pressure is None
    assert ctrs[CID[6]].memory.oom_kills == 2

    pod_b = pods[UID_B].memory
    assert pod_b.usage_bytes == 12 * GiB
    assert pod_b.working_set_bytes == 12 * GiB - 512 * MiB
    assert pod_b.path.endswith("kubepods-burstable-pod2a2b2c2d_3e3f_4041_9293_949596979899.slice")


def test_v1_cgroupfs_docker() -> None:
    version, pods, ctrs = read("v1-cgroupfs-docker")
    assert version == 1
    assert set(pods) == {UID_G, UID_B, UID_BE}
    assert all(c.runtime == "" for c in ctrs.values())
    g = ctrs[CID[1]].memory
    assert g.usage_bytes == 2 * GiB - 4 * MiB
    assert g.working_set_bytes == 2 * GiB - 6 * MiB  # total_inactive_file, hierarchical
    assert g.anon_bytes == 2 * GiB - 10 * MiB
    assert g.file_bytes == 6 * MiB
    assert g.limit_hits == 12  # memory.failcnt
    assert g.effective_limit_bytes == 2 * GiB
    assert g.pressure is None and g.high_events is None
    # No oom_kill line in memory.oom_control (kernel < 4.13): unknown, not 0.
    assert ctrs[CID[3]].memory.oom_kills is None
    assert ctrs[CID[3]].memory.effective_limit_bytes == 8 * GiB
    # 64 GiB limit on a 32 GiB node and the v1 sentinel above it: no limit at all.
    assert ctrs[CID[4]].memory.limit_bytes is None
    assert ctrs[CID[4]].memory.effective_limit_bytes is None
    assert ctrs[CID[4]].memory.oom_kills == 1
    assert pods[UID_BE].memory.effective_limit_bytes is None


def test_v1_systemd_crio_skips_conmon() -> None:
    version, pods, ctrs = read("v1-systemd-crio")
    assert version == 1
    assert set(ctrs) == {CID[7]}
    assert CID_CONMON not in ctrs
    c = ctrs[CID[7]]
    assert c.runtime == "cri-o"
    assert c.memory.effective_limit_bytes == 6 * GiB  # the pod slice's limit
    assert pods[UID_B].memory.effective_limit_bytes == 6 * GiB


def test_v2_cgroupfs_crio() -> None:
    version, pods, ctrs = read("v2-cgroupfs-crio")
    assert version == 2
    assert ctrs[CID[8]].runtime == "cri-o"
    assert ctrs[CID[8]].memory.effective_limit_bytes == 5 * GiB
    assert pods[UID_B].qos_class == "burstable"


def test_kind_nested_limit_from_the_node_container() -> None:
    version, pods, ctrs = read("v2-kind-nested")
    assert version == 2
    assert pods[UID_BE].qos_class == "besteffort"
    assert ctrs[CID[6]].memory.effective_limit_bytes == 8 * GiB
    assert ctrs[CID[6]].memory.path.startswith(f"/system.slice/docker-{CID[9]}.scope/")


def test_v1_docker_nested() -> None:
    version, pods, ctrs = read("v1-docker-nested")
    assert version == 1
    assert ctrs[CID[3]].memory.effective_limit_bytes == 6 * GiB
    assert pods[UID_B].qos_class == "burstable"


def test_no_kubepods_is_no_data(tmp_path: Path) -> None:
    (tmp_path / "fs/cgroup").mkdir(parents=True)
    (tmp_path / "fs/cgroup/cgroup.controllers").write_text("memory\n")
    with pytest.raises(NoDataError, match="no kubepods"):
        CgroupReader(paths=HostPaths(sysfs=tmp_path)).read(mem_total=None)


def test_no_memory_controller_is_no_data(tmp_path: Path) -> None:
    (tmp_path / "fs/cgroup").mkdir(parents=True)
    (tmp_path / "fs/cgroup/cgroup.controllers").write_text("cpu io\n")
    with pytest.raises(NoDataError, match="no cgroup memory controller"):
        CgroupReader(paths=HostPaths(sysfs=tmp_path)).read(mem_total=None)


def test_a_v1_pods_kills_keep_a_containers_last_count_while_it_is_unknown() -> None:
    # memory.oom_control without its oom_kill line (a file skipped, a container going away):
    # unknown, not 0; the pod's count never goes down, and a container gone keeps its kills.
    def mem(path: str, kills: int | None) -> CgroupMemory:
        return dataclasses.replace(cgroup_memory(path, used=1), cgroup_version=1, oom_kills=kills)

    def fold(kills: dict[str, int | None], listed: set[str]) -> int | None:
        containers = tuple(
            ContainerMemory(container_id=cid, runtime="", memory=mem(f"/p/{cid}", k))
            for cid, k in kills.items()
        )
        pod = tally.fold(
            uid="p", memory=mem("/p", 0), containers=containers, listed=frozenset(listed)
        )
        return pod.oom_kills

    tally = _PodKillTally()
    assert fold({"a": 2, "b": 1}, {"a", "b"}) == 3
    assert fold({"a": None, "b": 1}, {"a", "b"}) == 3  # a's count unknown this time
    assert fold({"b": 1}, {"b"}) == 3  # a gone while unknown: its last count stays
    assert fold({"b": 1, "c": 0}, {"b", "c"}) == 3
    tally.keep(set())  # the pod gone
    assert fold({"c": 0}, {"c"}) == 0


def _copy_without_containers(src: Path, dst: Path, *, uid: str) -> None:
    shutil.copytree(src, dst)
    for child in (dst / "burstable" / f"pod{uid}").iterdir():
        if child.is_dir():
            shutil.rmtree(child)


@pytest.mark.parametrize("leftover_first", [True, False])
def test_one_pod_in_two_kubepods_roots_is_one_pod(tmp_path: Path, leftover_first: bool) -> None:
    # A kubelet in a container (/docker/<id>/kubepods) beside a /kubepods with the same pod
    # UID: one pod, kept where its containers are, the other counted as a duplicate.
    host = tmp_path / "host"
    shutil.copytree(HOSTS / "v1-docker-nested", host, symlinks=True)
    memory = host / "sys/fs/cgroup/memory"
    (nested,) = (memory / "docker").glob("*/kubepods")
    pod = nested / "burstable" / f"pod{UID_B}"
    other = (memory / "kubepods") if leftover_first else (memory / "zz" / "kubepods")
    _copy_without_containers(nested, other, uid=UID_B)  # a leftover: the pod, no container
    assert (other / "burstable" / f"pod{UID_B}" / "memory.usage_in_bytes").is_file()
    reader = CgroupReader(paths=HostPaths(procfs=host / "proc", sysfs=host / "sys"))
    _version, pods = reader.read(mem_total=MEM_TOTAL)
    uids = [p.uid for p in pods]
    assert sorted(uids) == sorted(set(uids))
    (kept,) = [p for p in pods if p.uid == UID_B]
    assert kept.memory.path.startswith("/docker/") and kept.containers
    assert reader.skipped.counts() == {"duplicate": 1}
    assert kept.memory.path == "/" + str(pod.relative_to(memory))


def test_memory_high_is_read_where_it_has_throttled(tmp_path: Path) -> None:
    """v2 ``memory.high`` (the MemoryQoS bound, KEP-2570), read only where ``memory.events``
    ``high`` counts: a cgroup never over it is never throttled there (cgroup-v2.rst,
    "memory.events": high is "the number of times processes of the cgroup are throttled")."""
    from tests.support.memory_host import memory_host, memory_stat

    paths, _, _ = memory_host(tmp_path / "a", container=memory_stat(anon=GiB), current=GiB)
    ctr = next((tmp_path / "a").rglob("cri-containerd-*.scope"))
    (ctr / "memory.high").write_text(f"{GiB}\n")
    _, pods = CgroupReader(paths=paths).read(mem_total=MEM_TOTAL)
    assert pods[0].containers[0].memory.high_bytes is None  # high 0: not read
    (ctr / "memory.events").write_text("low 0\nhigh 12\nmax 0\noom 0\noom_kill 0\n")
    _, pods = CgroupReader(paths=paths).read(mem_total=MEM_TOTAL)
    assert pods[0].containers[0].memory.high_bytes == GiB
    assert pods[0].containers[0].memory.high_events == 12
    assert pods[0].memory.high_bytes is None  # the pod's own file absent
    (ctr / "memory.high").write_text("max\n")
    _, pods = CgroupReader(paths=paths).read(mem_total=MEM_TOTAL)
    assert pods[0].containers[0].memory.high_bytes is None
