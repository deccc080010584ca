"""``daemonset/components/own-writes``, enforced by the real API server.

The component's ValidatingAdmissionPolicies are applied as ``kubectl apply -k`` would apply
them; then, as the DaemonSet's ServiceAccount with a token bound to a Pod on node A (the token
the kubelet mounts into the agent's pod; no kubelet here, the Pod only exists), the actions
write node A and nodeguard's own pause quota, and are refused node B and a user's quota, with
the policies' messages. A token bound to no pod writes no Node. Users other than the
ServiceAccount named nodeguard are not affected. The policies are cluster-wide, so they are
removed at the end of the module, once the API server no longer enforces them (the other
modules' agents and probes write Nodes as the same ServiceAccount).
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from nodeguard.actions.audit import Auditor
from nodeguard.actions.context import Env
from nodeguard.actions.cordon import CordonConfig, cordon
from nodeguard.actions.katib import quota_name
from nodeguard.alerts.claims import AlertClaims
from nodeguard.kube.calls import MERGE_PATCH
from nodeguard.kube.client import KubeClient
from nodeguard.kube.errors import Forbidden
from nodeguard.kube.trial_records import TrialRecords, record_name
from tests.support.acting import run_action
from tests.support.agent import wait_until
from tests.support.controlplane.cluster import TestCluster
from tests.support.deploy.admission import POLICY_KINDS, api_as, dry_patch, remove_policies
from tests.support.deploy.manifests import (
    Applier,
    Obj,
    compose,
    find,
    rbac_objects,
    review,
    service_account_token,
)
from tests.support.kube_helpers import Cluster, cordoned, given, katib_trial

COMPONENT = "own-writes"
NODE_CLAIM = "authentication.kubernetes.io/node-name"
# A hang guard for the API server's policy and RBAC informers, not a speed bound.
SETTLE = 30.0


@dataclass(frozen=True)
class Tokens:
    namespace: str
    node_a: str
    node_b: str
    pod: str
    bound: str  # bound to a Pod on node_a: what the agent's pod mounts
    unbound: str  # a TokenRequest without a bound object


def _policies(kustomize_bin: Path, tmp: Path) -> list[Obj]:
    objs = compose(tmp, components=[COMPONENT], binary=kustomize_bin)
    return [o for o in objs if o["kind"] in POLICY_KINDS]


def _payload(token: str) -> dict[str, Any]:
    """The claims of a JWT (its middle part), unverified: the API server verified it."""
    part = token.split(".")[1]
    claims: dict[str, Any] = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    return claims


def _bound_token(core: client.CoreV1Api, *, namespace: str, sa: str, pod: Obj) -> str:
    body = {
        "spec": {
            "expirationSeconds": 3600,
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod["metadata"]["name"],
                "uid": pod["metadata"]["uid"],
            },
        }
    }
    req = core.create_namespaced_service_account_token(
        sa, namespace, client.AuthenticationV1TokenRequest.model_validate(body)
    )
    return str(given(req.status).token)


def _service_account(applier: Applier, *, namespace: str, name: str) -> str:
    """A ServiceAccount ``namespace/name`` bound to nodeguard's ClusterRole (as the DaemonSet's
    is), once RBAC grants it Node patches; its unbound token."""
    with_ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    applier.apply(with_ns, dry_run=False)
    sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}
    applier.apply({**sa, "metadata": {"name": name, "namespace": namespace}}, dry_run=False)
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": f"test-{namespace}-{name}"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "nodeguard",
        },
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
    }
    applier.apply(binding, dry_run=False)
    wait_until(
        f"RBAC to grant {namespace}/{name} its roles",
        lambda: all(
            review(applier.api, sa=name, namespace=namespace, triple=t, where=w)
            for t, w in (
                (("", "nodes", "patch"), ""),
                (("", "resourcequotas", "delete"), namespace),
            )
        ),
        timeout=SETTLE,
    )
    return service_account_token(applier.api, name=name, namespace=namespace)


def _client(cp: TestCluster, token: str) -> KubeClient:
    return KubeClient.with_token(server=cp.server_url, token=token, ca_file=cp.ca_cert_path)


@pytest.fixture(scope="module")
def tokens(
    *,
    applier: Applier,
    cluster: Cluster,
    control_plane: TestCluster,
    manifests: list[Obj],
    kustomize_bin: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Tokens]:
    """The DaemonSet's RBAC, the component's policies (enforced), two Nodes, a Pod of the
    ServiceAccount on node A and its tokens; the policies removed afterwards."""
    applier.apply(find(manifests, "Namespace"), dry_run=False)
    for o in rbac_objects(manifests):
        applier.apply(o, dry_run=False)
    sa = find(manifests, "ServiceAccount")["metadata"]
    namespace, name = sa["namespace"], sa["name"]
    core = client.CoreV1Api(applier.api)
    node_a, node_b = cluster.node(), cluster.node()
    pod = core.create_namespaced_pod(
        namespace,
        client.V1Pod.model_validate(
            {
                "metadata": {"name": f"nodeguard-{uuid.uuid4().hex[:6]}"},
                "spec": {
                    "nodeName": node_a,
                    "serviceAccountName": name,
                    "containers": [{"name": "nodeguard", "image": "registry.k8s.io/pause:3.10"}],
                },
            }
        ),
    )
    pod_json = cluster.as_json(pod)
    bound = _bound_token(core, namespace=namespace, sa=name, pod=pod_json)
    unbound = service_account_token(applier.api, name=name, namespace=namespace)
    wait_until(
        "RBAC to grant nodeguard Node patches",
        lambda: dry_patch(control_plane, unbound, node_b) is None,
        timeout=SETTLE,
    )
    policies = _policies(kustomize_bin, tmp_path_factory.mktemp(COMPONENT))
    try:
        for o in policies:
            applier.apply(o, dry_run=False)
        wait_until(
            "the API server to enforce the policies",
            lambda: dry_patch(control_plane, unbound, node_b) is not None,
            timeout=SETTLE,
        )
        yield Tokens(
            namespace=namespace,
            node_a=node_a,
            node_b=node_b,
            pod=pod_json["metadata"]["name"],
            bound=bound,
            unbound=unbound,
        )
    finally:
        core.delete_namespaced_pod(pod_json["metadata"]["name"], namespace, grace_period_seconds=0)
        remove_policies(applier, policies, cp=control_plane, token=unbound, node=node_b)


def test_the_component_is_three_policies_for_the_daemonsets_service_account(
    kustomize_bin: Path, tmp_path: Path, manifests: list[Obj]
) -> None:
    policies = _policies(kustomize_bin, tmp_path)
    assert sorted((o["kind"], o["metadata"]["name"]) for o in policies) == [
        ("ValidatingAdmissionPolicy", "nodeguard-own-configmaps"),
        ("ValidatingAdmissionPolicy", "nodeguard-own-node"),
        ("ValidatingAdmissionPolicy", "nodeguard-own-quotas"),
        ("ValidatingAdmissionPolicyBinding", "nodeguard-own-configmaps"),
        ("ValidatingAdmissionPolicyBinding", "nodeguard-own-node"),
        ("ValidatingAdmissionPolicyBinding", "nodeguard-own-quotas"),
    ]
    sa = find(manifests, "ServiceAccount")["metadata"]["name"]
    for o in policies:
        if o["kind"] == "ValidatingAdmissionPolicy":
            assert o["spec"]["failurePolicy"] == "Fail"
            (cond,) = o["spec"]["matchConditions"]
            assert f":{sa}$" in cond["expression"]  # the ServiceAccount the DaemonSet runs as
        else:
            assert o["spec"]["validationActions"] == ["Deny"]
            assert o["spec"]["policyName"] == o["metadata"]["name"]


def test_the_bound_token_names_the_pods_node(tokens: Tokens) -> None:
    claims = _payload(tokens.bound)["kubernetes.io"]
    assert claims["pod"]["name"] == tokens.pod
    assert claims["node"]["name"] == tokens.node_a
    assert "node" not in _payload(tokens.unbound)["kubernetes.io"]


async def test_the_agent_writes_its_own_node_only(
    tokens: Tokens, cluster: Cluster, control_plane: TestCluster
) -> None:
    cfg = CordonConfig(lease_namespace=tokens.namespace)
    kube = _client(control_plane, tokens.bound)
    try:
        mine = await cordon(
            kube=kube,
            node=tokens.node_a,
            rule="r",
            reason="x",
            identity="a",
            dry_run=False,
            config=cfg,
        )
        assert mine.outcome == "done", mine.message
        assert cordoned(cluster.core.read_node(tokens.node_a))
        (undone,) = await run_action(
            env=Env(
                kube=kube,
                auditor=Auditor(kube=kube, node_name=tokens.node_a, metrics=None),
                node=tokens.node_a,
                cordon=cfg,
            ),
            node=tokens.node_a,
            action="uncordon",
        )
        assert undone.outcome == "done", undone.message
        assert not cordoned(cluster.core.read_node(tokens.node_a))

        other = await cordon(
            kube=kube,
            node=tokens.node_b,
            rule="r",
            reason="x",
            identity="a",
            dry_run=False,
            config=cfg,
        )
        assert other.outcome == "failed", other.message
        assert (
            f"nodeguard on node {tokens.node_a} writes only that Node, not {tokens.node_b}"
            in other.message
        ), other.message
        assert not cordoned(cluster.core.read_node(tokens.node_b))
    finally:
        kube.close()


async def test_a_token_bound_to_no_pod_writes_no_node(
    tokens: Tokens, cluster: Cluster, control_plane: TestCluster
) -> None:
    kube = _client(control_plane, tokens.unbound)
    try:
        for node in (tokens.node_a, tokens.node_b):
            res = await cordon(
                kube=kube,
                node=node,
                rule="r",
                reason="x",
                identity="u",
                dry_run=False,
                config=CordonConfig(lease_namespace=tokens.namespace),
            )
            assert res.outcome == "failed", res.message
            assert "this token names no node" in res.message, res.message
            assert NODE_CLAIM in res.message
            assert not cordoned(cluster.core.read_node(node))
    finally:
        kube.close()


def _user_quota(cluster: Cluster, namespace: str, name: str, *, labels: dict[str, str]) -> Any:
    return cluster.core.create_namespaced_resource_quota(
        namespace,
        client.V1ResourceQuota.model_validate(
            {"metadata": {"name": name, "labels": labels}, "spec": {"hard": {"pods": "10"}}}
        ),
    )


async def test_the_agent_deletes_its_own_quotas_only(
    tokens: Tokens, cluster: Cluster, control_plane: TestCluster
) -> None:
    ns = cluster.namespace("own-quotas")
    kube = _client(control_plane, tokens.bound)
    try:
        # The pause and the resume: nodeguard's own quota, made and deleted.
        cluster.katib_experiment(ns)
        env = Env(
            kube=kube,
            auditor=Auditor(kube=kube, node_name=tokens.node_a, metrics=None),
            node=tokens.node_a,
            cordon=CordonConfig(lease_namespace=tokens.namespace),
        )
        args = {"experiments": [f"{ns}/random"]}
        (paused,) = await run_action(env=env, node=tokens.node_a, action="pause_katib", args=args)
        assert paused.outcome == "done", paused.message
        assert cluster.core.read_namespaced_resource_quota(quota_name("random"), ns)
        (resumed,) = await run_action(env=env, node=tokens.node_a, action="resume_katib", args=args)
        assert resumed.outcome == "done", resumed.message
        assert cluster.core.list_namespaced_resource_quota(ns).items == []

        # A user's quota, and one that bears the pause's name and label but not its spec.
        lookalike = {"nodeguard.io/katib-pause": "true", "katib.kubeflow.org/experiment": "x"}
        for name, labels in (("users", {}), (quota_name("x"), lookalike)):
            q = _user_quota(cluster, ns, name, labels=labels)
            with pytest.raises(Forbidden) as refused:
                await kube.delete_resource_quota(
                    name=name, namespace=ns, uid=given(q.metadata).uid or "", dry_run=False
                )
            assert (
                "nodeguard deletes only its own Katib pause quotas (nodeguard-katib-pause-"
                in str(refused.value)
            ), refused.value
            assert f"not {ns}/{name}" in str(refused.value)
            assert cluster.core.read_namespaced_resource_quota(name, ns)
        # Nor does it make any other quota.
        with pytest.raises(Forbidden) as made:
            await kube.create_resource_quota(
                namespace=ns,
                body={"metadata": {"name": "zero-pods"}, "spec": {"hard": {"pods": "0"}}},
                dry_run=False,
            )
        assert "nodeguard creates only its own Katib pause quotas" in str(made.value)
    finally:
        kube.close()


async def test_the_agent_writes_its_own_trial_records_only(
    tokens: Tokens, cluster: Cluster, control_plane: TestCluster
) -> None:
    ns = cluster.namespace("own-configmaps")
    exp = cluster.katib_experiment(ns)
    katib_trial(cluster, namespace=ns, experiment=exp, name="random-t1", parameters={})
    cluster.core.create_namespaced_config_map(
        ns, client.V1ConfigMap.model_validate({"metadata": {"name": "users"}, "data": {"a": "1"}})
    )
    kube = _client(control_plane, tokens.bound)
    try:
        # A trial pod's record, twice (made, then patched): nodeguard's own ConfigMap.
        records = TrialRecords(kube=kube)
        for pod in ("random-t1-a", "random-t1-b"):
            await records.put(
                namespace=ns, trial="random-t1", experiment="random", pod=pod, record={"x": 1}
            )
        made = cluster.core.read_namespaced_config_map(record_name("random-t1"), ns)
        assert sorted(made.data or {}) == ["random-t1-a", "random-t1-b"]
        # A user's ConfigMap, even patched to look like a record; and any other ConfigMap.
        for name, body in (
            ("users", {"data": {"a": "2"}}),
            ("users", {"metadata": {"labels": {"app.kubernetes.io/managed-by": "nodeguard"}}}),
        ):
            with pytest.raises(Forbidden) as refused:
                await kube.write(
                    kube.core.patch_namespaced_config_map,
                    name,
                    ns,
                    body,
                    _content_type=MERGE_PATCH,
                )
            assert "nodeguard writes only its own Katib trial memory ConfigMaps" in str(
                refused.value
            ), refused.value
        with pytest.raises(Forbidden):
            await kube.write(
                kube.core.create_namespaced_config_map, ns, {"metadata": {"name": "other"}}
            )
        assert (cluster.core.read_namespaced_config_map("users", ns).data or {}) == {"a": "1"}
    finally:
        kube.close()


def test_other_users_are_not_affected(
    tokens: Tokens, applier: Applier, cluster: Cluster, control_plane: TestCluster
) -> None:
    # A ServiceAccount whose name starts like nodeguard's, with the same roles: not limited.
    helper = _service_account(applier, namespace=tokens.namespace, name="nodeguard-helper")
    assert dry_patch(control_plane, helper, tokens.node_b) is None
    ns = cluster.namespace("lookalike")
    q = _user_quota(cluster, ns, "users", labels={})
    with api_as(control_plane, helper) as api:
        client.CoreV1Api(api).delete_namespaced_resource_quota(
            "users",
            ns,
            body=client.V1DeleteOptions(
                preconditions=client.V1Preconditions(uid=given(q.metadata).uid)
            ),
        )
    # The cluster's admin (and so kubelets and controllers) writes any Node as before.
    cluster.core.patch_node(tokens.node_b, {"metadata": {"annotations": {"test": "admin"}}})
    # The ServiceAccount named nodeguard in another namespace (an overlay's namespace:, a Helm
    # release elsewhere) is limited as the DaemonSet's is.
    elsewhere = _service_account(applier, namespace=cluster.namespace("ng"), name="nodeguard")
    refused = dry_patch(control_plane, elsewhere, tokens.node_b)
    assert refused is not None and refused.status == 403
    assert "this token names no node" in str(refused.body)


async def test_alert_driven_claims_on_other_nodes_are_refused(
    tokens: Tokens, control_plane: TestCluster, caplog: pytest.LogCaptureFixture
) -> None:
    # Why the component says "not with components/alert-driven": a delivery for another node,
    # received by this agent, cannot be claimed (nor acted on) there.
    kube = _client(control_plane, tokens.bound)
    try:
        claims = AlertClaims(kube=kube, claimant=f"{tokens.node_a}/a")
        assert await claims.claim(node=tokens.node_a, key="f00d:1000:firing") == "claimed"
        assert await claims.claim(node=tokens.node_b, key="f00d:1000:firing") == "unavailable"
        assert f"writes only that Node, not {tokens.node_b}" in caplog.text
    finally:
        kube.close()
