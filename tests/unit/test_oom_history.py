"""OOM kills as evidence after the kubelet replaced the killed container (issue 21, point 6).

The kubelet restarts an OOM-killed container within a second: a new container ID, a new cgroup
whose counters start at 0 (mm/memcontrol.c allocates them zeroed), the dead one's ID kept only
in ``lastState.terminated.containerID`` (pkg/kubelet/kubelet_pods.go
``convertToAPIContainerStatuses``; kube-state-metrics#570). Each test drives the real sampler
over a host tree that changes between samples as the kernel and the kubelet change it, with the
pod list parsed from Pod JSON as the API serves it, and reads the real signals.
"""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path
from typing import Any, Literal

import pytest

from nodeguard.kube.objects import pod_meta
from nodeguard.kube.watch import EARLIER_IDS_PER_CONTAINER, with_earlier_ids
from nodeguard.paths import HostPaths
from nodeguard.rules.signals import SIGNALS, History, targets
from nodeguard.sampling.sampler import Sampler, SamplerConfig
from nodeguard.snapshot import NodeSnapshot
from tests.fixtures.make_hosts import CID, kmsg, oom_records, v1_cgroup, v2_cgroup, write
from tests.support.hosts import HOSTS
from tests.support.pod_list import PodList as Cluster
from tests.support.pod_list import Runtime, status

GiB = 1 << 30
UID = "5a5b5c5d-6e6f-4071-8283-848586878889"
UID_NEW = "9a9b9c9d-aeaf-40b1-a2a3-a4a5a6a7a8a9"  # the same pod's name, recreated


class Host:
    """A node's cgroup tree (v1 cgroupfs or v2 systemd) and kernel log, changed step by step."""

    def __init__(self, root: Path, *, version: Literal[1, 2], runtime: Runtime = "containerd"):
        self.version, self.runtime = version, runtime
        shutil.copytree(HOSTS / "v2-systemd-containerd" / "proc", root / "proc")
        self.cg = root / "sys/fs/cgroup"
        if version == 2:
            write(self.cg / "cgroup.controllers", "cpuset cpu io memory pids\n")
        else:
            self.cg = self.cg / "memory"
            v1_cgroup(self.cg, usage=4 * GiB)
        self.kmsg = root / "kmsg"
        self.kmsg.write_text("")
        self._records: list[str] = []
        self.paths = HostPaths(procfs=root / "proc", sysfs=root / "sys", kmsg=self.kmsg)

    def pod_path(self, uid: str) -> str:
        """The pod's cgroup path as the kernel prints it (from the hierarchy's root)."""
        if self.version == 2:
            return (
                "/kubepods.slice/kubepods-burstable.slice/"
                f"kubepods-burstable-pod{uid.replace('-', '_')}.slice"
            )
        return f"/kubepods/burstable/pod{uid}"

    def container_path(self, uid: str, cid: str) -> str:
        if self.version == 1:
            return f"{self.pod_path(uid)}/{cid}"
        scope = "cri-containerd" if self.runtime == "containerd" else "crio"
        return f"{self.pod_path(uid)}/{scope}-{cid}.scope"

    def cgroup(self, path: str, *, oom_kill: int | None) -> None:
        d = self.cg / path.lstrip("/")
        if self.version == 2:
            v2_cgroup(d, current=GiB, max_=2 * GiB, anon=GiB, oom_kill=oom_kill or 0)
        else:
            v1_cgroup(d, usage=GiB, limit=2 * GiB, rss=GiB, oom_kill=oom_kill)

    def pod(self, uid: str, *, oom_kill: int | None = 0) -> None:
        self.cgroup(self.pod_path(uid), oom_kill=oom_kill)

    def container(self, uid: str, cid: str, *, oom_kill: int | None = 0) -> None:
        self.cgroup(self.container_path(uid, cid), oom_kill=oom_kill)

    def remove(self, path: str) -> None:
        shutil.rmtree(self.cg / path.lstrip("/"))

    def kernel_kill(self, uid: str, cid: str, *, pid: int) -> None:
        """The kernel log's records of one victim in the container (4.19+ format)."""
        self._records += oom_records(
            memcg=self.container_path(uid, cid),
            pid=pid,
            comm="python3",
            anon_kb=2_000_000,
            constraint="CONSTRAINT_MEMCG",
        )
        self._write_log()

    def kernel_group_kill(self, uid: str, cid: str, *, pids: tuple[int, int]) -> None:
        """A memory.oom.group kill (4.19+): the first victim, the group line, the first victim
        again (a repeat, counted by memory.events too) and the other member."""
        memcg = self.container_path(uid, cid)
        first = oom_records(
            memcg=memcg, pid=pids[0], comm="python3", anon_kb=1_000, constraint="CONSTRAINT_MEMCG"
        )
        kill = first[-1]
        member = kill.replace(f"process {pids[0]} ", f"process {pids[1]} ")
        self._records += [
            *first,
            f"Tasks in {memcg} are going to be killed due to memory.oom.group set",
            kill,
            member,
        ]
        self._write_log()

    def _write_log(self) -> None:
        self.kmsg.write_text(kmsg(list(self._records)))


