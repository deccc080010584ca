"""``nodeguard doctor``'s ``nodeguard-agents`` check on typed inputs: agent pods read by the
doctor's reader with the agent's own flag parser, rules loaded by nodeguard's own loader."""

from __future__ import annotations

from typing import Any

import nodeguard.doctor  # noqa: F401  (registers every check)
from nodeguard.cli.agent_flags import agent_settings
from nodeguard.doctor.agent_inputs import AgentRules, AgentView, RulesSource
from nodeguard.doctor.findings import Finding
from nodeguard.doctor.inputs import Cluster
from nodeguard.doctor.read_agents import agent_view, rules_from_data
from nodeguard.doctor.registry import CHECKS
from tests.support.doctor import GiB, node, pod

#: The shipped DaemonSet's arguments (daemonset/base/daemonset.yaml).
SHIPPED = [
    "run",
    "--path.procfs=/host/proc",
    "--listen-address=:9847",
    "--rules=/etc/nodeguard/rules",
    "--dry-run",
]


def agent_pod(
    name: str, *, node_name: str, args: list[str], phase: str = "Running", **spec: Any
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "nodeguard",
            "labels": {
                "app.kubernetes.io/name": "nodeguard",
                "app.kubernetes.io/component": "agent",
            },
            "ownerReferences": [{"kind": "DaemonSet", "name": "nodeguard", "controller": True}],
        },
        "spec": {
            "nodeName": node_name,
            "containers": [
                {
                    "name": "nodeguard",
                    "args": args,
                    "volumeMounts": [{"name": "rules", "mountPath": "/etc/nodeguard/rules"}],
                }
            ],
            "volumes": [{"name": "rules", "configMap": {"name": "nodeguard-rules"}}],
            **spec,
        },
        "status": {"phase": phase},
    }


def agent(
    name: str, *, node_name: str, args: list[str] = SHIPPED, phase: str = "Running"
) -> AgentView:
    view = agent_view(
        agent_pod(name, node_name=node_name, args=args, phase=phase), flags=agent_settings
    )
    assert view is not None
    return view


def found(c: Cluster) -> list[Finding]:
    return list(CHECKS["nodeguard-agents"].run(c))


def test_the_shipped_agent_is_read_as_the_agent_reads_its_flags() -> None:
    a = agent("ng-1", node_name="gpu-1")
    assert a.settings is not None
    assert (a.settings.dry_run, a.settings.webhook_token_file, a.settings.rules) == (
        True,
        False,
        ("/etc/nodeguard/rules",),
    )
    assert a.rules_sources == (RulesSource(namespace="nodeguard", config_map="nodeguard-rules"),)
    assert (a.daemonset, a.running) == ("nodeguard", True)
    # The last of --dry-run / --no-dry-run wins; without either, dry run is on.
    assert not agent("x", node_name="n", args=[*SHIPPED, "--no-dry-run"]).settings.dry_run  # type: ignore[union-attr]
    assert agent("x", node_name="n", args=["run"]).settings.dry_run  # type: ignore[union-attr]
    # Not `nodeguard run`, or flags it would refuse: not understood.
    assert agent("x", node_name="n", args=["snapshot"]).settings is None
    assert agent("x", node_name="n", args=["run", "--interval=soon"]).settings is None
    # Any other pod is no agent.
    assert (
        agent_view(
            {"metadata": {"labels": {"app.kubernetes.io/name": "nodeguard"}}}, flags=agent_settings
        )
        is None
    )


def test_a_rules_file_mounted_by_subpath_is_that_key() -> None:
    doc = agent_pod("ng", node_name="n", args=["run", "--rules=/etc/ng/local.yaml"])
    doc["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "rules", "mountPath": "/etc/ng/local.yaml", "subPath": "default.yaml"}
    ]
    view = agent_view(doc, flags=agent_settings)
    assert view is not None
    assert view.rules_sources == (
        RulesSource(namespace="nodeguard", config_map="nodeguard-rules", key="default.yaml"),
    )


