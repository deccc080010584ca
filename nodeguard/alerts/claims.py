"""Claiming an alert delivery cluster-wide, so that it acts once whichever agent receives it.

Alertmanager delivers to the nodeguard Service, which spreads deliveries over all agents: the two
copies an HA Alertmanager pair sends, a retry, or an alert's firing and its resolution can land
on different agents, whose own memory (:class:`~nodeguard.alerts.webhook.AlertDedupe`) cannot
see each other. The target Node carries the claims instead, in the annotation
``nodeguard.io/alert-deliveries`` (JSON: ``claimants``, the agents' names; ``seen``, each recent
delivery as ``[digest, expiry, claimant index]``; ``resolved``, the latest resolved instant per
fingerprint digest). A claim is a merge patch carrying the Node's resourceVersion: of two agents
claiming the same delivery at once, exactly one succeeds and the other reads again and finds it
taken (optimistic concurrency). A conflict is never taken for a win: the claimer reads and
tries again (with jittered backoff) until the Node says who has it.

A claim lives ``ttl`` (24 h) after the last time a copy of its delivery was seen: Alertmanager
re-sends a firing alert every ``repeat_interval`` to any agent, and each re-send that finds the
claim extends it (once a claim is past a tenth of its life), so an alert that keeps firing never
acts twice. Expiries are on the wall clock, unlike the agent's own durations
(:meth:`nodeguard.statefile.StateFile.now`): every agent reads them, and only the wall clock is
shared between nodes (a clock stepped back keeps a claim longer, which acts less; one stepped
forward by most of ``ttl`` forgets it early). At most :data:`KEEP` deliveries are kept per
Node (about 60 bytes each, well within the 256 KiB that all of a Node's annotations may take);
past that the soonest to expire go.

The remediator claims a delivery just before its first step (:meth:`AlertClaims.claim`), not
when the delivery arrives: while the API server is down the claim waits, like any step, and
when it is back exactly one agent's claim wins. An agent that claimed a delivery and was
restarted finds its own claim (``ours``) and goes on. Claims are written in dry run too: they
record which agent handles a delivery, not an action, and without them a dry-run pair of
agents would report two runs where a real pair makes one.

A claimant is ``<node>/<identity>``: the agent's node and the identity it holds that node's
Lease under (:mod:`nodeguard.remediation.actor`). A delivery claimed by an agent that died
before it finished is taken over (``taken_over``) once ``alive(claimant)`` says its liveness
lapsed (its node's Lease is held by someone else, or seen unrenewed by this agent for twice its
duration: :func:`nodeguard.remediation.actor.claimant_alive`), instead of
being dropped as a duplicate for the claim's whole 24 h; a finished delivery is marked done
(:meth:`AlertClaims.finish`, claimant index ``-1``) and never taken over. A claimant written
by an older nodeguard (a bare node name) is taken to be alive.

What is decided is here (:class:`AlertClaims`); the annotation's form, and reading and writing
it, are :mod:`nodeguard.alerts.claim_record`'s.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Literal

from nodeguard.alerts.claim_record import (
    ANNOTATION,
    DONE,
    KEEP,
    ClaimRecord,
    Seen,
    read_record,
    write_record,
)
from nodeguard.kube.client import KubeClient
from nodeguard.kube.errors import Conflict, KubeError

__all__ = ["ANNOTATION", "KEEP", "AlertClaims", "Claim", "parse_key"]

log = logging.getLogger(__name__)

Claim = Literal["claimed", "ours", "duplicate", "stale", "unavailable", "taken_over"]
#: ``await alive(claimant)``: whether the agent that claimed a delivery may still finish it.
Alive = Callable[[str], Awaitable[bool]]


def parse_key(key: str) -> tuple[str, int, str]:
    """``(fingerprint digest, startsAt instant in µs, status)`` of a delivery key
    (:func:`nodeguard.alerts.webhook.delivery_key`). Raises ``ValueError``."""
    fingerprint, instant, status = key.split(":")
    return fingerprint, int(instant), status


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:24]


class AlertClaims:
    """Claims deliveries on their target Node for agent ``claimant`` (``<node>/<identity>``).
    ``ttl``: how long a claim is remembered after its delivery was last seen, in seconds;
    ``attempts``: reads and writes before a Node that keeps changing is given up on for now
    (``unavailable``); ``alive``: whether another claimant may still finish (``None``: all
    are taken to be alive); ``clock``: wall-clock Unix seconds (the expiries are shared
    between nodes); ``sleep``: the backoff's, after a conflict."""

    def __init__(
        self,
        *,
        kube: KubeClient,
        claimant: str,
        ttl: float = 24 * 3600.0,
        attempts: int = 30,
        alive: Alive | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._kube, self._claimant, self._ttl, self._attempts = kube, claimant, ttl, attempts
        self._clock, self._sleep, self._alive = clock, sleep, alive

    async def claim(self, *, node: str, key: str) -> Claim:
        """Claim one delivery for ``node``: ``claimed`` (now, by us), ``ours`` (by us before a
        restart), ``duplicate`` (another agent has it, or it is done), ``taken_over`` (its
        claimant died before finishing: now ours), ``stale`` (a firing older than a
        resolution already handled), ``unavailable`` (the Node cannot be read or written now:
        the API server is down, the Node is gone, RBAC; or it kept changing under us). Raises
        ``ValueError`` for a malformed ``key``, before anything is read."""
        parts, digest = parse_key(key), _digest(key)
        for attempt in range(self._attempts):
            try:
                record = await read_record(kube=self._kube, node=node)
            except KubeError as exc:
                log.warning("cannot read node %s to claim an alert delivery: %s", node, exc)
                return "unavailable"
            answer, write = await self._decide(record, parts=parts, digest=digest)
            if not write:
                return answer
            try:
                text = record.compact_text()
                await write_record(kube=self._kube, node=node, record=record, text=text)
            except Conflict:
                # Another agent wrote the Node meanwhile: read again, and see who has it.
                await self._backoff(attempt)
                continue
            except KubeError as exc:
                if answer != "claimed":
                    return answer  # only the refresh was lost: the answer stands
                log.warning("cannot claim an alert delivery on node %s: %s", node, exc)
                return "unavailable"
            return answer
        log.warning("node %s kept changing while claiming an alert delivery; later", node)
        return "unavailable"

    async def _decide(
        self, record: ClaimRecord, *, parts: tuple[str, int, str], digest: str
    ) -> tuple[Claim, bool]:
        """Who delivers the delivery of key ``parts`` (:func:`parse_key`) and ``digest``, by
        ``record`` (changed to say what this agent claims, its expired deliveries dropped);
        and whether that is to be written."""
        (fingerprint, instant, status), now = parts, self._clock()
        record.seen = [e for e in record.seen if float(e.expiry) > now]
        found = next((e for e in record.seen if e.digest == digest), None)
        if found is not None:
            holder = record.holder(found)
            answer: Claim = "ours" if holder == self._claimant else "duplicate"
            if answer == "duplicate" and found.claimant != DONE and await self._lapsed(holder):
                log.warning("alert delivery claimed by %s, which died: taken over", holder)
                found.claimant = record.join(self._claimant)
                answer = "taken_over"
            elif float(found.expiry) - now > self._ttl * 0.9:
                return answer, False  # fresh enough: no write for a copy seen just now
            found.expiry = int(now + self._ttl)  # seen again: remembered a full ttl from now
            return answer, True
        resolved = record.resolved.get(fingerprint)
        if status == "firing" and resolved is not None and instant <= int(resolved):
            return "stale", False
        mine = record.join(self._claimant)
        record.seen.append(Seen(digest=digest, expiry=int(now + self._ttl), claimant=mine))
        if status == "resolved" and (resolved is None or instant >= int(resolved)):
            record.resolved.pop(fingerprint, None)  # the latest last: the one KEEP keeps
            record.resolved[fingerprint] = instant
        return "claimed", True

    async def _lapsed(self, holder: str) -> bool:
        if self._alive is None or not holder:
            return False
        return not await self._alive(holder)

    async def _backoff(self, attempt: int) -> None:
        # Jittered, so that agents that conflicted do not read and write in step again.
        await self._sleep(min(0.5, 0.01 * 2**attempt) * (0.5 + random.random()))

    async def finish(self, *, node: str, key: str) -> None:
        """Mark our claim of a delivery done: no one takes it over, whatever becomes of us.
        Best effort (tried a few times; a failure is logged)."""
        digest = _digest(key)
        for attempt in range(5):
            try:
                record = await read_record(kube=self._kube, node=node)
                mine = record.index(self._claimant)
                found = next((e for e in record.seen if e.digest == digest), None)
                if found is None or mine is None or found.claimant != mine:
                    return
                found.claimant = DONE
                await write_record(kube=self._kube, node=node, record=record, text=record.text())
                return
            except Conflict:
                await self._backoff(attempt)
            except KubeError as exc:
                log.warning("cannot mark alert delivery done on node %s: %s", node, exc)
                return

    async def release(self, *, node: str, key: str) -> bool:
        """Give back our claim of one delivery on ``node`` (a runbook abandoned before it
        planned anything: no pod list in time), so that the copy Alertmanager re-sends every
        ``repeat_interval`` acts on whichever agent it reaches instead of being dropped there as
        a ``duplicate`` for the claim's whole ``ttl``. A claim held by another agent is left.
        True when no claim of ours is left; False when the Node could not be read or written
        (logged: the claim then lives out its ``ttl``)."""
        digest = _digest(key)
        for attempt in range(self._attempts):
            try:
                record = await read_record(kube=self._kube, node=node)
            except KubeError as exc:
                log.warning("cannot read node %s to release an alert claim: %s", node, exc)
                return False
            mine = record.index(self._claimant)
            kept = [e for e in record.seen if not (e.digest == digest and e.claimant == mine)]
            if mine is None or len(kept) == len(record.seen):
                return True  # not ours (or gone already): nothing to give back
            record.seen = kept
            try:
                await write_record(kube=self._kube, node=node, record=record, text=record.text())
            except Conflict:
                await self._backoff(attempt)
                continue
            except KubeError as exc:
                log.warning("cannot release an alert claim on node %s: %s", node, exc)
                return False
            log.info("alert delivery claim on node %s released: nothing acted on it", node)
            return True
        log.warning("node %s kept changing while releasing an alert claim", node)
        return False
