"""The Helm chart (``charts/nodeguard/``), proven against kustomize's ``daemonset/`` and the
test API server.

- helm itself is the real one, built from Go modules (``tests/support/deploy/helm.py``).
- ``helm lint --strict`` passes; ``helm template`` renders with the defaults and with every
  value set.
- The chart renders daemonset/'s objects: the base against the chart's defaults, and the base
  with each component against the chart with that component's value on, object by object and
  field by field (kinds, names, RBAC rules, the DaemonSet's args, volumes and securityContext,
  everything), apart from the differences named in ``ALLOWED``. A planted difference (a verb
  taken from the ClusterRole, an argument, a volume) is found.
- ``helm install``, ``helm upgrade`` (dryRun false) and ``helm uninstall`` on the test
  kube-apiserver: the objects are there, changed, and gone. No kubelet runs there, so the
  DaemonSet's pods are not started: the objects are what is checked.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from nodeguard.cli import build_parser
from tests.support.controlplane.cluster import TestCluster
from tests.support.deploy import generate, helm
from tests.support.deploy.manifests import DAEMONSET, REPO, Applier, Obj, compose, container, find

CHART = REPO / "charts" / "nodeguard"
# The image daemonset/kustomization.yaml sets, given to both renderings.
IMAGE, TAG = "registry.example.com/nodeguard", "0.1.0"
IMAGES = {"images": [{"name": "nodeguard", "newName": IMAGE, "newTag": TAG}]}
# The chart's defaults, with the one required value, and the Namespace rendered (the base has
# it; with `helm install --create-namespace` Helm makes it and the chart leaves it out).
DEFAULTS = (f"image.repository={IMAGE}", "namespace.create=true")

# Each component of daemonset/components and the chart value that turns it on.
COMPONENT_VALUES: dict[str, tuple[str, ...]] = {
    "alert-driven": ("alertDriven.enabled=true",),
    "cgroup-v1-thresholds": ("cgroupV1Thresholds.enabled=true",),
    "gpu-nodes": ("gpuNodes.enabled=true",),
    "kernel-log": ("kernelLog.enabled=true",),
    "no-dry-run": ("dryRun=false",),
    "no-prometheus-operator": ("prometheusOperator.enabled=false",),
    "own-writes": ("ownWrites.enabled=true",),
    "psi-triggers": ("psiTriggers.enabled=true",),
}
# The components that do not go together in the chart (it refuses them: own-writes' policy
# would refuse the alert-driven agent's writes to the alert's node).
EXCLUSIVE = ("alert-driven", "own-writes")

# The differences the chart is allowed, each with why. Nothing else may differ.
ALLOWED = {
    # Helm's standard labels, on every object's metadata (the selectors and the pod template's
    # labels are the base's, unchanged: the DaemonSet's selector is immutable).
    "helm labels": (
        "app.kubernetes.io/instance",
        "app.kubernetes.io/managed-by",
        "app.kubernetes.io/version",
        "helm.sh/chart",
    ),
    # The order of the pod's volumes and the container's volumeMounts: lists keyed by name, in
    # which Kubernetes ignores the order. kustomize's strategic merge puts a component's items
    # first, its JSON patches last; the chart appends both.
    "volume order": ("volumes", "volumeMounts"),
    # The own-writes policies carry the base's labels (app.kubernetes.io/name, part-of) like
    # every other object of the chart; kustomize's labels: reach only the base's own resources,
    # not a component's.
    "labelled policies": ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"),
}
BASE_LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/part-of")


# -- comparing ---------------------------------------------------------------------------------
def _key(o: Obj) -> tuple[str, str, str]:
    return (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"])


def _by_name(o: Obj) -> Obj:
    """``o`` with its volumes and volume mounts sorted by name."""
    o = copy.deepcopy(o)
    if o["kind"] == "DaemonSet":
        pod = o["spec"]["template"]["spec"]
        pod["volumes"].sort(key=lambda v: v["name"])
        for c in pod["containers"]:
            c["volumeMounts"].sort(key=lambda m: m["name"])
    return o


def _without_allowed(o: Obj) -> Obj:
    o = _by_name(o)
    labels = o["metadata"].get("labels", {})
    for label in ALLOWED["helm labels"]:
        labels.pop(label, None)
    if o["kind"] in ALLOWED["labelled policies"]:
        for label in BASE_LABELS:
            labels.pop(label, None)
    if not labels:
        o["metadata"].pop("labels", None)
    return o


def _diff(a: Any, b: Any, path: str = "") -> Iterator[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in b:
                yield f"{path}.{k}: only in kustomize ({a[k]!r})"
            elif k not in a:
                yield f"{path}.{k}: only in the chart ({b[k]!r})"
            else:
                yield from _diff(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from _diff(x, y, f"{path}[{i}]")
    elif a != b:
        yield f"{path}: kustomize {a!r}, chart {b!r}"


def differences(kustomized: Iterable[Obj], charted: Iterable[Obj]) -> list[str]:
    """Every difference between kustomize's objects and the chart's, but those ``ALLOWED``:
    objects only one has, and each field that differs, by path."""
    ours = {_key(o): _by_name(o) for o in kustomized}
    theirs = {_key(o): _without_allowed(o) for o in charted}
    out = [f"{k}: only in kustomize" for k in sorted(set(ours) - set(theirs))]
    out += [f"{k}: only in the chart" for k in sorted(set(theirs) - set(ours))]
    for k in sorted(set(ours) & set(theirs)):
        out += [f"{k}{d}" for d in _diff(ours[k], theirs[k])]
    return out


# -- fixtures ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def helm_bin() -> Path:
    """helm, built from tests/support/deploy/go/helm on first use, cached."""
    return helm.ensure_built()


def _chart(helm_bin: Path, *sets: str, chart: Path = CHART) -> list[Obj]:
    return helm.template(chart, sets=(*DEFAULTS, *sets), binary=helm_bin)


def _kustomize(kustomize_bin: Path, tmp: Path, components: Iterable[str] = ()) -> list[Obj]:
    return compose(tmp, components=list(components), binary=kustomize_bin, extra=IMAGES)


# -- rendering ---------------------------------------------------------------------------------
def test_the_chart_files_are_generated_and_current() -> None:
    assert not [p for p in generate.stale() if generate.CHART_FILES in p.parents]
    # Every component has its value, and every DaemonSet-only component its generated part.
    assert sorted(COMPONENT_VALUES) == sorted(p.name for p in (DAEMONSET / "components").iterdir())
    made = {p.stem for p in (generate.CHART_FILES / "components").glob("*.yaml")}
    assert made == {*generate.DAEMONSET_COMPONENTS, "own-writes"}


def test_helm_is_the_pinned_build(helm_bin: Path) -> None:
    done = helm.run("version", "--short", binary=helm_bin)
    assert done.returncode == 0 and done.stdout.startswith(helm.version()), done


def test_helm_lint(helm_bin: Path) -> None:
    done = helm.run("lint", "--strict", str(CHART), "--set", DEFAULTS[0], binary=helm_bin)
    assert done.returncode == 0, done.stdout + done.stderr
    # Without an image the chart refuses to render, and says which value.
    done = helm.run("template", "nodeguard", str(CHART), binary=helm_bin)
    assert done.returncode != 0 and "image.repository is required" in done.stderr


def test_the_defaults_are_the_base(helm_bin: Path, kustomize_bin: Path, tmp_path: Path) -> None:
    assert differences(_kustomize(kustomize_bin, tmp_path), _chart(helm_bin)) == []
    # helm install --create-namespace: everything but the Namespace.
    plain = helm.template(CHART, sets=DEFAULTS[:1], binary=helm_bin)
    assert {_key(o) for o in _chart(helm_bin)} - {_key(o) for o in plain} == {
        ("Namespace", "", "nodeguard")
    }


@pytest.mark.parametrize("component", sorted(COMPONENT_VALUES))
def test_each_component_is_its_value(
    component: str, helm_bin: Path, kustomize_bin: Path, tmp_path: Path
) -> None:
    kustomized = _kustomize(kustomize_bin, tmp_path, [component])
    charted = _chart(helm_bin, *COMPONENT_VALUES[component])
    assert differences(kustomized, charted) == []
    # Each value changes something (the comparison above is not of two defaults).
    assert differences(_kustomize(kustomize_bin, tmp_path / "base"), charted)


def test_every_component_at_once(helm_bin: Path, kustomize_bin: Path, tmp_path: Path) -> None:
    for left_out in EXCLUSIVE:
        on = [c for c in COMPONENT_VALUES if c != left_out]
        sets = [s for c in on for s in COMPONENT_VALUES[c]]
        kustomized = _kustomize(kustomize_bin, tmp_path / left_out, on)
        assert differences(kustomized, _chart(helm_bin, *sets)) == [], left_out
    both = [s for c in EXCLUSIVE for s in COMPONENT_VALUES[c]]
    with pytest.raises(helm.HelmError, match="ownWrites and alertDriven do not go together"):
        _chart(helm_bin, *both)


def test_a_planted_difference_is_found(
    helm_bin: Path, kustomize_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kustomized = _kustomize(kustomize_bin, tmp_path / "k")
    charted = _chart(helm_bin)

    def planted(change: str) -> list[str]:
        objs = copy.deepcopy(charted)
        role = find(objs, "ClusterRole")
        c = container(objs)
        if change == "verb":
            role["rules"][0]["verbs"].remove("patch")
        elif change == "arg":
            c["args"].remove("--dry-run")
        elif change == "volume":
            find(objs, "DaemonSet")["spec"]["template"]["spec"]["volumes"].pop()
        elif change == "securityContext":
            c["securityContext"]["readOnlyRootFilesystem"] = False
        elif change == "object":
            objs.remove(find(objs, "RoleBinding"))
        elif change == "label":
            find(objs, "Service")["metadata"]["labels"]["app.kubernetes.io/part-of"] = "x"
        return differences(kustomized, objs)

    assert planted("verb") == [
        "('ClusterRole', '', 'nodeguard').rules[0].verbs: "
        + ("kustomize ['get', 'list', 'patch'], chart ['get', 'list']")
    ]
    for change in ("arg", "volume", "securityContext", "object", "label"):
        assert planted(change), change
    # And one planted in the chart itself: a verb taken from its copy of the base's RBAC, which
    # `generate --check` also reports.
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    rbac = chart / "files" / "base" / "rbac.yaml"
    rbac.write_text(rbac.read_text().replace("verbs: [create, get, update]", "verbs: [get]"))
    found = differences(kustomized, _chart(helm_bin, chart=chart))
    assert found == [
        "('Role', 'nodeguard', 'nodeguard-leases').rules[0].verbs: "
        "kustomize ['create', 'get', 'update'], chart ['get']"
    ]
    monkeypatch.setattr(generate, "CHART_FILES", chart / "files")
    assert generate.stale() == [rbac]


def test_every_value_set(helm_bin: Path, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(
        "image: {repository: reg.example/ng, tag: '9.9', pullPolicy: Always}\n"
        "dryRun: false\n"
        "resources: {requests: {cpu: 50m, memory: 100Mi}, limits: {memory: 300Mi}}\n"
        "rules: {existingConfigMap: my-rules}\n"
        "nodeSelector: {pool: training}\n"
        "tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]\n"
        "cordon: {mode: taint, budgetPercent: 20, budgetNodes: 3}\n"
        "evict: {maxPerWindow: 4, window: 10m}\n"
        "extraArgs: [--interval=10s]\n"
        "gpuNodes: {enabled: true}\n"
        "psiTriggers: {enabled: true}\n"
        "kernelLog: {enabled: true}\n"
        "cgroupV1Thresholds: {enabled: true}\n"
        "alertDriven: {enabled: true, tokenSecret: {name: am-token, key: bearer}}\n"
        "prometheusOperator: {enabled: true, labels: {release: kube-prometheus-stack}}\n"
    )
    objs = helm.template(CHART, sets=("namespace.create=true",), binary=helm_bin, values=values)
    pod = find(objs, "DaemonSet")["spec"]["template"]["spec"]
    c = container(objs)
    assert (c["image"], c["imagePullPolicy"]) == ("reg.example/ng:9.9", "Always")
    assert c["resources"] == {
        "requests": {"cpu": "50m", "memory": "100Mi"},
        "limits": {"memory": "300Mi"},
    }
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true", "pool": "training"}
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    args = build_parser().parse_args(c["args"])
    assert args.dry_run is False and args.interval == 10.0
    assert "--cordon.budget-percent=20" in c["args"] and "--cordon.budget-nodes=3" in c["args"]
    assert {"--cordon.mode=taint", "--evict.max-per-window=4", "--evict.window=10m"} <= set(
        c["args"]
    )
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["rules"]["configMap"]["name"] == "my-rules"
    assert not [o for o in objs if o["kind"] == "ConfigMap"]  # the existing one is used
    assert volumes["webhook-token"]["secret"] == {
        "secretName": "am-token",
        "defaultMode": 0o400,
        "items": [{"key": "bearer", "path": "token"}],
    }
    assert c["securityContext"]["privileged"] is True
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert {"/host/proc/pressure", "/host/sys/fs/cgroup", "/etc/nodeguard/webhook"} <= mounts
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert find(objs, kind)["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    # Inline rule files replace the shipped ones.
    inline = helm.template(
        CHART, sets=(*DEFAULTS, "rules.files.mine\\.yaml=spec: {}"), binary=helm_bin
    )
    assert find(inline, "ConfigMap", "nodeguard-rules")["data"] == {"mine.yaml": "spec: {}"}


# -- the API server ----------------------------------------------------------------------------
CLUSTER_SCOPED = (("ClusterRole", "nodeguard"), ("ClusterRoleBinding", "nodeguard"))
RBAC_V1 = "rbac.authorization.k8s.io/v1"


def _read(applier: Applier, api_version: str, kind: str, name: str, ns: str = "") -> Obj | None:
    """The stored object, None when there is none."""
    res = applier.dynamic.resources.get(api_version=api_version, kind=kind)
    try:
        found = res.get(name=name, namespace=ns or None)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    out: Obj = found.to_dict()
    return out


@pytest.fixture
def kept_cluster_objects(applier: Applier) -> Iterator[None]:
    """Other tests of the session apply daemonset/'s cluster-scoped objects (one name for the
    whole cluster): the install takes them over (--take-ownership) and the uninstall deletes
    them, so they are put back as they were."""
    before = [_read(applier, RBAC_V1, kind, name) for kind, name in CLUSTER_SCOPED]
    yield
    for obj in before:
        if obj is None:
            continue
        md = obj["metadata"]
        kept = {**obj, "metadata": {"name": md["name"], "labels": md.get("labels", {})}}
        applier.apply(kept, dry_run=False)
        back = _read(applier, obj["apiVersion"], obj["kind"], md["name"])
        assert back is not None
        for field in ("rules", "roleRef", "subjects"):
            assert back.get(field) == obj.get(field), (obj["kind"], field)


@pytest.mark.usefixtures("kept_cluster_objects")
def test_install_upgrade_uninstall(
    helm_bin: Path,
    control_plane: TestCluster,
    applier: Applier,
    manifests: list[Obj],
) -> None:
    # As other tests of the session leave them: the same cluster-scoped objects, not Helm's.
    for kind, name in CLUSTER_SCOPED:
        applier.apply(find(manifests, kind, name), dry_run=False)
    ns = f"helm-{uuid.uuid4().hex[:6]}"
    home = control_plane.work_dir / "helm"
    env = {
        **os.environ,
        "KUBECONFIG": str(control_plane.kubeconfig_path),
        **{f"HELM_{d}_HOME": str(home / d.lower()) for d in ("CACHE", "CONFIG", "DATA")},
    }

    def run(*args: str) -> str:
        done = helm.run(*args, "-n", ns, binary=helm_bin, env=env)
        assert done.returncode == 0, f"helm {' '.join(args)}:\n{done.stdout}{done.stderr}"
        return done.stdout

    def read(api_version: str, kind: str, name: str, namespace: str = ns) -> Obj:
        found = _read(applier, api_version, kind, name, namespace)
        assert found is not None, (kind, name)
        return found

    def agent(ds: Obj) -> Obj:
        c: Obj = ds["spec"]["template"]["spec"]["containers"][0]
        return c

    install = ("install", "nodeguard", str(CHART), "--create-namespace", "--take-ownership")
    run(*install, "--set", DEFAULTS[0])
    ds = read("apps/v1", "DaemonSet", "nodeguard")
    assert "--dry-run" in agent(ds)["args"] and agent(ds)["image"] == f"{IMAGE}:{TAG}"
    assert read("v1", "ConfigMap", "nodeguard-rules")["data"] == {
        "default.yaml": (REPO / "rules" / "default.yaml").read_text()
    }
    binding = read(RBAC_V1, "ClusterRoleBinding", "nodeguard", "")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "nodeguard", "namespace": ns}]
    assert read(RBAC_V1, "RoleBinding", "nodeguard-leases")["subjects"][0]["namespace"] == ns
    assert (
        read(RBAC_V1, "ClusterRole", "nodeguard", "")["metadata"]["labels"][
            "app.kubernetes.io/managed-by"
        ]
        == "Helm"
    )
    read("v1", "ServiceAccount", "nodeguard")
    read("monitoring.coreos.com/v1", "PrometheusRule", "nodeguard")
    generation = ds["metadata"]["generation"]

    run("upgrade", "nodeguard", str(CHART), "--reuse-values", "--set", "dryRun=false")
    ds = read("apps/v1", "DaemonSet", "nodeguard")
    assert "--no-dry-run" in agent(ds)["args"] and "--dry-run" not in agent(ds)["args"]
    assert ds["metadata"]["generation"] == generation + 1
    assert "REVISION: 2" in run("status", "nodeguard")

    run("uninstall", "nodeguard", "--wait")
    assert _read(applier, "apps/v1", "DaemonSet", "nodeguard", ns) is None
    assert _read(applier, RBAC_V1, "ClusterRole", "nodeguard") is None
    assert _read(applier, "v1", "ServiceAccount", "nodeguard", ns) is None
    applier.dynamic.resources.get(api_version="v1", kind="Namespace").delete(name=ns)


def test_the_readme_names_every_value() -> None:
    text = (REPO / "README.md").read_text()
    section = text[text.index("### 3, with Helm instead") :]
    section = section[: section.index("\n### ", 1)]
    assert "helm install nodeguard charts/nodeguard -n nodeguard --create-namespace" in section

    def leaves(values: dict[str, Any], prefix: str = "") -> Iterator[str]:
        for k, v in values.items():
            if isinstance(v, dict) and v:
                yield from leaves(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}"

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for name in leaves(values):
        last = name.rsplit(".", 1)[-1]
        assert f"`{name}`" in section or f"`.{last}`" in section, name


@pytest.mark.parametrize(
    ("value", "refusal"),
    [
        ("dryRun=flase", "at '/dryRun': got string, want boolean"),
        ("psiTrigers.enabled=true", "additional properties 'psiTrigers' not allowed"),
        ("cordon.mode=drain", "/cordon/mode"),
    ],
)
def test_a_mistyped_value_is_refused(value: str, refusal: str, helm_bin: Path) -> None:
    # values.schema.json: a typo would otherwise render the defaults (a dry run left on, a
    # component left out) without a word.
    with pytest.raises(helm.HelmError, match=re.escape(refusal)):
        _chart(helm_bin, value)
