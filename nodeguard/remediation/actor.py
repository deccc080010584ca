"""One agent acts for a node: a per-node ``coordination.k8s.io/v1`` Lease held on a loop.

Two agents for one node, each with its own ``--path.state`` (a rollout gone wrong, a debug copy,
two DaemonSets), would each evict, each write Events and incidents, each spend its own
per-node eviction limit. So acting is a cluster fact: the Lease ``nodeguard-<node>`` in the
agent's namespace names the one agent that acts (``holderIdentity``: pod name and a start id,
unique per process); any other agent only observes, and says once who holds the node and
until when. kured keeps its reboot lock in the cluster the same way (an annotation on its
DaemonSet with a TTL, kubereboot/kured ``pkg/daemonsetlock``); the Lease here follows
client-go's leader election (``tools/leaderelection/leaderelection.go``,
``tryAcquireOrRenew``; ``resourcelock/leaselock.go``):

- The holder renews every ``duration / 3`` seconds (the default 30 s lease: a write every 10 s
  per node, the rate of the kubelet's own node Lease, KEP-589 "Efficient Node Heartbeats").
  Every write carries the Lease's ``resourceVersion``: of two agents racing for it exactly one
  wins, the other gets 409.
- Another holder's Lease has lapsed when this agent has watched the same ``holderIdentity`` and
  ``renewTime`` stay unchanged for ``leaseDurationSeconds`` on its own monotonic clock (never by
  comparing another node's timestamps with this clock). Then it is taken over
  (``leaseTransitions`` + 1); a Lease released by its holder (no ``holderIdentity``) at once.
- The holder believes it holds the node until ``duration * 2/3`` after it *sent* its last
  successful write (client-go's renew deadline is shorter than the lease for the same reason):
  by then no one else can have taken it. Every destructive write (an eviction, a Node patch)
  is fenced: :meth:`NodeActor.fence` first renews the Lease with a conditional write, so an
  agent whose Lease was taken meanwhile sends nothing (:class:`~nodeguard.kube.errors.Fenced`).
- The fenced write also carries the holder's journal of runbooks under way and its eviction
  times on this node (annotation ``nodeguard.io/actor-state``). An agent that takes over from
  one that died adopts them (:meth:`NodeActor.take_over`): it finishes the unit whose eviction
  was on the wire instead of choosing another one, and counts the dead agent's evictions
  against the per-node limit. What the dead agent did and did not write down is unknown, so
  its rules' cooldowns are assumed to run from the takeover (act less, never more).
- An agent restarted on its own state (kill -9, an OOM kill, a container restart) takes the
  Lease of its previous process at once: the state directory (its device and inode, written as
  ``nodeguard.io/actor-holder-state``) is locked by one process at a time (``flock``,
  :mod:`nodeguard.statefile`), so a holder that used it is gone.
- A dry-run agent holds the Lease too (a dry-run pair reports one run, as a real pair makes
  one), but a real agent takes it from a live dry-run holder, and a dry-run agent never takes
  it from a real one, lapsed or not (annotation ``nodeguard.io/actor-dry-run``).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from nodeguard.kube.client import JSON, KubeClient
from nodeguard.kube.errors import Conflict, Fenced, KubeError, NotFound

__all__ = [
    "ANN_DRY_RUN",
    "ANN_STATE",
    "ActorCollector",
    "ClaimantWatch",
    "Inherited",
    "NodeActor",
    "claimant_alive",
    "lease_name",
]

log = logging.getLogger(__name__)

ANN_STATE = "nodeguard.io/actor-state"
ANN_DRY_RUN = "nodeguard.io/actor-dry-run"
ANN_STATE_ID = "nodeguard.io/actor-state-id"
#: The holder's state file id (written by every holder, dry run too).
ANN_HOLDER_STATE = "nodeguard.io/actor-holder-state"
#: The journal mirrored on the Lease, in characters at most (annotations share 256 KiB).
_MAX_STATE = 96 * 1024

State = Literal["actor", "observer", "unknown"]


def lease_name(node: str) -> str:
    """``nodeguard-<node>``; a node name too long for it (names are at most 253 characters)
    is cut and ended with a digest of the whole name."""
    name = f"nodeguard-{node}"
    if len(name) <= 253:
        return name
    return f"{name[:236]}-{hashlib.sha256(node.encode()).hexdigest()[:16]}"


def _micro_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True, slots=True, kw_only=True)
class Inherited:
    """What an agent that died left on the Lease: ``journal`` (incident id -> journal entry)
    and ``evictions`` (its eviction times on this node, Unix seconds); ``same_state``: it used
    this agent's own state file (a restart of the same agent: nothing to adopt); ``lapsed``:
    it did not release the Lease (killed, or cut off), so what it did last is unknown."""

    journal: dict[str, Any]
    evictions: list[float]
    same_state: bool
    lapsed: bool


class NodeActor:
    """Holds (or watches) the Lease of ``node`` in ``namespace`` for ``identity``.

    ``duration``: ``leaseDurationSeconds``; ``state_id``: an id of this agent's state file;
    ``mirror()``: what to write on the Lease with every renewal (the journal and eviction
    times). ``clock``: monotonic seconds (injectable for tests).
    """

    def __init__(
        self,
        *,
        kube: KubeClient,
        node: str,
        namespace: str,
        identity: str,
        duration: int,
        dry_run: bool,
        state_id: str,
        mirror: Callable[[], Mapping[str, Any]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kube, self.node, self.namespace = kube, node, namespace
        self.name = lease_name(node)
        self.identity, self.duration, self.dry_run = identity, duration, dry_run
        self._state_id, self._mirror = state_id, mirror
        self._clock = clock
        self._lease: JSON | None = None  # the last version read or written
        self._valid_until = 0.0  # monotonic: until when this agent may act
        self._observed: tuple[str, str] | None = None
        self._observed_at = 0.0
        self._lock = asyncio.Lock()
        self._said: tuple[State, str] | None = None
        self._cut_said = False
        self.state: State = "unknown"
        self.holder: str | None = None
        self.transitions = 0
        #: Set by a takeover from another agent's state: what it left (see :meth:`take_over`).
        self.inherited: Inherited | None = None

    # -- reading ------------------------------------------------------------------------------
    def is_actor(self) -> bool:
        """Whether this agent holds the node's Lease now, with at least a third of it left."""
        return self.state == "actor" and self._clock() < self._valid_until

    def _say(self, state: State, why: str) -> None:
        # Once per state and holder: a renewal (a new renewTime) is not news.
        if self._said == (state, self.holder or ""):
            return
        self._said = (state, self.holder or "")
        if state == "actor":
            # Taking the node from another agent is news; finding it free is the usual start.
            level = logging.WARNING if why.startswith("took") else logging.INFO
            log.log(level, "actor: %s acts for node %s (%s)", self.identity, self.node, why)
        else:
            log.warning("observer: node %s's actions are held by %s", self.node, why)

    # -- the Lease ----------------------------------------------------------------------------
    def _spec(self, lease: JSON) -> dict[str, Any]:
        spec: dict[str, Any] = lease.setdefault("spec", {})
        return spec

    def _annotations(self, lease: JSON) -> dict[str, str]:
        meta = lease.setdefault("metadata", {})
        ann: dict[str, str] = meta.get("annotations") or {}
        meta["annotations"] = ann
        return ann

    def _may_take(self, lease: JSON) -> tuple[bool, str]:
        """Whether this agent may take the Lease now; else who holds it, for the log."""
        spec = self._spec(lease)
        holder = str(spec.get("holderIdentity") or "")
        if not holder or holder == self.identity:
            return True, ""
        record = (holder, str(spec.get("renewTime") or spec.get("acquireTime") or ""))
        now = self._clock()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = float(spec.get("leaseDurationSeconds") or self.duration)
        holder_dry = self._annotations(lease).get(ANN_DRY_RUN) == "true"
        left = self._observed_at + duration - now
        renewed = spec.get("renewTime") or spec.get("acquireTime") or "?"
        why = f"{holder}{' (dry run)' if holder_dry else ''} until {renewed} + {duration:.0f}s"
        if self.dry_run and not holder_dry:
            return False, why  # a dry run never takes the node from a real agent
        if self._state_id and self._annotations(lease).get(ANN_HOLDER_STATE) == self._state_id:
            # The holder used this agent's own state file, which this process holds locked
            # (flock, nodeguard.statefile): it was this agent before a restart, and is dead.
            return True, ""
        if holder_dry and not self.dry_run:
            return True, ""  # a real agent takes it from a dry run at once
        return left <= 0, f"{why} ({max(left, 0):.0f}s left as seen here)"

    def _mirrored(self, ann: dict[str, str]) -> None:
        if self.dry_run:
            return  # a dry run keeps what a real agent left, for the next real one
        data = dict(self._mirror())
        text = json.dumps(data, separators=(",", ":"), default=str)
        journal = dict(data.get("journal") or {})
        # Runbooks are journaled when queued, so the oldest entries are the ones under way
        # (an eviction on the wire): the cut drops queued deliveries nothing has started
        # (Alertmanager re-sends them; a local rule fires again), the newest first, and
        # runbooks under way only when those are not enough, the oldest first.
        order = [k for k in reversed(journal) if _not_started(journal[k])]
        order += [k for k in journal if k not in set(order)]
        cut = 0
        while len(text) > _MAX_STATE and journal:
            journal.pop(order[cut])
            cut += 1
            text = json.dumps({**data, "journal": journal}, separators=(",", ":"), default=str)
        if cut and not self._cut_said:
            self._cut_said = True  # once: a flood would say it on every renewal
            log.warning(
                "lease %s/%s: journal over %d characters: %d of %d runbooks not mirrored "
                "(queued ones first); an agent taking over does not see them",
                self.namespace,
                self.name,
                _MAX_STATE,
                cut,
                cut + len(journal),
            )
        ann[ANN_STATE] = text
        ann[ANN_STATE_ID] = self._state_id

    async def _write(self, lease: JSON | None, *, previous: str) -> bool:
        """Create or replace the Lease as ours; True when it was written."""
        now = _micro_now()
        sent = self._clock()
        body: JSON = (
            lease
            if lease is not None
            else {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {"leaseTransitions": 0},
            }
        )
        spec = self._spec(body)
        taking = previous != self.identity
        spec.update(
            holderIdentity=self.identity,
            leaseDurationSeconds=self.duration,
            renewTime=now,
        )
        if taking:
            spec["acquireTime"] = now
            if previous:
                spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        ann = self._annotations(body)
        if taking:
            # A dry-run holder sent nothing destructive (it fences nothing): nothing it did is
            # unknown, so its rules' cooldowns need not be assumed to run.
            self._inherit(ann, lapsed=bool(previous) and ann.get(ANN_DRY_RUN) != "true")
        ann[ANN_DRY_RUN] = "true" if self.dry_run else "false"
        ann[ANN_HOLDER_STATE] = self._state_id
        self._mirrored(ann)
        try:
            if lease is None:
                written = await self._kube.create_lease(namespace=self.namespace, body=body)
            else:
                written = await self._kube.replace_lease(
                    name=self.name, namespace=self.namespace, body=body
                )
        except Conflict:
            self._lease = None  # someone else wrote it: read again
            self.inherited = None if taking else self.inherited
            return False
        self._lease = written
        self._valid_until = sent + self.duration * 2 / 3
        self.transitions = int(self._spec(written).get("leaseTransitions") or 0)
        self.holder = self.identity
        self._observed = None
        if taking:
            self._say("actor", f"took it from {previous}" if previous else "it was free")
        self.state = "actor"
        return True

    def _inherit(self, ann: dict[str, str], *, lapsed: bool) -> None:
        same = ann.get(ANN_STATE_ID) == self._state_id
        try:
            data = json.loads(ann.get(ANN_STATE) or "{}")
            journal = {str(k): v for k, v in dict(data.get("journal") or {}).items()}
            evictions = [float(t) for t in data.get("evictions") or []]
        except (ValueError, TypeError, AttributeError):
            log.warning("lease %s/%s: unreadable %s, ignored", self.namespace, self.name, ANN_STATE)
            journal, evictions = {}, []
        self.inherited = Inherited(
            journal=journal, evictions=evictions, same_state=same, lapsed=lapsed
        )

    async def attempt(self) -> bool:
        """One acquire-or-renew (:meth:`run` calls it every ``duration / 3`` seconds): whether
        this agent holds the node now. API failures leave the state as it was (an actor stays
        one until its renew deadline passes)."""
        async with self._lock:
            try:
                lease = self._lease if self.state == "actor" else None
                if lease is None:
                    lease = await self._kube.get_lease(name=self.name, namespace=self.namespace)
            except NotFound:
                lease = None
            except KubeError as exc:
                log.warning("cannot read lease %s/%s: %s", self.namespace, self.name, exc)
                return self.is_actor()
            if lease is None:
                try:
                    return await self._write(None, previous="") or await self._reread()
                except KubeError as exc:
                    log.warning("cannot create lease %s/%s: %s", self.namespace, self.name, exc)
                    return False
            spec = self._spec(lease)
            holder = str(spec.get("holderIdentity") or "")
            may, why = self._may_take(lease)
            if not may:
                self._lease, self.state, self.holder = lease, "observer", holder
                self._say("observer", why)
                return False
            try:
                if await self._write(lease, previous=holder):
                    return True
            except KubeError as exc:
                log.warning("cannot write lease %s/%s: %s", self.namespace, self.name, exc)
                return self.is_actor()
            return await self._reread()

    async def _reread(self) -> bool:
        """After a 409: whoever wrote it holds it now (ours again only on the next round)."""
        try:
            lease = await self._kube.get_lease(name=self.name, namespace=self.namespace)
        except KubeError:
            self.state = "unknown"
            return False
        holder = str(self._spec(lease).get("holderIdentity") or "")
        if holder != self.identity:
            self._lease, self.state, self.holder = lease, "observer", holder
            self._may_take(lease)  # starts watching its renewals
            self._say("observer", f"{holder} (it wrote the Lease first)")
        return False

    async def fence(self) -> None:
        """Right before a destructive write: renew the Lease now (a conditional write, carrying
        the journal as it is now); raises :class:`~nodeguard.kube.errors.Fenced` when this
        agent does not hold it, and :class:`~nodeguard.kube.errors.KubeError` when the API
        cannot say (the write is not sent either way)."""
        if not self.is_actor():
            raise Fenced(f"node {self.node} is held by {self.holder or 'another agent'}")
        async with self._lock:
            lease = self._lease
            if lease is None or not await self._write(lease, previous=self.identity):
                self.state = "unknown"
                raise Fenced(f"lost lease {self.namespace}/{self.name} to another agent")
            if not self.is_actor():
                # Answered after its renew deadline (a slow API server, a paused process):
                # another agent may have taken the node meanwhile. client-go's renew runs
                # under RenewDeadline, and a late success is a failure (leaderelection.go).
                self.state = "unknown"
                raise Fenced(f"lease {self.namespace}/{self.name} renewed past its deadline")

    async def release(self) -> None:
        """On a clean stop: clear ``holderIdentity`` so the next agent need not wait (the
        mirrored state stays on the Lease). Failures are ignored: the Lease lapses anyway."""
        async with self._lock:
            if self.state != "actor" or self._lease is None:
                return
            lease = self._lease
            self._spec(lease)["holderIdentity"] = None
            with contextlib.suppress(KubeError):
                await self._kube.replace_lease(name=self.name, namespace=self.namespace, body=lease)
            self.state = "unknown"

    async def run(self, *, stop: asyncio.Event) -> None:
        """Acquire or renew every ``duration / 3`` seconds until ``stop``; releases the Lease
        on the way out."""
        while not stop.is_set():
            try:
                await self.attempt()
            except Exception:  # a bug here must not stop the agent: it only stops acting
                log.exception("node lease %s/%s", self.namespace, self.name)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.duration / 3)
        await self.release()