def test_gpu_nodes_without_a_running_agent_are_one_error() -> None:
    nodes = (node("gpu-1", gpus=8), node("gpu-2", gpus=8), node("gpu-3", gpus=8), node("cpu-1"))
    agents = (
        agent("ng-1", node_name="gpu-1"),
        agent("ng-2", node_name="gpu-2", phase="Pending"),
        agent("ng-4", node_name="cpu-1"),
    )
    missing = [
        f
        for f in found(Cluster(nodes=nodes, pods=(), quotas=(), limit_ranges=(), agents=agents))
        if f.severity == "error"
    ]
    (f,) = missing
    assert f.title == "2 GPU/training node(s) without a running nodeguard agent"
    assert [str(o) for o in f.objects] == ["Node gpu-2", "Node gpu-3"]
    # A node that runs a training pod counts too; a CPU node without one does not.
    trainer = pod("t", node="cpu-1", labels={"training.kubeflow.org/job-name": "bert"})
    (f,) = found(Cluster(nodes=(node("cpu-1"),), pods=(trainer,), quotas=(), limit_ranges=()))
    assert [str(o) for o in f.objects] == ["Node cpu-1"]
    assert found(Cluster(nodes=(node("cpu-1"),), pods=(), quotas=(), limit_ranges=())) == []


def test_dry_run_is_one_info_per_daemonset_and_no_dry_run_is_none() -> None:
    nodes = (node("gpu-1", gpus=8), node("gpu-2", gpus=8))
    agents = (agent("ng-1", node_name="gpu-1"), agent("ng-2", node_name="gpu-2"))
    (f,) = found(Cluster(nodes=nodes, pods=(), quotas=(), limit_ranges=(), agents=agents))
    assert (f.severity, f.title) == (
        "info",
        "nodeguard agents of DaemonSet nodeguard/nodeguard in dry run: they record, never act",
    )
    assert [(x.label, x.text) for x in f.evidence] == [("pods", "ng-1, ng-2")]
    acting = tuple(agent(a.name, node_name=a.node, args=[*SHIPPED, "--no-dry-run"]) for a in agents)
    assert found(Cluster(nodes=nodes, pods=(), quotas=(), limit_ranges=(), agents=acting)) == []


def test_the_webhook_without_a_token_is_an_error_and_with_one_it_is_not() -> None:
    open_args = [*SHIPPED, "--no-dry-run", "--webhook.allow-unauthenticated"]
    c = Cluster(
        nodes=(),
        pods=(),
        quotas=(),
        limit_ranges=(),
        agents=(agent("ng", node_name="n", args=open_args),),
    )
    (f,) = found(c)
    assert (f.severity, f.title) == (
        "error",
        "the Alertmanager webhook of DaemonSet nodeguard/nodeguard takes deliveries without a "
        "token",
    )
    assert ("listen address", "every address: off loopback the agent refuses to start") in [
        (x.label, x.text) for x in f.evidence
    ]
    token = [*open_args, "--webhook.token-file=/etc/nodeguard/webhook/token"]
    c = Cluster(
        nodes=(),
        pods=(),
        quotas=(),
        limit_ranges=(),
        agents=(agent("ng", node_name="n", args=token),),
    )
    assert found(c) == []


RULES = """\
apiVersion: nodeguard.io/v1alpha1
kind: RuleSet
spec:
  rules:
    - name: much-available
      scope: node
      when: [{signal: node_memory_available_bytes, op: ">", value: 64Gi}]
      actions: [{action: record}]
    - name: at-most-all
      scope: node
      when: [{signal: node_memory_available_bytes, op: ">=", value: 64Gi}]
      actions: [{action: record}]
    - name: huge-container
      scope: container
      when:
        - {signal: container_working_set_bytes, op: ">=", value: 100Gi}
      actions: [{action: record}]
    - name: low-available
      scope: node
      when: [{signal: node_memory_available_bytes, op: "<", value: 1Ti}]
      actions: [{action: record}]
  alerts:
    - name: am-low
      alertname: NodeguardNodeMemoryLow
      actions: [{action: cordon}]
"""
SOURCE = RulesSource(namespace="nodeguard", config_map="nodeguard-rules")


def test_thresholds_the_node_can_never_reach_and_alert_rules_with_the_webhook_off() -> None:
    loaded = rules_from_data(SOURCE, {"default.yaml": RULES, "README": "not rules"})
    assert [r.name for r in loaded.rules] == [
        "much-available",
        "at-most-all",
        "huge-container",
        "low-available",
    ]
    nodes = (node("gpu-1", memory="64Gi", gpus=8), node("big", memory="256Gi", gpus=8))
    agents = tuple(
        agent(f"ng-{n.name}", node_name=n.name, args=[*SHIPPED, "--no-dry-run"]) for n in nodes
    )
    c = Cluster(
        nodes=nodes, pods=(), quotas=(), limit_ranges=(), agents=agents, agent_rules=(loaded,)
    )
    got = {(f.severity, f.title, tuple(str(o) for o in f.objects)) for f in found(c)}
    cm = "ConfigMap nodeguard/nodeguard-rules"
    assert got == {
        # MemAvailable > 64Gi on a node of 64Gi never holds; >= 64Gi could (in principle).
        ("warning", f"rule much-available of {cm} can never trip on 1 node(s)", (cm, "Node gpu-1")),
        ("warning", f"rule huge-container of {cm} can never trip on 1 node(s)", (cm, "Node gpu-1")),
        (
            "warning",
            f"alert rules in {cm} can never act: the agents' webhook is off",
            (cm, "DaemonSet nodeguard/nodeguard"),
        ),
    }
    f = next(f for f in found(c) if "much-available" in f.title)
    # The condition without its number: the threshold beside it says it in binary units.
    assert (f.evidence[0].label, f.evidence[0].text) == (
        "condition",
        "node_memory_available_bytes >",
    )
    assert [(x.label, x.bytes) for x in f.evidence][1:] == [
        ("threshold", 64 * GiB),
        ("largest node memory (gpu-1)", 64 * GiB),
    ]


