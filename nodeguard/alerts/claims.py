"""Claiming an alert delivery cluster-wide, so that it acts once whichever agent receives it.

Alertmanager delivers to the nodeguard Service, which spreads deliveries over all agents: the two
copies an HA Alertmanager pair sends, a retry, or an alert's firing and its resolution can land
on different agents, whose own memory (:class:`~nodeguard.alerts.webhook.AlertDedupe`) cannot
see each other. The target Node carries the claims instead, in the annotation
``nodeguard.io/alert-deliveries`` (JSON: ``seen``, the recent delivery keys with their expiry
and the agent that claimed each; ``resolved``, the latest resolved instant per fingerprint
digest). A claim is a merge patch carrying the Node's resourceVersion: of two agents claiming
the same delivery at once, exactly one succeeds and the other reads again and finds it taken
(optimistic concurrency). A conflict is never taken for a win: the claimer reads and tries
again (with jittered backoff) until the Node says who has it.

The remediator claims a delivery just before its first step (:meth:`AlertClaims.claim`), not
when the delivery arrives: while the API server is down the claim waits, like any step, and
when it is back exactly one agent's claim wins. An agent that claimed a delivery and was
restarted finds its own claim (``ours``) and goes on. Claims are written in dry run too: they
record which agent handles a delivery, not an action, and without them a dry-run pair of
agents would report two runs where a real pair makes one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from nodeguard.kube.client import KubeClient
from nodeguard.kube.errors import Conflict, KubeError

__all__ = ["ANNOTATION", "AlertClaims", "Claim", "parse_key"]

log = logging.getLogger(__name__)

ANNOTATION = "nodeguard.io/alert-deliveries"
_KEEP = 64  # delivery keys kept per node, newest last (each under 80 bytes)

Claim = Literal["claimed", "ours", "duplicate", "stale", "unavailable"]


def parse_key(key: str) -> tuple[str, int, str]:
    """``(fingerprint digest, startsAt instant in µs, status)`` of a delivery key
    (:func:`nodeguard.alerts.webhook.delivery_key`). Raises ``ValueError``."""
    fingerprint, instant, status = key.split(":")
    return fingerprint, int(instant), status


class AlertClaims:
    """Claims deliveries on their target Node for agent ``claimant`` (its node name). ``ttl``:
    how long a claim is remembered after its last delivery; ``attempts``: reads and writes
    before a Node that keeps changing is given up on for now (``unavailable``)."""

    def __init__(
        self,
        *,
        kube: KubeClient,
        claimant: str,
        ttl: float = 24 * 3600.0,
        attempts: int = 30,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._kube, self._claimant, self._ttl, self._attempts = kube, claimant, ttl, attempts
        self._clock, self._sleep = clock, sleep

    async def claim(self, *, node: str, key: str) -> Claim:
        """Claim one delivery for ``node``: ``claimed`` (now, by us), ``ours`` (by us before a
        restart), ``duplicate`` (another agent has it), ``stale`` (a firing older than a
        resolution already handled), ``unavailable`` (the Node cannot be read or written now:
        the API server is down, the Node is gone, RBAC; or it kept changing under us)."""
        fingerprint, instant, status = parse_key(key)
        for attempt in range(self._attempts):
            try:
                current = await self._kube.get_node(name=node)
            except KubeError as exc:
                log.warning("cannot read node %s to claim an alert delivery: %s", node, exc)
                return "unavailable"
            meta = current.get("metadata", {})
            data = self._decode((meta.get("annotations") or {}).get(ANNOTATION))
            now = self._clock()
            seen = [e for e in data["seen"] if float(e[1]) > now]
            holder = next((str(e[2]) for e in seen if e[0] == key), None)
            if holder is not None:
                return "ours" if holder == self._claimant else "duplicate"
            resolved = data["resolved"].get(fingerprint)
            if status == "firing" and resolved is not None and instant <= int(resolved):
                return "stale"
            seen.append([key, now + self._ttl, self._claimant])
            if status == "resolved" and (resolved is None or instant >= int(resolved)):
                data["resolved"].pop(fingerprint, None)
                data["resolved"][fingerprint] = instant
            value = json.dumps(
                {"seen": seen[-_KEEP:], "resolved": dict(list(data["resolved"].items())[-_KEEP:])},
                separators=(",", ":"),
            )
            patch = {
                "metadata": {
                    "resourceVersion": meta.get("resourceVersion"),
                    "annotations": {ANNOTATION: value},
                }
            }
            try:
                await self._kube.patch_node(name=node, patch=patch, dry_run=False)
            except Conflict:
                # Another agent wrote the Node meanwhile: read again, and see who has it.
                await self._sleep(min(0.5, 0.01 * 2**attempt) * (0.5 + random.random()))
                continue
            except KubeError as exc:
                log.warning("cannot claim an alert delivery on node %s: %s", node, exc)
                return "unavailable"
            return "claimed"
        log.warning("node %s kept changing while claiming an alert delivery; later", node)
        return "unavailable"

    @staticmethod
    def _decode(text: str | None) -> dict[str, Any]:
        try:
            data = json.loads(text or "{}")
            seen = [
                list(e)
                for e in data.get("seen", [])
                if isinstance(e, list) and len(e) == 3 and isinstance(e[0], str)
            ]
            resolved = {str(k): int(v) for k, v in dict(data.get("resolved", {})).items()}
        except (ValueError, TypeError, AttributeError):
            return {"seen": [], "resolved": {}}
        return {"seen": seen, "resolved": resolved}
