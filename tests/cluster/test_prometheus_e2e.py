"""End to end on loopback with the real programs: Prometheus scrapes nodeguard running on a
fixture host that trips an alert, evaluates the shipped alert rules, Alertmanager routes the alert
to nodeguard's webhook, nodeguard runs the mapped action (in dry run, and for real against the
test control plane); the host recovers, the resolved notification arrives and the undo runs; a
delivery repeated by hand acts once. Every PromQL expression of the dashboards and the alert
rules returns data from that Prometheus."""

from __future__ import annotations

import json
import re
import shutil
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures.make_hosts import CID, UID_B, UID_BE
from tests.support.agent import get, running_agent, wait_until
from tests.support.controlplane.cluster import TestCluster
from tests.support.hosts import HOSTS, host_flags
from tests.support.kube_helpers import Cluster, cordoned
from tests.support.promstack import (
    alertmanager,
    kubernetes_meta,
    prometheus,
    query,
    servicemonitor_job,
    with_file_sd,
)
from tests.support.remediation import incidents

ROOT = Path(__file__).resolve().parents[2]
ALERT_RULES = ROOT / "rules" / "prometheus" / "nodeguard-alerts.yml"
DASHBOARDS = sorted((ROOT / "grafana").glob("*.json"))
GiB = 1 << 30
TOKEN = "e2e-webhook-token-" + "0123456789abcdef" * 2  # 50 bytes

LOCAL_RULES = """\
apiVersion: nodeguard.io/v1alpha1
kind: RuleSet
spec:
  rules:
    - name: e2e-page-cache
      scope: node
      when:
        - {signal: node_page_cache_ratio, op: ">", value: 0.01}
      cooldown: 1h
      actions:
        - action: record
"""


def _set_meminfo(host: Path, field: str, gib: int) -> None:
    meminfo = host / "proc" / "meminfo"
    text = re.sub(
        rf"^{field}:\s+\d+ kB$",
        f"{field}:   {gib * GiB // 1024} kB",
        meminfo.read_text(),
        flags=re.M,
    )
    meminfo.write_text(text)


def _fast_alert_rules(workdir: Path) -> Path:
    """The shipped alert rules with every ``for`` at 0 s, so the test takes seconds."""
    data = yaml.safe_load(ALERT_RULES.read_text())
    for group in data["groups"]:
        for rule in group["rules"]:
            rule.pop("for", None)
    path = workdir / "alerts.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def _with_bool(expr: str) -> str:
    """An alert expression whose comparisons return 0/1 instead of filtering: it has data
    whenever its series exist, firing or not."""
    return re.sub(r"(==|!=|>=|<=|>|<)\s*(?=[0-9])", r"\1 bool ", expr)


def _dashboard_exprs() -> list[tuple[str, str]]:
    out = []
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            for target in panel["targets"]:
                expr = target["expr"].replace("$__rate_interval", "1m").replace("$instance", ".*")
                out.append((f"{path.name}: {panel['title']}", expr))
    return out


def _alert_exprs() -> list[tuple[str, str]]:
    """Every rule's expression: the alerts' (comparisons made 0/1) and the recording rules'."""
    data = yaml.safe_load(ALERT_RULES.read_text())
    return [
        (r.get("alert") or r["record"], _with_bool(r["expr"]))
        for g in data["groups"]
        for r in g["rules"]
    ]


