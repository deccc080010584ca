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
import dataclasses
import datetime as dt
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from nodeguard.actions.args import ActionArgs, Count, Flag, Percent
from nodeguard.actions.base import ActionResult, AuditEvent, ObjectRef
from nodeguard.actions.cordon_budget import (
    ANN_NODES_AT,
    allowed,
    cached_total,
    notes,
    spent_in_notes,
)
from nodeguard.actions.registry import Action, Settings, register
from nodeguard.kube.client import JSON, KubeClient
from nodeguard.kube.errors import Conflict, KubeError, NotFound

if TYPE_CHECKING:
    from nodeguard.actions.context import Call

__all__ = [
    "CORDON_SETTINGS",
    "BudgetLease",
    "CordonArgs",
    "CordonConfig",
    "CordonSettings",
    "cordon",
    "cordoned_by_rule",
    "is_cordoned_by_us",
    "uncordon",
]

LABEL = "nodeguard.io/cordoned"
ANN_BY = "nodeguard.io/cordoned-by"
ANN_RULE = "nodeguard.io/cordon-rule"
ANN_REASON = "nodeguard.io/cordon-reason"
ANN_TIME = "nodeguard.io/cordoned-at"
ANN_MODE = "nodeguard.io/cordon-mode"
DEFAULT_TAINT = "nodeguard.io/memory-pressure"
_ANNOTATIONS = (ANN_BY, ANN_RULE, ANN_REASON, ANN_TIME, ANN_MODE)


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
    taint_key: str = DEFAULT_TAINT
    taint_effect: str = "NoSchedule"
    budget_nodes: int | None = None
    budget_percent: float | None = None
    lease_namespace: str = "kube-system"
    lease_name: str = "nodeguard-cordon-budget"
    lease_seconds: int = 15
    lock_timeout: float = 30.0


def _micro_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class BudgetSpent(Exception):
    """An agent waiting for the budget Lease read on it that the budget is spent
    (:func:`~nodeguard.actions.cordon_budget.spent_in_notes`)."""


