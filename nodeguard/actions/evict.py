"""Evicting ranked victims through the policy/v1 Eviction subresource, never DELETE.

The plan comes from :mod:`nodeguard.actions.ranking`. Units are evicted in order until the target
memory is freed (the units' unreclaimable memory on this node adds up to it), within the per-node
limit of evictions per window (:class:`~nodeguard.actions.limits.EvictionLimiter`). Each unit ends
in one typed outcome (:class:`Evicted`, :class:`Blocked`, :class:`Skipped`); the walk stops on the
limit or an API failure (:class:`Stop`).

- A 429 from a PodDisruptionBudget means "later": the unit gets a capped exponential backoff
  and is skipped until it expires (an Event says so), and the next unit is tried; nodeguard
  never falls back to DELETE. Each Eviction carries the pod's UID as a precondition, so a pod
  replaced under the same name (a StatefulSet's) is never evicted in its place.
- A gang's members elsewhere in the cluster (same trial, job or PodGroup) are evicted with it;
  finished members (``Succeeded``/``Failed``) are neither evicted nor counted. Every unit, a
  lone pod too, is first counted against the PodDisruptionBudgets of its namespace as a whole
  (:mod:`nodeguard.actions.budgets`: a dry run's decrement is never written, so asking each
  member with ``dryRun=All`` passes a gang its budget cannot afford): a budget short of the
  unit refuses all of it ("would not evict gang X: budget NS/NAME allows N of M"), with the
  backoff of a 429. A dry run keeps the disruptions it would have spent in this walk, so two
  units sharing a budget are judged as the real run, whose spending the server records, judges
  them. Every member is then asked with ``dryRun=All`` (a webhook or a budget that changed
  meanwhile refuses there and leaves the whole gang running). Then the gang is written on the
  Node acted on (annotation ``nodeguard.io/evicting-gangs``: its members by name and UID)
  before the first real eviction, and removed once every member is gone: a gang cut short
  (the API server died, a budget changed its mind, the agent was killed) is finished first by
  the next eviction on that node, whichever process runs it (the agent after a restart,
  ``nodeguard act evict``).
- Dry run sends the same Eviction requests with ``dryRun=All`` (the API server runs the same
  PodDisruptionBudget check and deletes nothing) and spends scratch copies of the limiter and
  backoff, so the units, blocks and limit it reports are the ones a real run acts on.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from nodeguard.actions.args import ActionArgs, Flag, MemoryAmount
from nodeguard.actions.base import ActionResult, AuditEvent, ObjectRef, Outcome
from nodeguard.actions.budgets import BudgetCheck, check_budgets
from nodeguard.actions.limits import EvictionBackoff, EvictionLimiter
from nodeguard.actions.ranking import (
    EvictFilter,
    EvictionPlan,
    Unit,
    excluded_by,
    gang_of,
    never_evicted,
)
from nodeguard.actions.registry import Action, CliFlag, register
from nodeguard.actions.victims import DEFAULT_NODE_FREE, victims
from nodeguard.kube.budgets import budget_of
from nodeguard.kube.client import JSON, KubeClient
from nodeguard.kube.errors import Conflict, EvictionRefused, KubeError, NotFound
from nodeguard.kube.objects import pod_meta
from nodeguard.snapshot import PodMeta
from nodeguard.units import format_bytes, format_duration

if TYPE_CHECKING:
    from nodeguard.actions.context import Call

__all__ = [
    "DEFAULT_NODE_FREE",
    "GANGS_ANNOTATION",
    "Blocked",
    "EvictArgs",
    "Evicted",
    "Skipped",
    "Stop",
    "evict",
]

log = logging.getLogger(__name__)

GANGS_ANNOTATION = "nodeguard.io/evicting-gangs"
#: Priority at or below which a rule's ``evict`` (and ``nodeguard act evict``) may evict when
#: it names no ``maxPriority``: below the usual production PriorityClasses (1000 and up).
DEFAULT_MAX_PRIORITY = 999
_MAX_OPEN_GANGS = 16


class EvictArgs(ActionArgs):
    """What to evict.

    - ``free``: how much unreclaimable memory to free: a Kubernetes quantity (``4Gi``) or a
      percent of the node's usable memory (``5%``: MemTotal less the hugetlb pool and
      HardwareCorrupted, :attr:`~nodeguard.snapshot.MemInfo.usable_bytes`, the memory eviction
      can give back; of the GPU's memory in a ``gpu`` rule); ``0``: the first unit alone.
      Default: ``5%`` for a node rule (and ``nodeguard act evict``); the pod's own unit for a
      pod or container rule; the first unit for a ``gpu`` rule.
    - ``maxPriority`` (default 999), ``priorityClasses``, ``namespaces``, ``selector`` (labels,
      all must match; the value ``"*"`` only requires the label): which pods may be evicted.
    """

    free: Annotated[MemoryAmount | None, Flag(aliases=("--target",))] = Field(
        default=None,
        description="unreclaimable memory to free: a Kubernetes quantity (8Gi) or a percent of the "
        f"node's memory (5%); 0: the first unit alone (default {DEFAULT_NODE_FREE}, as a node "
        "rule's evict)",
    )
    max_priority: Annotated[int | None, Flag(metavar="PRIORITY")] = Field(
        default=DEFAULT_MAX_PRIORITY,
        alias="maxPriority",
        description=f"evict only pods of at most this priority (default {DEFAULT_MAX_PRIORITY}, "
        "as the runbook)",
    )
    priority_classes: Annotated[list[str] | None, Flag(name="priority-class", metavar="NAME")] = (
        Field(
            default=None,
            alias="priorityClasses",
            description="evict only pods of this PriorityClass; repeat for more (default: any)",
        )
    )
    namespaces: Annotated[list[str] | None, Flag(name="namespace", metavar="NAMESPACE")] = Field(
        default=None,
        description="evict only pods of this namespace; repeat for more (default: any)",
    )
    selector: Annotated[dict[str, str] | None, Flag(metavar="KEY=VALUE")] = Field(
        default=None,
        description="evict only pods with this label; VALUE * only requires the label; repeat "
        "for more, all must match (default: any)",
    )

    def filter(self) -> EvictFilter:
        """The pods these arguments allow to be evicted."""
        return EvictFilter(
            max_priority=self.max_priority,
            priority_classes=frozenset(self.priority_classes) if self.priority_classes else None,
            namespaces=frozenset(self.namespaces) if self.namespaces else None,
            labels=self.selector,
        )


# -- outcomes of one unit ----------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class Evicted:
    """Every live member of ``unit`` was evicted (or would be): ``pods`` as
    ``namespace/name``; ``counted`` bytes of this node's unreclaimable memory freed by it."""

    unit: str
    pods: tuple[str, ...]
    counted: int
    why: str
    finished: bool = False  # a gang started earlier, finished now


