"""Helpers for the manifest tests: rendering, server-side apply (and its dry run), the RBAC
objects of the rendered manifests, ServiceAccount tokens, and the container of the DaemonSet
laid out on disk as the kubelet would."""

from __future__ import annotations

import copy
import datetime as dt
import functools
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from tests.support.agent import wait_until
from tests.support.deploy import kustomize
from tests.support.kube_helpers import given

REPO = Path(__file__).resolve().parents[3]
DAEMONSET = REPO / "daemonset"
CRDS = Path(__file__).resolve().parent / "crds"
FIELD_MANAGER = "nodeguard-tests"

Obj = dict[str, Any]
# (apiGroup, resource[/subresource], verb): one permission of a Role or ClusterRole.
Triple = tuple[str, str, str]
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


# -- rendering ---------------------------------------------------------------------------------
def render(directory: Path, *, binary: Path | None = None) -> list[Obj]:
    """``kustomize build`` of a directory."""
    return kustomize.build(directory, binary=binary)


def compose(
    tmp: Path,
    *,
    components: Iterable[str] = (),
    binary: Path | None = None,
    extra: Obj | None = None,
) -> list[Obj]:
    """The base with ``components`` (names under daemonset/components), as a user's own
    kustomization elsewhere would write it (relative paths: kustomize refuses absolute ones)."""
    tmp.mkdir(parents=True, exist_ok=True)
    rel = os.path.relpath(DAEMONSET, tmp)
    doc: Obj = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [f"{rel}/base"],
        "components": [f"{rel}/components/{c}" for c in components],
        **(extra or {}),
    }
    (tmp / "kustomization.yaml").write_text(yaml.safe_dump(doc))
    return render(tmp, binary=binary)


def variants(tmp: Path, *, binary: Path | None = None) -> dict[str, list[Obj]]:
    """The base alone, and with every component of daemonset/components at once."""
    every = sorted(p.name for p in (DAEMONSET / "components").iterdir())
    return {
        "base": render(DAEMONSET, binary=binary),
        "every component": compose(tmp, components=every, binary=binary),
    }


def find(objs: Iterable[Obj], kind: str, name: str | None = None) -> Obj:
    """The one object of ``kind`` (and ``name``)."""
    found = [
        o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]
    if len(found) != 1:
        raise LookupError(f"{len(found)} objects of kind {kind} named {name or '*'}")
    return found[0]


def container(objs: Iterable[Obj]) -> Obj:
    """The nodeguard container of the DaemonSet."""
    spec = find(objs, "DaemonSet")["spec"]["template"]["spec"]
    (c,) = [c for c in spec["containers"] if c["name"] == "nodeguard"]
    found: Obj = c
    return found


# -- applying ----------------------------------------------------------------------------------
class Applier:
    """Server-side apply (``kubectl apply --server-side``), optionally as a dry run
    (``--dry-run=server``), with ``fieldValidation=Strict``: an unknown or duplicate field is an
    error, not silently dropped."""

    def __init__(self, api: client.ApiClient, *, discovery_cache: Path) -> None:
        self.api = api
        # The discovery cache goes where the caller says (the client's default is a file in
        # /tmp per API server, left behind).
        # kubernetes.dynamic carries no annotations.
        self.dynamic = DynamicClient(  # type: ignore[no-untyped-call]
            api, cache_file=str(discovery_cache)
        )

    def path(self, obj: Obj) -> str:
        res = self.dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        ns = obj["metadata"].get("namespace") if res.namespaced else None
        return str(res.path(name=obj["metadata"]["name"], namespace=ns))

    def apply(self, obj: Obj, *, dry_run: bool) -> tuple[Obj, list[str]]:
        """The object as the API server stored (or would store) it, and its warnings."""
        query = [
            ("fieldManager", FIELD_MANAGER),
            ("fieldValidation", "Strict"),
            ("force", "true"),
        ]
        if dry_run:
            query.append(("dryRun", "All"))
        request = self.api.param_serialize(
            "PATCH",
            self.path(obj),
            query_params=query,
            header_params={
                "Content-Type": "application/apply-patch+yaml",
                "Accept": "application/json",
            },
            body=json.dumps(obj),  # JSON is YAML
            auth_settings=["BearerToken"],
        )
        resp = self.api.call_api(*request)
        data: bytes = resp.read()  # type: ignore[no-untyped-call]  # RESTResponse.read: unannotated
        if not 200 <= resp.status <= 299:
            exc = ApiException(status=resp.status, reason=resp.reason)
            exc.body = data.decode()
            raise exc
        warnings = list(resp.headers.getlist("Warning"))
        parsed: Obj = json.loads(data)
        return parsed, warnings


