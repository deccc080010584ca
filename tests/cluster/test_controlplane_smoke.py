"""Smoke test of the real Kubernetes test control plane (tests/support/controlplane)."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator

import pytest

from tests.support.controlplane.cluster import TestCluster

kubernetes = pytest.importorskip("kubernetes")
from kubernetes import client, config  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402

from tests.support.kube_helpers import given, name_of  # noqa: E402


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def core(control_plane: TestCluster) -> Iterator[client.CoreV1Api]:
    # kubernetes.config carries no annotations (the generated client does).
    api_client: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(control_plane.kubeconfig_path)
    )
    with api_client:
        yield client.CoreV1Api(api_client)


def test_default_namespace_and_version(control_plane: TestCluster, core: client.CoreV1Api) -> None:
    assert given(core.read_namespace("default").status).phase == "Active"
    version = client.VersionApi(core.api_client).get_code()
    assert version.git_version.startswith("v1.")
    assert control_plane.server_url.startswith("https://127.0.0.1:")


def test_node_pod_and_status_subresource(core: client.CoreV1Api) -> None:
    node_name = _name("node")
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=node_name)))
    core.patch_node_status(
        node_name,
        {
            "status": {
                "conditions": [
                    {
                        "type": "MemoryPressure",
                        "status": "True",
                        "reason": "Test",
                        "message": "set by the smoke test",
                    }
                ]
            }
        },
    )
    conditions = given(given(core.read_node_status(node_name).status).conditions)
    assert [(c.type, c.status) for c in conditions] == [("MemoryPressure", "True")]

    pod_name = _name("pod")
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name=pod_name),
        spec=client.V1PodSpec(
            node_name=node_name,
            containers=[client.V1Container(name="main", image="registry.k8s.io/pause:3.10")],
        ),
    )
    created = core.create_namespaced_pod("default", pod)
    assert given(created.spec).node_name == node_name
    assert given(created.status).phase == "Pending"

    core.patch_namespaced_pod_status(
        pod_name,
        "default",
        {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
    )
    status = given(core.read_namespaced_pod_status(pod_name, "default").status)
    assert status.phase == "Running"
    assert [(c.type, c.status) for c in status.conditions or []] == [("Ready", "True")]
    assert [
        name_of(p)
        for p in core.list_namespaced_pod(
            "default", field_selector=f"spec.nodeName={node_name}"
        ).items
    ] == [pod_name]


def test_service_account_token_is_authenticated_but_forbidden(
    control_plane: TestCluster,
    core: client.CoreV1Api,
) -> None:
    sa_name = _name("sa")
    core.create_namespaced_service_account(
        "default", client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=sa_name))
    )
    token_request = core.create_namespaced_service_account_token(
        sa_name,
        "default",
        client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600)
        ),
    )
    token = given(token_request.status).token
    assert token

    configuration = client.Configuration()
    configuration.host = control_plane.server_url
    configuration.ssl_ca_cert = str(control_plane.ca_cert_path)
    configuration.api_key = {"authorization": token}
    configuration.api_key_prefix = {"authorization": "Bearer"}
    with client.ApiClient(configuration) as sa_client, pytest.raises(ApiException) as raised:
        client.CoreV1Api(sa_client).list_node()
    assert raised.value.status == 403  # authenticated (not 401), then denied by RBAC
    assert f"system:serviceaccount:default:{sa_name}" in str(raised.value.body)


def test_apiserver_restart_keeps_data_and_port(
    control_plane: TestCluster,
    core: client.CoreV1Api,
) -> None:
    name = _name("cm")
    core.create_namespaced_config_map(
        "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name), data={"k": "v"})
    )
    url = control_plane.server_url
    port = int(url.rsplit(":", 1)[1])

    control_plane.stop_apiserver()
    assert not control_plane.apiserver_running
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), 2):
        pass

    control_plane.start_apiserver()
    assert control_plane.server_url == url
    assert core.read_namespaced_config_map(name, "default").data == {"k": "v"}