@dataclass(frozen=True, slots=True, kw_only=True)
class Blocked:
    """A PodDisruptionBudget refused ``pod`` (now; or earlier, ``in_backoff``, and ``pod``
    names the unit's pods); the unit is left alone for ``retry_in`` seconds. ``partial``:
    members evicted before the refusal. ``budget``: the budget (``namespace/name``) that the
    check of the whole unit found short, before any eviction (``pod``: the first member it
    counts); ``gang``: the unit has more than one member."""

    unit: str
    pod: str
    reason: str
    retry_in: float
    in_backoff: bool = False
    partial: tuple[str, ...] = ()
    budget: str = ""
    gang: bool = False

    def refusal(self, *, dry_run: bool) -> str:
        """The whole unit refused by a budget, in words: "would not evict gang X: budget
        NS/NAME allows N of M: ..." (the real run: "did not evict")."""
        verb = "would not evict" if dry_run else "did not evict"
        return f"{verb} {'gang ' if self.gang else ''}{self.unit}: {self.reason}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Skipped:
    """``unit`` was passed over: ``reason`` (its usage unknown, a member that may never be
    evicted); ``pod`` names the member concerned, or the unit's pods."""

    unit: str
    reason: str
    pod: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Stop:
    """Why the walk ended before the plan did: the per-node ``limit``, or an API ``failure``
    (``partial``: members of the unit under way that were evicted before it)."""

    kind: str  # "limit" | "failure"
    message: str
    transient: bool = False
    partial: tuple[str, ...] = ()


UnitOutcome = Evicted | Blocked | Skipped


def _names(unit: Unit) -> str:
    """The unit's pods on this node, ``namespace/name``, comma-separated."""
    return ", ".join(f"{p.namespace}/{p.name}" for p in unit.pods)


def _split(name: str) -> tuple[str, str]:
    namespace, _, pod = name.partition("/")
    return namespace, pod


class _Refused(Exception):
    """A member's eviction was refused by a budget (internal to the walk); ``evicted``: the
    members evicted before it."""

    def __init__(self, pod: str, why: str, retry_after: float | None) -> None:
        super().__init__(why)
        self.pod, self.why, self.retry_after = pod, why, retry_after
        self.evicted: list[str] = []


class _Failed(Exception):
    """An API failure mid-unit, with the members evicted before it (internal to the walk)."""

    def __init__(self, exc: KubeError, evicted: list[str]) -> None:
        super().__init__(str(exc))
        self.exc, self.evicted = exc, evicted


@dataclass(frozen=True, slots=True, kw_only=True)
class _Member:
    namespace: str
    name: str
    uid: str
    node: str

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


#: ``(pod "namespace/name", pod UID, message)``: write the Event of one pod evicted.
Announce = Callable[[str, str, str], Awaitable[None]]


async def _evict_one(kube: KubeClient, m: _Member, *, dry_run: bool) -> bool:
    """Evict one member (UID precondition); False when it is gone or replaced. Raises
    :class:`_Refused` for a budget's refusal, :class:`KubeError` for anything else."""
    try:
        await kube.evict_pod(name=m.name, namespace=m.namespace, uid=m.uid, dry_run=dry_run)
    except (NotFound, Conflict):
        return False  # gone meanwhile, or a new pod under the name: not the one decided on
    except EvictionRefused as exc:
        raise _Refused(m.ref, exc.refusal, exc.retry_after) from exc
    return True


