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
``--webhook.allow-unauthenticated``), 401 without the configured bearer token (or with one that
is not text), 408 when the body does not arrive within the body timeout, 413 over the body limit
(also once decompressed), 415 for a ``Content-Encoding`` other than gzip, 400 for a body that is
not what its encoding says, malformed or too deeply nested JSON, a payload without the v4 fields
(unknown fields are ignored) or with a field over its bound (:data:`LIMITS`, named in the
answer), 503 when the queue is full or the state file cannot be written (Alertmanager retries;
what was queued is deduplicated), 200 once every alert is queued — and, with a state file, its
journal entry and its delivery on disk (:meth:`~nodeguard.statefile.StateFile.persist`) — or
deliberately skipped, with the outcome of each in the body.

The bounds are on bytes, not only counts: every field of an alert is bounded by the payload
model, and what is remembered of a delivery is a fixed-size digest (900 KB fingerprints once
made 100 deliveries cost 87 MB).

The receiver is made of what it does: the payload model (:mod:`~nodeguard.alerts.payload`),
reading a request into it (:mod:`~nodeguard.alerts.delivery`), the deliveries taken
(:mod:`~nodeguard.alerts.dedupe`) and the firing made of an alert
(:mod:`~nodeguard.alerts.alert_firing`).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from nodeguard.alerts.alert_firing import alert_firing
from nodeguard.alerts.claims import AlertClaims
from nodeguard.alerts.dedupe import AlertDedupe, Outcome, delivery_key, fingerprint_key
from nodeguard.alerts.delivery import Refusal, authorized, parse_payload, read_body
from nodeguard.alerts.payload import LIMITS, WebhookAlert, WebhookPayload
from nodeguard.firing import Firing
from nodeguard.rules.schema import AlertRule
from nodeguard.snapshot import NodeSnapshot
from nodeguard.statefile import StateFile

__all__ = [
    "LIMITS",
    "AlertDedupe",
    "Outcome",
    "WebhookAlert",
    "WebhookPayload",
    "WebhookReceiver",
    "delivery_key",
    "fingerprint_key",
]

log = logging.getLogger(__name__)

#: The outcomes that stop a batch with a 503 (Alertmanager retries the whole batch), and why.
_RETRY = {
    "queue_full": "remediation queue full",
    "state_not_persisted": "remediation state cannot be written",
    "observer": "this agent only observes",
}


class WebhookReceiver:
    """The aiohttp handler. ``rules()`` gives the alert rules in force, ``submit(firing)`` queues
    (False when full), ``latest()`` the agent's latest snapshot (evidence for its own node).
    Without a ``token`` the webhook is off (403) unless ``unauthenticated``. ``state``: the
    state file that must hold what was taken before a delivery is answered 2xx. ``acting()``:
    whether this agent acts for its node (:mod:`nodeguard.remediation.actor`); an observer
    answers 503, so Alertmanager delivers again, to an agent that acts. ``counts`` holds
    ``(status, outcome)`` counters for the exporter; ``requests`` by code."""

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
        body_timeout: float = 10.0,
        state: StateFile | None = None,
        acting: Callable[[], bool] = lambda: True,
    ) -> None:
        self._acting = acting
        self._node, self._rules, self._submit, self._latest = node_name, rules, submit, latest
        self._dry, self._token, self._node_label = global_dry_run, token, node_label
        self._open, self._body_timeout = unauthenticated, body_timeout
        self._state = state
        self.dedupe = dedupe or AlertDedupe()
        self.counts: Counter[tuple[str, str]] = Counter()
        self.requests: Counter[int] = Counter()
        self.claims: Counter[str] = Counter()

    def set_acting(self, acting: Callable[[], bool]) -> None:
        """Whether this agent acts for its node, asked for every alert (see the class)."""
        self._acting = acting

    def claimer(self, claims: AlertClaims) -> Callable[[Firing], Awaitable[str]]:
        """The remediator's claim of an alert's delivery on its target Node, counted in
        ``claims`` (``nodeguard_webhook_claims_total{outcome}``)."""

        async def claim(firing: Firing) -> str:
            outcome = await claims.claim(node=firing.node, key=firing.key)
            self.claims[outcome] += 1
            if outcome == "duplicate":
                # The Node's claim is the cluster-wide memory: a re-sent copy asks it again,
                # and takes the delivery over once its claimant is seen dead (a first sight
                # of a claimant is alive: nodeguard.remediation.actor.claimant_alive).
                self.dedupe.forget(firing.key)
            return outcome

        return claim

    def _answer(self, status: int, body: dict[str, Any]) -> web.Response:
        self.requests[status] += 1
        headers = {"WWW-Authenticate": 'Bearer realm="nodeguard"'} if status == 401 else None
        return web.json_response(body, status=status, headers=headers)

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
        if not authorized(request, token=self._token):
            return self._answer(401, {"error": "missing or wrong bearer token"})
        raw = await read_body(request, timeout=self._body_timeout)
        payload = raw if isinstance(raw, Refusal) else parse_payload(raw)
        if isinstance(payload, Refusal):
            return self._answer(payload.status, {"error": payload.error})
        outcomes: list[dict[str, str]] = []
        for alert in payload.alerts:
            outcome = await self._decide(alert)
            self.counts[(alert.status, outcome)] += 1
            outcomes.append(
                {
                    "fingerprint": alert.fingerprint,
                    "status": alert.status,
                    "alertname": alert.labels.get("alertname", ""),
                    "outcome": outcome,
                }
            )
            if outcome in _RETRY:
                # Alertmanager retries the whole batch; the rest is handled then.
                return self._answer(503, {"error": f"{_RETRY[outcome]}, retry", "alerts": outcomes})
        if self._state is not None and not await self._state.persist():
            # Taken and queued, but a kill now would lose it: Alertmanager must send it again
            # (the copy is a duplicate while this agent lives, and acts after a restart).
            return self._answer(
                503, {"error": "remediation state cannot be written, retry", "alerts": outcomes}
            )
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
        if self._state is not None and not self._state.persisted:
            return "state_not_persisted"  # taken now, it would act unknown to the next start
        # Checked and taken in one step of the event loop (no await in between): of
        # deliveries arriving together, one passes.
        skip = self.dedupe.take(alert)
        if skip is not None:
            return skip
        if not (rule.actions if alert.status == "firing" else rule.resolve):
            return "nothing_to_undo"
        if not self._acting():
            self.dedupe.release(alert)
            return "observer"
        firing = alert_firing(
            alert, rule=rule, node=node, latest=self._latest(), global_dry_run=self._dry
        )
        if not self._submit(firing):
            self.dedupe.release(alert)  # Alertmanager's retry must find it new
            if self._state is not None and not self._state.persisted:
                return "state_not_persisted"
            return "queue_full"
        return "queued"
