"""What the ``nodeguard-agents`` and ``node-reserve`` checks read beside the object lists: the
nodeguard agents (the DaemonSet's pods, their flags), the rules their ConfigMaps hold (loaded
by nodeguard's own loader), each kubelet's running configuration (``configz``), and the
reader's notes (what it could not read, said once).
"""

from __future__ import annotations

from dataclasses import dataclass

from nodeguard.rules.schema import AlertRule, Rule

__all__ = ["AgentRules", "AgentSettings", "AgentView", "KubeletConfigView", "RulesSource"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentSettings:
    """An agent's ``nodeguard run`` flags as its own parser reads them
    (:mod:`nodeguard.cli.run_flags`): ``--dry-run`` (default on), whether
    ``--webhook.token-file`` is given, ``--webhook.allow-unauthenticated``, the
    ``--listen-address`` host (``None``: every address) and the ``--rules`` paths."""

    dry_run: bool
    webhook_token_file: bool
    webhook_unauthenticated: bool
    listen_host: str | None
    rules: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class RulesSource:
    """A ConfigMap that a ``--rules`` path of an agent reads: ``key`` for a file mount (a
    ``subPath`` or one of the volume's ``items``), ``None`` for the directory of its keys."""

    namespace: str
    config_map: str
    key: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentView:
    """A nodeguard agent pod (labels ``app.kubernetes.io/name=nodeguard``,
    ``app.kubernetes.io/component=agent``): where it runs, whether it is running (phase
    ``Running``), its DaemonSet (``None``: no such owner), its container's arguments, the
    settings they make (``None``: not a ``nodeguard run`` the parser understands) and the
    ConfigMaps its rules come from."""

    namespace: str
    name: str
    node: str
    running: bool
    daemonset: str | None
    args: tuple[str, ...]
    settings: AgentSettings | None
    rules_sources: tuple[RulesSource, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentRules:
    """The rules of one :class:`RulesSource`, loaded as the agent loads them
    (:func:`nodeguard.rules.load.load_rules`): ``problems`` are the loader's messages when
    they do not load (the agent then has none of them), ``unread`` why the ConfigMap could
    not be read (``forbidden``, ``not found``)."""

    source: RulesSource
    rules: tuple[Rule, ...] = ()
    alerts: tuple[AlertRule, ...] = ()
    problems: tuple[str, ...] = ()
    unread: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class KubeletConfigView:
    """A node's kubelet configuration as ``configz`` reports it (KubeletConfiguration
    v1beta1, staging/src/k8s.io/kubelet/config/v1beta1/types.go): ``evictionHard``'s
    ``memory.available`` as written (``100Mi`` or ``5%``; ``None``: no memory threshold, the
    kubelet then evicts on memory never), ``systemReserved`` / ``kubeReserved`` memory in
    bytes (``None``: not set)."""

    node: str
    eviction_memory_available: str | None
    system_reserved_bytes: int | None
    kube_reserved_bytes: int | None