async def _evict_all(
    kube: KubeClient,
    members: list[_Member],
    *,
    dry_run: bool,
    each: Callable[[_Member], Awaitable[None]] | None = None,
) -> list[str]:
    """Evict each member in order; the ones evicted (``await each(member)`` after each). Raises
    :class:`_Refused` or :class:`_Failed` carrying the members evicted before it."""
    done: list[str] = []
    for m in members:
        try:
            if await _evict_one(kube, m, dry_run=dry_run):
                done.append(m.ref)
                if each is not None:
                    await each(m)
        except _Refused as refused:
            refused.evicted = done
            raise
        except KubeError as exc:
            raise _Failed(exc, done) from exc
    return done


async def _live(kube: KubeClient, members: list[_Member]) -> list[_Member]:
    """The members still running: not deleted, not terminating, not finished, not replaced
    (same UID). A finished one is left be: its eviction would only delete it (and the logs a
    retained Katib trial pod is kept for)."""
    alive: set[str] = set()
    for namespace in sorted({m.namespace for m in members}):
        items, _ = await kube.list_pods(namespace=namespace)
        alive |= {
            meta.uid
            for meta in (pod_meta(p) for p in items)
            if not meta.terminating and not meta.finished
        }
    return [m for m in members if m.uid in alive]


# -- gangs recorded on the Node ----------------------------------------------------------------
async def _read_gangs(kube: KubeClient, node: str) -> tuple[JSON, dict[str, Any]]:
    current = await kube.get_node(name=node)
    text = (current.get("metadata", {}).get("annotations") or {}).get(GANGS_ANNOTATION)
    try:
        gangs = json.loads(text) if text else {}
        if not isinstance(gangs, dict):
            gangs = {}
    except ValueError:
        log.warning("node %s: unreadable %s annotation, ignored", node, GANGS_ANNOTATION)
        gangs = {}
    return current, gangs


async def _write_gangs(
    kube: KubeClient, node: str, change: Callable[[dict[str, Any]], None], *, dry_run: bool
) -> None:
    """Read, change and write the node's gang record with its resourceVersion (a concurrent
    writer is a Conflict: read again)."""
    for attempt in range(5):
        current, gangs = await _read_gangs(kube, node)
        change(gangs)
        value = json.dumps(gangs, separators=(",", ":"), sort_keys=True) if gangs else None
        patch = {
            "metadata": {
                "resourceVersion": current["metadata"]["resourceVersion"],
                "annotations": {GANGS_ANNOTATION: value},
            }
        }
        try:
            await kube.patch_node(name=node, patch=patch, dry_run=dry_run)
            return
        except Conflict:
            if attempt == 4:
                raise


def _forget(key: str) -> Callable[[dict[str, Any]], None]:
    """The change that removes one gang from the node's record."""

    def change(gangs: dict[str, Any]) -> None:
        gangs.pop(key, None)

    return change


def _members_of(record: Mapping[str, Any]) -> list[_Member]:
    return [
        _Member(namespace=str(m[0]), name=str(m[1]), uid=str(m[2]), node=str(m[3]))
        for m in record.get("members", [])
        if isinstance(m, list) and len(m) == 4
    ]


