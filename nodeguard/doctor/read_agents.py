"""Reading the nodeguard agents for the ``nodeguard-agents`` check: their pods (from the pods
already read), their flags (through the agent's own parser, given by the command line: the
doctor sits below :mod:`nodeguard.cli`), the ConfigMaps their ``--rules`` paths mount
(daemonset/base/daemonset.yaml: ``--rules=/etc/nodeguard/rules``, a ``configMap`` volume
``nodeguard-rules`` mounted there), and those rules, loaded by nodeguard's own loader
(:func:`nodeguard.rules.load.load_rules`) from the ConfigMap's keys written as files, as the
kubelet writes them into the mount.

Reading a ConfigMap needs ``get configmaps`` in the agent's namespace (docs/doctor-rbac.yaml,
the optional ``nodeguard-doctor-agent-rules``); refused, the rules are left out and one note
says so.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from nodeguard.doctor.agent_inputs import AgentRules, AgentSettings, AgentView, RulesSource
from nodeguard.kube.client import KubeClient
from nodeguard.kube.errors import Forbidden, KubeError, NotFound
from nodeguard.rules.load import RuleError, load_rules

__all__ = ["AGENT_LABELS", "AgentFlags", "agent_view", "read_agents", "rules_from_data"]

JSON = dict[str, Any]
#: The agent's pod labels (daemonset/base, charts/nodeguard).
AGENT_LABELS = {"app.kubernetes.io/name": "nodeguard", "app.kubernetes.io/component": "agent"}
#: An agent's container arguments -> its settings, ``None`` when they are not understood.
AgentFlags = Callable[[Sequence[str]], AgentSettings | None]


def _is_agent(pod: JSON) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in AGENT_LABELS.items())


def _container(spec: JSON) -> JSON:
    containers = spec.get("containers") or [{}]
    return next((c for c in containers if c.get("name") == "nodeguard"), containers[0])


def _sources(
    spec: JSON, container: JSON, rules: Sequence[str], namespace: str
) -> list[RulesSource]:
    """The ConfigMaps behind each ``--rules`` path: the volume mounted at it (a directory: its
    keys, or with ``items`` the paths they name) or above it (a file: the key at that path)."""
    volumes = {v.get("name"): v for v in spec.get("volumes") or []}
    out: list[RulesSource] = []
    for path in rules:
        wanted = PurePosixPath(path)
        for mount in container.get("volumeMounts") or []:
            at = PurePosixPath(mount.get("mountPath", "/"))
            cm = (volumes.get(mount.get("name")) or {}).get("configMap")
            if not cm or not (wanted == at or at in wanted.parents):
                continue
            name = str(cm.get("name", ""))
            sub = mount.get("subPath")
            if sub:
                key: str | None = str(sub) if wanted == at else None
            elif wanted == at:
                key = None
            else:
                rel = str(wanted.relative_to(at))
                items = {i.get("path"): i.get("key") for i in cm.get("items") or []}
                key = items.get(rel, rel) if items else rel
            source = RulesSource(namespace=namespace, config_map=name, key=key)
            if source not in out:
                out.append(source)
    return out


def agent_view(pod: JSON, *, flags: AgentFlags) -> AgentView | None:
    """An :class:`AgentView` of an agent pod; ``None`` for any other pod."""
    if not _is_agent(pod):
        return None
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    container = _container(spec)
    # The image's entrypoint is `nodeguard`; a command that spells it out (`python -m
    # nodeguard run`) is read from its `run` on.
    words = [str(w) for w in [*(container.get("command") or []), *(container.get("args") or [])]]
    args = tuple(words[words.index("run") :] if "run" in words else words)
    settings = flags(args)
    owner = next(
        (o for o in meta.get("ownerReferences") or [] if o.get("kind") == "DaemonSet"), None
    )
    namespace = meta.get("namespace", "")
    return AgentView(
        namespace=namespace,
        name=meta.get("name", ""),
        node=spec.get("nodeName") or "",
        running=(pod.get("status") or {}).get("phase") == "Running",
        daemonset=owner.get("name") if owner else None,
        args=args,
        settings=settings,
        rules_sources=tuple(_sources(spec, container, settings.rules, namespace))
        if settings
        else (),
    )


_KNOWN = re.compile(r" \(known: [^)]*\)")


def rules_from_data(source: RulesSource, data: dict[str, str]) -> AgentRules:
    """Load a ConfigMap's ``data`` as the agent would: its keys written as files of a
    directory (the mount), then :func:`~nodeguard.rules.load.load_rules` on the directory (or
    on the one key's file)."""
    with tempfile.TemporaryDirectory(prefix="nodeguard-doctor-") as tmp:
        root = Path(tmp)
        for key, text in data.items():
            if "/" not in key and not key.startswith("."):
                (root / key).write_text(text, encoding="utf-8")
        target = root / source.key if source.key else root
        try:
            loaded = load_rules([target])
        except RuleError as exc:
            # The loader's list of every known signal (action) is ~1,500 characters: the
            # finding's fix runs `nodeguard check`, which prints it; the evidence keeps the
            # error and its "did you mean".
            problems = tuple(
                _KNOWN.sub("", m.replace(f"{root}/", f"configmap {source.config_map}: "))
                for m in exc.messages
            )
            return AgentRules(source=source, problems=problems)
    return AgentRules(source=source, rules=loaded.rules, alerts=loaded.alerts)


async def read_agents(
    kube: KubeClient, pods: Sequence[JSON], *, flags: AgentFlags
) -> tuple[tuple[AgentView, ...], tuple[AgentRules, ...], tuple[str, ...]]:
    """The agents among ``pods``, the rules of their ConfigMaps (each read once) and the
    notes. Raises :mod:`nodeguard.kube.errors` other than forbidden and not found."""
    agents = [a for p in pods if (a := agent_view(p, flags=flags)) is not None]
    sources = sorted(
        {s for a in agents for s in a.rules_sources},
        key=lambda s: (s.namespace, s.config_map, s.key or ""),
    )
    rules: list[AgentRules] = []
    refused: list[str] = []
    for source in sources:
        try:
            cm = await kube.get_config_map(name=source.config_map, namespace=source.namespace)
        except Forbidden:
            refused.append(f"{source.namespace}/{source.config_map}")
            rules.append(AgentRules(source=source, unread="forbidden"))
            continue
        except NotFound:
            rules.append(AgentRules(source=source, unread="not found"))
            continue
        except KubeError:
            raise
        rules.append(rules_from_data(source, dict(cm.get("data") or {})))
    notes: tuple[str, ...] = ()
    if refused:
        notes = (
            f"the agents' rules ConfigMaps were not read (get configmaps forbidden: "
            f"{', '.join(refused)}): rules that can never trip are not checked; bind "
            "nodeguard-doctor-agent-rules (docs/doctor-rbac.yaml) in their namespace",
        )
    return tuple(agents), tuple(rules), notes