def install_crds(api: client.ApiClient) -> None:
    """The Prometheus Operator's ServiceMonitor and PrometheusRule CRDs (published schemas),
    served before this returns."""
    ext = client.ApiextensionsV1Api(api)
    names = []
    for path in sorted(CRDS.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc:
                continue
            names.append(doc["metadata"]["name"])
            try:
                ext.create_custom_resource_definition(doc)
            except ApiException as exc:
                if exc.status != 409:
                    raise

    def established(name: str) -> bool:
        crd = ext.read_custom_resource_definition(name)
        conditions = {c.type: c.status for c in given(crd.status).conditions or []}
        return conditions.get("Established") == "True"

    for name in names:
        wait_until(f"CRD {name} established", functools.partial(established, name), timeout=60)


# -- RBAC --------------------------------------------------------------------------------------
def triples(role: Obj) -> set[Triple]:
    """Every (group, resource, verb) a Role or ClusterRole grants."""
    return {
        (group, resource, verb)
        for rule in role.get("rules", [])
        for group in rule.get("apiGroups", [])
        for resource in rule.get("resources", [])
        for verb in rule.get("verbs", [])
    }


def without(role: Obj, drop: Triple) -> Obj:
    """A copy of ``role`` that no longer grants ``drop`` (and grants everything else)."""
    out = copy.deepcopy(role)
    rules = []
    for rule in out.get("rules", []):
        group, resource, verb = drop
        if group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"]:
            # Split the rule so that only this one verb of this one resource goes.
            others = [r for r in rule["resources"] if r != resource]
            if others:
                rules.append({**rule, "resources": others})
            verbs = [v for v in rule["verbs"] if v != verb]
            if verbs:
                rules.append({**rule, "resources": [resource], "verbs": verbs})
        else:
            rules.append(rule)
    out["rules"] = rules
    return out


def rbac_objects(
    objs: Iterable[Obj],
    *,
    namespace: str | None = None,
    suffix: str = "",
    drop: Triple | None = None,
) -> list[Obj]:
    """The ServiceAccount, roles and bindings of the rendered manifests; moved to ``namespace``
    with ``suffix`` on cluster-scoped names (a copy that cannot clash), without ``drop``."""
    out = []
    for original in objs:
        if original["kind"] not in RBAC_KINDS:
            continue
        o = copy.deepcopy(original)
        md = o["metadata"]
        if namespace and "namespace" in md:
            md["namespace"] = namespace
        if o["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            md["name"] += suffix
        if o["kind"] == "ClusterRoleBinding":
            o["roleRef"]["name"] += suffix
        for s in o.get("subjects", []):
            if namespace:
                s["namespace"] = namespace
        if drop is not None and o["kind"] in ("ClusterRole", "Role"):
            o = without(o, drop)
        out.append(o)
    return out


def service_account_token(api: client.ApiClient, *, name: str, namespace: str) -> str:
    """A TokenRequest token of the ServiceAccount (what the kubelet mounts into the pod)."""
    req = client.CoreV1Api(api).create_namespaced_service_account_token(
        name,
        namespace,
        client.AuthenticationV1TokenRequest.model_validate({"spec": {"expirationSeconds": 3600}}),
    )
    return str(given(req.status).token)


def token_kubeconfig(path: Path, *, server: str, ca: Path, token: str) -> Path:
    """A kubeconfig with the token: what the in-cluster config gives a pod."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "c", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "sa"}}],
        "current-context": "c",
    }
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    return path


def review(api: client.ApiClient, *, sa: str, namespace: str, triple: Triple, where: str) -> bool:
    """Whether the ServiceAccount may do ``triple`` (in namespace ``where``, "" for cluster
    scope), by a SubjectAccessReview (the same authorizer the requests go through)."""
    group, resource, verb = triple
    res, _, sub = resource.partition("/")
    attrs: Obj = {"group": group, "resource": res, "subresource": sub, "verb": verb}
    if where:
        attrs["namespace"] = where
    if (group, res) == ("coordination.k8s.io", "leases") and verb in ("get", "update"):
        attrs["name"] = "nodeguard-cordon-budget"  # one Lease of the namespace
    body = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": f"system:serviceaccount:{namespace}:{sa}",
            "groups": [
                "system:serviceaccounts",
                f"system:serviceaccounts:{namespace}",
                "system:authenticated",
            ],
            "resourceAttributes": attrs,
        },
    }
    out = client.AuthorizationV1Api(api).create_subject_access_review(
        client.V1SubjectAccessReview.model_validate(body)
    )
    return bool(given(out.status).allowed)


# -- the container on disk ---------------------------------------------------------------------
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """The kubelet's expansion of ``$(VAR)`` in command and args (``$$`` is a literal ``$``;
    an undefined variable is left as written)."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR.sub(sub, text)


def write_projected(directory: Path, data: dict[str, str]) -> None:
    """Files as the kubelet's atomic writer lays out a ConfigMap or Secret volume: a timestamped
    hidden directory, ``..data`` linking to it, and each key linking through ``..data``. Called
    again, it swaps the content in place (a new directory, then ``..data`` renamed over)."""
    directory.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("..%Y_%m_%d_%H_%M_%S.%f")
    payload = directory / stamp
    payload.mkdir()
    for key, value in data.items():
        (payload / key).write_text(value)
    old = os.readlink(directory / "..data") if (directory / "..data").is_symlink() else None
    tmp_link = directory / "..data_tmp"
    tmp_link.symlink_to(stamp)
    os.replace(tmp_link, directory / "..data")
    for key in data:
        link = directory / key
        if not link.is_symlink():
            link.symlink_to(f"..data/{key}")
    if old:
        for f in (directory / old).iterdir():
            f.unlink()
        (directory / old).rmdir()
