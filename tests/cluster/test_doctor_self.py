"""``nodeguard doctor``'s ``nodeguard-agents`` check against the test kube-apiserver: an agent
pod of a real DaemonSet object with the shipped arguments and rules volume, its rules
ConfigMap, a GPU node without an agent; the ConfigMap read only with the optional
``nodeguard-doctor-agent-rules`` bound in the agent's namespace (a RoleBinding), and without
it one note."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from tests.support.controlplane.cluster import TestCluster
from tests.support.doctor_cluster import REPO, doctor_account, doctor_node, run_doctor
from tests.support.kube_helpers import Cluster, given

RULES = """\
apiVersion: nodeguard.io/v1alpha1
kind: RuleSet
spec:
  rules:
    - name: much-available
      scope: node
      when: [{signal: node_memory_available_bytes, op: ">", value: 2Ti}]
      actions: [{action: record}]
"""


def _agent(cluster: Cluster, namespace: str, node: str) -> None:
    """The shipped DaemonSet (daemonset/base) as an object in ``namespace``, and one pod of it
    on ``node`` (no DaemonSet controller runs here: the pod is made as it would make it)."""
    shipped = yaml.safe_load((REPO / "daemonset/base/daemonset.yaml").read_text())
    shipped["metadata"]["namespace"] = namespace
    apps = client.AppsV1Api(cluster.api)
    ds = apps.create_namespaced_daemon_set(namespace, shipped)
    template: dict[str, Any] = shipped["spec"]["template"]
    spec = {**template["spec"], "nodeName": node}
    pod = {
        "metadata": {
            "name": f"nodeguard-{node}",
            "labels": template["metadata"]["labels"],
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "DaemonSet",
                    "name": given(ds.metadata).name,
                    "uid": given(ds.metadata).uid,
                    "controller": True,
                }
            ],
        },
        "spec": spec,
    }
    cluster.core.create_namespaced_pod(namespace, client.V1Pod.model_validate(pod))
    cluster.core.patch_namespaced_pod_status(
        pod["metadata"]["name"], namespace, {"status": {"phase": "Running"}}
    )


def _found(out: str) -> set[tuple[str, str, str]]:
    return {
        (f["check"], f["severity"], f["title"])
        for f in json.loads(out)["findings"]
        if f["check"] == "nodeguard-agents"
    }


def test_agents_missing_in_dry_run_and_rules_out_of_reach(
    cluster: Cluster, control_plane: TestCluster, tmp_path: Path
) -> None:
    ns = cluster.namespace("nodeguard")
    guarded = doctor_node(cluster, memory="64Gi", allocatable="60Gi", gpus=8)
    bare = doctor_node(cluster, memory="64Gi", allocatable="60Gi", gpus=8)
    cluster.core.create_namespaced_config_map(
        ns,
        client.V1ConfigMap.model_validate(
            {"metadata": {"name": "nodeguard-rules"}, "data": {"default.yaml": RULES}}
        ),
    )
    _agent(cluster, ns, guarded)
    scope = [f"--node={guarded}", f"--node={bare}", "--json"]
    cm = f"ConfigMap {ns}/nodeguard-rules"
    missing = (
        "nodeguard-agents",
        "error",
        "1 GPU/training node(s) without a running nodeguard agent",
    )
    dry = (
        "nodeguard-agents",
        "info",
        f"nodeguard agents of DaemonSet {ns}/nodeguard in dry run: they record, never act",
    )
    out_of_reach = (
        "nodeguard-agents",
        "warning",
        f"rule much-available of {cm} can never trip on 1 node(s)",
    )
    rc, out, err = run_doctor(control_plane.kubeconfig_path, *scope)
    assert (rc, _found(out)) == (1, {missing, dry, out_of_reach}), err
    report = json.loads(out)
    (m,) = [f for f in report["findings"] if f["title"] == missing[2]]
    assert [o["name"] for o in m["objects"]] == [bare]

    # The read-only role alone: the ConfigMap is refused, one note, the rest the same.
    kubeconfig = doctor_account(
        cluster, control_plane, tmp_path / "plain", cluster_roles=["nodeguard-doctor"]
    )
    rc, out, err = run_doctor(kubeconfig, *scope)
    assert (rc, _found(out)) == (1, {missing, dry}), err
    notes = [line for line in err.splitlines() if "rules ConfigMaps were not read" in line]
    assert notes == [
        f"nodeguard doctor: note: the agents' rules ConfigMaps were not read (get configmaps "
        f"forbidden: {ns}/nodeguard-rules): rules that can never trip are not checked; bind "
        "nodeguard-doctor-agent-rules (docs/doctor-rbac.yaml) in their namespace"
    ]
    # With the optional role bound in the agent's namespace only: as the admin sees it.
    kubeconfig = doctor_account(
        cluster,
        control_plane,
        tmp_path / "rules",
        cluster_roles=["nodeguard-doctor"],
        namespace_roles=[(ns, "nodeguard-doctor-agent-rules")],
    )
    rc, out, err = run_doctor(kubeconfig, *scope)
    assert (rc, _found(out)) == (1, {missing, dry, out_of_reach}), err
