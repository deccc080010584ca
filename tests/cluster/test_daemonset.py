"""The DaemonSet manifests (``daemonset/``), proven against the real tools and the real API server.

- Rendered by kustomize (the real one, built from Go modules:
``tests/support/deploy/kustomize.py``),
  base, components and overlay; the files generated from ``rules/`` are current.
- Accepted by the test control plane: server-side apply as a dry run (``dryRun=All``) with
  ``fieldValidation=Strict``, the Prometheus Operator's published CRDs installed. The Namespace
  is applied for real first (a dry-run Namespace does not exist for the dry run of what goes in
  it); server-side apply rather than create, so that the real objects other tests here create
  from the same manifests do not make the dry run a 409.
- RBAC: the whole action suite runs as the DaemonSet's ServiceAccount (a TokenRequest token);
  then, for every verb the roles grant, a copy of the roles without that verb makes the action
  that needs it fail with 403.
- The DaemonSet's arguments and mounts agree with the CLI: ``nodeguard run`` with exactly the
  container's arguments, against the volumes laid out as the kubelet lays them out (the host
  being a committed fixture tree).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from nodeguard.actions.audit import Auditor
from nodeguard.actions.base import ActionResult
from nodeguard.actions.context import Env
from nodeguard.actions.cordon import LABEL, CordonConfig, cordon
from nodeguard.actions.evict import evict
from nodeguard.actions.katib import quota_name
from nodeguard.actions.limits import EvictionBackoff, EvictionLimiter
from nodeguard.actions.ranking import EvictFilter, plan_eviction
from nodeguard.cli import build_parser
from nodeguard.cli.flags import cordon_config
from nodeguard.kube.client import KubeClient
from nodeguard.kube.errors import Forbidden
from nodeguard.kube.objects import pod_meta
from nodeguard.kube.trial_records import TrialRecords
from nodeguard.kube.watch import PodWatcher
from nodeguard.remediation.actor import NodeActor
from tests.fixtures.make_hosts import v2_cgroup
from tests.support.acting import run_action
from tests.support.agent import free_port, wait_until, wait_until_async
from tests.support.controlplane.cluster import TestCluster
from tests.support.deploy import generate, kustomize
from tests.support.deploy.container import Container, HostPathMissing, http, lay_out, metric
from tests.support.deploy.manifests import (
    DAEMONSET,
    REPO,
    Applier,
    Obj,
    Triple,
    compose,
    container,
    expand,
    find,
    rbac_objects,
    render,
    review,
    service_account_token,
    token_kubeconfig,
    triples,
    variants,
    write_projected,
)
from tests.support.hosts import HOSTS
from tests.support.kube_helpers import (
    Cluster,
    cordoned,
    custom_json,
    given,
    katib_trial,
    name_of,
)

GiB = 1 << 30
# Every component shipped (each a directory with a kustomization), not a list kept by hand.
COMPONENTS = tuple(
    sorted(p.parent.name for p in (DAEMONSET / "components").glob("*/kustomization.yaml"))
)

# Every call nodeguard makes to the API (nodeguard/kube/client.py and the watch), by role.
CLUSTER_ROLE: set[Triple] = {
    ("", "nodes", "get"),
    ("", "nodes", "list"),
    ("", "nodes", "patch"),
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("", "pods/eviction", "create"),
    ("policy", "poddisruptionbudgets", "list"),
    ("", "events", "create"),
    ("kubeflow.org", "experiments", "get"),
    ("kubeflow.org", "experiments", "list"),
    ("kubeflow.org", "experiments", "patch"),
    ("kubeflow.org", "trials", "list"),
    ("kubeflow.org", "trials", "get"),
    ("", "configmaps", "create"),
    ("", "configmaps", "patch"),
    ("", "resourcequotas", "list"),
    ("", "resourcequotas", "create"),
    ("", "resourcequotas", "delete"),
}
ROLE: set[Triple] = {
    ("coordination.k8s.io", "leases", "create"),
    ("coordination.k8s.io", "leases", "get"),
    ("coordination.k8s.io", "leases", "update"),
}


# -- fixtures (kustomize_bin, manifests, applier: tests/support/deploy/fixtures.py)
# --------------------
@dataclass
class ServiceAccount:
    namespace: str
    name: str
    token: str


def _install_rbac(applier: Applier, objs: list[Obj]) -> ServiceAccount:
    for o in objs:
        applier.apply(o, dry_run=False)
    sa = find(objs, "ServiceAccount")["metadata"]
    token = service_account_token(applier.api, name=sa["name"], namespace=sa["namespace"])
    return ServiceAccount(namespace=sa["namespace"], name=sa["name"], token=token)


async def _wait_rbac(applier: Applier, sa: ServiceAccount, *, denied: Triple | None) -> None:
    """Until the authorizer (its informer caches) grants exactly the roles, less ``denied``."""

    def settled(t: Triple, where: str, want: bool) -> bool:
        return (
            review(applier.api, sa=sa.name, namespace=sa.namespace, triple=t, where=where) == want
        )

    for t in sorted(CLUSTER_ROLE | ROLE):
        where = "" if t[1] == "nodes" else sa.namespace
        want = t != denied
        await wait_until_async(
            f"RBAC to settle for {t} (want {want})",
            functools.partial(settled, t, where, want),
            timeout=60,
            step=0.1,
        )


@pytest.fixture(scope="module")
def daemonset_sa(applier: Applier, manifests: list[Obj]) -> ServiceAccount:
    """The DaemonSet's Namespace, ServiceAccount, roles and bindings, applied for real, and a
    TokenRequest token of the ServiceAccount."""
    applier.apply(find(manifests, "Namespace"), dry_run=False)
    return _install_rbac(applier, rbac_objects(manifests))


def _sa_client(cp: TestCluster, sa: ServiceAccount) -> KubeClient:
    return KubeClient.with_token(server=cp.server_url, token=sa.token, ca_file=cp.ca_cert_path)


def _cordon_config(objs: list[Obj], namespace: str) -> CordonConfig:
    """The cordon settings the DaemonSet's arguments give (the CLI parses them)."""
    args = build_parser().parse_args(
        [expand(a, {"POD_NAMESPACE": namespace}) for a in container(objs)["args"]]
    )
    return cordon_config(args)