def one_container_pod(
    host: Host,
    cluster: Cluster,
    *,
    uid: str = UID,
    cid: str = CID[3],
    name: str = "trainer",
    oom_kill: int | None = 0,
) -> None:
    """A pod ``uid`` with one container ``app`` (``cid``): its cgroups (``oom_kill`` the
    counters' value) on the host and its Pod in the API."""
    host.pod(uid, oom_kill=oom_kill)
    host.container(uid, cid, oom_kill=oom_kill)
    cluster.set(uid=uid, name=name, statuses=[status("app", cid)])


def kubelet_restarts(
    host: Host, cluster: Cluster, *, dead: str, new: str, oom_kill: int | None = 0
) -> None:
    """The kubelet replaces the container ``dead`` of :func:`one_container_pod` by ``new``:
    the dead cgroup goes, the new one's counters read ``oom_kill``, and the status names the
    dead ID in ``lastState``."""
    host.remove(host.container_path(UID, dead))
    host.container(UID, new, oom_kill=oom_kill)
    cluster.set(uid=UID, name="trainer", statuses=[status("app", new, last=dead)])


@pytest.fixture
def make_host(tmp_path: Path) -> Any:
    def make(*, version: Literal[1, 2], runtime: Runtime = "containerd") -> Host:
        return Host(tmp_path, version=version, runtime=runtime)

    return make


class Agent:
    """The sampler and the rule history, as ``nodeguard run`` holds them."""

    def __init__(self, host: Host, cluster: Cluster) -> None:
        self.sampler = Sampler(
            config=SamplerConfig(
                paths=host.paths,
                node_name="n",
                collectors=frozenset({"meminfo", "cgroups", "kmsg"}),
            ),
            cluster=cluster,
        )
        self.history = History()
        self.snap: NodeSnapshot | None = None

    def sample(self) -> NodeSnapshot:
        self.snap = self.sampler.sample_once()
        self.history.observe(self.snap)
        return self.snap

    def value(self, signal: str, key: str) -> float | None:
        assert self.snap is not None
        sig = SIGNALS[signal]
        target = next(t for t in targets(self.snap, sig.scope) if t.key == key)
        return sig.fn(self.snap, self.history, target)

    def container(self, uid: str, cid: str) -> float | None:
        return self.value("container_oom_kills_10m", f"{uid}/{cid}")

    def pod(self, uid: str) -> float | None:
        return self.value("pod_oom_kills_10m", uid)

    def close(self) -> None:
        self.sampler.close()


@pytest.fixture
def agent_on() -> Any:
    made: list[Agent] = []

    def make(host: Host, cluster: Cluster) -> Agent:
        made.append(Agent(host, cluster))
        return made[-1]

    yield make
    for a in made:
        a.close()