def _trial_pod(cluster: Cluster, *, host: Path, node: str) -> None:
    """A Katib trial's pod of the API in the host's besteffort pod cgroup: the fixture's
    cgroup renamed to the UID the API server gave the pod (systemd writes its dashes as _)."""
    ns = cluster.namespace("katib")
    pod = cluster.pod(
        namespace=ns,
        node=node,
        name="random-abc-pod",
        labels={
            "katib.kubeflow.org/experiment": "random",
            "katib.kubeflow.org/trial": "random-abc",
        },
    )
    old, new = UID_BE.replace("-", "_"), pod["metadata"]["uid"].replace("-", "_")
    (found,) = host.rglob(f"*pod{old}.slice")
    found.rename(found.with_name(found.name.replace(old, new)))


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "real"])
def test_alert_to_action_and_back(
    dry_run: bool,
    cluster: Cluster,
    control_plane: TestCluster,
    tmp_path: Path,
    gpu_env: dict[str, str],
) -> None:
    host = tmp_path / "host"
    shutil.copytree(HOSTS / "v2-systemd-containerd", host)
    _set_meminfo(host, "MemAvailable", 1)  # 1 GiB of 32: NodeguardNodeMemoryLow
    _set_meminfo(host, "SUnreclaim", 1)  # and nothing else
    node = cluster.node(memory="32Gi")
    _trial_pod(cluster, host=host, node=node)  # the Katib trials panel has one to show
    local = tmp_path / "local.yaml"
    local.write_text(LOCAL_RULES)
    args = [
        f"--path.procfs={host / 'proc'}",
        f"--path.sysfs={host / 'sys'}",
        f"--path.kmsg={host / 'kmsg'}",
        f"--path.state={tmp_path / 'state'}",
        f"--node-name={node}",
        "--interval=250ms",
        f"--kubeconfig={control_plane.kubeconfig_path}",
        f"--rules={ROOT / 'rules' / 'alertmanager.yaml'}",
        f"--rules={local}",
        f"--webhook.token-file={_token_file(tmp_path)}",
        "--dry-run" if dry_run else "--no-dry-run",
    ]
    with running_agent(args=args, log_path=tmp_path / "agent.log", env=gpu_env) as agent:
        hook = f"{agent}/webhook/alertmanager"
        with (
            alertmanager(workdir=tmp_path / "am", webhook_url=hook, token=TOKEN) as am,
            prometheus(
                workdir=tmp_path / "prom",
                target=agent.removeprefix("http://"),
                rule_files=[_fast_alert_rules(tmp_path)],
                alertmanager_url=am,
            ) as prom,
        ):

            def mapped() -> list[dict[str, Any]]:
                return [i for i in incidents(agent) if i["rule"] == "am-node-memory-low"]

            fired = wait_until(
                "the alert's firing to reach nodeguard",
                lambda: [i for i in mapped() if i["kind"] == "firing"],
                timeout=60,
                step=0.2,
            )
            assert fired[0]["dry_run"] is dry_run
            assert fired[0]["actions"][0] == "cordon:done"
            held = cordoned(cluster.core.read_node(node))
            assert held is (not dry_run)
            reason = "NodeguardWouldCordon" if dry_run else "NodeguardCordoned"
            assert cluster.events("default", name=node, reason=reason)

            # Every query of the dashboards and the alert rules returns data (a counter born at
            # the first action needs a second scrape before increase() has two points).
            def empty() -> list[tuple[str, str]]:
                return [
                    (where, expr)
                    for where, expr in _dashboard_exprs() + _alert_exprs()
                    if not query(prom, expr)
                ]

            wait_until(
                "every query to return data",
                lambda: not empty(),
                timeout=60,
                step=1,
                detail=lambda: "\n".join(f"{w}: {e}" for w, e in empty()),
            )

            # The host recovers: the alert resolves, and the undo runs.
            _set_meminfo(host, "MemAvailable", 20)
            resolved = wait_until(
                "the resolved notification",
                lambda: [i for i in mapped() if i["kind"] == "resolved"],
                timeout=60,
                step=0.2,
            )
            assert resolved[0]["actions"] == ["uncordon:" + ("noop" if dry_run else "done")]
            assert not cordoned(cluster.core.read_node(node))
            metrics = get(f"{agent}/metrics")[1]
            assert re.search(
                r'nodeguard_webhook_alerts_total\{outcome="queued",'
                r'status="resolved"\} [1-9]',
                metrics,
            )

        # A delivery repeated by hand (as an HA pair or a retry would) acts once.
        payload = {
            "version": "4",
            "status": "firing",
            "receiver": "nodeguard",
            "alerts": [
                {
                    "status": "firing",
                    "fingerprint": "by-hand",
                    "startsAt": "2026-11-30T06:00:00Z",
                    "labels": {"alertname": "NodeguardSlabUnreclaimableHigh", "node": node},
                    "annotations": {},
                }
            ],
        }
        outcomes = [_post(hook, payload)["alerts"][0]["outcome"] for _ in range(2)]
        assert outcomes == ["queued", "duplicate"]
        by_hand = wait_until(
            "the hand-made delivery's incident",
            lambda: [i for i in incidents(agent) if i["rule"] == "am-slab-unreclaimable-high"],
            timeout=60,
            step=0.2,
        )
        time.sleep(1.0)
        assert (
            len([i for i in incidents(agent) if i["rule"] == "am-slab-unreclaimable-high"])
            == len(by_hand)
            == 1
        )


def _token_file(tmp_path: Path) -> Path:
    path = tmp_path / "webhook-token"
    path.write_text(TOKEN + "\n")
    return path


