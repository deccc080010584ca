"""The deliveries this agent took, and the latest resolved instance of each alert, so that a
copy of a delivery (an HA Alertmanager pair sends each twice; a retry repeats a batch) or a
firing already resolved does not act again.

A delivery is ``(fingerprint, startsAt, status)``; ``startsAt`` counts as the instant it names.
What is remembered is a fixed-size digest of each, kept in the state file's ``alerts`` section,
so a restarted agent remembers and the memory is bounded in bytes.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, MutableMapping
from typing import Any, Literal

from nodeguard.alerts.payload import WebhookAlert

__all__ = ["AlertDedupe", "Outcome", "delivery_key", "fingerprint_key"]

#: What became of one alert of a delivery (the ``outcome`` of the answer's ``alerts[]``, and of
#: ``nodeguard_webhook_alerts_total``).
Outcome = Literal[
    "queued",
    "duplicate",
    "stale",
    "unmatched",
    "no_node",
    "nothing_to_undo",
    "queue_full",
    "state_not_persisted",
    "observer",
]


def _digest(*parts: object) -> str:
    # Fixed-size keys: what is remembered costs the same whatever the sender put in a field.
    return hashlib.sha256("\0".join(str(p) for p in parts).encode()).hexdigest()[:32]


def delivery_key(alert: WebhookAlert) -> str:
    """The identity of one delivery, ``FINGERPRINT-DIGEST:INSTANT:STATUS`` (the instant of
    ``startsAt`` in microseconds): bounded in size whatever the fingerprint, and readable by
    :func:`nodeguard.alerts.claims.parse_key`."""
    return f"{fingerprint_key(alert)}:{alert.instant}:{alert.status}"


def fingerprint_key(alert: WebhookAlert) -> str:
    """A digest of the alert's fingerprint (what resolutions are remembered under)."""
    return _digest(alert.fingerprint)


class AlertDedupe:
    """Deliveries this agent took, each remembered for ``ttl`` seconds (at most ``limit``,
    oldest forgotten first), and the latest resolved instance of each fingerprint. Kept in
    ``store`` (the state file's ``alerts`` section; ``changed()`` saves it). Keys are fixed-size
    digests, so the memory is bounded in bytes (about 100 bytes an entry)."""

    def __init__(
        self,
        *,
        ttl: float = 24 * 3600.0,
        limit: int = 20000,
        clock: Callable[[], float] = time.time,
        store: MutableMapping[str, Any] | None = None,
        changed: Callable[[], None] = lambda: None,
    ) -> None:
        self._ttl, self._limit, self._clock, self._changed = ttl, limit, clock, changed
        store = store if store is not None else {}
        self._seen: dict[str, float] = store.setdefault("seen", {})
        self._resolved: dict[str, int] = store.setdefault("resolved", {})

    def _prune(self) -> None:
        now = self._clock()
        for key in [k for k, expiry in self._seen.items() if float(expiry) < now]:
            del self._seen[key]
        for table in (self._seen, self._resolved):
            while len(table) > self._limit:
                del table[next(iter(table))]  # insertion order: the oldest first

    def take(self, alert: WebhookAlert) -> Outcome | None:
        """``duplicate``/``stale`` if the alert must not act; else ``None``, and the delivery
        is taken: a copy arriving next is a duplicate. Give it back with :meth:`release` if it
        could not be queued."""
        self._prune()
        key = delivery_key(alert)
        if key in self._seen:
            # An alert that keeps firing is re-sent every repeat_interval: keep its key alive
            # for as long as it does, or it would act again when the key expired.
            del self._seen[key]
            self._seen[key] = self._clock() + self._ttl
            return "duplicate"
        resolved = self._resolved.get(fingerprint_key(alert))
        if alert.status == "firing" and resolved is not None and alert.instant <= int(resolved):
            return "stale"
        self._seen[key] = self._clock() + self._ttl
        if alert.status == "resolved":
            fp = fingerprint_key(alert)
            if int(self._resolved.get(fp, alert.instant)) <= alert.instant:
                self._resolved.pop(fp, None)
                self._resolved[fp] = alert.instant
        self._prune()
        self._changed()
        return None

    def release(self, alert: WebhookAlert) -> None:
        """Forget a delivery taken by :meth:`take` (the queue was full: the retry is new)."""
        self.forget(delivery_key(alert))

    def forget(self, key: str) -> None:
        """Forget the delivery :func:`delivery_key` ``key`` (a firing's ``key``): its next copy
        acts. For an alert whose runbook could not plan (no pod list in time): Alertmanager
        re-sends a firing alert every ``repeat_interval``, and that copy is not a duplicate."""
        if self._seen.pop(key, None) is not None:
            self._changed()