def _not_started(entry: Any) -> bool:
    return isinstance(entry, dict) and not entry.get("next") and not entry.get("progress")


class ClaimantWatch:
    """What this agent has seen of other claimants' Leases, to judge their liveness by
    observation as client-go does (``observedTime`` in ``tools/leaderelection/leaderelection.go``:
    the local time a *change* of the record was seen), never by comparing another node's
    ``renewTime`` with this clock. ``clock``: monotonic seconds. For each claimant it keeps the
    Lease's record (``holderIdentity``, ``renewTime``, ``resourceVersion``) last seen and when
    it was first seen so; at most :attr:`KEEP` claimants (the longest unseen go)."""

    KEEP = 4096

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._seen: dict[str, tuple[tuple[str, ...], float]] = {}

    def unchanged_for(self, *, claimant: str, record: tuple[str, ...]) -> float:
        """Seconds this agent has seen ``record`` unchanged for ``claimant`` (0 the first time
        it sees it, and whenever it changed)."""
        now = self._clock()
        last = self._seen.pop(claimant, None)
        since = last[1] if last is not None and last[0] == record else now
        self._seen[claimant] = (record, since)
        while len(self._seen) > self.KEEP:
            self._seen.pop(next(iter(self._seen)))
        return now - since


async def claimant_alive(
    *, kube: KubeClient, namespace: str, claimant: str, watch: ClaimantWatch | None = None
) -> bool:
    """Whether the agent ``<node>/<identity>`` that claimed an alert delivery
    (:mod:`nodeguard.alerts.claims`) may still be finishing it.

    Dead: its node's Lease is released or held by another identity (the agent was replaced),
    or ``watch`` has seen the same Lease record (``renewTime``, ``resourceVersion``) unchanged
    for ``2 * leaseDurationSeconds`` on this agent's monotonic clock. The holder's timestamps
    are never compared with this clock (a node whose clock is behind would look dead). A claim
    seen for the first time is alive until then: the copy that finds it is a duplicate, and the
    first copy Alertmanager re-sends after ``2 * leaseDurationSeconds`` (60 s with the default
    30 s lease; in practice its next ``repeat_interval``, 4 h by default) to this agent takes
    it over. Without ``watch`` every call is a first sight (alive unless replaced).

    Alive: a missing Lease (404) — it proves nothing about its holder: a person deleted it, or
    ``--actor.lease-namespace`` changed in a rollout, and a live holder creates it again; the
    claim then waits out its own expiry (24 h after its last copy was seen). Also alive: a bare
    node name (an older agent's claim) and an API that cannot say: a delivery is never acted on
    twice on a guess."""
    node, sep, identity = claimant.partition("/")
    if not sep:
        return True
    try:
        lease = await kube.get_lease(name=lease_name(node), namespace=namespace)
    except KubeError:  # NotFound included: see above
        return True
    spec = lease.get("spec") or {}
    if spec.get("holderIdentity") != identity:
        return False
    if watch is None:
        return True
    record = (
        identity,
        str(spec.get("renewTime") or spec.get("acquireTime") or ""),
        str((lease.get("metadata") or {}).get("resourceVersion") or ""),
    )
    duration = float(spec.get("leaseDurationSeconds") or 0)
    if duration <= 0:
        return True  # no lease time to judge by
    return watch.unchanged_for(claimant=claimant, record=record) < 2 * duration


class ActorCollector(Collector):
    """``nodeguard_actor{state}``: 1 for the state this agent is in for its node (``actor``:
    it holds the node's Lease and acts; ``observer``: another agent does; ``unknown``: the API
    has not said yet), 0 for the others."""

    def __init__(self, *, actor: NodeActor) -> None:
        self._actor = actor

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        g = GaugeMetricFamily(
            "nodeguard_actor",
            "Whether this agent acts for its node (holds the per-node Lease) or only observes",
            labels=["state"],
        )
        state = self._actor.state
        current = "actor" if self._actor.is_actor() else "observer" if state == "observer" else ""
        current = current or "unknown"
        for state in ("actor", "observer", "unknown"):
            g.add_metric([state], 1.0 if state == current else 0.0)
        yield g
