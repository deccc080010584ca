"""The pod watch feeding pod metadata into snapshots and /metrics, and ``nodeguard act`` by hand,
against the real kube-apiserver."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nodeguard.kube.client import KubeClient
from nodeguard.kube.watch import PodWatcher
from nodeguard.kube.watch_stream import Relist
from nodeguard.paths import HostPaths
from nodeguard.sampling.sampler import Sampler, SamplerConfig
from tests.fixtures.make_hosts import kmsg, oom_records, v2_cgroup
from tests.support.agent import wait_until_async
from tests.support.controlplane.cluster import TestCluster
from tests.support.hosts import HOSTS, exposition
from tests.support.kube_helpers import Cluster, given, synced_watcher

GiB = 1 << 30


def host_for(tmp_path: Path, pods: list[dict[str, Any]]) -> HostPaths:
    """A v2 host tree whose kubepods cgroups are these API pods (UIDs and container IDs)."""
    shutil.copytree(HOSTS / "v2-systemd-containerd" / "proc", tmp_path / "proc")
    cg = tmp_path / "sys/fs/cgroup"
    cg.mkdir(parents=True)
    (cg / "cgroup.controllers").write_text("memory\n")
    for i, pod in enumerate(pods, 1):
        pod_dir = cg / "kubepods/burstable" / f"pod{pod['metadata']['uid']}"
        v2_cgroup(pod_dir, current=i * GiB, anon=i * GiB)
        cid = pod["status"]["containerStatuses"][0]["containerID"].split("://")[1]
        v2_cgroup(pod_dir / cid, current=i * GiB, anon=i * GiB)
    return HostPaths(procfs=tmp_path / "proc", sysfs=tmp_path / "sys", kmsg=tmp_path / "none")


async def test_watch_feeds_labels_and_overcommit(
    cluster: Cluster,
    control_plane: TestCluster,
    tmp_path: Path,
) -> None:
    ns, node = cluster.namespace("watch"), cluster.node(memory="64Gi")
    a = cluster.pod(
        namespace=ns,
        node=node,
        name="trainer",
        request="8Gi",
        limit="16Gi",
        priority_class="nodeguard-test-high",
    )
    b = cluster.pod(namespace=ns, node=node, name="prep", request="4Gi")
    async with synced_watcher(kubeconfig=control_plane.kubeconfig_path, node=node) as watcher:
        assert {m.name for m in watcher.pods().values()} == {"trainer", "prep"}
        sampler = Sampler(
            config=SamplerConfig(
                paths=host_for(tmp_path, [a, b]),
                node_name=node,
                collectors=frozenset({"meminfo", "cgroups"}),
            ),
            cluster=watcher,
        )
        snap = sampler.sample_once()
        body = exposition(snap)
        assert (
            f'nodeguard_container_memory_working_set_bytes{{container="main",'
            f'namespace="{ns}",pod="trainer"}} 1.073741824e+09'
        ) in body
        assert (
            f'nodeguard_pod_memory_request_bytes{{container="",namespace="{ns}",pod="prep"}} '
            "4.294967296e+09" in body
        )
        assert (
            f'priority_class="nodeguard-test-high",qos_class="burstable",uid="{a["metadata"]["uid"]}"'
            in body
        )
        no_workload = '{container="",namespace="",pod=""}'
        for name, value in (
            ("node_memory_allocatable_bytes", "6.8719476736e+10"),
            ("node_memory_requests_bytes", "1.2884901888e+10"),  # 8 + 4 GiB
            ("node_memory_limits_bytes", "1.7179869184e+10"),  # 16 GiB
            ("node_pods_without_memory_limit", "1.0"),
        ):
            assert f"nodeguard_{name}{no_workload} {value}" in body

        # Changes arrive through the watch, not a new list.
        lists = watcher.relists
        cluster.pod(namespace=ns, node=node, name="late")
        await wait_until_async(
            "the late pod watched",
            lambda: "late" in {m.name for m in watcher.pods().values()},
            timeout=30,
        )
        cluster.core.delete_namespaced_pod("prep", ns, grace_period_seconds=0)
        await wait_until_async(
            "prep gone from the watch",
            lambda: "prep" not in {m.name for m in watcher.pods().values()},
            timeout=30,
        )
        assert watcher.relists == lists


def test_watch_error_event_means_relist() -> None:
    watcher = PodWatcher(kube=None, node_name="n")  # type: ignore[arg-type]
    with pytest.raises(Relist, match="410"):
        watcher._store.apply({"type": "ERROR", "object": {"code": 410, "message": "too old"}})


async def test_relists_after_gone(
    cluster: Cluster,
    control_plane: TestCluster,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 410 Gone needs an etcd compaction to happen for real; the watch's answer to it is what is
    # tested here: the stream raising Relist once makes the watcher list again.
    node = cluster.node()
    kube = KubeClient.load(kubeconfig=control_plane.kubeconfig_path)
    watcher = PodWatcher(kube=kube, node_name=node, watch_timeout=2)
    real = watcher._stream.watch
    calls = {"n": 0}

    def gone_once(rv: str, stop: Any) -> str:
        calls["n"] += 1
        if calls["n"] == 1:
            raise Relist("410 Gone")
        return real(rv, stop)

    monkeypatch.setattr(watcher._stream, "watch", gone_once)
    stop = asyncio.Event()
    task = asyncio.create_task(watcher.run(stop=stop))
    try:
        await wait_until_async("a second relist", lambda: watcher.relists >= 2, timeout=30)
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)
        kube.close()


def test_act_evict_dry_run_prints_a_plan(cluster: Cluster, control_plane: TestCluster) -> None:
    ns, node = cluster.namespace("act"), cluster.node()
    cluster.pod(namespace=ns, node=node, name="critical", priority_class="system-node-critical")
    cluster.pod(
        namespace=ns,
        node=node,
        name="pandas-prep",
        request="1Gi",
        priority_class="nodeguard-test-low",
    )
    cluster.pod(
        namespace=ns, node=node, name="trainer", request="8Gi", priority_class="nodeguard-test-high"
    )

    def act(*extra: str, status: int = 0) -> str:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "nodeguard",
                "act",
                "evict",
                "--node",
                node,
                "--dry-run",
                "--kubeconfig",
                str(control_plane.kubeconfig_path),
                *extra,
            ],
            capture_output=True,
            text=True,
            check=False,
            env={"COLUMNS": "200", "PATH": ""},
        )
        assert out.returncode == status, (out.stdout, out.stderr)
        return out.stdout

    # No agent to say how much each pod uses: a memory target cannot be measured (the default
    # target, as a rule's: 5 % of the node's memory capacity), so nothing would be evicted and
    # the run is refused (exit status 3), saying how to measure or to take just the first unit.
    for blind in (act("--free", "1Gi", status=3), act(status=3)):
        assert "DRY RUN evict refused: would evict 0 unit(s)" in blind
        assert blind.count("(unreclaimable memory unknown)") == 1
        assert "--agent-url http://AGENT_POD_IP:9847, or --free 0 for the first unit" in blind
    text = act("--free", "0")  # the first unit only
    plan = text[text.index("Eviction plan") : text.index("Never evicted here")]
    assert "pandas-prep" in plan and "trainer" not in plan
    assert "usage unknown; priority 100" in plan
    never = text[text.index("Never evicted here") :]
    assert "system-critical" in never
    # As the runbook: priority above 999 is left alone unless --max-priority says otherwise.
    assert "above the maximum 999" in never
    everyone = act("--free", "0", "--max-priority", "1000000")
    plan = everyone[everyone.index("Eviction plan") : everyone.index("Never evicted here")]
    assert plan.index("pandas-prep") < plan.index("trainer")
    assert (
        f"DRY RUN evict done: would evict 1 unit(s) (pod/{ns}/pandas-prep: {ns}/pandas-prep)"
        in text
    )
    assert "No unreclaimable memory known" in text
    assert given(cluster.pod_json(ns, "pandas-prep"))["metadata"].get("deletionTimestamp") is None


async def test_cancelling_the_watch_does_not_hang(
    cluster: Cluster, control_plane: TestCluster
) -> None:
    node = cluster.node()
    kube = KubeClient.load(kubeconfig=control_plane.kubeconfig_path)
    watcher = PodWatcher(kube=kube, node_name=node)  # a 60 s server-side watch
    task = asyncio.create_task(watcher.run(stop=asyncio.Event()))
    await asyncio.wait_for(watcher.synced.wait(), 15)
    await asyncio.sleep(0.5)  # now blocked in the watch's read
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The pool is still usable after the shut-down socket.
    assert (await kube.get_node(name=node))["metadata"]["name"] == node
    kube.close()
    # The executor thread let go too: asyncio.run() would otherwise wait for it at exit, up to
    # the 60 s of the server-side watch; a sixth of that bounds it here.
    await asyncio.wait_for(asyncio.get_running_loop().shutdown_default_executor(), 10)


def test_act_exit_codes(cluster: Cluster, control_plane: TestCluster) -> None:
    node = cluster.node()

    def act(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "nodeguard",
                "act",
                *argv,
                "--kubeconfig",
                str(control_plane.kubeconfig_path),
            ],
            capture_output=True,
            text=True,
            check=False,
            env={"COLUMNS": "200", "PATH": ""},
        )

    typo = act("evict", "--node", "no-such-node", "--dry-run")
    assert typo.returncode == 4 and "no node 'no-such-node'" in typo.stderr
    bad = act("evict", "--node", node, "--selector", "oops")
    assert bad.returncode == 2 and "not KEY=VALUE" in bad.stderr and "Traceback" not in bad.stderr
    bad = act("evict", "--node", node, "--free", "lots")
    assert bad.returncode == 2 and "not a memory quantity" in bad.stderr
    refused = act(
        "cordon", "--node", node, "--budget-nodes", "0", "--dry-run", "--lease-namespace", "default"
    )
    assert refused.returncode == 3, refused.stdout + refused.stderr
    # Other tests may have left nodes cordoned by nodeguard; with none, the list says so.
    m = re.search(
        r"budget spent, (\d+) of 0 node\(s\) already cordoned by nodeguard \((.*?)\)",
        refused.stdout.replace("\n", " "),
    )
    assert m is not None, refused.stdout
    assert m.group(2) == "none" if m.group(1) == "0" else m.group(2) != "none"
    down = subprocess.run(
        [
            sys.executable,
            "-m",
            "nodeguard",
            "act",
            "cordon",
            "--node",
            node,
            "--kubeconfig",
            str(_unreachable_kubeconfig(control_plane)),
        ],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": ""},
    )
    assert down.returncode == 1 and "Traceback" not in down.stderr + down.stdout


def _unreachable_kubeconfig(control_plane: TestCluster) -> Path:
    import json as _json

    text = control_plane.kubeconfig_path.read_text()
    data = _json.loads(text)
    data["clusters"][0]["cluster"]["server"] = "https://127.0.0.1:1"
    path = control_plane.kubeconfig_path.with_name("unreachable.kubeconfig")
    path.write_text(_json.dumps(data))
    return path


def _restarted(cluster: Cluster, *, name: str, ns: str, new: str, old: str, restarts: int) -> None:
    """The status the kubelet writes after restarting an OOM-killed container: the new ID, the
    old one in ``lastState.terminated`` (pkg/kubelet/kubelet_pods.go
    ``convertToAPIContainerStatuses``), through the status subresource as the kubelet does."""
    cluster.core.patch_namespaced_pod_status(
        name,
        ns,
        {
            "status": {
                "containerStatuses": [
                    {
                        "name": "main",
                        "containerID": f"containerd://{new}",
                        "image": "pause",
                        "imageID": "",
                        "ready": True,
                        "restartCount": restarts,
                        "state": {"running": {}},
                        "lastState": {
                            "terminated": {
                                "containerID": f"containerd://{old}",
                                "exitCode": 137,
                                "reason": "OOMKilled",
                            }
                        },
                    }
                ]
            }
        },
    )


async def test_a_kernel_log_victim_is_named_after_its_container_was_replaced(
    cluster: Cluster,
    control_plane: TestCluster,
    tmp_path: Path,
) -> None:
    """The kernel log names the killed container by the ID the kubelet has replaced within a
    second; its series is labelled with the container's name through
    ``lastState.terminated.containerID`` (kube-state-metrics#570 lost the kill the same way),
    and after a second restart, which leaves the first ID in no status, through the IDs the
    watch saw before. Both kills are one series of the container: 2."""
    ns, node = cluster.namespace("oom"), cluster.node()
    pod = cluster.pod(namespace=ns, node=node, name="trainer")
    uid = pod["metadata"]["uid"]
    first = pod["status"]["containerStatuses"][0]["containerID"].split("://")[1]
    second, third = "5" * 64, "6" * 64
    paths = host_for(tmp_path, [pod])
    kmsg_file = tmp_path / "kmsg"
    records: list[str] = []

    def kernel_kill(cid: str, pid: int) -> None:
        memcg = f"/kubepods/burstable/pod{uid}/{cid}"
        records.extend(
            oom_records(
                memcg=memcg, pid=pid, comm="python3", anon_kb=1, constraint="CONSTRAINT_MEMCG"
            )
        )
        kmsg_file.write_text(kmsg(records))

    def replace_cgroup(old: str, new: str) -> None:
        pod_dir = tmp_path / f"sys/fs/cgroup/kubepods/burstable/pod{uid}"
        shutil.rmtree(pod_dir / old)
        v2_cgroup(pod_dir / new, current=GiB, anon=GiB)

    kernel_kill(first, 4100)
    replace_cgroup(first, second)
    paths = dataclasses.replace(paths, kmsg=kmsg_file)
    series = re.compile(r"^nodeguard_container_kernel_oom_kills_total\{(.*)\} (\S+)$", re.M)
    async with synced_watcher(kubeconfig=control_plane.kubeconfig_path, node=node) as watcher:
        _restarted(cluster, name="trainer", ns=ns, new=second, old=first, restarts=1)
        await wait_until_async(
            "the second container", lambda: second in watcher.pods()[uid].containers, timeout=30
        )
        sampler = Sampler(
            config=SamplerConfig(
                paths=paths, node_name=node, collectors=frozenset({"meminfo", "cgroups", "kmsg"})
            ),
            cluster=watcher,
        )
        try:
            body = exposition(sampler.sample_once())
            assert series.findall(body) == [
                (f'container="main",namespace="{ns}",pod="trainer"', "1.0")
            ]
            kernel_kill(second, 4200)
            replace_cgroup(second, third)
            _restarted(cluster, name="trainer", ns=ns, new=third, old=second, restarts=2)
            await wait_until_async(
                "the third container", lambda: third in watcher.pods()[uid].containers, timeout=30
            )
            assert first in watcher.pods()[uid].containers  # the earlier status's ID, kept
            body = exposition(sampler.sample_once())
            assert series.findall(body) == [
                (f'container="main",namespace="{ns}",pod="trainer"', "2.0")
            ]
        finally:
            sampler.close()
