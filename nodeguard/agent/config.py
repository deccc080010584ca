"""Everything ``nodeguard run`` was told (:mod:`nodeguard.cli.run` makes it from the flags)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from nodeguard.actions.cordon import CordonConfig
from nodeguard.connections import ConnectionLimits
from nodeguard.exposition.metric_filter import MetricFilter
from nodeguard.kube.client import REQUEST_TIMEOUT_SECONDS
from nodeguard.sampling.focus import NotifyConfig
from nodeguard.sampling.sampler import SamplerConfig

__all__ = ["DEFAULT_POSTURE_INTERVAL", "STATE_FILE", "AgentConfig"]

#: The remediation state's file name under ``--path.state``.
STATE_FILE = "remediation-state.json"
#: ``--posture.interval`` when not given, seconds (:mod:`nodeguard.agent.posture`: why a minute).
DEFAULT_POSTURE_INTERVAL = 60.0


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentConfig:
    """Everything ``nodeguard run`` was told. ``host=None`` listens on every address."""

    sampler: SamplerConfig
    host: str | None
    port: int
    dry_run: bool
    kubeconfig: Path | None
    rules: tuple[Path, ...] = ()
    incidents_dir: Path | None = None
    incidents_keep: int = 200
    cordon: CordonConfig = field(default_factory=CordonConfig)
    actor_namespace: str = "kube-system"
    actor_lease_seconds: int = 30
    evictions_per_window: int = 5
    eviction_window: float = 600.0
    concurrency: int = 2
    queue_size: int = 64
    webhook_token: str | None = None
    webhook_unauthenticated: bool = False
    webhook_node_label: str = "node"
    webhook_max_body: int = 1 << 20
    limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    metric_filter: MetricFilter = field(default_factory=MetricFilter)
    notify: NotifyConfig = field(default_factory=NotifyConfig)
    #: Seconds after SIGTERM to wait for the tasks before cancelling them (``--shutdown.timeout``).
    shutdown_timeout: float = 20.0
    pod_list_wait: float | None = None
    #: Seconds between evaluations of the doctor's node checks (``--posture.interval``; 0: off).
    posture_interval: float = DEFAULT_POSTURE_INTERVAL

    def pods_wait(self) -> float:
        """How long a step that plans from pods (an eviction) waits for this node's pod list
        and a sample that names the cgroups from it, seconds: ``pod_list_wait``, by default two
        sampling intervals and one API call's timeout (the watch's first LIST)."""
        if self.pod_list_wait is not None:
            return self.pod_list_wait
        return 2 * self.sampler.interval + REQUEST_TIMEOUT_SECONDS