def test_rules_that_do_not_load_and_a_missing_config_map_are_errors() -> None:
    bad = rules_from_data(SOURCE, {"default.yaml": RULES.replace('op: ">"', 'op: "=>"')})
    assert bad.rules == () and len(bad.problems) == 1
    assert bad.problems[0].startswith("configmap nodeguard-rules: default.yaml:7: ")
    agents = (agent("ng", node_name="n", args=[*SHIPPED, "--no-dry-run"]),)
    missing = AgentRules(source=SOURCE, unread="not found")
    c = Cluster(
        nodes=(), pods=(), quotas=(), limit_ranges=(), agents=agents, agent_rules=(bad, missing)
    )
    assert [(f.severity, f.title) for f in found(c)] == [
        (
            "error",
            "the rules of ConfigMap nodeguard/nodeguard-rules do not load: the agents act on "
            "none of them",
        ),
        ("error", "the agents' rules ConfigMap nodeguard/nodeguard-rules does not exist"),
    ]
    # Refused (forbidden): no finding, the reader's note says so.
    c = Cluster(
        nodes=(),
        pods=(),
        quotas=(),
        limit_ranges=(),
        agents=agents,
        agent_rules=(AgentRules(source=SOURCE, unread="forbidden"),),
    )
    assert found(c) == []


def test_an_unknown_signal_is_named_without_the_list_of_every_known_one() -> None:
    bad = rules_from_data(
        SOURCE, {"default.yaml": RULES.replace("container_working_set_bytes", "container_wss")}
    )
    problem = bad.problems[0]  # then its value, a byte amount to a signal no longer known
    assert problem == (
        "configmap nodeguard-rules: default.yaml:16: spec.rules[2].when[0].signal: unknown "
        "signal 'container_wss' (did you mean 'container_working_set_bytes'?)"
    )


def test_the_fix_for_missing_agents_is_what_would_run_one_there() -> None:
    gpu = node("gpu-1", gpus=8)  # no GPU Feature Discovery label: gpu-nodes does not select it
    labelled = node("gpu-2", gpus=8, labels={"nvidia.com/gpu.present": "true"})
    trainer = pod("t", node="cpu-1", labels={"training.kubeflow.org/job-name": "bert"})
    nodes = (gpu, labelled, node("cpu-1"))

    def fix(*agents: AgentView) -> list[str]:
        c = Cluster(nodes=nodes, pods=(trainer,), quotas=(), limit_ranges=(), agents=agents)
        (f,) = [f for f in found(c) if f.severity == "error"]
        return f.fix.splitlines()

    assert fix() == [
        "# no nodeguard agent runs in this cluster; from a nodeguard checkout:",
        "kubectl apply -k daemonset/overlays/gpu-nodes",
    ]
    lines = fix(agent("ng-9", node_name="other", args=[*SHIPPED, "--no-dry-run"]))
    assert "kubectl label node gpu-1 nvidia.com/gpu.present=true" in lines
    assert "kubectl -n nodeguard get pods -o wide --field-selector spec.nodeName=gpu-2" in lines
    assert "# training without GPUs on cpu-1: run the agent on every node" in lines


def test_with_a_namespace_the_agents_of_other_nodes_are_not_reported() -> None:
    nodes = (node("gpu-1", gpus=8),)
    agents = (agent("ng-1", node_name="gpu-1"), agent("ng-2", node_name="gpu-2"))
    c = Cluster(
        nodes=nodes,
        pods=(),
        quotas=(),
        limit_ranges=(),
        agents=agents,
        namespaces=frozenset({"ml"}),
    )
    (f,) = found(c)
    assert f.title.endswith("in dry run: they record, never act")
    assert f.evidence[0].text == "ng-1"  # not ng-2: gpu-2 runs no pod of ml
