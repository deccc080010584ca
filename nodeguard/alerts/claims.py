"""Claiming an alert delivery cluster-wide, so that it acts once whichever agent receives it.

Alertmanager delivers to the nodeguard Service, which spreads deliveries over all agents: the two
copies an HA Alertmanager pair sends, a retry, or an alert's firing and its resolution can land
on different agents, whose in-memory dedupe (:class:`~nodeguard.alerts.webhook.AlertDedupe`)
cannot see each other. The target Node carries the claims instead, in the annotation
``nodeguard.io/alert-deliveries`` (JSON: the recent ``(fingerprint, startsAt, status)`` keys
with their expiry, and the latest resolved ``startsAt`` per fingerprint). A claim is a merge
patch carrying the Node's resourceVersion: of two agents claiming the same delivery at once,
exactly one succeeds and the other re-reads and finds it taken (optimistic concurrency).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from typing import Any, Literal

from nodeguard.kube.client import KubeClient
from nodeguard.kube.errors import Conflict, KubeError

__all__ = ["ANNOTATION", "AlertClaims"]

log = logging.getLogger(__name__)

ANNOTATION = "nodeguard.io/alert-deliveries"
_KEEP = 64  # keys kept per node, newest last


def _instant(text: str) -> float:
    value = text.strip().replace("Z", "+00:00")
    if "." in value:
        head, _, tail = value.partition(".")
        digits = "".join(ch for ch in tail if ch.isdigit())
        value = f"{head}.{digits[:6]}{tail[len(digits) :]}"
    try:
        return dt.datetime.fromisoformat(value).timestamp()
    except ValueError:
        return 0.0


class AlertClaims:
    """Claims deliveries on their target Node. ``ttl``: how long a claim is remembered after
    its last delivery (an alert that keeps firing keeps refreshing it)."""

    def __init__(self, *, kube: KubeClient, ttl: float = 24 * 3600.0) -> None:
        self._kube, self._ttl = kube, ttl

    async def claim(
        self, *, node: str, fingerprint: str, starts_at: str, status: str
    ) -> Literal["claimed", "duplicate", "stale", "unavailable"]:
        """Claim one delivery for ``node``. ``unavailable``: the Node could not be read or
        written (it does not exist, the API is down, RBAC): the caller falls back to its own
        memory rather than dropping the alert."""
        key = [fingerprint, starts_at, status]
        for _ in range(5):
            try:
                current = await self._kube.get_node(name=node)
            except KubeError as exc:
                log.warning("cannot read node %s to claim an alert delivery: %s", node, exc)
                return "unavailable"
            meta = current.get("metadata", {})
            data = self._decode((meta.get("annotations") or {}).get(ANNOTATION))
            now = time.time()
            seen = [e for e in data["seen"] if e[3] > now]
            duplicate = any(e[:3] == key for e in seen)
            resolved = data["resolved"].get(fingerprint)
            stale = (
                status == "firing"
                and resolved is not None
                and _instant(starts_at) <= _instant(resolved)
            )
            seen = [e for e in seen if e[:3] != key] + [[*key, now + self._ttl]]
            if status == "resolved" and (
                resolved is None or _instant(starts_at) >= _instant(resolved)
            ):
                data["resolved"][fingerprint] = starts_at
            patch = {
                "metadata": {
                    "resourceVersion": meta.get("resourceVersion"),
                    "annotations": {
                        ANNOTATION: json.dumps(
                            {
                                "seen": seen[-_KEEP:],
                                "resolved": dict(list(data["resolved"].items())[-_KEEP:]),
                            },
                            separators=(",", ":"),
                        )
                    },
                }
            }
            try:
                await self._kube.patch_node(name=node, patch=patch, dry_run=False)
            except Conflict:
                continue  # another agent wrote meanwhile: read again
            except KubeError as exc:
                log.warning("cannot claim an alert delivery on node %s: %s", node, exc)
                return "unavailable"
            if duplicate:
                return "duplicate"
            return "stale" if stale else "claimed"
        return "unavailable"

    @staticmethod
    def _decode(text: str | None) -> dict[str, Any]:
        try:
            data = json.loads(text or "{}")
            seen = [list(e) for e in data.get("seen", []) if isinstance(e, list) and len(e) == 4]
            resolved = {str(k): str(v) for k, v in dict(data.get("resolved", {})).items()}
        except (ValueError, TypeError, AttributeError):
            return {"seen": [], "resolved": {}}
        return {"seen": seen, "resolved": resolved}