class BudgetLease:
    """A Lease held as a mutex while the budget is counted and the node patched.

    ``async with BudgetLease(...)``: acquires (waiting with jittered backoff while another live
    holder has it, up to ``timeout`` seconds; raises :class:`TimeoutError`), releases on exit.
    In dry run it waits the same way but writes nothing. ``clock`` (monotonic seconds) and
    ``sleep`` are injectable, so tests drive the wait on a fake clock.

    Whether another holder's Lease has expired is judged as client-go's leader election does:
    by how long this agent has watched the same ``renewTime`` stay unchanged, on its own
    monotonic clock, never by comparing the holder's timestamps with this machine's clock (the
    nodes' clocks may disagree). The holder does not renew: it must finish within the lease, and
    :meth:`check` says whether it still may write.
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
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        spent: Callable[[JSON], Awaitable[str | None]] | None = None,
    ) -> None:
        self._kube, self._ns, self._name = kube, namespace, name
        self._id, self._duration, self._timeout, self._dry = identity, duration, timeout, dry_run
        self._clock, self._sleep, self._spent = clock, sleep, spent
        self._observed: tuple[str, str] | None = None
        self._observed_at = 0.0
        self._acquired_at = 0.0
        #: The Lease as it was when acquired (``None``: made by this agent, or a dry run's).
        self.lease: JSON | None = None
        #: Annotations to write on the Lease when it is let go (the budget's notes).
        self.notes: dict[str, str] = {}

    def _held_by_other(self, lease: JSON) -> bool:
        spec = lease.get("spec", {})
        holder = spec.get("holderIdentity")
        if not holder or holder == self._id:
            return False
        record = (str(holder), str(spec.get("renewTime") or spec.get("acquireTime") or ""))
        now = self._clock()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = float(spec.get("leaseDurationSeconds") or self._duration)
        return now - self._observed_at < duration

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
            why = await self._spent(lease) if self._spent is not None else None
            if why is not None:  # the holders before said the budget is spent: no point waiting
                raise BudgetSpent(why)
            return False
        self.lease = lease
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
        deadline = self._clock() + self._timeout
        delay = 0.05
        while not await self._try_acquire():
            left = deadline - self._clock()
            if left <= 0:
                raise TimeoutError(f"Lease {self._ns}/{self._name} still held by another agent")
            # never sleep past the deadline: one last try at it, then give up on time
            await self._sleep(min(delay * (0.5 + random.random()), left))
            delay = min(delay * 2, 1.0)
        self._acquired_at = self._clock()
        return self

    def check(self) -> None:
        """Raise :class:`TimeoutError` when less than a third of the lease is left: another
        agent may take it over soon, so no decision made under it may be written any more."""
        if self._clock() - self._acquired_at > self._duration * 2 / 3:
            raise TimeoutError(
                f"Lease {self._ns}/{self._name} held too long (slow API server); "
                "giving up rather than deciding on a stale budget"
            )

    async def __aexit__(self, *exc: object) -> None:
        if self._dry:
            return
        try:
            lease = await self._kube.get_lease(name=self._name, namespace=self._ns)
            if lease.get("spec", {}).get("holderIdentity") == self._id:
                lease["spec"]["holderIdentity"] = None
                if self.notes:
                    meta = lease.setdefault("metadata", {})
                    meta["annotations"] = {**(meta.get("annotations") or {}), **self.notes}
                await self._kube.replace_lease(name=self._name, namespace=self._ns, body=lease)
        except KubeError:
            pass  # it expires by itself after leaseDurationSeconds


def _taint_present(node: JSON, key: str) -> bool:
    return any(t.get("key") == key for t in node.get("spec", {}).get("taints") or [])


def _recorded_mode(node: JSON) -> str:
    annotations = node.get("metadata", {}).get("annotations") or {}
    return str(annotations.get(ANN_MODE, "unschedulable"))


def _marked(node: JSON) -> bool:
    return bool(node.get("metadata", {}).get("labels", {}).get(LABEL) == "true")


def is_cordoned_by_us(node: JSON, *, taint_key: str = DEFAULT_TAINT) -> bool:
    """Whether nodeguard's mark is on the node and its cordon (in the recorded mode) is still
    in place. A mark whose cordon someone removed (``kubectl uncordon``) is stale: not ours."""
    if not _marked(node):
        return False
    if _recorded_mode(node) == "taint":
        return _taint_present(node, taint_key)
    return bool(node.get("spec", {}).get("unschedulable"))


def _cordoned(node: JSON, config: CordonConfig) -> bool:
    if config.mode == "taint":
        return _taint_present(node, config.taint_key)
    return bool(node.get("spec", {}).get("unschedulable"))


def _allowed(config: CordonConfig, total: int) -> int | None:
    return allowed(
        budget_nodes=config.budget_nodes, budget_percent=config.budget_percent, total=total
    )


Refusal = tuple[str, dict[str, Any]]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Budget:
    """The cordon budget of ``node`` (:mod:`nodeguard.actions.cordon_budget`): checked once
    before the Lease is contended for, and counted under it."""

    kube: KubeClient
    node: str
    config: CordonConfig

    async def _ours(self) -> list[JSON]:
        """nodeguard's cordons but this node's: a label-selected list, a few Nodes."""
        marked = await self.kube.list_nodes(label_selector=f"{LABEL}=true")
        return [
            n
            for n in marked
            if n["metadata"]["name"] != self.node
            and is_cordoned_by_us(n, taint_key=self.config.taint_key)
        ]

    def _refusal(self, held: list[JSON], most: int | None) -> Refusal | None:
        if most is None or len(held) < most:
            return None
        names = ", ".join(n["metadata"]["name"] for n in held) or "none"
        return (
            f"not cordoning {self.node}: budget spent, {len(held)} of "
            f"{most} node(s) already cordoned by nodeguard ({names})",
            {"cordoned": len(held), "allowed": most},
        )

    async def spent_in_notes(self, lease: JSON) -> str | None:
        """:class:`BudgetLease`'s ``spent``: the notes of the holders before say the budget is
        spent, and nodeguard's cordons (the label-selected list) confirm it. Notes alone can be
        stale (nodes uncordoned since): then this agent waits its turn and counts."""
        c = self.config
        if spent_in_notes(lease, budget_nodes=c.budget_nodes, budget_percent=c.budget_percent):
            total = cached_total(lease) if c.budget_percent is not None else 0
            refusal = self._refusal(await self._ours(), _allowed(c, total or 0))
            return refusal[0] if refusal is not None else None
        return None

    async def before_lease(self) -> Refusal | None:
        """A budget spent, refused at once before contending for the Lease (a thousand agents
        pressured together need not queue for it only to count and refuse); the Node count
        only from the Lease's notes (``None`` without a fresh one: counted under the Lease)."""
        c = self.config
        if c.budget_nodes is None and c.budget_percent is None:
            return None
        total: int | None = 0
        if c.budget_percent is not None:
            try:
                lease = await self.kube.get_lease(name=c.lease_name, namespace=c.lease_namespace)
            except NotFound:
                return None
            total = cached_total(lease)
        if total is None:
            return None
        return self._refusal(await self._ours(), _allowed(c, total))

    async def under_lease(self, lease: BudgetLease) -> Refusal | None:
        """Count under the Lease and leave the notes for the next holders. The Node count of
        the notes (while fresh) only refuses; a cordon is decided on Nodes listed now, so a
        hand-edited or stale count never cordons more than the budget."""
        c = self.config
        held = await self._ours()
        total, counted_at = 0, None
        if c.budget_percent is not None:
            cached = cached_total(lease.lease)
            if cached is not None and (spent := self._refusal(held, _allowed(c, cached))):
                # Refused on the count of the holders before (a count too small, after the
                # cluster grew, refuses more: the safe side); never cordoned on one.
                lease.notes = notes(
                    total=cached, counted_at=_counted_at(lease.lease), cordoned=len(held)
                )
                return spent
            # A cordon is decided on the Nodes counted now: at most the budget's cordons each
            # list them, not every agent of a cluster-wide incident.
            total, counted_at = len(await self.kube.list_nodes()), time.time()
        refusal = self._refusal(held, _allowed(c, total))
        lease.notes = notes(
            total=total if c.budget_percent is not None else None,
            counted_at=counted_at,
            cordoned=len(held) + (0 if refusal else 1),
        )
        return refusal


