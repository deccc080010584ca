"""``nodeguard doctor`` against the test kube-apiserver: running it, a ServiceAccount bound to
the shipped roles (docs/doctor-rbac.yaml), and a stand-in kubelet that serves ``/configz`` over
HTTPS for the API server's node proxy to reach."""

from __future__ import annotations

import datetime
import functools
import ipaddress
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.support.agent import wait_until
from tests.support.controlplane.cluster import TestCluster
from tests.support.deploy.manifests import service_account_token, token_kubeconfig
from tests.support.kube_helpers import Cluster, unique

REPO = Path(__file__).resolve().parents[2]


def run_doctor(kubeconfig: Path, *args: str) -> tuple[int, str, str]:
    """``nodeguard doctor --kubeconfig=... ARGS``: exit status, stdout, stderr."""
    done = subprocess.run(
        [sys.executable, "-m", "nodeguard", "doctor", f"--kubeconfig={kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
    return done.returncode, done.stdout, done.stderr


def shipped_roles() -> dict[str, dict[str, Any]]:
    """docs/doctor-rbac.yaml's ClusterRoles by name."""
    docs = yaml.safe_load_all((REPO / "docs/doctor-rbac.yaml").read_text())
    return {d["metadata"]["name"]: d for d in docs}


def _binding(role: str, subject: list[dict[str, str]]) -> dict[str, Any]:
    """A (Cluster)RoleBinding of ClusterRole ``role`` to ``subject``, under a fresh name."""
    return {
        "metadata": {"name": unique(role)},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": subject,
    }


def _allowed(cluster: Cluster, *, user: str, rule: dict[str, Any], ns: str) -> bool:
    """Whether the API server's authorizer allows ``user`` the first verb of ``rule`` (a
    ClusterRole rule) on its first resource (a SubjectAccessReview, as the admin)."""
    attributes = {
        "verb": rule["verbs"][0],
        "group": rule.get("apiGroups", [""])[0],
        "resource": rule["resources"][0],
        **({"name": rule["resourceNames"][0]} if rule.get("resourceNames") else {}),
        **({"namespace": ns} if ns else {}),
    }
    review = client.AuthorizationV1Api(cluster.api).create_subject_access_review(
        client.V1SubjectAccessReview.model_validate(
            {"spec": {"user": user, "resourceAttributes": attributes}}
        )
    )
    return bool(review.status and review.status.allowed)


def doctor_account(
    cluster: Cluster,
    control_plane: TestCluster,
    path: Path,
    *,
    cluster_roles: Sequence[str] = (),
    namespace_roles: Sequence[tuple[str, str]] = (),
    other_roles: Sequence[dict[str, Any]] = (),
) -> Path:
    """A kubeconfig of a new ServiceAccount bound to the shipped ``cluster_roles`` (a
    ClusterRoleBinding each) and to ``(namespace, role)`` pairs (a RoleBinding each); a role
    of ``other_roles`` (ClusterRole documents) may be named too."""
    ns = cluster.namespace("doctor-sa")
    sa = "nodeguard-doctor"
    cluster.core.create_namespaced_service_account(
        ns, client.V1ServiceAccount.model_validate({"metadata": {"name": sa}})
    )
    rbac = client.RbacAuthorizationV1Api(cluster.api)
    roles = {**shipped_roles(), **{r["metadata"]["name"]: r for r in other_roles}}
    subject = [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]
    for name in {*cluster_roles, *(r for _, r in namespace_roles)}:
        try:
            rbac.create_cluster_role(client.V1ClusterRole.model_validate(roles[name]))
        except ApiException as exc:
            if exc.status != 409:
                raise
    for name in cluster_roles:
        rbac.create_cluster_role_binding(
            client.V1ClusterRoleBinding.model_validate(_binding(name, subject))
        )
    for where, name in namespace_roles:
        rbac.create_namespaced_role_binding(
            where,
            client.V1RoleBinding.model_validate(_binding(name, subject)),
        )
    user = f"system:serviceaccount:{ns}:{sa}"
    for where, name in [*(("", r) for r in cluster_roles), *namespace_roles]:
        # The authorizer sees a new binding through its informer, a moment later: the account
        # is handed out once the API server allows the first rule of each role it was bound.
        wait_until(
            f"{name} in force for {user}",
            functools.partial(_allowed, cluster, user=user, rule=roles[name]["rules"][0], ns=where),
            timeout=30,
        )
    return token_kubeconfig(
        path,
        server=control_plane.server_url,
        ca=control_plane.ca_cert_path,
        token=service_account_token(cluster.api, name=sa, namespace=ns),
    )


def proxyable_address() -> str | None:
    """An IPv4 address of this machine that is neither loopback nor link-local: the API server
    refuses to proxy to those (pkg/registry/core/node/strategy.go ``ResourceLocation`` through
    ``proxyutil.IsProxyableIP``). ``None`` when the machine has none."""
    candidates: list[str] = []
    with suppress(OSError):
        candidates += [
            str(i[4][0]) for i in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
        ]
    try:
        out = subprocess.run(
            ["hostname", "-I"], capture_output=True, text=True, check=False, timeout=5
        )
        candidates += out.stdout.split()
    except OSError:
        pass
    for text in candidates:
        try:
            ip = ipaddress.ip_address(text)
        except ValueError:
            continue
        if ip.version == 4 and not (ip.is_loopback or ip.is_link_local or ip.is_unspecified):
            return str(ip)
    return None


#: A documentation address (RFC 5737 TEST-NET-3) put on the loopback device when the machine
#: has no other: not in 127/8, so the API server proxies to it, and reachable only from here.
SPARE_ADDRESS = "203.0.113.77"


@contextmanager
def proxy_address() -> Iterator[str]:
    """:func:`proxyable_address`, or where there is none (a CI machine with loopback only)
    :data:`SPARE_ADDRESS` added to ``lo`` for the test (``ip addr``, as root) and removed
    after it."""
    ip = proxyable_address()
    if ip is not None:
        yield ip
        return
    device = ["ip", "addr", "{}", f"{SPARE_ADDRESS}/32", "dev", "lo"]
    subprocess.run([a.format("add") for a in device], check=True, timeout=10)
    try:
        yield SPARE_ADDRESS
    finally:
        subprocess.run([a.format("del") for a in device], check=False, timeout=10)


def _self_signed(directory: Path, ip: str) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "stand-in-kubelet")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=2))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "kubelet.crt", directory / "kubelet.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@contextmanager
def stand_in_kubelet(
    directory: Path, *, ip: str, configz: dict[str, Any]
) -> Iterator[tuple[int, list[str]]]:
    """An HTTPS server on ``ip`` answering ``GET /configz`` with ``configz`` (404 elsewhere),
    with a self-signed certificate: the kube-apiserver verifies a kubelet's certificate only
    with ``--kubelet-certificate-authority`` (pkg/kubelet/client/kubelet_client.go: no CA, then
    ``Insecure``), which the test control plane does not set. Yields its port and the paths
    it was asked for."""
    cert, key = _self_signed(directory, ip)
    asked: list[str] = []
    body = json.dumps(configz).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            found = self.path.split("?")[0] == "/configz"
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body if found else b"{}")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((ip, 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], asked
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def doctor_node(
    cluster: Cluster,
    *,
    memory: str,
    allocatable: str,
    gpus: int = 0,
    kubelet: tuple[str, int] | None = None,
) -> str:
    """A Node with that capacity and allocatable memory (and ``nvidia.com/gpu``), whose
    kubelet, when given, is at ``(address, port)`` (``status.addresses`` InternalIP and
    ``daemonEndpoints.kubeletEndpoint.Port``, what the API server's node proxy dials)."""
    name = unique("doctor")
    cluster.core.create_node(client.V1Node.model_validate({"metadata": {"name": name}}))
    capacity = {"memory": memory, "cpu": "16", "pods": "110"}
    if gpus:
        capacity["nvidia.com/gpu"] = str(gpus)
    status: dict[str, Any] = {
        "capacity": capacity,
        "allocatable": {**capacity, "memory": allocatable},
    }
    if kubelet:
        status["addresses"] = [{"type": "InternalIP", "address": kubelet[0]}]
        status["daemonEndpoints"] = {"kubeletEndpoint": {"Port": kubelet[1]}}
    cluster.core.patch_node_status(name, {"status": status})
    return name