@pytest.mark.parametrize("runtime", ["containerd", "cri-o"])
@pytest.mark.parametrize("read_after_kill", [False, True])
def test_v2_a_kill_stays_after_the_container_is_replaced(
    make_host: Any, agent_on: Any, runtime: Runtime, read_after_kill: bool
) -> None:
    """v2: the killed container's cgroup goes, the new one's memory.events reads oom_kill 0;
    the kill is the container's (pod UID, name) and the pod's, once: the pod counter, the
    kernel log and (``read_after_kill``: a sample that read the old cgroup at 1 before the
    kubelet replaced it) the old cgroup's counter all saw the same victim."""
    host, cluster = make_host(version=2, runtime=runtime), Cluster()
    host.pod(UID)
    host.container(UID, CID[3])
    host.container(UID, CID[2])  # a sidecar: the look-alike, killed never
    cluster.set(
        uid=UID,
        name="trainer",
        statuses=[status("app", CID[3], runtime=runtime), status("side", CID[2], runtime=runtime)],
    )
    agent = agent_on(host, cluster)
    agent.sample()
    assert (agent.container(UID, CID[3]), agent.pod(UID)) == (0, 0)

    host.pod(UID, oom_kill=1)  # memory.events is hierarchical: the pod's counts it
    host.kernel_kill(UID, CID[3], pid=4100)
    if read_after_kill:
        host.container(UID, CID[3], oom_kill=1)
        agent.sample()
        assert (agent.container(UID, CID[3]), agent.pod(UID)) == (1, 1)
    host.remove(host.container_path(UID, CID[3]))
    host.container(UID, CID[5])  # the restarted container: a new ID, counters at 0
    cluster.set(
        uid=UID,
        name="trainer",
        statuses=[
            status("app", CID[5], runtime=runtime, last=CID[3]),
            status("side", CID[2], runtime=runtime),
        ],
    )
    snap = agent.sample()
    new = next(c for p in snap.pods for c in p.containers if c.container_id == CID[5])
    assert new.memory.oom_kills == 0
    assert agent.container(UID, CID[5]) == 1
    assert agent.pod(UID) == 1
    assert agent.container(UID, CID[2]) == 0  # the sidecar's own history: no kill
    agent.sample()  # a sample later, nothing new: still one kill, not two
    assert (agent.container(UID, CID[5]), agent.pod(UID)) == (1, 1)


def test_v2_a_container_restarted_twice_in_the_window_counts_two_kills(
    make_host: Any, agent_on: Any
) -> None:
    """The second restart leaves the first dead ID in neither ``containerID`` nor ``lastState``:
    the agent still knows its name from the earlier status, so both kills are the container's.
    A container born and killed between two samples (its first reading already 1) counts too."""
    host, cluster = make_host(version=2), Cluster()
    one_container_pod(host, cluster)
    agent = agent_on(host, cluster)
    agent.sample()
    host.pod(UID, oom_kill=1)
    host.kernel_kill(UID, CID[3], pid=4100)
    kubelet_restarts(host, cluster, dead=CID[3], new=CID[4])
    agent.sample()
    assert agent.container(UID, CID[4]) == 1
    # Killed again before any sample read it at 0, and not yet replaced.
    host.pod(UID, oom_kill=2)
    host.container(UID, CID[4], oom_kill=1)
    host.kernel_kill(UID, CID[4], pid=4200)
    agent.sample()
    assert (agent.container(UID, CID[4]), agent.pod(UID)) == (2, 2)
    kubelet_restarts(host, cluster, dead=CID[4], new=CID[5])
    agent.sample()
    assert (agent.container(UID, CID[5]), agent.pod(UID)) == (2, 2)


def test_v2_without_the_kernel_log_a_new_cgroup_born_killed_counts(
    make_host: Any, agent_on: Any
) -> None:
    """No kernel log (an unprivileged container: /dev/kmsg refused): a container cgroup that
    first appears with oom_kill 1 was born since the last sample at 0, so its kill counts."""
    host, cluster = make_host(version=2), Cluster()
    host.kmsg.unlink()
    one_container_pod(host, cluster)
    agent = agent_on(host, cluster)
    assert agent.sample().oom is None
    host.pod(UID, oom_kill=1)
    host.remove(host.container_path(UID, CID[3]))
    host.container(UID, CID[4], oom_kill=1)
    cluster.set(uid=UID, name="trainer", statuses=[status("app", CID[4])])
    agent.sample()
    assert (agent.container(UID, CID[4]), agent.pod(UID)) == (1, 1)


@pytest.mark.parametrize("oom_kill", [0, None], ids=["4.13+", "before-4.13"])
def test_v1_the_pod_counts_the_kernel_logs_kills(
    make_host: Any, agent_on: Any, oom_kill: int | None
) -> None:
    """v1: ``memory.oom_control`` ``oom_kill`` counts the victim's own cgroup only (and exists
    since 4.13); the container replaced before a sample read its 1, the pod's count is the
    kernel log's. Before 4.13 there is no counter at all: the kernel log is the only count."""
    host, cluster = make_host(version=1), Cluster()
    one_container_pod(host, cluster, oom_kill=oom_kill)
    agent = agent_on(host, cluster)
    agent.sample()
    assert agent.pod(UID) == (None if oom_kill is None else 0)
    host.kernel_kill(UID, CID[3], pid=4100)
    kubelet_restarts(host, cluster, dead=CID[3], new=CID[4], oom_kill=oom_kill)
    agent.sample()
    assert agent.pod(UID) == 1
    assert agent.container(UID, CID[4]) == 1