def _counted_at(lease: JSON | None) -> float | None:
    """When the Lease's Node count was made (kept as it was when it is reused)."""
    try:
        return float(((lease or {}).get("metadata") or {}).get("annotations", {})[ANN_NODES_AT])
    except (KeyError, TypeError, ValueError):
        return None


def _cordon_patch(
    node: JSON, *, config: CordonConfig, identity: str, rule: str, reason: str
) -> JSON:
    meta: dict[str, Any] = {
        "labels": {LABEL: "true"},
        "annotations": {
            ANN_BY: identity,
            ANN_RULE: rule,
            ANN_REASON: reason[:512],
            ANN_TIME: _micro_now(),
            ANN_MODE: config.mode,
        },
    }
    if config.mode == "taint":
        # A merge patch replaces the whole list: carry the resourceVersion so a taint added
        # meanwhile is a Conflict (and a retry), never lost.
        meta["resourceVersion"] = node["metadata"]["resourceVersion"]
        taints = list(node.get("spec", {}).get("taints") or [])
        taints.append({"key": config.taint_key, "value": "true", "effect": config.taint_effect})
        return {"metadata": meta, "spec": {"taints": taints}}
    # A bool needs no precondition: kubelet status writes between read and patch are harmless.
    return {"metadata": meta, "spec": {"unschedulable": True}}


class CordonArgs(ActionArgs):
    """``mode``: ``unschedulable`` (``spec.unschedulable``, as ``kubectl cordon``) or
    ``taint`` (a NoSchedule taint); default: the agent's ``--cordon.mode``."""

    # By hand, the setting ``--cordon.mode`` is this choice: one flag, not two.
    mode: Annotated[Literal["unschedulable", "taint"] | None, Flag(cli=False)] = None


