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
  one that died adopts them (:attr:`NodeActor.inherited`, read by the agent's decisions,
  :class:`~nodeguard.agent.decide.Decisions`): it finishes the unit whose eviction
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
import hashlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from nodeguard.kube.client import JSON, KubeClient
from nodeguard.kube.errors import Fenced, KubeError
from nodeguard.remediation.lease_api import LeaseApi
from nodeguard.remediation.lease_mirror import ANN_STATE, Inherited
from nodeguard.remediation.lease_takeover import ANN_DRY_RUN, Candidate, Takeover, lease_spec

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

State = Literal["actor", "observer", "unknown"]


def lease_name(node: str) -> str:
    """``nodeguard-<node>``; a node name too long for it (names are at most 253 characters)
    is cut and ended with a digest of the whole name."""
    name = f"nodeguard-{node}"
    if len(name) <= 253:
        return name
    return f"{name[:236]}-{hashlib.sha256(node.encode()).hexdigest()[:16]}"


class NodeActor:
    """Holds (or watches) the Lease of ``node`` in ``namespace`` for ``identity``.

    ``duration``: ``leaseDurationSeconds``; ``state_id``: an id of this agent's state file;
    ``mirror()``: what to write on the Lease with every renewal (the journal and eviction
    times). ``clock``: monotonic seconds (injectable for tests). Who may take the Lease is
    :class:`~nodeguard.remediation.lease_takeover.Takeover`'s judgement; its reads and writes,
    :class:`~nodeguard.remediation.lease_api.LeaseApi`'s.
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
        self.node, self.namespace, self.name = node, namespace, lease_name(node)
        self.identity, self.duration, self._clock = identity, duration, clock
        me = Candidate(identity=identity, duration=duration, dry_run=dry_run, state_id=state_id)
        self._api = LeaseApi(
            kube=kube, namespace=namespace, name=self.name, candidate=me, mirror=mirror
        )
        self._takeover = Takeover(candidate=me, clock=clock)
        self._valid_until = 0.0  # monotonic: until when this agent may act
        self._lock = asyncio.Lock()
        self._log = StateLog(identity=identity, node=node)
        self.state: State = "unknown"
        self.holder: str | None = None
        self.transitions = 0
        #: Set by a takeover from another agent's state, before the write that takes it is sent:
        #: what that agent left (the agent's decisions adopt it and set this back to None).
        self.inherited: Inherited | None = None

    def is_actor(self) -> bool:
        """Whether this agent holds the node's Lease now, with at least a third of it left."""
        return self.state == "actor" and self._clock() < self._valid_until

    def _observe(self, lease: JSON, holder: str, why: str) -> None:
        self._api.last, self.state, self.holder = lease, "observer", holder
        self._log.observing(holder=holder, why=why)

    async def _write(self, lease: JSON | None, *, previous: str) -> bool:
        """Create or replace the Lease as ours; True when it was written."""
        sent = self._clock()
        taking = previous != self.identity
        body, left = self._api.as_ours(lease, previous=previous)
        if taking:  # set before the write is sent: the agent's decisions read it meanwhile
            self.inherited = left
        written = await self._api.send(body, create=lease is None)
        if written is None:  # 409: someone else wrote it
            self.inherited = None if taking else self.inherited
            return False
        self._valid_until = sent + self.duration * 2 / 3
        self.transitions = int(lease_spec(written).get("leaseTransitions") or 0)
        self.holder = self.identity
        self._takeover.forget()
        if taking:
            self._log.acting(previous=previous)
        self.state = "actor"
        return True

    async def attempt(self) -> bool:
        """One acquire-or-renew (:meth:`run` calls it every ``duration / 3`` seconds): whether
        this agent holds the node now. API failures leave the state as it was (an actor stays
        one until its renew deadline passes)."""
        async with self._lock:
            try:
                # The holder's own last write is the newest version: renewed without a read.
                lease = self._api.last if self.state == "actor" else None
                if lease is None:
                    lease = await self._api.read()
            except KubeError as exc:
                log.warning("cannot read lease %s/%s: %s", self.namespace, self.name, exc)
                return self.is_actor()
            if lease is None:
                try:
                    return await self._write(None, previous="") or await self._reread()
                except KubeError as exc:
                    log.warning("cannot create lease %s/%s: %s", self.namespace, self.name, exc)
                    return False
            holder = str(lease_spec(lease).get("holderIdentity") or "")
            may, why = self._takeover.may_take(lease)
            if not may:
                self._observe(lease, holder, why)
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
        lease = await self._api.reread()
        if lease is None:
            self.state = "unknown"
            return False
        holder = str(lease_spec(lease).get("holderIdentity") or "")
        if holder != self.identity:
            self._takeover.may_take(lease)  # starts watching its renewals
            self._observe(lease, holder, f"{holder} (it wrote the Lease first)")
        return False

    async def fence(self) -> None:
        """Right before a destructive write: renew the Lease now (a conditional write, carrying
        the journal as it is now); raises :class:`~nodeguard.kube.errors.Fenced` when this
        agent does not hold it, and :class:`~nodeguard.kube.errors.KubeError` when the API
        cannot say (the write is not sent either way)."""
        if not self.is_actor():
            raise Fenced(f"node {self.node} is held by {self.holder or 'another agent'}")
        async with self._lock:
            lease = self._api.last
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
            if self.state == "actor" and await self._api.release():
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


class StateLog:
    """The log lines of the agent ``identity`` about who acts for ``node``: one for each change
    of the state or the holder (a renewal, a new ``renewTime``, is not news)."""

    def __init__(self, *, identity: str, node: str) -> None:
        self._identity, self._node = identity, node
        self._said: tuple[State, str] | None = None

    def acting(self, *, previous: str) -> None:
        """This agent acts for the node, taken from the holder ``previous`` (``""``: free)."""
        if self._news("actor", self._identity):
            # Taking the node from another agent is news; finding it free is the usual start.
            level = logging.WARNING if previous else logging.INFO
            why = f"took it from {previous}" if previous else "it was free"
            log.log(level, "actor: %s acts for node %s (%s)", self._identity, self._node, why)

    def observing(self, *, holder: str, why: str) -> None:
        """Another agent, ``holder``, acts for the node; ``why``: who and until when."""
        if self._news("observer", holder):
            log.warning("observer: node %s's actions are held by %s", self._node, why)

    def _news(self, state: State, holder: str) -> bool:
        said, self._said = self._said, (state, holder)
        return said != (state, holder)


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
