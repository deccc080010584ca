"""Cordon and uncordon, with a cluster-wide budget decided under a Lease.

Cordoning sets ``spec.unschedulable`` (what ``kubectl cordon`` does) or, if configured, adds a
NoSchedule taint; either way nodeguard labels the node ``nodeguard.io/cordoned=true`` and
annotates who, which rule, why and when. It only uncordons nodes that carry its own mark: a node
an operator cordoned stays cordoned.

The budget (at most N nodes, or N % of nodes, cordoned by nodeguard at once) is counted and the
node patched while holding a ``coordination.k8s.io/v1`` Lease used as a mutex: the holder writes
its identity and renew time; another agent waits until the holder releases it or the lease
expires (``leaseDurationSeconds`` after ``renewTime``). Updates carry the Lease's
resourceVersion, so of two agents racing for a free Lease exactly one wins (the other gets 409).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import random
import time
from dataclasses import dataclass
from typing import Any, Literal

from nodeguard.actions.audit import Auditor, ObjectRef
from nodeguard.actions.base import ActionResult
from nodeguard.kube.client import JSON, KubeClient
from nodeguard.kube.errors import Conflict, KubeError, NotFound

__all__ = ["BudgetLease", "CordonConfig", "cordon", "is_cordoned_by_us", "uncordon"]

LABEL = "nodeguard.io/cordoned"
ANN_BY = "nodeguard.io/cordoned-by"
ANN_RULE = "nodeguard.io/cordon-rule"
ANN_REASON = "nodeguard.io/cordon-reason"
ANN_TIME = "nodeguard.io/cordoned-at"
_ANNOTATIONS = (ANN_BY, ANN_RULE, ANN_REASON, ANN_TIME)


@dataclass(frozen=True, slots=True, kw_only=True)
class CordonConfig:
    """How to cordon, and the budget.

    ``mode``: ``unschedulable`` or ``taint`` (``taint_key``/``taint_effect``).
    ``budget_nodes`` / ``budget_percent``: at most this many nodes (or percent of all nodes,
    rounded down, at least 1) cordoned by nodeguard at once; both ``None``: no budget.
    ``lease_namespace``/``lease_name``: the Lease that serialises budget decisions;
    ``lease_seconds`` its duration; ``lock_timeout`` how long to wait for it.
    """

    mode: Literal["unschedulable", "taint"] = "unschedulable"
    taint_key: str = "nodeguard.io/memory-pressure"
    taint_effect: str = "NoSchedule"
    budget_nodes: int | None = None
    budget_percent: float | None = None
    lease_namespace: str = "kube-system"
    lease_name: str = "nodeguard-cordon-budget"
    lease_seconds: int = 15
    lock_timeout: float = 30.0


def _micro_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_time(value: str | None) -> float | None:
    if not value:
        return None
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


class BudgetLease:
    """A Lease held as a mutex while the budget is counted and the node patched.

    ``async with BudgetLease(...)``: acquires (waiting with jittered backoff while another live
    holder has it, up to ``timeout``; raises :class:`TimeoutError`), releases on exit. In dry
    run it waits the same way but writes nothing.
    """

    def __init__(
        self,
        *,
        kube: KubeClient,
        namespace: str,
        name: str,
        identity: str,
        duration: int,
        timeout: float,
        dry_run: bool,
    ) -> None:
        self._kube, self._ns, self._name = kube, namespace, name
        self._id, self._duration, self._timeout, self._dry = identity, duration, timeout, dry_run
        self.waited = 0

    def _held_by_other(self, lease: JSON) -> bool:
        spec = lease.get("spec", {})
        holder = spec.get("holderIdentity")
        if not holder or holder == self._id:
            return False
        renewed = _parse_time(spec.get("renewTime") or spec.get("acquireTime"))
        duration = spec.get("leaseDurationSeconds") or self._duration
        return renewed is not None and renewed + duration > time.time()

    async def _try_acquire(self) -> bool:
        now = _micro_now()
        try:
            lease = await self._kube.get_lease(name=self._name, namespace=self._ns)
        except NotFound:
            if self._dry:
                return True
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self._name, "namespace": self._ns},
                "spec": {
                    "holderIdentity": self._id,
                    "leaseDurationSeconds": self._duration,
                    "acquireTime": now,
                    "renewTime": now,
                    "leaseTransitions": 0,
                },
            }
            try:
                await self._kube.create_lease(namespace=self._ns, body=body)
                return True
            except Conflict:
                return False
        if self._held_by_other(lease):
            return False
        if self._dry:
            return True
        spec = lease.setdefault("spec", {})
        spec.update(
            holderIdentity=self._id,
            leaseDurationSeconds=self._duration,
            acquireTime=now,
            renewTime=now,
            leaseTransitions=int(spec.get("leaseTransitions") or 0) + 1,
        )
        try:
            await self._kube.replace_lease(name=self._name, namespace=self._ns, body=lease)
            return True
        except Conflict:
            return False

    async def __aenter__(self) -> BudgetLease:
        deadline = time.monotonic() + self._timeout
        delay = 0.05
        while not await self._try_acquire():
            self.waited += 1
            if time.monotonic() > deadline:
                raise TimeoutError(f"Lease {self._ns}/{self._name} still held by another agent")
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 1.0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._dry:
            return
        try:
            lease = await self._kube.get_lease(name=self._name, namespace=self._ns)
            if lease.get("spec", {}).get("holderIdentity") == self._id:
                lease["spec"]["holderIdentity"] = None
                await self._kube.replace_lease(name=self._name, namespace=self._ns, body=lease)
        except KubeError:
            pass  # it expires by itself after leaseDurationSeconds


def is_cordoned_by_us(node: JSON) -> bool:
    """Whether nodeguard's mark is on the node."""
    return bool(node.get("metadata", {}).get("labels", {}).get(LABEL) == "true")


