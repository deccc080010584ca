"""Check ``nodeguard-agents``: nodeguard itself, from its agents' pods, flags and rules.

- **missing** (error): a GPU or training node (:mod:`~nodeguard.doctor.gpu_nodes`) with no
  running agent pod: nothing there samples its memory or acts on it. One finding names every
  such node.
- **dry run** (info): ``nodeguard run`` defaults to ``--dry-run`` (an
  ``argparse.BooleanOptionalAction`` with ``default=True`` in :mod:`nodeguard.cli.run_flags`;
  the last of ``--dry-run``/``--no-dry-run`` wins) and the shipped DaemonSet says it. Info,
  not warning: a dry run takes nothing away from the node (the kubelet's eviction and the
  kernel stay as they are, and nodeguard still samples, exports and records what it would
  have done); it is the shipped first step, and a CI gate at ``--fail-on warning`` should not
  fail for it. One finding per DaemonSet.
- **webhook without a token** (error): ``--webhook.allow-unauthenticated`` without
  ``--webhook.token-file``: anyone who reaches the port makes nodeguard cordon and evict
  (:mod:`nodeguard.alerts.webhook`). Off loopback the agent refuses to start with it
  (:func:`nodeguard.agent.run.run_agent`), which the evidence says.
- **alert rules with the webhook off** (warning): the rules' ConfigMap maps Alertmanager alerts
  but there is no ``--webhook.token-file``: the webhook answers 403 and they never act.
- **rules ConfigMap missing** (error): the kubelet does not start a pod whose ``configMap``
  volume names a ConfigMap that does not exist (pkg/volume/configmap, unless ``optional``).
- **rules that do not load** (error): the ConfigMap's rules fail nodeguard's own loader: the
  agent keeps no rule of them (at start) or its last good ones (on a reload).
- **thresholds out of the node's reach** (warning): a ``when`` condition ``>``/``>=`` on a
  byte amount that cannot exceed the node's memory, with a threshold at or above
  ``status.capacity.memory`` (the machine's MemTotal, cAdvisor ``MachineInfo.MemoryCapacity``
  through pkg/kubelet/nodestatus/setters.go ``MachineInfo``): ``MemAvailable`` and a
  cgroup's working set or unreclaimable memory are parts of MemTotal. All ``when`` conditions
  must hold, so one such condition keeps the rule from ever firing there. Ratios are not
  checked here: the schema already refuses a ratio outside 0..1 at load time.

Not checked: GPU memory thresholds (the API does not give a GPU's memory), rates and counts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from nodeguard.doctor.agent_inputs import AgentRules, AgentView
from nodeguard.doctor.findings import Fact, Finding, ObjectRef
from nodeguard.doctor.gpu_nodes import gpu_or_training
from nodeguard.doctor.inputs import Cluster, NodeView
from nodeguard.doctor.registry import Check, register

__all__ = ["BOUNDED_BY_NODE_MEMORY"]

CHECK = "nodeguard-agents"
#: Byte signals that never exceed the node's MemTotal (nodeguard.rules.signals).
BOUNDED_BY_NODE_MEMORY = frozenset(
    {
        "node_memory_available_bytes",
        "pod_working_set_bytes",
        "container_working_set_bytes",
        "pod_unreclaimable_bytes",
        "container_unreclaimable_bytes",
    }
)
SHOWN = 5


def _ref(kind: str, namespace: str, name: str) -> ObjectRef:
    return ObjectRef(kind=kind, namespace=namespace, name=name)


def _owner(agent: AgentView) -> ObjectRef:
    if agent.daemonset:
        return _ref("DaemonSet", agent.namespace, agent.daemonset)
    return _ref("Pod", agent.namespace, agent.name)


def _names(names: list[str]) -> str:
    more = f" (+{len(names) - SHOWN})" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more


def _missing(cluster: Cluster) -> Iterator[Finding]:
    running = {a.node for a in cluster.agents if a.running}
    bare = [
        (node, why)
        for node in cluster.nodes
        if node.name not in running
        and (why := gpu_or_training(node, cluster.pods_on(node.name))) is not None
    ]
    if not bare:
        return
    yield Finding(
        check=CHECK,
        severity="error",
        title=f"{len(bare)} GPU/training node(s) without a running nodeguard agent",
        objects=tuple(_ref("Node", "", node.name) for node, _ in bare),
        evidence=tuple(Fact(label=node.name, text=why) for node, why in bare[:SHOWN]),
        fix=_missing_fix(cluster, [node for node, _ in bare]),
    )


def _missing_fix(cluster: Cluster, nodes: list[NodeView]) -> str:
    """What runs an agent there. The shipped DaemonSet tolerates every taint
    (daemonset/base/daemonset.yaml ``tolerations: [{operator: Exists}]``) and its
    ``gpu-nodes`` overlay selects ``nvidia.com/gpu.present=true``, GPU Feature Discovery's
    label: no agent at all is an install, a GPU node without the label is a label, and a
    labelled node without one is its agent pod's own story (pending, crashing)."""
    if not cluster.agents:
        return (
            "# no nodeguard agent runs in this cluster; from a nodeguard checkout:\n"
            "kubectl apply -k daemonset/overlays/gpu-nodes"
        )
    unlabelled = [n.name for n in nodes if not n.gpu_label and n.gpus]
    cpu_only = [n.name for n in nodes if not n.gpu_label and not n.gpus]
    labelled = [n.name for n in nodes if n.gpu_label]
    parts = []
    if unlabelled:
        parts.append(
            "# the gpu-nodes DaemonSet selects nvidia.com/gpu.present=true:\n"
            f"kubectl label node {' '.join(unlabelled[:SHOWN])} nvidia.com/gpu.present=true"
        )
    if cpu_only:
        parts.append(
            f"# training without GPUs on {_names(cpu_only)}: run the agent on every node\n"
            "# (daemonset/ rather than daemonset/overlays/gpu-nodes)"
        )
    if labelled:
        ns = cluster.agents[0].namespace
        parts.append(
            "# selected, yet no agent runs: its pod there and why\n"
            f"kubectl -n {ns} get pods -o wide --field-selector spec.nodeName={labelled[0]}"
        )
    return "\n".join(parts)


