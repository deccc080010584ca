"""The Alertmanager webhook receiver (payload version 4).

``POST /webhook/alertmanager``, configured in Alertmanager as a ``webhook_configs`` receiver
with ``send_resolved: true`` (docs/alertmanager.yml). For each alert of a delivery, decided by
the alert's own ``status`` (a batch can mix firing and resolved):

- duplicate: the delivery ``(fingerprint, startsAt, status)`` was already taken by this agent
  (an HA Alertmanager pair delivers each notification twice; a retry after a 503 repeats the
  batch) -> nothing. ``startsAt`` counts as the instant it names, so ``...T10:00:00Z``,
  ``...T10:00:00.000Z`` and ``...T11:00:00+01:00`` are one alert. The check and the taking are
  one step of the event loop, so deliveries arriving together cannot both pass it; what was
  taken is kept in the state file, so a restarted agent remembers;
- stale: a firing whose instance (fingerprint, startsAt) was already resolved -> nothing;
- unmatched: no alert rule maps its ``alertname`` and labels -> nothing;
- otherwise a :class:`~nodeguard.firing.Firing` for the node named by the node label (default
  ``node``) goes to the remediator's journal and queue, the same path as local rules. Before its
  first step runs, the remediator claims the delivery on the target Node
  (:mod:`nodeguard.alerts.claims`), so of all the agents behind the Service exactly one acts,
  also when the API server was down when the deliveries came (the claim waits for it).

Answers: 403 when no token is configured (the webhook is off unless started with
``--webhook.allow-unauthenticated``), 401 without the configured bearer token, 413 over the body
limit, 400 for malformed
JSON or a payload without the v4 fields (unknown fields are ignored), 503 when the queue is
full (Alertmanager retries; what was queued is deduplicated), 200 once every alert is queued
or deliberately skipped, with the outcome of each in the body.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Literal

from aiohttp import web
from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
)

from nodeguard.alerts.claims import AlertClaims
from nodeguard.firing import Firing
from nodeguard.rules.schema import AlertRule
from nodeguard.snapshot import NodeSnapshot

__all__ = ["AlertDedupe", "WebhookAlert", "WebhookPayload", "WebhookReceiver", "delivery_key"]

log = logging.getLogger(__name__)

Outcome = Literal[
    "queued", "duplicate", "stale", "unmatched", "no_node", "nothing_to_undo", "queue_full"
]

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


class WebhookAlert(_Loose):
    """One alert of a delivery (Alertmanager's webhook payload, ``alerts[]``). ``startsAt``
    must be an RFC 3339 time with a zone (pydantic parses it; beyond microseconds the digits
    are dropped): it is half of the alert instance's identity."""

    status: Literal["firing", "resolved"]
    labels: dict[str, str]
    annotations: dict[str, str] = Field(default_factory=dict)
    starts_at: AwareDatetime = Field(alias="startsAt")
    ends_at: str = Field(default="", alias="endsAt")
    fingerprint: str = Field(min_length=1)

    @field_validator("starts_at", mode="wrap")
    @classmethod
    def _rfc3339(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> dt.datetime:
        try:
            parsed: dt.datetime = handler(value)
        except ValidationError:
            raise ValueError(f"not an RFC 3339 time with a zone: {str(value)[:64]!r}") from None
        return parsed

    @property
    def instant(self) -> int:
        """``startsAt`` as integer microseconds since the epoch, whatever its notation."""
        return (self.starts_at - _EPOCH) // dt.timedelta(microseconds=1)


class WebhookPayload(_Loose):
    """The delivery: version ``"4"`` and its alerts; group fields are not needed."""

    version: Literal["4"]
    status: str = ""
    receiver: str = ""
    alerts: list[WebhookAlert]


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
        if self._seen.pop(delivery_key(alert), None) is not None:
            self._changed()


class WebhookReceiver:
    """The aiohttp handler. ``rules()`` gives the alert rules in force, ``submit(firing)`` queues
    (False when full), ``latest()`` the agent's latest snapshot (evidence for its own node).
    Without a ``token`` the webhook is off (403) unless ``unauthenticated``.
    ``counts`` holds ``(status, outcome)`` counters for the exporter; ``requests`` by code."""

    def __init__(
        self,
        *,
        node_name: str,
        rules: Callable[[], tuple[AlertRule, ...]],
        submit: Callable[[Firing], bool],
        latest: Callable[[], NodeSnapshot | None],
        global_dry_run: bool,
        token: str | None = None,
        node_label: str = "node",
        dedupe: AlertDedupe | None = None,
        unauthenticated: bool = False,
    ) -> None:
        self._node, self._rules, self._submit, self._latest = node_name, rules, submit, latest
        self._dry, self._token, self._node_label = global_dry_run, token, node_label
        self._open = unauthenticated
        self.dedupe = dedupe or AlertDedupe()
        self.counts: dict[tuple[str, str], int] = {}
        self.requests: dict[int, int] = {}
        self.claims: dict[str, int] = {}

    def claimer(self, claims: AlertClaims) -> Callable[[Firing], Awaitable[str]]:
        """The remediator's claim of an alert's delivery on its target Node, counted in
        ``claims`` (``nodeguard_webhook_claims_total{outcome}``)."""

        async def claim(firing: Firing) -> str:
            outcome = await claims.claim(node=firing.node, key=firing.key)
            self.claims[outcome] = self.claims.get(outcome, 0) + 1
            return outcome

        return claim

    def _answer(self, status: int, body: dict[str, Any]) -> web.Response:
        self.requests[status] = self.requests.get(status, 0) + 1
        headers = {"WWW-Authenticate": 'Bearer realm="nodeguard"'} if status == 401 else None
        return web.json_response(body, status=status, headers=headers)

    def _authorized(self, request: web.Request) -> bool:
        if not self._token:
            return True
        header = request.headers.get("Authorization", "")
        scheme, _, credential = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            credential.strip().encode(), self._token.encode()
        )

    async def handle(self, request: web.Request) -> web.Response:
        """``POST /webhook/alertmanager``."""
        if not self._token and not self._open:
            return self._answer(
                403,
                {
                    "error": "the webhook is off: start nodeguard with --webhook.token-file "
                    "(or --webhook.allow-unauthenticated, for a test on loopback)"
                },
            )
        if not self._authorized(request):
            return self._answer(401, {"error": "missing or wrong bearer token"})
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._answer(413, {"error": f"body over {request.client_max_size} bytes"})
        try:
            data = json.loads(raw)
        except ValueError as exc:
            return self._answer(400, {"error": f"malformed JSON: {exc}"})
        try:
            payload = WebhookPayload.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
            )
            return self._answer(400, {"error": f"not an Alertmanager v4 payload: {problems}"})
        outcomes = []
        full = False
        for alert in payload.alerts:
            outcome = await self._decide(alert)
            self.counts[(alert.status, outcome)] = self.counts.get((alert.status, outcome), 0) + 1
            outcomes.append(
                {
                    "fingerprint": alert.fingerprint,
                    "status": alert.status,
                    "alertname": alert.labels.get("alertname", ""),
                    "outcome": outcome,
                }
            )
            if outcome == "queue_full":
                full = True
                break  # Alertmanager retries the whole batch; the rest is handled then
        if full:
            return self._answer(503, {"error": "remediation queue full, retry", "alerts": outcomes})
        return self._answer(200, {"alerts": outcomes})

    async def _decide(self, alert: WebhookAlert) -> Outcome:
        rule = next((r for r in self._rules() if r.matches(alert.labels)), None)
        if rule is None:
            return "unmatched"
        node = alert.labels.get(self._node_label)
        if not node:
            log.warning(
                "alert %s has no %r label: no node to act on",
                alert.labels.get("alertname"),
                self._node_label,
            )
            return "no_node"
        # Checked and taken in one step of the event loop (no await in between): of
        # deliveries arriving together, one passes.
        skip = self.dedupe.take(alert)
        if skip is not None:
            return skip
        if not (rule.actions if alert.status == "firing" else rule.resolve):
            return "nothing_to_undo"
        if not self._submit(self._firing(alert, rule, node)):
            self.dedupe.release(alert)  # Alertmanager's retry must find it new
            return "queue_full"
        return "queued"

    def _firing(self, alert: WebhookAlert, rule: AlertRule, node: str) -> Firing:
        ns, pod = alert.labels.get("namespace"), alert.labels.get("pod")
        pod_ref = (ns, pod) if ns and pod else None
        snap = self._latest()
        text = alert.annotations.get("summary") or alert.annotations.get("description") or ""
        labels = ",".join(f"{k}={v}" for k, v in sorted(alert.labels.items()))
        return Firing(
            rule=rule.name,
            kind="firing" if alert.status == "firing" else "resolved",
            scope="pod" if pod_ref else "node",
            target=f"{ns}/{pod}" if pod_ref else node,
            node=node,
            time=time.time(),
            steps=tuple(
                a.step for a in (rule.actions if alert.status == "firing" else rule.resolve)
            ),
            dry_run=self._dry or bool(rule.dry_run),
            pod_ref=pod_ref,
            source="alertmanager",
            summary=f"alert {alert.labels.get('alertname')} {alert.status} ({labels})"
            + (f": {text}" if text else ""),
            key=delivery_key(alert),
            snapshot=snap if snap is not None and snap.node_name == node else None,
        )