def _cordoned(node: JSON, config: CordonConfig) -> bool:
    if config.mode == "taint":
        return any(
            t.get("key") == config.taint_key for t in node.get("spec", {}).get("taints") or []
        )
    return bool(node.get("spec", {}).get("unschedulable"))


def _allowed(config: CordonConfig, total: int) -> int | None:
    limits = []
    if config.budget_nodes is not None:
        limits.append(config.budget_nodes)
    if config.budget_percent is not None:
        limits.append(max(1, math.floor(total * config.budget_percent / 100.0)))
    return min(limits) if limits else None


def _cordon_patch(
    node: JSON, *, config: CordonConfig, identity: str, rule: str, reason: str
) -> JSON:
    meta: dict[str, Any] = {
        "resourceVersion": node["metadata"]["resourceVersion"],
        "labels": {LABEL: "true"},
        "annotations": {
            ANN_BY: identity,
            ANN_RULE: rule,
            ANN_REASON: reason[:512],
            ANN_TIME: _micro_now(),
        },
    }
    if config.mode == "taint":
        taints = list(node.get("spec", {}).get("taints") or [])
        taints.append({"key": config.taint_key, "value": "true", "effect": config.taint_effect})
        return {"metadata": meta, "spec": {"taints": taints}}
    return {"metadata": meta, "spec": {"unschedulable": True}}


