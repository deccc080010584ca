"""Running a firing's actions: rule action names bound to :mod:`nodeguard.actions`.

Each action gets the firing (its scope, target and the snapshot it was decided on) and returns
:class:`~nodeguard.actions.base.ActionResult` values; ``evict`` on a GPU rule evicts only pods
using that GPU, lowest priority and most GPU memory first. Without a Kubernetes API (no
cluster) an action that needs one reports ``refused`` and says why: a dry run tells the truth
about what a real run could do.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from nodeguard.actions.audit import Auditor
from nodeguard.actions.base import ActionResult
from nodeguard.actions.cordon import CordonConfig, cordon, uncordon
from nodeguard.actions.evict import EvictionBackoff, EvictionLimiter, evict
from nodeguard.actions.katib import EXPERIMENT_LABEL, experiments_on_node, pause_katib, resume_katib
from nodeguard.actions.ranking import EvictFilter, EvictionPlan, plan_eviction
from nodeguard.kube.client import KubeClient
from nodeguard.kube.objects import parse_bytes, pod_meta
from nodeguard.rules.actions import CordonArgs, EvictArgs, KatibArgs
from nodeguard.rules.engine import Firing
from nodeguard.rules.schema import ActionSpec
from nodeguard.snapshot import PodMeta

__all__ = ["Runbook"]

log = logging.getLogger(__name__)
_DEFAULT_NODE_FREE = "5%"


@dataclass(slots=True, kw_only=True)
class Runbook:
    """What actions need: the API (``None`` without a cluster), the auditor, this node's name
    (also the Lease identity), cordon settings, eviction limits and backoff (kept across
    firings), and which Katib experiments each rule paused (for its resume)."""

    kube: KubeClient | None
    auditor: Auditor
    node: str
    cordon_config: CordonConfig = field(default_factory=CordonConfig)
    limiter: EvictionLimiter = field(default_factory=EvictionLimiter)
    backoff: EvictionBackoff = field(default_factory=EvictionBackoff)
    paused: dict[tuple[str, str], list[tuple[str, str]]] = field(default_factory=dict)
    #: Holds the cordon budget's Lease: unique per agent process, so two agents (or a restarted
    #: one whose old Lease is still live) never both believe they hold it.
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}")

    async def run(
        self, spec: ActionSpec, *, firing: Firing, dry_run: bool, note: str
    ) -> list[ActionResult]:
        """Run one action of a firing; never raises."""
        impl = _IMPLS[spec.action]
        if spec.action != "record" and self.kube is None:
            return [
                ActionResult(
                    action=spec.action,
                    node=self.node,
                    dry_run=dry_run,
                    outcome="refused",
                    message=f"{'would ' if dry_run else ''}{spec.action}: not "
                    "possible, no Kubernetes API configured (--kubeconfig)",
                )
            ]
        try:
            return await impl(self, spec.parsed_args(), firing, dry_run, note)
        except Exception as exc:  # an action's bug must not kill the remediator
            log.exception("action %s of rule %s failed", spec.action, firing.rule)
            return [
                ActionResult(
                    action=spec.action,
                    node=self.node,
                    dry_run=dry_run,
                    outcome="failed",
                    message=f"{type(exc).__name__}: {exc}",
                )
            ]

    def _api(self) -> KubeClient:
        assert self.kube is not None  # checked in run()
        return self.kube


Impl = Callable[[Runbook, Any, Firing, bool, str], Awaitable[list[ActionResult]]]


async def _cordon(
    rb: Runbook, args: CordonArgs, firing: Firing, dry: bool, note: str
) -> list[ActionResult]:
    cfg = dataclasses.replace(rb.cordon_config, mode=args.mode)
    return [
        await cordon(
            kube=rb._api(),
            auditor=rb.auditor,
            node=firing.node,
            rule=firing.rule,
            reason=note,
            identity=f"{rb.node}/{rb.identity}",
            dry_run=dry,
            config=cfg,
        )
    ]


async def _uncordon(
    rb: Runbook, args: CordonArgs, firing: Firing, dry: bool, note: str
) -> list[ActionResult]:
    return [
        await uncordon(
            kube=rb._api(),
            auditor=rb.auditor,
            node=firing.node,
            rule=firing.rule,
            dry_run=dry,
            config=rb.cordon_config,
            only_rule=firing.rule,
        )
    ]


def _free_bytes(value: str, firing: Firing) -> int | None:
    """A ``free`` argument in bytes; ``None`` for a percent of a node whose MemTotal this agent
    does not know (an alert about another node)."""
    if value.endswith("%"):
        snap = firing.snapshot
        mem = snap.meminfo if snap and snap.node_name == firing.node else None
        if mem is None or not mem.total_bytes:
            return None
        return int(mem.total_bytes * float(value[:-1]) / 100.0)
    return parse_bytes(value)


async def _pods(rb: Runbook, firing: Firing) -> tuple[dict[str, PodMeta], dict[str, int]]:
    """The pods of the firing's node and their working sets: from the snapshot for this node;
    from the API for another node (an alert about it), without working sets."""
    snap = firing.snapshot
    if snap is not None and snap.node_name == firing.node and snap.pod_meta is not None:
        usage = {
            p.uid: p.memory.working_set_bytes
            for p in snap.pods
            if p.memory.working_set_bytes is not None
        }
        return dict(snap.pod_meta), usage
    items, _ = await rb._api().list_pods(node_name=firing.node)
    return {m.uid: m for m in (pod_meta(p) for p in items)}, {}


def _firing_pod(firing: Firing, pods: dict[str, PodMeta]) -> str | None:
    """The UID of the pod a firing is about: given, or found by namespace/name (alerts)."""
    if firing.pod_uid:
        return firing.pod_uid
    if firing.pod_ref:
        return next((m.uid for m in pods.values() if (m.namespace, m.name) == firing.pod_ref), None)
    return None


async def _evict(
    rb: Runbook, args: EvictArgs, firing: Firing, dry: bool, note: str
) -> list[ActionResult]:
    flt = EvictFilter(
        max_priority=args.max_priority,
        priority_classes=frozenset(args.priority_classes) if args.priority_classes else None,
        namespaces=frozenset(args.namespaces) if args.namespaces else None,
        labels=args.selector,
    )
    if firing.scope == "gpu":
        return [await _evict_from_gpu(rb, args, firing, dry=dry, note=note, flt=flt)]
    pods, usage = await _pods(rb, firing)
    plan = plan_eviction(pods=pods, usage=usage, flt=flt)
    pod_uid = _firing_pod(firing, pods)
    if firing.scope in ("pod", "container"):
        # The pod of the firing, with its gang, and nothing else.
        mine = tuple((u, why) for u, why in plan.ranked if any(p.uid == pod_uid for p in u.pods))
        if not mine:
            why = next(
                (e.reason for e in plan.excluded if e.pod.uid == pod_uid),
                "not in this node's pod list",
            )
            return [
                _refused_evict(
                    firing=firing,
                    dry=dry,
                    message=f"not evicting pod {pod_uid or firing.pod_ref}: {why}",
                )
            ]
        plan = EvictionPlan(ranked=mine, excluded=plan.excluded)
        wanted = _free_bytes(args.free, firing) if args.free else 0
    else:
        wanted = _free_bytes(args.free or _DEFAULT_NODE_FREE, firing)
    if wanted is None:
        return [
            _refused_evict(
                firing=firing,
                dry=dry,
                message=f"free: {args.free or _DEFAULT_NODE_FREE} is a share of "
                f"{firing.node}'s MemTotal, which only its own agent knows",
            )
        ]
    target = wanted
    return [
        await evict(
            kube=rb._api(),
            auditor=rb.auditor,
            node=firing.node,
            plan=plan,
            target_bytes=target,
            rule=f"{firing.rule} ({note})",
            dry_run=dry,
            limiter=rb.limiter,
            backoff=rb.backoff,
        )
    ]


async def _evict_from_gpu(
    rb: Runbook, args: EvictArgs, firing: Firing, *, dry: bool, note: str, flt: EvictFilter
) -> ActionResult:
    """A GPU rule evicts only pods with processes on that GPU (the firing's target, a UUID):
    lowest priority first, then the most GPU memory on it. ``free`` counts GPU memory on that
    GPU (a quantity, or a percent of its total); without it, the first unit alone."""
    snap = firing.snapshot
    device = None
    if snap is not None and snap.node_name == firing.node and snap.gpu and snap.pod_meta:
        device = next((d for d in snap.gpu.devices if d.key == firing.target), None)
    if snap is None or device is None:
        return _refused_evict(
            firing=firing,
            dry=dry,
            message=f"no GPU {firing.target} with this node's pod list in the snapshot",
        )
    usage: dict[str, int] = {}
    unknown: set[str] = set()
    for u in snap.gpu_containers():
        if u.gpu_index == device.index and u.used_bytes is None:
            unknown.add(u.pod_uid)
        elif u.gpu_index == device.index and u.used_bytes is not None:
            usage[u.pod_uid] = usage.get(u.pod_uid, 0) + u.used_bytes
    on_gpu = unknown | set(usage)
    pods = {uid: m for uid, m in (snap.pod_meta or {}).items() if uid in on_gpu}
    for uid in unknown:
        usage.pop(uid, None)  # part of its GPU memory is unknown, so is its total
    plan = plan_eviction(pods=pods, usage=usage, flt=flt)
    ranked = sorted(plan.ranked, key=lambda r: (r[0].priority, -r[0].usage_bytes, r[0].key))
    where = f"GPU {device.index} ({device.key})"
    reasons = []
    for unit, _ in ranked:
        known = f"{unit.usage_bytes} B of GPU memory on {where}"
        why = known if unit.usage_known else f"GPU memory on {where} unknown"
        why += f"; priority {unit.priority}"
        if unit.kind != "pod":
            why += f"; {unit.kind} of {len(unit.pods)} pod(s) on this GPU, evicted together"
        reasons.append((unit, why))
    target = 0
    if args.free and args.free.endswith("%"):
        if device.memory is None:
            return _refused_evict(
                firing=firing,
                dry=dry,
                message=f"free: {args.free} of {where}, whose total memory is unknown",
            )
        target = int(device.memory.total_bytes * float(args.free[:-1]) / 100.0)
    elif args.free:
        target = parse_bytes(args.free)
    return await evict(
        kube=rb._api(),
        auditor=rb.auditor,
        node=firing.node,
        plan=EvictionPlan(ranked=tuple(reasons), excluded=plan.excluded),
        target_bytes=target,
        rule=f"{firing.rule} ({note})",
        dry_run=dry,
        limiter=rb.limiter,
        backoff=rb.backoff,
    )


async def _experiments(rb: Runbook, firing: Firing) -> list[tuple[str, str]]:
    pods, _ = await _pods(rb, firing)
    uid = _firing_pod(firing, pods)
    if firing.scope in ("pod", "container") and uid and uid in pods:
        meta = pods[uid]
        exp = meta.labels.get(EXPERIMENT_LABEL)
        return [(meta.namespace, exp)] if exp else []
    return experiments_on_node(pods)


async def _pause(
    rb: Runbook, args: KatibArgs, firing: Firing, dry: bool, note: str
) -> list[ActionResult]:
    experiments = await _experiments(rb, firing)
    if not experiments:
        return [
            ActionResult(
                action="pause_katib",
                node=firing.node,
                dry_run=dry,
                outcome="noop",
                message="no Katib experiment has trials on this node",
            )
        ]
    results = await pause_katib(
        kube=rb._api(),
        auditor=rb.auditor,
        node=firing.node,
        experiments=experiments,
        floor=args.floor,
        dry_run=dry,
        note=note,
        by=f"{firing.node}/{firing.rule}",
    )
    if not dry:
        key = (firing.rule, firing.target)
        done = [
            tuple(r.details["experiment"].split("/", 1))
            for r in results
            if r.outcome in ("done", "noop") and "experiment" in r.details
        ]
        rb.paused[key] = sorted({*rb.paused.get(key, []), *((a, b) for a, b in done)})
    return results


async def _resume(
    rb: Runbook, args: BaseModel, firing: Firing, dry: bool, note: str
) -> list[ActionResult]:
    key = (firing.rule, firing.target)
    experiments = sorted({*rb.paused.get(key, []), *(await _experiments(rb, firing))})
    if not experiments:
        return [
            ActionResult(
                action="resume_katib",
                node=firing.node,
                dry_run=dry,
                outcome="noop",
                message="no Katib experiment to resume",
            )
        ]
    results = await resume_katib(
        kube=rb._api(),
        auditor=rb.auditor,
        node=firing.node,
        experiments=experiments,
        dry_run=dry,
        note=note,
        only_by=f"{firing.node}/{firing.rule}",
    )
    if not dry and all(r.outcome != "failed" for r in results):
        rb.paused.pop(key, None)
    return results


async def _record(
    rb: Runbook, args: BaseModel, firing: Firing, dry: bool, note: str
) -> list[ActionResult]:
    return [
        ActionResult(
            action="record",
            node=firing.node,
            dry_run=dry,
            outcome="done",
            message=f"evidence recorded: {note}",
        )
    ]


_IMPLS: dict[str, Impl] = {
    "cordon": _cordon,
    "uncordon": _uncordon,
    "evict": _evict,
    "pause_katib": _pause,
    "resume_katib": _resume,
    "record": _record,
}


def _refused_evict(*, firing: Firing, dry: bool, message: str) -> ActionResult:
    """An evict that this runbook refuses before asking the API, and why."""
    return ActionResult(
        action="evict", node=firing.node, dry_run=dry, outcome="refused", message=message
    )