# -- the walk ----------------------------------------------------------------------------------
@dataclass(slots=True, kw_only=True)
class _Walk:
    """One eviction run over a plan. ``progress`` is the journal's record of this step: units
    done and bytes freed before an agent restart are not done or counted twice."""

    kube: KubeClient
    node: str
    rule: str
    note: str
    dry_run: bool
    limiter: EvictionLimiter
    backoff: EvictionBackoff
    progress: MutableMapping[str, Any]
    checkpoint: Callable[[], None]
    one_shot: bool = False
    finish_only: bool = False
    flt: EvictFilter = dataclasses.field(default_factory=EvictFilter)
    outcomes: list[UnitOutcome] = dataclasses.field(default_factory=list)
    stop: Stop | None = None
    # Disruptions by budget a dry run would have spent so far (the server never records them).
    spent: dict[str, int] = dataclasses.field(default_factory=dict)
    # Writes a pod's Event the moment its eviction is done (``Announce``), so that a run cut
    # short (nodeguard act interrupted or killed, the agent SIGKILLed) leaves none unsaid.
    announce: Announce | None = None
    announced: set[str] = dataclasses.field(default_factory=set)

    @property
    def freed(self) -> int:
        return int(self.progress.get("freed", 0))

    def _done(self, outcome: Evicted) -> None:
        self.outcomes.append(outcome)
        self.progress["freed"] = self.freed + outcome.counted
        self.progress["units"] = [*self.progress.get("units", []), outcome.unit]
        self.progress.pop("inflight", None)
        self.checkpoint()

    async def _evict(self, members: list[_Member], *, why: str) -> list[str]:
        """Evict members for real (or dry run), noting each one evicted (``done``) in the
        written-ahead ``inflight`` record (saved at once), then writing its Event at once
        (``announce``) and noting that (``announced``): a run cut short between the two
        (SIGKILL, a stop, a full disk) leaves the Event owed, and the resumed step writes it
        (:meth:`_Finish.inflight`), never twice."""

        async def each(m: _Member) -> None:
            if self.dry_run:
                return
            inflight = self.progress.get("inflight")
            if inflight is not None:
                inflight["done"] = [*inflight.get("done", []), m.ref]
                self.checkpoint()
            await self._announce_one(inflight, m, why=why)

        return await _evict_all(self.kube, members, dry_run=self.dry_run, each=each)

    async def _announce_one(self, inflight: Any, m: _Member, *, why: str) -> None:
        if self.announce is None:
            return
        message = f"evicted {m.ref} from {self.node} for rule {self.rule}"
        await self.announce(m.ref, m.uid, f"{message} ({self.note}): {why}")
        self.announced.add(m.ref)
        if inflight is not None:
            inflight["announced"] = [*inflight.get("announced", []), m.ref]
            self.checkpoint()

    async def _announce_owed(self, inflight: Any, members: list[_Member], *, why: str) -> None:
        """Write the Events an earlier run owes: pods in ``done`` not in ``announced``."""
        said = {str(ref) for ref in inflight.get("announced", [])}
        self.announced |= said  # written by the earlier run: not again from this result
        done = {str(ref) for ref in inflight.get("done", [])}
        for m in members:
            if m.ref in done and m.ref not in said:
                await self._announce_one(inflight, m, why=why)

    async def members(self, unit: Unit) -> list[PodMeta]:
        """Every live pod of the unit, cluster-wide for a gang: the namespace's pods (by label
        where the gang has one) whose gang is this one, neither terminating nor finished."""
        if unit.kind == "pod":
            return list(unit.pods)
        items, _ = await self.kube.list_pods(
            namespace=unit.namespace, label_selector=unit.label_selector()
        )
        found = {
            m.uid: m
            for m in (pod_meta(p) for p in items)
            if not m.terminating and not m.finished and gang_of(m) == (unit.kind, unit.name)
        }
        found.update({p.uid: p for p in unit.pods})
        return sorted(found.values(), key=lambda m: (m.node_name, m.name))

    async def one(self, unit: Unit, why: str) -> None:
        """Try one unit; its outcome goes to ``outcomes``; raises :class:`_Failed`."""
        await _UnitSteps(walk=self).run(unit, why)

    def _record(self, gangs: dict[str, Any], unit: Unit, members: list[_Member]) -> None:
        while len(gangs) >= _MAX_OPEN_GANGS:  # a node is never a log of every gang ever
            gangs.pop(min(gangs, key=lambda k: str(gangs[k].get("at", ""))))
        gangs[unit.key] = {
            "members": [[m.namespace, m.name, m.uid, m.node] for m in members],
            "at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "by": self.node,
            "rule": self.rule,
        }

    async def run(self, plan: EvictionPlan, target: int, usage: Mapping[str, int]) -> None:
        """Finish started gangs, then evict units in order until ``target`` bytes are freed
        (0: one unit), the limit is spent or the API fails."""
        try:
            finish = _Finish(walk=self)
            await finish.inflight()
            already = set(self.progress.get("units", []))
            await finish.gangs(usage)
            if self.finish_only:
                return  # what was under way is done; the condition that chose more is gone
            for unit, why in plan.ranked:
                if self.progress.get("units") and self.freed >= target:
                    break
                if unit.key in already:
                    continue  # done before a restart (counted in ``freed``)
                if not self.limiter.allows(self.node):
                    self.stop = Stop(
                        kind="limit",
                        message=f"eviction limit reached ({self.limiter.max_units} per "
                        f"{self.limiter.window:.0f}s on {self.node})",
                    )
                    return
                if target > 0 and not unit.usage_known:
                    # Without its usage the target cannot be measured: never evict blind.
                    self.outcomes.append(
                        Skipped(unit=unit.key, pod=_names(unit), reason=f"{plan.measure} unknown")
                    )
                    continue
                await self.one(unit, why)
        except _Failed as failed:
            self.stop = Stop(
                kind="failure",
                message=f"eviction stopped by an API error: {type(failed.exc).__name__}: "
                f"{failed.exc}",
                transient=failed.exc.transient,
                partial=tuple(failed.evicted),
            )
        except KubeError as exc:  # reading the node's gang record
            self.stop = Stop(
                kind="failure",
                message=f"eviction stopped by an API error: {type(exc).__name__}: {exc}",
                transient=exc.transient,
            )