def _by_owner(agents: list[AgentView]) -> dict[ObjectRef, list[AgentView]]:
    groups: dict[ObjectRef, list[AgentView]] = {}
    for agent in agents:
        groups.setdefault(_owner(agent), []).append(agent)
    return groups


def _dry_run(cluster: Cluster) -> Iterator[Finding]:
    dry = [a for a in cluster.agents if a.settings is not None and a.settings.dry_run]
    for owner, agents in sorted(_by_owner(dry).items(), key=lambda kv: str(kv[0])):
        yield Finding(
            check=CHECK,
            severity="info",
            title=f"nodeguard agents of {owner} in dry run: they record, never act",
            objects=(owner,),
            evidence=(Fact(label="pods", text=_names(sorted(a.name for a in agents))),),
            fix=(
                "# once the NodeguardWould... Events look right: replace --dry-run with "
                "--no-dry-run in its args\n# (or add daemonset/components/no-dry-run):\n"
                f"kubectl -n {owner.namespace} edit {owner.kind.lower()} {owner.name}"
            ),
        )


def _webhook(cluster: Cluster) -> Iterator[Finding]:
    open_ = [
        a
        for a in cluster.agents
        if a.settings is not None
        and a.settings.webhook_unauthenticated
        and not a.settings.webhook_token_file
    ]
    for owner, agents in sorted(_by_owner(open_).items(), key=lambda kv: str(kv[0])):
        host = agents[0].settings.listen_host if agents[0].settings else None
        loopback = host in ("127.0.0.1", "::1", "[::1]", "localhost")
        yield Finding(
            check=CHECK,
            severity="error",
            title=f"the Alertmanager webhook of {owner} takes deliveries without a token",
            objects=(owner,),
            evidence=(
                Fact(label="pods", text=_names(sorted(a.name for a in agents))),
                Fact(
                    label="listen address",
                    text=(host or "every address")
                    + ("" if loopback else ": off loopback the agent refuses to start"),
                ),
            ),
            fix=(
                "kubectl -n nodeguard create secret generic nodeguard-webhook-token "
                '--from-literal=token="$(openssl rand -hex 32)"\n# then drop '
                "--webhook.allow-unauthenticated and add daemonset/components/alert-driven "
                "(--webhook.token-file)"
            ),
        )


