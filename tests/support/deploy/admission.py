"""The ValidatingAdmissionPolicies of ``daemonset/components/own-writes`` taken off the test
API server again: they are cluster-wide and restrict the DaemonSet's ServiceAccount, which the
other modules' agents and probes act as, so a module that applies them removes them and waits
until the API server no longer enforces them (its policy informer catches up asynchronously)."""

from __future__ import annotations

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.support.agent import wait_until
from tests.support.controlplane.cluster import TestCluster
from tests.support.deploy.manifests import Applier, Obj

__all__ = ["POLICY_KINDS", "api_as", "dry_patch", "remove_policies"]

POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
# A hang guard for the API server's policy informer, not a speed bound.
SETTLE = 30.0


def api_as(cp: TestCluster, token: str) -> client.ApiClient:
    """The client library's ApiClient authenticated by ``token``."""
    cfg = client.Configuration()
    cfg.host, cfg.ssl_ca_cert = cp.server_url, str(cp.ca_cert_path)
    cfg.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(cfg)


def dry_patch(cp: TestCluster, token: str, node: str) -> ApiException | None:
    """A server-side dry-run patch of ``node``'s annotations with ``token``: None when
    admitted, the refusal otherwise (admission runs on dry runs too)."""
    with api_as(cp, token) as api:
        try:
            client.CoreV1Api(api).patch_node(
                node, {"metadata": {"annotations": {"nodeguard.io/probe": "x"}}}, dry_run="All"
            )
        except ApiException as exc:
            return exc
    return None


def remove_policies(
    applier: Applier, objs: list[Obj], *, cp: TestCluster, token: str, node: str
) -> None:
    """Delete the bindings, then the policies among ``objs`` (those that were made), and wait
    until ``token`` (the DaemonSet's ServiceAccount) may patch ``node`` again."""
    adm = client.AdmissionregistrationV1Api(applier.api)
    for kind, delete in (
        ("ValidatingAdmissionPolicyBinding", adm.delete_validating_admission_policy_binding),
        ("ValidatingAdmissionPolicy", adm.delete_validating_admission_policy),
    ):
        for o in objs:
            if o["kind"] == kind:
                try:
                    delete(o["metadata"]["name"])
                except ApiException as exc:
                    if exc.status != 404:
                        raise
    wait_until(
        "the API server to stop enforcing the policies",
        lambda: dry_patch(cp, token, node) is None,
        timeout=SETTLE,
    )