@dataclass(frozen=True, slots=True)
class _Finish:
    """What earlier runs left under way on the node, finished before a walk starts anything:
    the unit written ahead in ``progress``, and the gangs recorded on the Node."""

    walk: _Walk

    async def inflight(self) -> None:
        """A unit whose evictions were under way when the process died (written ahead in
        ``progress``): evict its members again (a member already evicted is terminating or
        gone: that changes nothing) and count it, once, instead of starting another unit."""
        inflight = self.walk.progress.get("inflight")
        if not inflight:
            return
        members = _members_of(inflight)
        try:
            live = await _live(self.walk.kube, members)
            evicted = await self.walk._evict(live, why=str(inflight.get("why", "")))
        except _Refused as refused:  # a budget changed its mind meanwhile: "later"
            evicted = refused.evicted
        # Reported now: what an earlier run evicted (``done``: its result was never recorded),
        # what it evicted but did not live to note (its request went through; it died before
        # the answer), and what this run evicted. An earlier eviction whose Event was not
        # written (``done`` but not ``announced``: killed, stopped or the disk full between the
        # two) gets it now, once.
        why = str(inflight.get("why", ""))
        done = [str(ref) for ref in inflight.get("done", [])]
        await self.walk._announce_owed(inflight, members, why=why)
        gone = [m.ref for m in members if m not in live and m.ref not in done]
        self.walk.limiter.record(self.walk.node)
        if len(members) > 1 and not self.walk.dry_run:
            await _write_gangs(
                self.walk.kube, self.walk.node, _forget(str(inflight["unit"])), dry_run=False
            )
        self.walk._done(
            Evicted(
                unit=str(inflight["unit"]),
                pods=tuple(dict.fromkeys(done + gone + evicted)),
                counted=int(inflight.get("counted", 0)),
                why=f"{inflight.get('why', '')} (under way when it was cut short; completed)",
            )
        )

    async def gangs(self, usage: Mapping[str, int]) -> None:
        """Evict what is left of gangs an earlier run started on this node."""
        _, gangs = await _read_gangs(self.walk.kube, self.walk.node)
        for key, record in sorted(gangs.items()):
            members = _members_of(record)
            if self.walk.flt.namespaces is not None and not all(
                m.namespace in self.walk.flt.namespaces for m in members
            ):
                continue  # outside what this run may touch: left for a run that may
            live = await _live(self.walk.kube, members)
            if len(live) == len(members):
                # Recorded, but no member was ever evicted (stopped before the first eviction,
                # then abandoned): nothing to finish, and no decision to act on now.
                if not self.walk.dry_run:
                    await _write_gangs(self.walk.kube, self.walk.node, _forget(key), dry_run=False)
                continue
            try:
                # Only what still runs: a member already evicted was reported by its run.
                evicted = await _evict_all(self.walk.kube, live, dry_run=self.walk.dry_run)
            except _Refused as refused:
                retry_in = self.walk.backoff.refused(key, retry_after=refused.retry_after)
                self.walk.outcomes.append(
                    Blocked(
                        unit=key,
                        pod=refused.pod,
                        reason=f"{refused.why} (finishing a gang started earlier)",
                        retry_in=retry_in,
                        partial=tuple(refused.evicted),
                    )
                )
                continue
            if not self.walk.dry_run:
                await _write_gangs(self.walk.kube, self.walk.node, _forget(key), dry_run=False)
            if not evicted:
                continue  # every member was already gone: only the record was left
            self.walk._done(
                Evicted(
                    unit=key,
                    pods=tuple(evicted),
                    counted=sum(usage.get(m.uid, 0) for m in members if m.ref in evicted),
                    why=f"finishing a gang started {record.get('at', 'earlier')} by "
                    f"{record.get('by', '?')} (rule {record.get('rule', '?')})",
                    finished=True,
                )
            )