def _clear_marks(cluster: Cluster) -> None:
    """Nodes other tests left cordoned by nodeguard would spend the budget."""
    for n in cluster.core.list_node(label_selector=f"{LABEL}=true").items:
        cluster.core.patch_node(name_of(n), {"metadata": {"labels": {LABEL: None}}})


# -- the files ---------------------------------------------------------------------------------
def test_generated_files_are_current() -> None:
    stale = [str(p.relative_to(REPO)) for p in generate.stale()]
    assert not stale, (
        f"out of date (run .venv/bin/python -m tests.support.deploy.generate): {stale}"
    )


def test_kustomize_is_the_pinned_build(kustomize_bin: Path) -> None:
    out = subprocess.run(
        [str(kustomize_bin), "version"], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == kustomize.version()


def test_the_base_has_every_object_and_no_wildcard(manifests: list[Obj]) -> None:
    kinds = sorted(o["kind"] for o in manifests)
    assert kinds == sorted(
        [
            "Namespace",
            "ResourceQuota",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "ConfigMap",
            "Service",
            "DaemonSet",
            "ServiceMonitor",
            "PrometheusRule",
        ]
    )
    ns = find(manifests, "Namespace")["metadata"]
    assert ns["name"] == "nodeguard"
    # hostPID and hostPath volumes are beyond the baseline Pod Security level.
    assert ns["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    for o in manifests:
        if o["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
            assert o["metadata"]["namespace"] == "nodeguard", o["kind"]
        for rule in o.get("rules", []):
            for key in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in rule.get(key, []), (o["kind"], rule)
                assert not any("*" in v for v in rule.get(key, [])), (o["kind"], rule)
    for binding in ("ClusterRoleBinding", "RoleBinding"):
        b = find(manifests, binding)
        assert b["subjects"] == [
            {"kind": "ServiceAccount", "name": "nodeguard", "namespace": "nodeguard"}
        ]
    assert find(manifests, "ClusterRoleBinding")["roleRef"]["name"] == "nodeguard"


def test_the_daemonset(manifests: list[Obj]) -> None:
    ds = find(manifests, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    c = container(manifests)
    assert ds["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    assert (
        ds["spec"]["selector"]["matchLabels"].items()
        <= ds["spec"]["template"]["metadata"]["labels"].items()
    )
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["serviceAccountName"] == "nodeguard"
    assert {"operator": "Exists"} in pod["tolerations"]  # GPU taints, memory pressure, our own
    assert pod["hostPID"] is True  # NVML's PIDs: see the comment in the manifest
    assert not pod.get("hostNetwork") and not pod.get("hostIPC")
    assert c["image"] == "registry.example.com/nodeguard:0.1.0"

    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["privileged"] is False
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYSLOG"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}

    res = c["resources"]
    for kind in ("requests", "limits"):
        assert set(res[kind]) == {"cpu", "memory"}, kind
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}

    port = next(p for p in c["ports"] if p["name"] == "metrics")
    assert port["containerPort"] == 9847
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}

    # The host's /proc and /sys, read-only under /host, and the kernel log device.
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    for host, path, flag in (
        ("/proc", "/host/proc", "--path.procfs"),
        ("/sys", "/host/sys", "--path.sysfs"),
        ("/dev/kmsg", "/host/dev/kmsg", "--path.kmsg"),
    ):
        m = mounts[path]
        assert m["readOnly"] is True
        assert volumes[m["name"]]["hostPath"]["path"] == host
        assert f"{flag}={path}" in c["args"]
    assert volumes[mounts["/host/dev/kmsg"]["name"]]["hostPath"]["type"] == "CharDevice"
    # Only what every supported node has: /proc/pressure exists only where PSI is on, so its
    # writable mount (PSI triggers) is components/psi-triggers.
    assert "/host/proc/pressure" not in mounts
    assert {v["hostPath"]["path"] for v in volumes.values() if "hostPath" in v} == {
        "/proc",
        "/sys",
        "/dev/kmsg",
        "/var/lib/nodeguard",
    }
    assert "--path.state=/var/lib/nodeguard" in c["args"]
    assert volumes[mounts["/var/lib/nodeguard"]["name"]]["hostPath"]["path"] == "/var/lib/nodeguard"
    # The rules: a directory mount of the ConfigMap (a subPath would never see an update).
    rules = mounts["/etc/nodeguard/rules"]
    assert "subPath" not in rules
    assert volumes[rules["name"]]["configMap"]["name"] == "nodeguard-rules"
    assert "--rules=/etc/nodeguard/rules" in c["args"]
    # No webhook token is shipped (one known to all is none): the webhook is off in the base.
    assert "/etc/nodeguard/webhook" not in mounts
    assert not any(a.startswith("--webhook.token-file") for a in c["args"])
    # Dry run by default; the lease in the pod's own namespace, where the Role is.
    assert "--dry-run" in c["args"] and "--no-dry-run" not in c["args"]
    assert "--cordon.lease-namespace=$(POD_NAMESPACE)" in c["args"]


def test_monitoring_objects_and_config(manifests: list[Obj]) -> None:
    svc = find(manifests, "Service")
    pod_labels = find(manifests, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert [p["name"] for p in svc["spec"]["ports"]] == ["metrics"]
    assert svc["metadata"]["name"] == "nodeguard"  # the job label the alerts expect

    sm = find(manifests, "ServiceMonitor")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    assert endpoint["honorLabels"] is True

    shipped = yaml.safe_load((REPO / "rules/prometheus/nodeguard-alerts.yml").read_text())
    assert find(manifests, "PrometheusRule")["spec"]["groups"] == shipped["groups"]

    cm = find(manifests, "ConfigMap", "nodeguard-rules")
    assert cm["data"] == {"default.yaml": (REPO / "rules/default.yaml").read_text()}
    assert not [o for o in manifests if o["kind"] == "Secret"]


def _with(objs: list[Obj]) -> dict[str, Any]:
    c = container(objs)
    return {
        "args": c["args"],
        "sc": c["securityContext"],
        "selector": find(objs, "DaemonSet")["spec"]["template"]["spec"].get("nodeSelector"),
        "rules": find(objs, "ConfigMap", "nodeguard-rules")["data"],
    }


def test_components_and_overlays(kustomize_bin: Path, tmp_path: Path) -> None:
    base = _with(compose(tmp_path / "base", binary=kustomize_bin))
    parts = {
        c: _with(compose(tmp_path / c, components=[c], binary=kustomize_bin)) for c in COMPONENTS
    }
    act = build_parser().parse_args(parts["no-dry-run"]["args"])
    assert act.dry_run is False and build_parser().parse_args(base["args"]).dry_run is True
    assert [a for a in parts["no-dry-run"]["args"] if a not in base["args"]] == ["--no-dry-run"]
    assert parts["gpu-nodes"]["selector"] == {"nvidia.com/gpu.present": "true"}
    assert base["selector"] is None
    assert parts["kernel-log"]["sc"]["privileged"] is True
    made = compose(tmp_path / "t", components=["cgroup-v1-thresholds"], binary=kustomize_bin)
    mounts = {m["mountPath"]: m for m in container(made)["volumeMounts"]}
    assert not mounts["/host/sys/fs/cgroup"].get("readOnly") and mounts["/host/sys"]["readOnly"]
    # PSI triggers are writes: /proc/pressure alone is writable, over the read-only /host/proc.
    psi = compose(tmp_path / "psi", components=["psi-triggers"], binary=kustomize_bin)
    mounts = {m["mountPath"]: m for m in container(psi)["volumeMounts"]}
    assert not mounts["/host/proc/pressure"].get("readOnly") and mounts["/host/proc"]["readOnly"]
    volumes = {v["name"]: v for v in find(psi, "DaemonSet")["spec"]["template"]["spec"]["volumes"]}
    pressure = volumes[mounts["/host/proc/pressure"]["name"]]["hostPath"]
    assert pressure == {"path": "/proc/pressure", "type": "Directory"}
    # Before Linux 6.5 psi_open refuses a writer without CAP_SYS_RESOURCE; SYSLOG kept, ALL
    # still dropped (a patch replaces the list, the map is merged).
    capabilities = container(psi)["securityContext"]["capabilities"]
    assert capabilities == {"drop": ["ALL"], "add": ["SYSLOG", "SYS_RESOURCE"]}
    assert parts["alert-driven"]["rules"] == {
        "alertmanager.yaml": (REPO / "rules/alertmanager.yaml").read_text()
    }
    plain = compose(tmp_path / "plain", components=["no-prometheus-operator"], binary=kustomize_bin)
    kinds = {o["kind"] for o in plain}
    assert "ServiceMonitor" not in kinds and "PrometheusRule" not in kinds and "DaemonSet" in kinds
    # own-writes adds admission policies and changes nothing else (test_admission_policy.py).
    own = compose(tmp_path / "own", components=["own-writes"], binary=kustomize_bin)
    alone = compose(tmp_path / "alone", binary=kustomize_bin)
    added = sorted((o["kind"], o["metadata"]["name"]) for o in own if o not in alone)
    assert added == [
        (kind, name)
        for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
        for name in ("nodeguard-own-configmaps", "nodeguard-own-node", "nodeguard-own-quotas")
    ]
    assert len(own) == len(alone) + 6
    # All together, as a user's kustomization would combine them.
    everything = _with(compose(tmp_path / "all", components=COMPONENTS, binary=kustomize_bin))
    assert "--no-dry-run" in everything["args"] and everything["sc"]["privileged"] is True
    assert everything["selector"] and set(everything["rules"]) == {"alertmanager.yaml"}
    # The ready overlay, and the component lines daemonset/kustomization.yaml offers commented out.
    overlay = _with(render(DAEMONSET / "overlays" / "gpu-nodes", binary=kustomize_bin))
    assert overlay["selector"] == {"nvidia.com/gpu.present": "true"}
    offered = re.findall(
        r"^\s*#\s*-\s*components/([\w-]+)\s*$",
        (DAEMONSET / "kustomization.yaml").read_text(),
        re.M,
    )
    assert sorted(offered) == sorted(COMPONENTS)


def test_rule_files_pass_nodeguard_check(kustomize_bin: Path, tmp_path: Path) -> None:
    for variant, components in (("base", []), ("alert-driven", ["alert-driven"])):
        cm = find(
            compose(tmp_path / variant, components=components, binary=kustomize_bin),
            "ConfigMap",
            "nodeguard-rules",
        )
        files = []
        for key, text in cm["data"].items():
            (tmp_path / variant / key).write_text(text)
            files.append(str(tmp_path / variant / key))
        done = subprocess.run(
            [sys.executable, "-m", "nodeguard", "check", *files],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr


# -- the API server accepts every object -------------------------------------------------------
def _template_pod(objs: list[Obj], namespace: str) -> Obj:
    """A Pod as the DaemonSet controller makes it from the template (PodSecurity and most pod
    validation apply to Pods, not to the DaemonSet)."""
    template = find(objs, "DaemonSet")["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**template["metadata"], "name": "nodeguard-dry", "namespace": namespace},
        "spec": template["spec"],
    }


def test_server_side_dry_run_accepts_every_object(
    applier: Applier, kustomize_bin: Path, tmp_path: Path
) -> None:
    rendered = variants(tmp_path, binary=kustomize_bin)
    for variant, objs in rendered.items():
        ns = find(objs, "Namespace")
        applier.apply(ns, dry_run=False)
        for o in [*objs, _template_pod(objs, ns["metadata"]["name"])]:
            if o["kind"] == "Namespace":
                continue
            try:
                stored, warnings = applier.apply(o, dry_run=True)
            except ApiException as exc:
                pytest.fail(f"{variant}: {o['kind']} {o['metadata']['name']}: {exc.body}")
            assert not warnings, (variant, o["kind"], warnings)
            assert stored["kind"] == o["kind"]
            if o["kind"] == "ServiceMonitor":
                assert stored["spec"]["endpoints"][0]["honorLabels"] is True
            if o["kind"] == "Pod":
                assert stored["spec"]["priority"] == 2000001000  # system-node-critical
    # Without the namespace's Pod Security label, a baseline cluster rejects the pod, and says why.
    strict = f"baseline-{uuid.uuid4().hex[:6]}"
    applier.apply(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": strict,
                "labels": {"pod-security.kubernetes.io/enforce": "baseline"},
            },
        },
        dry_run=False,
    )
    with pytest.raises(ApiException) as refused:
        applier.apply(_template_pod(rendered["base"], strict), dry_run=True)
    assert refused.value.status == 403
    assert "hostPID" in str(refused.value.body) and "hostPath" in str(refused.value.body)


# -- RBAC --------------------------------------------------------------------------------------
def test_roles_grant_exactly_what_nodeguard_calls(manifests: list[Obj]) -> None:
    assert triples(find(manifests, "ClusterRole")) == CLUSTER_ROLE
    role = find(manifests, "Role")
    assert triples(role) == ROLE
    # Leases of its own namespace only: the budget's and one per node (nodeguard-<node>),
    # whose names RBAC cannot list (resourceNames are exact names).
    assert role["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["create", "get", "update"],
        }
    ]
    # The Lease goes where the Role is: the pod's namespace.
    assert _cordon_config(manifests, "nodeguard").lease_namespace == role["metadata"]["namespace"]


async def test_action_suite_as_the_daemonset_service_account(
    *,
    cluster: Cluster,
    control_plane: TestCluster,
    manifests: list[Obj],
    daemonset_sa: ServiceAccount,
    applier: Applier,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    await _wait_rbac(applier, daemonset_sa, denied=None)
    cfg = _cordon_config(manifests, daemonset_sa.namespace)
    assert cfg.lease_namespace == daemonset_sa.namespace and cfg.budget_percent
    kube = _sa_client(control_plane, daemonset_sa)
    try:
        _clear_marks(cluster)
        node, other = cluster.node(), cluster.node()
        ns = cluster.namespace("ds-suite")
        aud = Auditor(kube=kube, node_name=node, metrics=None)
        env = Env(kube=kube, auditor=aud, node=node, cordon=cfg)

        # cordon/uncordon under the budget's Lease (created, then taken over: get and update).
        for n in (node, other):
            (res,) = await run_action(env=env, node=n, action="cordon", rule="node-memory-low")
            assert res.outcome == "done", res.message
            assert cordoned(cluster.core.read_node(n))
            (res,) = await run_action(env=env, node=n, action="uncordon")
            assert res.outcome == "done", res.message
        lease = client.CoordinationV1Api(cluster.api).read_namespaced_lease(
            cfg.lease_name, cfg.lease_namespace
        )
        spec = given(lease.spec)
        assert spec.holder_identity is None and (spec.lease_transitions or 0) >= 1

        # evict: a pod and a two-pod Katib trial (a gang: its members listed in the namespace,
        # checked with dry-run evictions, recorded on the node, then evicted), ranked from the
        # pod list of the node.
        trial = {
            "katib.kubeflow.org/experiment": "random",
            "katib.kubeflow.org/trial": "random-trial-1",
        }
        low = "nodeguard-test-low"
        cluster.pod(namespace=ns, node=node, name="prep", request="1Gi", priority_class=low)
        for role in ("master", "worker"):
            cluster.pod(
                namespace=ns,
                node=node,
                name=f"trial-1-{role}",
                request="1Gi",
                priority_class=low,
                labels=trial,
            )
        items, _ = await kube.list_pods(node_name=node)
        env.usage = {p["metadata"]["uid"]: 3 * GiB for p in items}
        (res,) = await run_action(env=env, node=node, action="evict", args={"free": "100Gi"})
        assert res.outcome == "done", res.message
        evicted = sorted(p for u in res.details["evicted"] for p in u["pods"])
        assert evicted == [f"{ns}/prep", f"{ns}/trial-1-master", f"{ns}/trial-1-worker"]
        for name in ("prep", "trial-1-master", "trial-1-worker"):
            pod = cluster.pod_json(ns, name)
            assert pod is None or pod["metadata"].get("deletionTimestamp"), name

        # pause/resume Katib: the pause quota made and deleted, the experiment annotated.
        cluster.katib_experiment(ns)
        experiments = {"experiments": [f"{ns}/random"]}
        (paused,) = await run_action(env=env, node=node, action="pause_katib", args=experiments)
        assert paused.outcome == "done", paused.message
        assert cluster.core.read_namespaced_resource_quota(quota_name("random"), ns)
        (resumed,) = await run_action(env=env, node=node, action="resume_katib")
        assert resumed.outcome == "done", resumed.message
        assert cluster.core.list_namespaced_resource_quota(ns).items == []
        exp = custom_json(
            cluster.custom.get_namespaced_custom_object(
                "kubeflow.org", "v1beta1", ns, "experiments", "random"
            )
        )
        assert "nodeguard.io/paused-by" not in (exp["metadata"].get("annotations") or {})

        # The pod watch: list, then a pod created afterwards arrives by the watch.
        watcher = PodWatcher(kube=kube, node_name=node, watch_timeout=5)
        stop = asyncio.Event()
        task = asyncio.create_task(watcher.run(stop=stop))
        try:
            await wait_until_async("the watch synced", watcher.is_synced, timeout=30)
            late = await asyncio.to_thread(
                cluster.pod, namespace=ns, node=node, name="late", request="1Gi"
            )
            await wait_until_async(
                "the late pod watched",
                lambda: late["metadata"]["uid"] in watcher.pods(),
                timeout=30,
            )
            node_seen = watcher.node()
            assert node_seen is not None and node_seen.allocatable_memory_bytes == 64 * GiB
            assert watcher.relists == 1
        finally:
            stop.set()
            await task

        # Every action left its Event, written as the ServiceAccount.
        assert cluster.events("default", name=node, reason="NodeguardCordoned")
        assert cluster.events(ns, name="prep", reason="NodeguardEvicted")
        assert cluster.events(ns, name="random", reason="NodeguardKatibPaused")
        assert cluster.events(ns, name="random", reason="NodeguardKatibResumed")
        assert aud.events_written >= 9 and aud.pending == 0
        assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    finally:
        kube.close()


async def test_the_node_lease_as_the_daemonset_service_account(
    *,
    cluster: Cluster,
    control_plane: TestCluster,
    manifests: list[Obj],
    daemonset_sa: ServiceAccount,
    applier: Applier,
) -> None:
    # The per-node Lease nodeguard-<node>, in the namespace the DaemonSet gives the agent:
    # created (create), renewed (update), watched by a second agent (get) and taken over
    # (update) with the shipped Role alone.
    await _wait_rbac(applier, daemonset_sa, denied=None)
    cfg = _cordon_config(manifests, daemonset_sa.namespace)
    kube = _sa_client(control_plane, daemonset_sa)
    clocks = [1000.0, 1000.0]

    def clock_of(i: int) -> Callable[[], float]:
        return lambda: clocks[i]

    try:
        node = cluster.node()
        a, b = (
            NodeActor(
                kube=kube,
                node=node,
                namespace=cfg.lease_namespace,
                identity=f"nodeguard-{who}",
                duration=15,
                dry_run=False,
                state_id=who,
                mirror=dict,
                clock=clock_of(i),
            )
            for i, who in enumerate(("a", "b"))
        )
        assert await a.attempt() and await a.attempt()
        assert not await b.attempt() and b.state == "observer"
        clocks[1] += 15
        assert await b.attempt() and b.transitions == 1
    finally:
        kube.close()


def test_nothing_else_is_granted(
    applier: Applier, daemonset_sa: ServiceAccount, manifests: list[Obj]
) -> None:
    sa = daemonset_sa
    for where, t in [
        ("", ("", "nodes", "update")),
        ("", ("", "nodes", "delete")),
        ("", ("", "nodes/status", "patch")),
        ("default", ("", "pods", "delete")),
        ("default", ("", "pods", "get")),
        ("default", ("", "pods", "patch")),
        ("default", ("", "secrets", "get")),
        ("default", ("", "events", "delete")),
        ("default", ("coordination.k8s.io", "leases", "create")),  # only its own namespace
        ("kube-system", ("coordination.k8s.io", "leases", "update")),
        ("default", ("kubeflow.org", "experiments", "delete")),
        ("default", ("batch", "jobs", "patch")),
        ("", ("rbac.authorization.k8s.io", "clusterroles", "escalate")),
    ]:
        allowed = review(applier.api, sa=sa.name, namespace=sa.namespace, triple=t, where=where)
        assert not allowed, (where, t)
    # The Lease Role is its own namespace's: a Lease of another namespace is refused.
    body = {
        "spec": {
            "user": f"system:serviceaccount:{sa.namespace}:{sa.name}",
            "groups": ["system:serviceaccounts", "system:authenticated"],
            "resourceAttributes": {
                "group": "coordination.k8s.io",
                "resource": "leases",
                "verb": "update",
                "namespace": "kube-node-lease",
                "name": "someone-elses-lease",
            },
        }
    }
    out = client.AuthorizationV1Api(applier.api).create_subject_access_review(
        client.V1SubjectAccessReview.model_validate(body)
    )
    assert given(out.status).allowed is False


# One probe per permission: the nodeguard action (or the call it makes) that needs it. Each
# checks that the 403 names exactly the permission taken away, not some other one.
@dataclass
class Probe:
    kube: KubeClient
    cluster: Cluster
    namespace: str  # the copy's namespace: its ServiceAccount, Role and the budget's Lease
    caplog: pytest.LogCaptureFixture
    missing: Triple

    @property
    def denial(self) -> str:
        """How the API server words the refusal of the missing permission."""
        _, resource, verb = self.missing
        return f'cannot {verb} resource "{resource}"'

    def env(self, node: str) -> Env:
        return Env(
            kube=self.kube,
            auditor=Auditor(kube=self.kube, node_name=node, metrics=None),
            node=node,
            cordon=CordonConfig(lease_namespace=self.namespace),
        )

    async def cordon(self, *, budget: bool = False, auditor: Auditor | None = None) -> ActionResult:
        node = self.cluster.node()
        # The Lease is taken with or without a budget; only a budget counts nodes.
        cfg = CordonConfig(budget_nodes=1000 if budget else None, lease_namespace=self.namespace)
        res = await cordon(
            kube=self.kube,
            node=node,
            rule="r",
            reason="x",
            identity=f"{node}/probe",
            dry_run=False,
            config=cfg,
        )
        aud = auditor or Auditor(kube=self.kube, node_name=node, metrics=None)
        await aud.record(result=res, default_reason="NodeguardCordonProbe")
        return res

    def failed(self, res: ActionResult) -> None:
        assert res.outcome == "failed", res.message
        assert "Forbidden:" in res.message and self.denial in res.message, res.message

    def forbidden(self, exc: BaseException) -> None:
        assert isinstance(exc, Forbidden) and self.denial in str(exc), repr(exc)

    def logged(self, logger: str) -> bool:
        """Whether ``logger`` logged the Forbidden error of the missing permission."""
        return any(
            r.name == logger
            and isinstance(r.args, tuple)
            and any(isinstance(a, Forbidden) and self.denial in str(a) for a in r.args)
            for r in self.caplog.records
        )

    async def watch(self) -> PodWatcher:
        """Run the pod watch for a node with a pod until it logs the 403."""
        node = self.cluster.node()
        self.cluster.pod(namespace=self.namespace, node=node, name="resident")
        watcher = PodWatcher(kube=self.kube, node_name=node, watch_timeout=5)
        stop = asyncio.Event()
        task = asyncio.create_task(watcher.run(stop=stop))
        try:
            await wait_until_async(
                "the watch's log line", lambda: self.logged("nodeguard.kube.watch"), timeout=30
            )
        finally:
            stop.set()
            await task
        return watcher


async def _needs_nodes(p: Probe) -> None:
    p.failed(await p.cordon(budget=p.missing[2] == "list"))  # list: counting the budget


async def _needs_pods_list(p: Probe) -> None:
    watcher = await p.watch()
    assert not watcher.is_synced()
    with pytest.raises(Forbidden) as info:
        await p.kube.list_pods(node_name="any")
    p.forbidden(info.value)


async def _needs_pods_watch(p: Probe) -> None:
    watcher = await p.watch()
    assert watcher.is_synced() and len(watcher.pods()) == 1  # listed, but never watched


async def _needs_evictions(p: Probe) -> None:
    node = p.cluster.node()
    pod = p.cluster.pod(namespace=p.namespace, node=node, name="victim", request="1Gi")
    meta = pod_meta(pod)
    res = await evict(
        kube=p.kube,
        node=node,
        plan=plan_eviction(pods={meta.uid: meta}, usage={meta.uid: GiB}, flt=EvictFilter()),
        target_bytes=0,
        rule="r",
        dry_run=False,
        limiter=EvictionLimiter(),
        backoff=EvictionBackoff(),
    )
    p.failed(res)
    live = p.cluster.pod_json(p.namespace, "victim")
    assert live is not None and not live["metadata"].get("deletionTimestamp")


async def _needs_events(p: Probe) -> None:
    # An Event that cannot be written never fails the action: it is logged, and missing.
    aud = Auditor(kube=p.kube, node_name="probe", metrics=None)
    res = await p.cordon(auditor=aud)
    assert res.outcome == "done", res.message
    assert aud.events_written == 0 and p.logged("nodeguard.audit")
    assert not p.cluster.events("default", name=res.node, reason="NodeguardCordoned")
    p.cluster.core.patch_node(  # leave no nodeguard cordon behind for other tests' budgets
        res.node, {"metadata": {"labels": {LABEL: None}}, "spec": {"unschedulable": None}}
    )
    with pytest.raises(Forbidden) as info:
        await p.kube.create_event(
            namespace=p.namespace,
            body={"metadata": {"generateName": "x-"}, "involvedObject": {"kind": "Pod"}},
        )
    p.forbidden(info.value)


async def _needs_katib(p: Probe) -> None:
    """pause_katib reads the experiment, its trials, the namespace's experiments and pause
    quotas, makes a quota and annotates the experiment; resume_katib deletes the quota."""
    p.cluster.katib_experiment(p.namespace)
    node = p.cluster.node()
    args = {"experiments": [f"{p.namespace}/random"]}
    if p.missing[1:] == ("resourcequotas", "delete"):
        (paused,) = await run_action(env=p.env(node), node=node, action="pause_katib", args=args)
        assert paused.outcome == "done", paused.message
        (res,) = await run_action(env=p.env(node), node=node, action="resume_katib", args=args)
    else:
        (res,) = await run_action(env=p.env(node), node=node, action="pause_katib", args=args)
    p.failed(res)


async def _needs_trial_records(p: Probe) -> None:
    """A trial pod's memory record: the Trial read (its UID for the ownerReference), the
    ConfigMap patched, or made where it is not there yet."""
    exp = p.cluster.katib_experiment(p.namespace)
    katib_trial(p.cluster, namespace=p.namespace, experiment=exp, name="t1", parameters={})
    with pytest.raises(Forbidden) as info:
        await TrialRecords(kube=p.kube).put(
            namespace=p.namespace, trial="t1", experiment="random", pod="t1-x", record={"a": 1}
        )
    p.forbidden(info.value)


async def _needs_lease(p: Probe) -> None:
    if p.missing[2] == "update":
        # A free Lease exists (an agent released it): taking it is an update.
        client.CoordinationV1Api(p.cluster.api).create_namespaced_lease(
            p.namespace,
            client.V1Lease.model_validate(
                {
                    "metadata": {"name": CordonConfig().lease_name},
                    "spec": {"leaseDurationSeconds": 15},
                }
            ),
        )
    p.failed(await p.cordon())


PROBES: dict[Triple, Callable[[Probe], Awaitable[None]]] = {
    ("", "nodes", "get"): _needs_nodes,
    ("", "nodes", "list"): _needs_nodes,
    ("", "nodes", "patch"): _needs_nodes,
    ("", "pods", "list"): _needs_pods_list,
    ("", "pods", "watch"): _needs_pods_watch,
    ("", "pods/eviction", "create"): _needs_evictions,
    ("policy", "poddisruptionbudgets", "list"): _needs_evictions,
    ("", "events", "create"): _needs_events,
    ("kubeflow.org", "experiments", "get"): _needs_katib,
    ("kubeflow.org", "experiments", "list"): _needs_katib,
    ("kubeflow.org", "experiments", "patch"): _needs_katib,
    ("kubeflow.org", "trials", "list"): _needs_katib,
    ("kubeflow.org", "trials", "get"): _needs_trial_records,
    ("", "configmaps", "create"): _needs_trial_records,
    ("", "configmaps", "patch"): _needs_trial_records,
    ("", "resourcequotas", "list"): _needs_katib,
    ("", "resourcequotas", "create"): _needs_katib,
    ("", "resourcequotas", "delete"): _needs_katib,
    ("coordination.k8s.io", "leases", "create"): _needs_lease,
    ("coordination.k8s.io", "leases", "get"): _needs_lease,
    ("coordination.k8s.io", "leases", "update"): _needs_lease,
}


def test_every_permission_has_a_probe() -> None:
    assert set(PROBES) == CLUSTER_ROLE | ROLE


@pytest.fixture
async def without_one(
    request: pytest.FixtureRequest,
    cluster: Cluster,
    control_plane: TestCluster,
    manifests: list[Obj],
    applier: Applier,
) -> AsyncIterator[tuple[KubeClient, str]]:
    """The DaemonSet's RBAC copied into a fresh namespace, less one permission; a client
    authenticated as the copy's ServiceAccount."""
    drop: Triple = request.param
    ns = cluster.namespace("ngrbac")
    objs = rbac_objects(manifests, namespace=ns, suffix=f"-{ns}", drop=drop)
    assert drop not in triples(find(objs, "ClusterRole")) | triples(find(objs, "Role"))
    sa = _install_rbac(applier, objs)
    await _wait_rbac(applier, sa, denied=drop)
    kube = _sa_client(control_plane, sa)
    try:
        yield kube, ns
    finally:
        kube.close()
        rbac = client.RbacAuthorizationV1Api(cluster.api)
        rbac.delete_cluster_role_binding(find(objs, "ClusterRoleBinding")["metadata"]["name"])
        rbac.delete_cluster_role(find(objs, "ClusterRole")["metadata"]["name"])


@pytest.mark.parametrize(
    "without_one",
    sorted(PROBES),
    ids=[f"{r}-{v}" for _, r, v in sorted(PROBES)],
    indirect=True,
)
async def test_without_a_permission_an_action_is_forbidden(
    without_one: tuple[KubeClient, str],
    request: pytest.FixtureRequest,
    cluster: Cluster,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    kube, ns = without_one
    drop = request.node.callspec.params["without_one"]
    _clear_marks(cluster)
    await PROBES[drop](Probe(kube=kube, cluster=cluster, namespace=ns, caplog=caplog, missing=drop))


# -- the DaemonSet's arguments run the agent ---------------------------------------------------
def _tree(paths: list[Path]) -> dict[str, float]:
    return {
        str(f): f.lstat().st_mtime for p in paths for f in [p, *p.rglob("*")] if not f.is_symlink()
    }


@contextlib.contextmanager
def running(box: Container, *, extra: tuple[str, ...] = ()) -> Iterator[str]:
    """``python -m nodeguard`` with the container's arguments (a free --listen-address, on
    loopback, in place of the container's port), its environment, until ready; its base URL.
    Stopped with SIGTERM, as the kubelet stops it; it must exit 0."""
    port = free_port()
    args = [
        f"--listen-address=127.0.0.1:{port}" if a.startswith("--listen-address=") else a
        for a in box.args
    ]
    assert args != box.args, "the container sets no --listen-address"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "nodeguard", *args, *extra],
        env={**env, **box.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            assert proc.poll() is None, proc.communicate()[0]
            return http(f"{url}/readyz")[0] == 200

        wait_until("the agent ready", ready, timeout=60, step=0.2)
        yield url
    finally:
        proc.terminate()
        try:
            out = proc.communicate(timeout=20)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            out = proc.communicate()[0]
    assert proc.returncode == 0, out


def test_the_daemonset_arguments_run_the_agent(
    manifests: list[Obj], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    box = lay_out(
        manifests, tmp_path / "container", host=HOSTS / "v2-systemd-containerd", node="gpu-1"
    )
    for name, value in box.env.items():
        monkeypatch.setenv(name, value)  # the parser reads $NODE_NAME for its default
    args = build_parser().parse_args(box.args)
    assert args.command == "run" and args.dry_run is True
    assert args.node_name == "gpu-1"  # from $NODE_NAME (the downward API)
    # $(POD_NAMESPACE), expanded by the kubelet
    assert cordon_config(args).lease_namespace == "nodeguard"
    before = _tree(box.read_only)
    rules_dir = box.root / "etc/nodeguard/rules"
    with running(box) as url:
        status, metrics = http(f"{url}/metrics")
        assert status == 200
        # Node memory from /host/proc, containers from /host/sys/fs/cgroup, OOM kills from the
        # kernel log, the rules from the ConfigMap mount.
        assert metric(metrics, "nodeguard_node_memory_available_bytes")
        assert metric(metrics, "nodeguard_node_memory_slab_unreclaimable_bytes")
        assert len(metric(metrics, "nodeguard_container_memory_working_set_bytes")) >= 4
        for collector in ("meminfo", "pressure", "cgroups", "kmsg", "processes"):
            assert metric(metrics, "nodeguard_collector_success", collector=collector) == [1.0]
        assert metric(metrics, "nodeguard_node_oom_kills_total")
        shipped = yaml.safe_load((REPO / "rules/default.yaml").read_text())
        assert metric(metrics, "nodeguard_rules_loaded") == [float(len(shipped["spec"]["rules"]))]
        # No token in the base: the webhook is off.
        empty = json.dumps({"version": "4", "alerts": []}).encode()
        status, body = http(f"{url}/webhook/alertmanager", data=empty)
        assert status == 403 and "--webhook.token-file" in body
        # The kubelet updates the ConfigMap's files in place: the rules reload, no restart.
        shipped["spec"]["rules"] = shipped["spec"]["rules"][:1]
        write_projected(rules_dir, {"default.yaml": yaml.safe_dump(shipped)})
        wait_until(
            "the rules to be reloaded",
            lambda: metric(http(f"{url}/metrics")[1], "nodeguard_rules_loaded") == [1.0],
            timeout=30,
            step=0.5,
        )
        assert metric(http(f"{url}/metrics")[1], "nodeguard_rules_reloads_total") == [1.0]
    # Nothing written where the mounts are read-only (but the rules the test swapped); the
    # state (the kernel-log position) kept in the hostPath.
    after = _tree(box.read_only)
    changed = {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}
    assert not [p for p in changed if not p.startswith(str(rules_dir))]
    assert (box.root / "var/lib/nodeguard/kmsg-oom.json").is_file()


def test_the_base_starts_on_a_node_without_psi(
    manifests: list[Obj], kustomize_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel without PSI (before 4.20, booted with psi=0, or RHEL 8/9 without psi=1) has no
    /proc/pressure: the base still lays out as the kubelet would start it, and the agent runs
    with the pressure collector's "no data" (available 0, success 1), not an error. The
    look-alike that must not start there: components/psi-triggers, whose Directory hostPath the
    kubelet refuses on that node."""
    host = HOSTS / "v1-rhel7-3.10"
    assert not (host / "proc" / "pressure").exists()
    box = lay_out(manifests, tmp_path / "container", host=host, node="cpu-1")
    for name, value in box.env.items():
        monkeypatch.setenv(name, value)
    with running(box) as url:
        metrics = http(f"{url}/metrics")[1]
        assert metric(metrics, "nodeguard_collector_available", collector="pressure") == [0.0]
        assert metric(metrics, "nodeguard_collector_success", collector="pressure") == [1.0]
        assert not metric(metrics, "nodeguard_node_memory_pressure_ratio")
        assert metric(metrics, "nodeguard_node_memory_available_bytes")
    psi = compose(tmp_path / "psi", components=["psi-triggers"], binary=kustomize_bin)
    with pytest.raises(HostPathMissing, match="/proc/pressure"):
        lay_out(psi, tmp_path / "psi-container", host=host, node="cpu-1")
    lay_out(psi, tmp_path / "psi-ok", host=HOSTS / "v2-systemd-containerd", node="gpu-1")


def test_the_daemonset_arguments_with_its_service_account(
    *,
    manifests: list[Obj],
    daemonset_sa: ServiceAccount,
    cluster: Cluster,
    control_plane: TestCluster,
    applier: Applier,
    tmp_path: Path,
) -> None:
    """The same, authenticated as the DaemonSet's ServiceAccount (the in-cluster config
    reads the token the kubelet mounts; here a kubeconfig holds it): the agent lists and watches
    its node's pods and names their containers."""
    node, ns = cluster.node(memory="128Gi"), cluster.namespace("ds-agent")
    pods = [
        cluster.pod(namespace=ns, node=node, name=name, request="2Gi", limit="8Gi")
        for name in ("trainer", "loader")
    ]
    host = tmp_path / "host"
    shutil.copytree(HOSTS / "v2-systemd-containerd", host)
    burstable = host / "sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice"
    for i, pod in enumerate(pods, 1):
        uid = pod["metadata"]["uid"].replace("-", "_")
        cid = pod["status"]["containerStatuses"][0]["containerID"].split("://")[1]
        pod_dir = burstable / f"kubepods-burstable-pod{uid}.slice"
        v2_cgroup(pod_dir, current=i * GiB, anon=i * GiB)
        v2_cgroup(pod_dir / f"cri-containerd-{cid}.scope", current=i * GiB, anon=i * GiB)
    box = lay_out(manifests, tmp_path / "container", host=host, node=node)
    kubeconfig = token_kubeconfig(
        tmp_path / "kubeconfig",
        server=control_plane.server_url,
        ca=control_plane.ca_cert_path,
        token=daemonset_sa.token,
    )
    with running(box, extra=(f"--kubeconfig={kubeconfig}",)) as url:

        def named() -> str | None:
            """The metrics once both pods' containers are named in them."""
            metrics = http(f"{url}/metrics")[1]
            found = [
                v
                for name in ("trainer", "loader")
                for v in metric(
                    metrics,
                    "nodeguard_container_memory_working_set_bytes",
                    namespace=ns,
                    pod=name,
                    container="main",
                )
            ]
            return metrics if len(found) == 2 else None

        metrics = wait_until(
            "both pods named",
            named,
            timeout=60,
            step=0.5,
            detail=lambda: http(f"{url}/metrics")[1][-3000:],
        )
        assert metric(metrics, "nodeguard_node_memory_allocatable_bytes") == [128.0 * GiB]


# -- the install documentation matches the manifests -------------------------------------------
def _install_doc() -> str:
    """The "Install on a cluster" section: in README.md, else docs/install.md (where it was
    written before it moved into the README)."""
    for path in (REPO / "README.md", REPO / "docs" / "install.md"):
        text = path.read_text() if path.is_file() else ""
        m = re.search(r"^(#+) Install on a cluster\n(.*?)(?=^\1 |\Z)", text, re.M | re.S)
        if m:
            return m.group(2)
    raise AssertionError("no 'Install on a cluster' section in README.md or docs/install.md")


def test_the_install_doc_matches_the_manifests(manifests: list[Obj]) -> None:
    doc = _install_doc()
    assert "kubectl apply -k daemonset/" in doc and "kubectl delete -k daemonset/" in doc
    for kind in {o["kind"] for o in manifests}:
        assert kind in doc, f"{kind} is not in the install doc's list"
    for component in sorted(p.name for p in (DAEMONSET / "components").iterdir()):
        assert f"components/{component}" in doc, component
    res = container(manifests)["resources"]
    assert (
        f"requests {res['requests']['cpu']} CPU / {res['requests']['memory'].replace('Mi', ' MiB')}"
        in doc
    )
    assert f"limits {res['limits']['cpu']} / {res['limits']['memory'].replace('Mi', ' MiB')}" in doc
    images = yaml.safe_load((DAEMONSET / "kustomization.yaml").read_text())["images"]
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", doc, re.S)]
    assert {"images": images} in blocks, "the doc's images: block is not the kustomization's"
    svc = find(manifests, "Service")
    port = svc["spec"]["ports"][0]["port"]
    url = f"http://{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc:{port}/webhook"
    assert url in doc
    assert (REPO / "docs" / "alertmanager.yml").read_text().count(url) == 1
    # The one line that turns dry run off is the one daemonset/kustomization.yaml offers.
    assert "# - components/no-dry-run" in (DAEMONSET / "kustomization.yaml").read_text()
    assert "  - components/no-dry-run" in doc


def test_the_image_matches_the_daemonset(manifests: list[Obj]) -> None:
    """The Dockerfile as text; tests/image/test_image.py builds it and runs the image."""
    text = (REPO / "Dockerfile").read_text()
    stages = re.split(r"^FROM\s+", text, flags=re.M)[1:]
    assert len(stages) == 2, "a build stage and a final stage"
    final = stages[-1]
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.M)
    assert base and re.fullmatch(r"python:3\.1[1-9]-slim(-\w+)?", base.group(1)), base
    assert final.startswith("${PYTHON_IMAGE}\n")
    # No compiler: nothing installed from Debian, every Python package from a wheel.
    assert "apt-get" not in text and "apk " not in text
    assert "--only-binary=:all:" in stages[0]
    assert "RUN " not in final  # the final stage only copies the environment in
    user = re.search(r"^USER (\d+)", final, re.M)
    assert user and int(user.group(1)) != 0
    assert re.search(r'^ENTRYPOINT \["nodeguard"\]$', final, re.M)
    # The DaemonSet gives the subcommand as its first argument and no command of its own.
    c = container(manifests)
    assert "command" not in c and c["args"][0] == "run"
    assert c["securityContext"]["runAsUser"] == 0  # the manifest says why
    lines = (REPO / ".dockerignore").read_text().splitlines()
    kept = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert kept[:1] == ["*"] and {"!pyproject.toml", "!README.md", "!nodeguard/"} <= set(kept)


def test_the_alert_driven_component_needs_the_users_token(
    kustomize_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    objs = compose(tmp_path / "ad", components=["alert-driven"], binary=kustomize_bin)
    c = container(objs)
    assert "--webhook.token-file=/etc/nodeguard/webhook/token" in c["args"]
    volume = next(
        v
        for v in find(objs, "DaemonSet")["spec"]["template"]["spec"]["volumes"]
        if v["name"] == "webhook-token"
    )
    # Not optional: without the Secret the pod waits for it rather than acting without a token.
    assert volume["secret"] == {"secretName": "nodeguard-webhook-token", "defaultMode": 0o400}
    assert not [o for o in objs if o["kind"] == "Secret"]
    token = "f" * 64
    box = lay_out(
        objs,
        tmp_path / "container",
        host=HOSTS / "v2-systemd-containerd",
        node="gpu-1",
        secrets={"nodeguard-webhook-token": {"token": token + "\n"}},
    )
    for name, value in box.env.items():
        monkeypatch.setenv(name, value)
    with running(box) as url:
        empty = json.dumps({"version": "4", "alerts": []}).encode()
        assert http(f"{url}/webhook/alertmanager", data=empty)[0] == 401
        assert http(f"{url}/webhook/alertmanager", data=empty, token="wrong")[0] == 401
        assert http(f"{url}/webhook/alertmanager", data=empty, token=token)[0] == 200
    # The placeholder of old, or a short token, is refused at start with one line.
    for bad, why in (
        ("replace-me-with-the-output-of-openssl-rand-hex-32", "placeholder"),
        ("short", "at least 32 are needed"),
    ):
        write_projected(box.root / "etc/nodeguard/webhook", {"token": bad})
        done = subprocess.run(
            [sys.executable, "-m", "nodeguard", *box.args],
            env={**os.environ, **box.env},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 1 and why in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
