"""What an action is given: the decision (:class:`Call`) and the agent's means (:class:`Env`).

The same :class:`Env` serves a real run and a dry run. A dry run gets :meth:`Env.limits` as
scratch copies of the eviction limiter and backoff: it spends the per-node limit and backs off
from a PodDisruptionBudget exactly as the real run would, and forgets it when it is done, so the
plan a dry run reports is the one a real run carries out (issue: the dry run is the real plan).
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from nodeguard.actions.audit import Auditor
from nodeguard.actions.base import ActionResult, Outcome
from nodeguard.actions.cordon import CordonConfig
from nodeguard.actions.limits import EvictionBackoff, EvictionLimiter
from nodeguard.firing import Firing
from nodeguard.kube.client import KubeClient
from nodeguard.snapshot import NodeSnapshot

__all__ = ["Call", "Env"]


def _no_snapshot() -> NodeSnapshot | None:
    return None


def _identity() -> str:
    return f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"


@dataclass(slots=True, kw_only=True)
class Env:
    """The agent's (or ``nodeguard act``'s) means to act.

    - ``kube``: the API, ``None`` without a cluster; ``auditor``: where results are audited.
    - ``node``: the agent's own node (Event source); ``identity``: unique per process (holds
      the cordon budget's Lease: two agents, or a restarted one whose old Lease is still live,
      never both believe they hold it).
    - ``cordon``: cordon mode and budget; ``limiter``/``backoff``: the per-node eviction limit
      and the PodDisruptionBudget backoff, kept in the state file by the agent.
    - ``usage``: pod UID -> bytes an eviction frees, for nodes whose snapshot this process
      does not have (``nodeguard act --agent-url``: the agent's unreclaimable memory, its
      working set where that is unknown); ``usage_measure`` names what it counts
      (:func:`~nodeguard.actions.ranking.usage_measure`).
    - ``pods_synced``: whether this process's pod list of ``node`` has been listed (the pod
      watch's first LIST, :meth:`nodeguard.kube.watch.PodWatcher.is_synced`); ``None`` where
      it keeps none (``nodeguard act`` lists the pods itself). ``latest``: the sampler's
      newest snapshot. Together they say when a step that plans from pods
      (:attr:`~nodeguard.actions.registry.Action.needs_pods`) can: :meth:`pod_data`.
    """

    kube: KubeClient | None
    auditor: Auditor
    node: str
    cordon: CordonConfig = field(default_factory=CordonConfig)
    limiter: EvictionLimiter = field(default_factory=EvictionLimiter)
    backoff: EvictionBackoff = field(default_factory=EvictionBackoff)
    identity: str = field(default_factory=_identity)
    usage: Mapping[str, int] = field(default_factory=dict)
    pods_synced: Callable[[], bool] | None = None
    latest: Callable[[], NodeSnapshot | None] = _no_snapshot

    def pod_data(self, firing: Firing) -> Firing | None:
        """``firing`` with a snapshot whose cgroups were named from a listed pod list (its
        ``pod_meta`` is set: names, priorities and working sets of this node's pods), or
        ``None`` while there is none yet. Its own snapshot where that one has it, else the
        newest (a firing decided, or resumed, on the first sample after a start carries one
        taken before the pod list arrived: ``pod_meta`` is ``None`` there, see
        :meth:`nodeguard.sampling.sampler.Sampler`). Unchanged where this process keeps no pod
        list or the firing is for another node: its plan lists that node's pods from the API."""
        if self.pods_synced is None or firing.node != self.node:
            return firing
        own = firing.snapshot
        if own is not None and own.node_name == firing.node and own.pod_meta is not None:
            return firing
        if not self.pods_synced():
            return None
        latest = self.latest()
        if latest is None or latest.node_name != firing.node or latest.pod_meta is None:
            return None  # listed, but no sample since has named the cgroups
        return firing.with_snapshot(latest)

    def pod_data_missing(self) -> str:
        """What :meth:`pod_data` still waits for, in words (for the abandon's record)."""
        if self.pods_synced is not None and not self.pods_synced():
            return f"the pod list of {self.node} has not been listed (the watch's first LIST)"
        return f"no snapshot has named the cgroups of {self.node} from its pod list"

    usage_measure: str = "unreclaimable memory"

    def limits(self, *, dry_run: bool) -> tuple[EvictionLimiter, EvictionBackoff]:
        """The limiter and backoff a run spends: the real ones, or in dry run copies that
        start from the same state and are then dropped."""
        if dry_run:
            return self.limiter.scratch(), self.backoff.scratch()
        return self.limiter, self.backoff


def _no_checkpoint() -> None:
    return None


@dataclass(slots=True, kw_only=True)
class Call:
    """One run of one firing's steps.

    - ``firing``: the decision (rule, scope, target, node to act on, evidence).
    - ``dry_run``: the effective dry run (the global one wins over a rule's).
    - ``note``: what Events and annotations say about why (the incident id and summary).
    - ``progress``: this step's journal record, which an action may fill as it goes (what it
      has already done) and read when the step is resumed after a restart; ``checkpoint()``
      writes it to the state file now (an action calls it after each irreversible write).
    - ``finishing``: the step is run again after a restart only to finish what it had under
      way (its ``progress`` is not empty) although its rule's condition no longer holds: an
      action completes and reports the writes it had started and starts nothing new.
    """

    env: Env
    firing: Firing
    dry_run: bool
    note: str
    progress: MutableMapping[str, Any] = field(default_factory=dict)
    checkpoint: Callable[[], None] = _no_checkpoint
    finishing: bool = False
    _limits: tuple[EvictionLimiter, EvictionBackoff] | None = None

    @property
    def kube(self) -> KubeClient | None:
        return self.env.kube

    @property
    def node(self) -> str:
        """The node acted on."""
        return self.firing.node

    @property
    def one_shot(self) -> bool:
        """Whether nothing runs this decision again: ``nodeguard act`` acts once and keeps no
        backoff, where the agent retries a failed step and remembers a budget's refusal."""
        return self.firing.source == "act"

    def limits(self) -> tuple[EvictionLimiter, EvictionBackoff]:
        """The limiter and backoff of this call: one pair for all its steps (in dry run, one
        scratch pair, so two evict steps of one firing see each other's spending)."""
        if self._limits is None:
            self._limits = self.env.limits(dry_run=self.dry_run)
        return self._limits

    def result(
        self,
        *,
        action: str,
        outcome: Outcome,
        message: str,
        details: Mapping[str, Any] | None = None,
        retry: bool = False,
    ) -> list[ActionResult]:
        """A one-result answer of ``action`` on this call's node, in this call's dry run."""
        return [
            ActionResult(
                action=action,
                node=self.node,
                dry_run=self.dry_run,
                outcome=outcome,
                message=message,
                details=details or {},
                retry=retry,
            )
        ]

    def api(self) -> KubeClient:
        """The API; the dispatcher refuses an action that needs one before calling it."""
        if self.env.kube is None:
            raise RuntimeError("no Kubernetes API: dispatch() should have refused this action")
        return self.env.kube