@dataclass(frozen=True, slots=True)
class _UnitSteps:
    """The steps of one unit of a walk, in order: its backoff, its members, the members never
    evicted, its budgets counted whole, the evictions (asked first, the gang recorded, written
    ahead), and what a refusal or a success leaves."""

    walk: _Walk

    async def run(self, unit: Unit, why: str) -> None:
        """Try one unit; its outcome goes to the walk's ``outcomes``; raises :class:`_Failed`."""
        if (held := self._in_backoff(unit)) is not None:
            self.walk.outcomes.append(held)
            return
        try:
            metas = await self.walk.members(unit)
        except KubeError as exc:
            raise _Failed(exc, []) from exc
        if (never := self._never(unit, metas)) is not None:
            self.walk.outcomes.append(never)
            return
        gang = len(metas) > 1
        check = await self._budgets(unit, metas)
        if (short := check.shortfall) is not None:
            # The whole unit, before any eviction: never a gang cut short by its budget.
            self.walk.outcomes.append(
                Blocked(
                    unit=unit.key,
                    pod=short.pod,
                    reason=short.reason,
                    retry_in=self.walk.backoff.refused(unit.key, retry_after=short.retry_after),
                    budget=short.budget,
                    gang=gang,
                )
            )
            return
        members = [
            _Member(namespace=p.namespace, name=p.name, uid=p.uid, node=p.node_name) for p in metas
        ]
        try:
            evicted = await self._evict_unit(unit, members, gang=gang, why=why)
        except _Refused as refused:
            self._refused(unit, refused)
            return
        except KubeError as exc:
            raise _Failed(exc, []) from exc
        await self._succeeded(unit, check, gang=gang, evicted=evicted, why=why)

    def _in_backoff(self, unit: Unit) -> Blocked | None:
        """The unit blocked for now: a budget refused it earlier and its backoff runs."""
        if (until := self.walk.backoff.until(unit.key)) is None:
            return None
        return Blocked(
            unit=unit.key,
            pod=_names(unit),
            reason="in backoff after a PodDisruptionBudget refusal",
            retry_in=round(until - self.walk.backoff.clock(), 1),
            in_backoff=True,
        )

    def _never(self, unit: Unit, metas: list[PodMeta]) -> Skipped | None:
        """The unit skipped: a member, on any node, is never evicted or outside the rule's (or
        command's) own filter (priority, namespaces, labels), as the plan judged this node's."""
        never = [(m, r) for m in metas if (r := never_evicted(m) or excluded_by(m, self.walk.flt))]
        if not never:
            return None
        m, r = never[0]
        return Skipped(
            unit=unit.key,
            pod=f"{m.namespace}/{m.name}",
            reason=f"a member may not be evicted: {r}",
        )

    async def _budgets(self, unit: Unit, metas: list[PodMeta]) -> BudgetCheck:
        """The unit counted whole against its namespace's budgets (and this dry run's spending);
        raises :class:`_Failed` when they cannot be listed."""
        try:
            budgets = await self.walk.kube.list_pod_disruption_budgets(namespace=unit.namespace)
        except KubeError as exc:
            raise _Failed(exc, []) from exc
        return check_budgets(
            members=metas, budgets=[budget_of(b) for b in budgets], spent=self.walk.spent
        )

    async def _evict_unit(
        self, unit: Unit, members: list[_Member], *, gang: bool, why: str
    ) -> list[str]:
        """Ask for every member (a gang, or a dry run), record a gang on the Node, write the
        unit ahead, then evict it. Raises :class:`_Refused` or :class:`KubeError`."""
        if gang or self.walk.dry_run:
            # Ask first for every member: a budget refusing one leaves the whole gang running.
            for member in members:
                await _evict_one(self.walk.kube, member, dry_run=True)
        if gang:
            await _write_gangs(
                self.walk.kube,
                self.walk.node,
                lambda g: self.walk._record(g, unit, members),
                dry_run=self.walk.dry_run,
            )
        if not self.walk.dry_run:
            # Written ahead: killed during the evictions, the resumed step completes this
            # unit rather than choosing another one.
            self.walk.progress["inflight"] = {
                "unit": unit.key,
                "members": [[m.namespace, m.name, m.uid, m.node] for m in members],
                "counted": unit.usage_bytes,
                "why": why,
            }
            self.walk.checkpoint()
        return await self.walk._evict(members, why=why)

    def _refused(self, unit: Unit, refused: _Refused) -> None:
        """A budget refused a member mid-unit: the unit backs off, with what it evicted."""
        partial = tuple(refused.evicted)
        self.walk.progress.pop("inflight", None)
        retry_in = self.walk.backoff.refused(unit.key, retry_after=refused.retry_after)
        if partial:
            self.walk.limiter.record(self.walk.node)
        self.walk.outcomes.append(
            Blocked(
                unit=unit.key,
                pod=refused.pod,
                reason=refused.why,
                retry_in=retry_in,
                partial=partial,
            )
        )

    async def _succeeded(
        self, unit: Unit, check: BudgetCheck, *, gang: bool, evicted: list[str], why: str
    ) -> None:
        """The unit evicted: counted, its budgets' disruptions kept (a dry run), its gang record
        cleared."""
        self.walk.limiter.record(self.walk.node)
        self.walk.backoff.succeeded(unit.key)
        if self.walk.dry_run:
            for ref, n in check.needs.items():
                self.walk.spent[ref] = self.walk.spent.get(ref, 0) + n
        if gang and not self.walk.dry_run:
            try:
                await _write_gangs(self.walk.kube, self.walk.node, _forget(unit.key), dry_run=False)
            except KubeError as exc:  # evicted all the same; the next run clears the record
                log.warning("gang %s evicted, record not cleared: %s", unit.key, exc)
        self.walk._done(
            Evicted(unit=unit.key, pods=tuple(evicted), counted=unit.usage_bytes, why=why)
        )


def _later(walk: _Walk, blocked: Blocked) -> str:
    """What happens next to a refused unit, and nothing more: the agent leaves it alone for the
    backoff (and tries it when a rule next evicts on the node); ``nodeguard act`` runs once."""
    wait = format_duration(round(blocked.retry_in))
    if walk.one_shot:
        return "not tried again: nodeguard act runs once"
    if walk.dry_run:
        return f"a real run would leave it alone for {wait} (backoff)"
    return f"left alone for {wait} (backoff)"


def _events(walk: _Walk, pods: Mapping[tuple[str, str], PodMeta]) -> tuple[AuditEvent, ...]:
    verb = "would evict" if walk.dry_run else "evicted"
    out: list[AuditEvent] = []

    def ref(name: str) -> ObjectRef:
        namespace, pod = _split(name)
        meta = pods.get((namespace, pod))
        return ObjectRef(kind="Pod", name=pod, namespace=namespace, uid=meta.uid if meta else "")

    def evicted(pod: str, why: str) -> None:
        message = f"{verb} {pod} from {walk.node} for rule {walk.rule}{why}"
        out.append(
            AuditEvent(
                obj=ref(pod),
                reason="NodeguardEvicted",
                message=message,
                type="Warning",
                written=pod in walk.announced,
            )
        )

    for o in walk.outcomes:
        if isinstance(o, Evicted):
            for p in o.pods:
                evicted(p, f" ({walk.note}): {o.why}")
        elif isinstance(o, Blocked) and not o.in_backoff:
            for p in o.partial:
                evicted(
                    p, f": part of {o.unit}, whose member {o.pod} a PodDisruptionBudget refused"
                )
            if o.budget:
                message = f"{o.refusal(dry_run=walk.dry_run)}; never by DELETE; {_later(walk, o)}"
            else:
                message = (
                    f"eviction of {o.pod} refused ({o.reason}); never by DELETE; {_later(walk, o)}"
                )
            out.append(
                AuditEvent(
                    obj=ref(o.pod),
                    reason="NodeguardEvictionBlocked",
                    message=message,
                    type="Warning",
                )
            )
    if walk.stop is not None:
        for p in walk.stop.partial:
            evicted(p, f", before {walk.stop.message}")
    return tuple(out)