def _post(url: str, payload: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        url,
        data=json.dumps(payload).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        body: dict[str, Any] = json.load(resp)
    return body


# -- target labels under the shipped scrape configs -------------------------------------------
AGENT_POD = "nodeguard-x7k2p"
# Series about the agent itself: the target's namespace/pod/container (the agent's pod) are
# theirs. Every other series is about the node, a GPU or a workload.
AGENT_SERIES = re.compile(
    r"nodeguard_(build_info|snapshot_timestamp_seconds|collector_\w+|cgroup_files_open|"
    r"node_info|rules?_\w+|remediation_\w+|incidents_total|actions_total|webhook_\w+|http_\w+|"
    r"sampler_\w+|focus_\w+|notify_\w+|state_\w+|timeline_\w+|trial_\w+|actor)$"
)


def _shipped_jobs(tmp_path: Path, agent: str) -> dict[str, dict[str, Any]]:
    """The shipped ways to scrape the DaemonSet, rendered from daemonset/ by kustomize: the
    ServiceMonitor as the Prometheus Operator turns it into a scrape job, and
    docs/prometheus-scrape-kubernetes.yml as written; both discover the agent's pod through a
    file that carries what Kubernetes discovery would say of it."""
    from tests.support.deploy import kustomize
    from tests.support.deploy.manifests import DAEMONSET, find, render

    objs = render(DAEMONSET, binary=kustomize.ensure_built())
    sd_file = tmp_path / "targets.json"
    meta = kubernetes_meta(
        address=agent.removeprefix("http://"),
        service=find(objs, "Service", "nodeguard"),
        daemonset=find(objs, "DaemonSet", "nodeguard"),
        pod=AGENT_POD,
    )
    sd_file.write_text(json.dumps([{"targets": [meta.pop("__address__")], "labels": meta}]))
    docs = yaml.safe_load((ROOT / "docs" / "prometheus-scrape-kubernetes.yml").read_text())
    return {
        "servicemonitor": servicemonitor_job(
            find(objs, "ServiceMonitor", "nodeguard"), sd_file=sd_file
        ),
        "pod-discovery": with_file_sd(docs["scrape_configs"][0], sd_file=sd_file),
    }


@pytest.mark.parametrize("how", ["servicemonitor", "pod-discovery"])
def test_no_series_takes_the_agents_pod_for_its_own(
    how: str, tmp_path: Path, gpu_env: dict[str, str]
) -> None:
    # honor_labels keeps a label the series has, even empty, and gives it the target's where it
    # has none (scrape.go mutateSampleLabels); stored, an empty label is no label. So a pod
    # series (container ""), a node series and a GPU's (namespace, pod and container "") are
    # stored without them, never with the agent's own pod, as the kubelet's cAdvisor series are.
    args = [
        *host_flags("v2-systemd-containerd"),
        f"--path.state={tmp_path / 'state'}",
        "--interval=1s",
    ]
    with running_agent(args=args, log_path=tmp_path / "agent.log", env=gpu_env) as agent:
        job = _shipped_jobs(tmp_path, agent)[how]
        with prometheus(workdir=tmp_path / "prom", scrape_configs=[job]) as prom:
            wait_until(
                "a scrape",
                lambda: query(prom, 'nodeguard_gpu_memory_total_bytes{gpu="1"}'),
                timeout=60,
                step=0.2,
            )
            series: list[dict[str, str]] = [
                r["metric"] for r in query(prom, '{__name__=~"nodeguard_.+"}')
            ]

    def only(name: str, **want: str) -> dict[str, str]:
        found = [s for s in series if s["__name__"] == name and want.items() <= s.items()]
        assert len(found) == 1, (name, want, found)
        return found[0]

    workload = {"namespace", "pod", "container"}
    target = {"job", "instance"} | ({"service", "endpoint"} if how == "servicemonitor" else set())
    node = only("nodeguard_node_memory_available_bytes")
    assert set(node) == {"__name__"} | target  # no workload label at all
    assert node["job"] == "nodeguard"
    assert set(only("nodeguard_gpu_memory_total_bytes", gpu="0")) & workload == set()
    assert (
        set(only("nodeguard_node_oom_kills_total", constraint="CONSTRAINT_MEMCG")) & workload
        == set()
    )
    # The pod as a whole: its pod (the UID, no cluster here), no container, no namespace.
    pod = only("nodeguard_pod_memory_working_set_bytes", pod=UID_B)
    assert set(pod) & workload == {"pod"}
    ctr = only("nodeguard_container_memory_working_set_bytes", container=CID[3])
    assert (ctr["pod"], "namespace" in ctr) == (UID_B, False)
    assert only("nodeguard_gpu_container_memory_used_bytes", container=CID[3])["pod"] == UID_B
    # Only the agent's own series carry its pod, and under the ServiceMonitor all of them do.
    with_agent_pod = {s["__name__"] for s in series if s.get("pod") == AGENT_POD}
    assert all(AGENT_SERIES.match(n) for n in with_agent_pod), with_agent_pod
    if how == "servicemonitor":
        build = only("nodeguard_build_info")
        assert (build["namespace"], build["pod"], build["container"]) == (
            "nodeguard",
            AGENT_POD,
            "nodeguard",
        )
        assert (build["service"], build["endpoint"]) == ("nodeguard", "metrics")
    else:
        assert with_agent_pod == set()  # this job adds no pod label to its target