def _rules(cluster: Cluster) -> Iterator[Finding]:
    for loaded in cluster.agent_rules:
        readers = [a for a in cluster.agents if loaded.source in a.rules_sources]
        cm = _ref("ConfigMap", loaded.source.namespace, loaded.source.config_map)
        if loaded.unread == "not found":
            yield Finding(
                check=CHECK,
                severity="error",
                title=f"the agents' rules {cm} does not exist",
                objects=(cm, *sorted({_owner(a) for a in readers}, key=str)),
                evidence=(Fact(label="agents", text=_names(sorted(a.name for a in readers))),),
                fix=(
                    "# the kubelet does not start a pod whose configMap volume is missing:\n"
                    f"kubectl -n {cm.namespace} create configmap {cm.name} "
                    "--from-file=rules/default.yaml"
                ),
            )
        if loaded.problems:
            yield Finding(
                check=CHECK,
                severity="error",
                title=f"the rules of {cm} do not load: the agents act on none of them",
                objects=(cm,),
                evidence=tuple(Fact(label="error", text=m) for m in loaded.problems[:SHOWN]),
                fix=(
                    "# check the rules before applying them:\nnodeguard check FILE.yaml\n"
                    f"kubectl -n {cm.namespace} edit configmap {cm.name}"
                ),
            )
        off = [a for a in readers if a.settings is not None and not a.settings.webhook_token_file]
        if loaded.alerts and off:
            yield Finding(
                check=CHECK,
                severity="warning",
                title=f"alert rules in {cm} can never act: the agents' webhook is off",
                objects=(cm, *sorted({_owner(a) for a in off}, key=str)),
                evidence=(
                    Fact(label="alert rules", text=", ".join(r.name for r in loaded.alerts)),
                    Fact(label="--webhook.token-file", text="not set"),
                ),
                fix="# add daemonset/components/alert-driven (the token Secret and its flag)",
            )
        yield from _out_of_reach(cluster, loaded, readers, cm)


def _out_of_reach(
    cluster: Cluster, loaded: AgentRules, readers: list[AgentView], cm: ObjectRef
) -> Iterator[Finding]:
    nodes = {n.name: n for n in cluster.nodes}
    for rule in loaded.rules:
        for cond in rule.when:
            if cond.signal not in BOUNDED_BY_NODE_MEMORY or cond.op not in (">", ">="):
                continue
            unreachable = []
            for agent in readers:
                node = nodes.get(agent.node)
                capacity = node.meta.capacity_memory_bytes if node else None
                if capacity is None:
                    continue
                if cond.value > capacity or (cond.op == ">" and cond.value == capacity):
                    unreachable.append((agent.node, capacity))
            if not unreachable:
                continue
            unreachable.sort()
            yield Finding(
                check=CHECK,
                severity="warning",
                title=f"rule {rule.name} of {cm} can never trip on {len(unreachable)} node(s)",
                objects=(cm, *(_ref("Node", "", n) for n, _ in unreachable[:SHOWN])),
                evidence=(
                    Fact(label="condition", text=f"{cond.signal} {cond.op}"),
                    Fact(label="threshold", bytes=int(cond.value)),
                    Fact(
                        label=f"largest node memory ({unreachable[-1][0]})",
                        bytes=max(c for _, c in unreachable),
                    ),
                ),
                fix=(
                    f"# {cond.signal} never exceeds the node's memory: lower the threshold "
                    "below it, or compare a ratio (the *_ratio signals)\n"
                    f"kubectl -n {cm.namespace} edit configmap {cm.name}"
                ),
            )


def _in_scope(cluster: Cluster) -> Cluster:
    """The cluster with only the agents of the nodes in scope (``--node``, or the nodes of the
    ``--namespace`` pods) and the rules they read: asked about namespace ``ml``, the doctor
    says nothing of the agents on nodes where ``ml`` has no pod. With no scope, every agent,
    scheduled or not."""
    if not cluster.namespaces:
        return cluster
    nodes = {n.name for n in cluster.nodes}
    agents = tuple(a for a in cluster.agents if a.node in nodes)
    sources = {s for a in agents for s in a.rules_sources}
    return dataclasses.replace(
        cluster,
        agents=agents,
        agent_rules=tuple(r for r in cluster.agent_rules if r.source in sources),
    )


def _findings(cluster: Cluster) -> Iterator[Finding]:
    yield from _missing(cluster)
    scoped = _in_scope(cluster)
    yield from _dry_run(scoped)
    yield from _webhook(scoped)
    yield from _rules(scoped)


register(
    Check(
        id="nodeguard-agents",
        title="nodeguard itself: agents missing, in dry run, open webhook, rules out of reach",
        run=_findings,
    )
)