async def evict(
    *,
    kube: KubeClient,
    node: str,
    plan: EvictionPlan,
    target_bytes: int,
    rule: str,
    dry_run: bool,
    limiter: EvictionLimiter,
    backoff: EvictionBackoff,
    note: str = "",
    usage: Mapping[str, int] | None = None,
    progress: MutableMapping[str, Any] | None = None,
    checkpoint: Callable[[], None] = lambda: None,
    one_shot: bool = False,
    flt: EvictFilter | None = None,
    announce: Announce | None = None,
    finish_only: bool = False,
) -> ActionResult:
    """Evict units of ``plan`` in order until ``target_bytes`` are freed (0: just the first).
    With a target, units whose usage (``plan.measure``) is unknown are skipped, never evicted
    blind. Gangs an earlier run left half-evicted on ``node`` are finished first;
    ``finish_only``: only those and the unit under way when an earlier run was cut short,
    nothing of ``plan``.

    Outcomes: done (at least one unit evicted, or would be); blocked (every candidate refused
    by a PodDisruptionBudget or in backoff); refused (the per-node limit is spent before
    anything was evicted, or a target with no candidate's working set known); noop (no
    candidate); failed (an API error stopped it: what was
    evicted is listed and evented all the same, ``retry`` when transient). The result carries
    one Event per pod evicted or refused; it is not audited here.
    """
    walk = _Walk(
        kube=kube,
        node=node,
        rule=rule,
        note=note,
        dry_run=dry_run,
        limiter=limiter,
        backoff=backoff,
        progress=progress if progress is not None else {},
        checkpoint=checkpoint,
        one_shot=one_shot,
        finish_only=finish_only,
        flt=flt or EvictFilter(),
        announce=announce,
    )
    await walk.run(plan, target_bytes, usage or {})
    tally = _Tally.of(walk)
    by_name = {(p.namespace, p.name): p for u, _ in plan.ranked for p in u.pods}
    return ActionResult(
        action="evict",
        node=node,
        dry_run=dry_run,
        outcome=tally.outcome(plan),
        message=tally.message(walk, plan, target_bytes),
        details=tally.details(walk, target_bytes),
        events=_events(walk, by_name),
        retry=walk.stop is not None and walk.stop.kind == "failure" and walk.stop.transient,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class _Tally:
    """A walk's outcomes by kind, and the members of units left half-done."""

    evicted: list[Evicted]
    blocked: list[Blocked]
    skipped: list[Skipped]
    stop: Stop | None
    partial: list[str]

    @classmethod
    def of(cls, walk: _Walk) -> _Tally:
        blocked = [o for o in walk.outcomes if isinstance(o, Blocked)]
        stop = walk.stop
        return cls(
            evicted=[o for o in walk.outcomes if isinstance(o, Evicted)],
            blocked=blocked,
            skipped=[o for o in walk.outcomes if isinstance(o, Skipped)],
            stop=stop,
            partial=[p for b in blocked for p in b.partial] + list(stop.partial if stop else ()),
        )

    def outcome(self, plan: EvictionPlan) -> Outcome:
        """The result's outcome (see :func:`evict`)."""
        stop = self.stop
        if stop is not None and stop.kind == "failure":
            return "failed"
        if self.evicted:
            return "done"
        if stop is not None:
            return "refused"
        if self.blocked:
            return "blocked"
        if any(s.reason == f"{plan.measure} unknown" for s in self.skipped):
            return "refused"  # a target nobody can measure: say so, rather than "nothing to do"
        return "noop"

    def message(self, walk: _Walk, plan: EvictionPlan, target_bytes: int) -> str:
        """The result's message: what was evicted, freed, blocked, skipped, and why it ended."""
        verb = "would evict" if walk.dry_run else "evicted"
        names = (
            "; ".join(
                f"{o.unit}: {', '.join(o.pods) or 'already gone'}"
                + (" — finishing a gang started earlier" if o.finished else "")
                for o in self.evicted
            )
            or "nothing"
        )
        target = format_bytes(target_bytes) if target_bytes else "0: the first unit alone"
        message = (
            f"{verb} {len(self.evicted)} unit(s) ({names}), {format_bytes(walk.freed)} of "
            f"{plan.measure} (target {target})"
        )
        if self.partial:
            message += f"; {verb} also {', '.join(self.partial)} of unit(s) left half-done"
        for b in self.blocked:
            if b.budget:
                message += f"; {b.refusal(dry_run=walk.dry_run)} ({_later(walk, b)})"
            else:
                message += f"; blocked: {b.pod} ({b.reason}; {_later(walk, b)})"
        for s in self.skipped:
            message += f"; skipped: {s.pod} ({s.reason})"
        if self.stop is not None:
            message += f"; {self.stop.message}"
        if self.outcome(plan) == "refused" and self.stop is None:
            message += (
                f"; no {plan.measure} known for the candidates, so no memory target can be met "
                "(nodeguard act: --agent-url http://AGENT_POD_IP:9847, or --free 0 for the first "
                "unit)"
            )
        return message

    def details(self, walk: _Walk, target_bytes: int) -> dict[str, Any]:
        """The result's details: each unit's outcome as data."""
        return {
            "evicted": [
                {
                    "unit": o.unit,
                    "pods": list(o.pods),
                    "usage_bytes": o.counted,
                    "why": o.why,
                    "finished_gang": o.finished,
                }
                for o in self.evicted
            ],
            "blocked": [
                {
                    "unit": b.unit,
                    "pod": b.pod,
                    "reason": b.reason,
                    "retry_in_seconds": b.retry_in,
                    "in_backoff": b.in_backoff,
                    "partial": list(b.partial),
                    "budget": b.budget or None,
                }
                for b in self.blocked
            ],
            "skipped": [{"unit": s.unit, "pod": s.pod, "reason": s.reason} for s in self.skipped],
            "half_done": self.partial,
            "freed_bytes": walk.freed,
            "target_bytes": target_bytes,
            "limit_used": walk.limiter.used(walk.node),
        }


# -- the action --------------------------------------------------------------------------------
async def _announce(call: Call, ref: str, uid: str, message: str) -> None:
    namespace, name = _split(ref)
    obj = ObjectRef(kind="Pod", name=name, namespace=namespace, uid=uid)
    await call.env.auditor.event(
        obj=obj, reason="NodeguardEvicted", message=message, event_type="Warning"
    )


async def _run_evict(call: Call, args: EvictArgs) -> list[ActionResult]:
    try:
        plan, target, usage = await victims(call, free=args.free, flt=args.filter())
    except KubeError as exc:
        return call.result(
            action="evict",
            outcome="failed",
            message=f"cannot list the pods of {call.node}: {type(exc).__name__}: {exc}",
            retry=exc.transient,
        )
    refusal = None
    if call.firing.scope == "gpu" and not plan.ranked and target is None:
        refusal = f"no GPU {call.firing.target} with this node's pod list in the snapshot"
    elif plan.not_found:
        refusal = f"not evicting pod {call.firing.pod_uid or call.firing.pod_ref}: {plan.not_found}"
    elif target is None:
        refusal = (
            f"free: {args.free} is a share of a total this process does not know "
            f"({call.firing.node}'s usable memory or the GPU's memory)"
        )
    if call.finishing:
        # Only what an earlier run had under way (a pod it is evicting may already be gone
        # from the plan): the plan and its target are not used.
        refusal, target = None, target or 0
    limiter, backoff = call.limits()
    if refusal is not None:
        return call.result(
            action="evict",
            outcome="refused",
            message=refusal,
            details={"plan": plan_record(plan)},
        )
    assert target is not None
    result = await evict(
        kube=call.api(),
        node=call.node,
        plan=plan,
        target_bytes=target,
        rule=call.firing.rule,
        note=call.note,
        dry_run=call.dry_run,
        limiter=limiter,
        backoff=backoff,
        usage=usage,
        progress=call.progress,
        checkpoint=call.checkpoint,
        one_shot=call.one_shot,
        flt=args.filter(),
        announce=functools.partial(_announce, call),
        finish_only=call.finishing,
    )
    return [dataclasses.replace(result, details={**result.details, "plan": plan_record(plan)})]


def plan_record(plan: EvictionPlan) -> dict[str, Any]:
    """The plan as data (``nodeguard act`` prints it; incidents keep it)."""
    return {
        "ranked": [
            {
                "unit": u.key,
                "kind": u.kind,
                "namespace": u.namespace,
                "name": u.name,
                "pods": [p.name for p in u.pods],
                "usage_bytes": u.usage_bytes if u.usage_known else None,
                "request_bytes": u.request_bytes,
                "priority": u.priority,
                "why": why,
            }
            for u, why in plan.ranked
        ],
        "excluded": [
            {"pod": f"{e.pod.namespace}/{e.pod.name}", "why": e.reason} for e in plan.excluded
        ],
        "measure": plan.measure,
    }


register(
    Action(
        name="evict",
        summary="evict the lowest-ranked pods (gangs whole) through the Eviction API until "
        "`free` is freed",
        args=EvictArgs,
        run=_run_evict,
        needs_pods=True,
        reasons={
            "done": "NodeguardEvicted",
            "noop": "NodeguardEvictNoop",
            "refused": "NodeguardEvictRefused",
            "blocked": "NodeguardEvictionBlocked",
            "failed": "NodeguardEvictFailed",
        },
        dry_reasons={"done": "NodeguardWouldEvict", "blocked": "NodeguardWouldBeBlocked"},
        # By hand, no snapshot of this node: its agent's has the usage to rank by.
        cli_flags=(
            CliFlag(
                names=("--agent-url",),
                dest="agent_url",
                metavar="URL",
                help="the node's agent (http://AGENT_POD_IP:9847: its pod IP, or a "
                "port-forward), for each pod's unreclaimable memory from its /snapshot "
                "(default: none, usage unknown)",
            ),
        ),
    )
)