async def cordon(
    *,
    kube: KubeClient,
    auditor: Auditor,
    node: str,
    rule: str,
    reason: str,
    identity: str,
    dry_run: bool,
    config: CordonConfig = CordonConfig(),
) -> ActionResult:
    """Cordon ``node`` if the budget allows. Outcomes: done; noop (already cordoned, by us or
    by someone else — then left alone); refused (budget spent, or the Lease not obtained);
    failed (API error: nothing was changed, retry later)."""
    verb = "would cordon" if dry_run else "cordoned"

    def result(outcome: Any, message: str, **details: Any) -> ActionResult:
        return ActionResult(
            action="cordon",
            node=node,
            dry_run=dry_run,
            outcome=outcome,
            message=message,
            details=details,
        )

    ref = ObjectRef(kind="Node", name=node)
    try:
        current = await kube.get_node(name=node)
        ref.uid = current["metadata"].get("uid", "")
        if is_cordoned_by_us(current):
            return result("noop", f"{node} is already cordoned by nodeguard")
        if _cordoned(current, config):
            return result("noop", f"{node} is already cordoned by someone else; left alone")
        async with BudgetLease(
            kube=kube,
            namespace=config.lease_namespace,
            name=config.lease_name,
            identity=identity,
            duration=config.lease_seconds,
            timeout=config.lock_timeout,
            dry_run=dry_run,
        ):
            ours = await kube.list_nodes(label_selector=f"{LABEL}=true")
            total = len(await kube.list_nodes()) if config.budget_percent is not None else 0
            allowed = _allowed(config, total)
            if allowed is not None and len(ours) >= allowed:
                res = result(
                    "refused",
                    f"not cordoning {node}: budget spent, {len(ours)} of "
                    f"{allowed} node(s) already cordoned by nodeguard "
                    f"({', '.join(n['metadata']['name'] for n in ours)})",
                    cordoned=len(ours),
                    allowed=allowed,
                )
                await auditor.record(
                    result=res, obj=ref, reason="NodeguardCordonRefused", event_type="Warning"
                )
                return res
            # Re-read under the lock: the patch carries this resourceVersion.
            current = await kube.get_node(name=node)
            patch = _cordon_patch(
                current, config=config, identity=identity, rule=rule, reason=reason
            )
            await kube.patch_node(name=node, patch=patch, dry_run=dry_run)
    except TimeoutError as exc:
        return result("refused", f"not cordoning {node}: {exc}")
    except KubeError as exc:
        res = result("failed", f"cordon of {node} failed: {type(exc).__name__}: {exc}")
        await auditor.record(
            result=res, obj=ref, reason="NodeguardCordonFailed", event_type="Warning"
        )
        return res
    res = result(
        "done", f"{verb} {node} ({config.mode}) for rule {rule}: {reason}", mode=config.mode
    )
    await auditor.record(result=res, obj=ref, reason="NodeguardCordoned", event_type="Warning")
    return res


async def uncordon(
    *,
    kube: KubeClient,
    auditor: Auditor,
    node: str,
    rule: str,
    dry_run: bool,
    config: CordonConfig = CordonConfig(),
) -> ActionResult:
    """Undo nodeguard's cordon of ``node``; a node without nodeguard's mark is left alone."""

    def result(outcome: Any, message: str) -> ActionResult:
        return ActionResult(
            action="uncordon", node=node, dry_run=dry_run, outcome=outcome, message=message
        )

    ref = ObjectRef(kind="Node", name=node)
    try:
        current = await kube.get_node(name=node)
        ref.uid = current["metadata"].get("uid", "")
        if not is_cordoned_by_us(current):
            return result("noop", f"{node} is not cordoned by nodeguard; left alone")
        spec: JSON = {}
        if config.mode == "taint":
            spec["taints"] = [
                t
                for t in current.get("spec", {}).get("taints") or []
                if t.get("key") != config.taint_key
            ] or None
        else:
            spec["unschedulable"] = None
        patch = {
            "metadata": {
                "resourceVersion": current["metadata"]["resourceVersion"],
                "labels": {LABEL: None},
                "annotations": dict.fromkeys(_ANNOTATIONS),
            },
            "spec": spec,
        }
        await kube.patch_node(name=node, patch=patch, dry_run=dry_run)
    except KubeError as exc:
        res = result("failed", f"uncordon of {node} failed: {type(exc).__name__}: {exc}")
        await auditor.record(
            result=res, obj=ref, reason="NodeguardUncordonFailed", event_type="Warning"
        )
        return res
    res = result("done", f"{'would uncordon' if dry_run else 'uncordoned'} {node} (rule {rule})")
    await auditor.record(result=res, obj=ref, reason="NodeguardUncordoned")
    return res