def test_v2_a_group_kill_is_one_kill_a_victim(make_host: Any, agent_on: Any) -> None:
    """memory.oom.group (kubelet >= 1.28 on v2): two victims, the first killed twice, and
    memory.events oom_kill counts 3. Each signal counts 2 victims; the repeat stays visible in
    the snapshot's ``oom.repeats_by_container`` (README, "Kernel log formats understood")."""
    host, cluster = make_host(version=2), Cluster()
    one_container_pod(host, cluster)
    agent = agent_on(host, cluster)
    agent.sample()
    host.pod(UID, oom_kill=3)
    host.container(UID, CID[3], oom_kill=3)
    host.kernel_group_kill(UID, CID[3], pids=(4100, 4101))
    snap = agent.sample()
    assert snap.oom is not None
    assert snap.oom.by_container == {f"{UID}/{CID[3]}": 2}
    assert snap.oom.repeats_by_container == {f"{UID}/{CID[3]}": 1}
    assert (agent.container(UID, CID[3]), agent.pod(UID)) == (2, 2)
    # Then the kubelet replaces it: still 2.
    kubelet_restarts(host, cluster, dead=CID[3], new=CID[4])
    agent.sample()
    assert (agent.container(UID, CID[4]), agent.pod(UID)) == (2, 2)


def test_a_pod_recreated_under_the_same_name_has_a_history_of_its_own(
    make_host: Any, agent_on: Any
) -> None:
    """A pod deleted and recreated (a StatefulSet's ``trainer-0``) has a new UID: the old one's
    kill is not the new one's, though namespace, pod and container names are the same."""
    host, cluster = make_host(version=2), Cluster()
    one_container_pod(host, cluster, name="trainer-0")
    agent = agent_on(host, cluster)
    agent.sample()
    host.pod(UID, oom_kill=1)
    host.container(UID, CID[3], oom_kill=1)
    host.kernel_kill(UID, CID[3], pid=4100)
    agent.sample()
    assert (agent.container(UID, CID[3]), agent.pod(UID)) == (1, 1)
    host.remove(host.pod_path(UID))
    del cluster.objects[UID]
    one_container_pod(host, cluster, uid=UID_NEW, cid=CID[4], name="trainer-0")
    agent.sample()
    assert (agent.container(UID_NEW, CID[4]), agent.pod(UID_NEW)) == (0, 0)


@pytest.mark.parametrize("runtime", ["containerd", "cri-o", "docker"])
def test_a_replaced_containers_id_is_named_through_last_state(runtime: Runtime) -> None:
    """``lastState.terminated.containerID`` has the form of ``containerID``,
    ``<runtime>://<id>`` (the kubelet's ``kubecontainer.ContainerID.String()``), for app and
    init containers alike; a status without ``lastState`` names only its current ID."""
    pod = {
        "metadata": {"uid": UID, "name": "trainer", "namespace": "ml"},
        "spec": {"containers": [{"name": "app"}], "initContainers": [{"name": "fetch"}]},
        "status": {
            "containerStatuses": [status("app", CID[5], runtime=runtime, last=CID[3])],
            "initContainerStatuses": [status("fetch", CID[7], runtime=runtime)],
        },
    }
    assert pod_meta(pod).containers == {CID[3]: "app", CID[5]: "app", CID[7]: "fetch"}


def test_the_watch_keeps_a_bounded_number_of_earlier_ids() -> None:
    """A container in CrashLoopBackOff restarts for days: the IDs kept beside its status are
    the newest :data:`EARLIER_IDS_PER_CONTAINER` of each name, and a new UID (a pod recreated)
    keeps none of the old pod's."""
    cluster = Cluster()
    ids = [f"{n:064x}" for n in range(1, 20)]
    meta = None
    for prev, cid in itertools.pairwise(ids):
        cluster.set(uid=UID, name="trainer", statuses=[status("app", cid, last=prev)])
        meta = with_earlier_ids(cluster.pods()[UID], meta)
    assert meta is not None
    assert list(meta.containers) == ids[-2 - EARLIER_IDS_PER_CONTAINER :]
    assert set(meta.containers.values()) == {"app"}
    cluster.set(uid=UID_NEW, name="trainer", statuses=[status("app", CID[1])])
    assert with_earlier_ids(cluster.pods()[UID_NEW], meta).containers == {CID[1]: "app"}