class CordonSettings(BaseModel):
    """The cordon settings of ``nodeguard run`` and ``nodeguard act cordon``/``uncordon``
    (``--cordon.FIELD``): the part of :class:`CordonConfig` an operator chooses."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["unschedulable", "taint"] = Field(
        default="unschedulable",
        description="spec.unschedulable, or a NoSchedule taint (default unschedulable)",
    )
    budget_nodes: Annotated[Count | None, Flag(metavar="COUNT")] = Field(
        default=None,
        description="at most this many nodes cordoned by nodeguard at once (default: no budget)",
    )
    budget_percent: Annotated[Percent | None, Flag(metavar="PERCENT")] = Field(
        default=None,
        description="at most this percent of the nodes cordoned by nodeguard at once "
        "(default: no budget)",
    )
    lease_namespace: Annotated[str, Flag(metavar="NAMESPACE")] = Field(
        default="kube-system", description="namespace of the budget's Lease (default kube-system)"
    )

    def config(self) -> CordonConfig:
        """These settings, the rest of :class:`CordonConfig` at its defaults."""
        return CordonConfig(
            mode=self.mode,
            budget_nodes=self.budget_nodes,
            budget_percent=self.budget_percent,
            lease_namespace=self.lease_namespace,
        )


#: ``cordon`` and ``uncordon`` read the same settings (``env.cordon``).
CORDON_SETTINGS = Settings(
    group="cordon", title="cordon", model=CordonSettings, make=CordonSettings.config
)


def _result(
    action: str, node: str, dry_run: bool, outcome: Any, message: str, **kw: Any
) -> ActionResult:
    return ActionResult(
        action=action, node=node, dry_run=dry_run, outcome=outcome, message=message, **kw
    )


def _failed(
    action: str, node: str, dry_run: bool, exc: KubeError, ref: ObjectRef, *, reason: str
) -> ActionResult:
    message = f"{action} of {node} failed: {type(exc).__name__}: {exc}"
    return _result(
        action,
        node,
        dry_run,
        "failed",
        message,
        retry=exc.transient,
        events=(
            AuditEvent(
                obj=ref,
                reason=reason,
                message=message,
                type="Warning",
            ),
        ),
    )


async def cordon(
    *,
    kube: KubeClient,
    node: str,
    rule: str,
    reason: str,
    identity: str,
    dry_run: bool,
    config: CordonConfig = CordonConfig(),
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> ActionResult:
    """Cordon ``node`` if the budget allows (``clock``/``sleep``: the Lease's, see
    :class:`BudgetLease`). Outcomes: done; noop (already cordoned, by us or
    by someone else — then left alone, also when that happened while we waited for the Lease);
    refused (budget spent; or the Lease not obtained in time or held too long);
    failed (API error; ``retry`` when transient). ``identity`` must be unique per agent process
    (it holds the Lease). The result carries its Event; it is not audited here."""
    verb = "would cordon" if dry_run else "cordoned"
    ref = ObjectRef(kind="Node", name=node)

    def result(outcome: Any, message: str, *, reason: str, **kw: Any) -> ActionResult:
        event = AuditEvent(
            obj=ref,
            reason=reason,
            message=message,
            type="Normal" if outcome in ("done", "noop") else "Warning",
        )
        return _result("cordon", node, dry_run, outcome, message, events=(event,), **kw)

    def already(current: JSON) -> ActionResult | None:
        if is_cordoned_by_us(current, taint_key=config.taint_key):
            return result(
                "noop", f"{node} is already cordoned by nodeguard", reason="NodeguardCordonNoop"
            )
        if _cordoned(current, config):
            return result(
                "noop",
                f"{node} is already cordoned by someone else; left alone",
                reason="NodeguardCordonNoop",
            )
        return None

    try:
        current = await kube.get_node(name=node)
        ref.uid = current["metadata"].get("uid", "")
        if (res0 := already(current)) is not None:
            return res0
        budget = _Budget(kube=kube, node=node, config=config)
        if (early := await budget.before_lease()) is not None:
            return result("refused", early[0], reason="NodeguardCordonRefused", details=early[1])
        async with BudgetLease(
            kube=kube,
            namespace=config.lease_namespace,
            name=config.lease_name,
            identity=identity,
            duration=config.lease_seconds,
            timeout=config.lock_timeout,
            dry_run=dry_run,
            clock=clock,
            sleep=sleep,
            spent=budget.spent_in_notes,
        ) as lease:
            if (spent := await budget.under_lease(lease)) is not None:
                return result(
                    "refused", spent[0], reason="NodeguardCordonRefused", details=spent[1]
                )
            for attempt in range(3):
                # Re-read under the lock: someone may have cordoned it while we waited.
                current = await kube.get_node(name=node)
                if (res0 := already(current)) is not None:
                    return res0
                lease.check()
                patch = _cordon_patch(
                    current, config=config, identity=identity, rule=rule, reason=reason
                )
                try:
                    await kube.patch_node(name=node, patch=patch, dry_run=dry_run)
                    break
                except Conflict:
                    if attempt == 2:
                        raise
    except (TimeoutError, BudgetSpent) as exc:  # the next firing of the rule tries again
        return result("refused", f"not cordoning {node}: {exc}", reason="NodeguardCordonRefused")
    except KubeError as exc:
        return _failed("cordon", node, dry_run, exc, ref, reason="NodeguardCordonFailed")
    return result(
        "done",
        f"{verb} {node} ({config.mode}) for rule {rule}: {reason}",
        reason="NodeguardCordoned",
        details={"mode": config.mode},
    )


async def uncordon(
    *,
    kube: KubeClient,
    node: str,
    rule: str,
    dry_run: bool,
    config: CordonConfig = CordonConfig(),
    only_rule: str | None = None,
) -> ActionResult:
    """Undo nodeguard's cordon of ``node`` in the mode it was made (recorded on the node);
    a node without nodeguard's mark is left alone. A stale mark (someone uncordoned the node
    meanwhile) is removed, and nothing else is touched. With ``only_rule`` (a rule's resolve),
    a cordon made by another rule is left for that rule (or a person) to undo. Outcomes: done,
    noop, failed (``retry`` when transient)."""
    ref = ObjectRef(kind="Node", name=node)

    def result(outcome: Any, message: str, *, reason: str) -> ActionResult:
        event = AuditEvent(obj=ref, reason=reason, message=message)
        return _result("uncordon", node, dry_run, outcome, message, events=(event,))

    try:
        current = await kube.get_node(name=node)
        ref.uid = current["metadata"].get("uid", "")
        if not _marked(current):
            return result(
                "noop",
                f"{node} is not cordoned by nodeguard; left alone",
                reason="NodeguardUncordonNoop",
            )
        by = (current["metadata"].get("annotations") or {}).get(ANN_RULE, "")
        if only_rule is not None and by != only_rule:
            return result(
                "noop",
                f"{node} was cordoned by rule {by or '?'}, not {only_rule}; left for it",
                reason="NodeguardUncordonNoop",
            )
        unmark = {"labels": {LABEL: None}, "annotations": dict.fromkeys(_ANNOTATIONS)}
        if not is_cordoned_by_us(current, taint_key=config.taint_key):
            await kube.patch_node(name=node, patch={"metadata": unmark}, dry_run=dry_run)
            return result(
                "noop",
                f"{node} was uncordoned by someone else; nodeguard's stale mark removed",
                reason="NodeguardUncordonNoop",
            )
        spec: JSON = {}
        if _recorded_mode(current) == "taint":
            unmark["resourceVersion"] = current["metadata"]["resourceVersion"]
            spec["taints"] = [
                t
                for t in current.get("spec", {}).get("taints") or []
                if t.get("key") != config.taint_key
            ] or None
        else:
            spec["unschedulable"] = None
        await kube.patch_node(name=node, patch={"metadata": unmark, "spec": spec}, dry_run=dry_run)
    except KubeError as exc:
        return _failed("uncordon", node, dry_run, exc, ref, reason="NodeguardUncordonFailed")
    return result(
        "done",
        f"{'would uncordon' if dry_run else 'uncordoned'} {node} (rule {rule})",
        reason="NodeguardUncordoned",
    )


def cordoned_by_rule(node: JSON) -> str | None:
    """The rule whose cordon is on ``node`` (nodeguard's mark, cordon still in place), if any:
    how a restarted agent whose state file was lost finds the undo it still owes."""
    if not is_cordoned_by_us(node):
        return None
    return str((node.get("metadata", {}).get("annotations") or {}).get(ANN_RULE, "")) or None


async def _run_cordon(call: Call, args: CordonArgs) -> list[ActionResult]:
    config = call.env.cordon
    if args.mode is not None:
        config = dataclasses.replace(config, mode=args.mode)
    return [
        await cordon(
            kube=call.api(),
            node=call.node,
            rule=call.firing.rule,
            reason=call.note,
            identity=f"{call.env.node}/{call.env.identity}",
            dry_run=call.dry_run,
            config=config,
        )
    ]


async def _run_uncordon(call: Call, args: CordonArgs) -> list[ActionResult]:
    # A rule's resolve undoes only that rule's cordon; by hand, any cordon of nodeguard's.
    by_hand = call.firing.source == "act"
    return [
        await uncordon(
            kube=call.api(),
            node=call.node,
            rule=call.firing.rule,
            dry_run=call.dry_run,
            config=call.env.cordon,
            only_rule=None if by_hand else call.firing.rule,
        )
    ]


register(
    Action(
        name="cordon",
        summary="mark the node unschedulable (or taint it), within the cluster-wide budget",
        args=CordonArgs,
        run=_run_cordon,
        undo="uncordon",
        settings=CORDON_SETTINGS,
        reasons={
            "done": "NodeguardCordoned",
            "noop": "NodeguardCordonNoop",
            "refused": "NodeguardCordonRefused",
            "blocked": "NodeguardCordonRefused",
            "failed": "NodeguardCordonFailed",
        },
        dry_reasons={"done": "NodeguardWouldCordon"},
    )
)
register(
    Action(
        name="uncordon",
        summary="undo nodeguard's cordon of the node (a rule's resolve: only that rule's)",
        args=CordonArgs,
        run=_run_uncordon,
        settings=CORDON_SETTINGS,
        reasons={
            "done": "NodeguardUncordoned",
            "noop": "NodeguardUncordonNoop",
            "refused": "NodeguardUncordonNoop",
            "blocked": "NodeguardUncordonNoop",
            "failed": "NodeguardUncordonFailed",
        },
        dry_reasons={"done": "NodeguardWouldUncordon"},
    )
)
