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
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import hmac
import json
import logging
import re
import time
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Annotated, Any, Literal

from aiohttp import hdrs, web
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
)

from nodeguard.alerts.claims import AlertClaims
from nodeguard.firing import Firing
from nodeguard.rules.schema import AlertRule
from nodeguard.snapshot import NodeSnapshot
from nodeguard.statefile import StateFile

__all__ = [
    "LIMITS",
    "AlertDedupe",
    "WebhookAlert",
    "WebhookPayload",
    "WebhookReceiver",
    "delivery_key",
]

log = logging.getLogger(__name__)

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

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
# RFC 3339 section 5.6 date-time: full-date "T" full-time, the zone required.
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")

#: Bounds of the fields of an alert, in characters (and entries). Alertmanager's fingerprints
#: are 16 hex digits and its times 20-35 characters; labels and annotations are Prometheus's,
#: which sets no limit of its own, so these are generous.
LIMITS = {
    "fingerprint": 64,
    "time": 64,
    "labels": 64,
    "label_name": 128,
    "label_value": 1024,
    "annotations": 64,
    "annotation_value": 8192,
    "text": 256,  # status, receiver
}
# An incident keeps the summary of its firing: cut, so 200 kept incidents stay small.
_SUMMARY_CHARS = 2000
_ERROR_PART_CHARS = 40


def _unicode(value: str) -> str:
    """Text that UTF-8 can write: JSON's ``"\\ud800"`` escape gives a lone surrogate, which
    every later encode (an incident id, an API request, a log line) would fail on."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("not Unicode text (a lone surrogate)") from None
    return value


_Unicode = AfterValidator(_unicode)
Fingerprint = Annotated[
    str, StringConstraints(min_length=1, max_length=LIMITS["fingerprint"]), _Unicode
]
Time = Annotated[str, StringConstraints(max_length=LIMITS["time"]), _Unicode]
LabelName = Annotated[str, StringConstraints(max_length=LIMITS["label_name"]), _Unicode]
LabelValue = Annotated[str, StringConstraints(max_length=LIMITS["label_value"]), _Unicode]
AnnotationValue = Annotated[str, StringConstraints(max_length=LIMITS["annotation_value"]), _Unicode]
Text = Annotated[str, StringConstraints(max_length=LIMITS["text"]), _Unicode]


class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


class WebhookAlert(_Loose):
    """One alert of a delivery (Alertmanager's webhook payload, ``alerts[]``). ``startsAt``
    must be an RFC 3339 time with a zone (pydantic parses it; beyond microseconds the digits
    are dropped): it is half of the alert instance's identity."""

    status: Literal["firing", "resolved"]
    labels: dict[LabelName, LabelValue] = Field(max_length=LIMITS["labels"])
    annotations: dict[LabelName, AnnotationValue] = Field(
        default_factory=dict, max_length=LIMITS["annotations"]
    )
    starts_at: AwareDatetime = Field(alias="startsAt")
    ends_at: Time = Field(default="", alias="endsAt")
    fingerprint: Fingerprint

    @field_validator("starts_at", mode="wrap")
    @classmethod
    def _rfc3339(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> dt.datetime:
        if isinstance(value, str) and len(value) > LIMITS["time"]:
            raise ValueError(f"longer than {LIMITS['time']} characters")
        if not isinstance(value, str) or not _RFC3339.fullmatch(value):
            # pydantic also takes Unix times and dates without a zone: not Alertmanager's.
            raise ValueError(f"not an RFC 3339 time with a zone: {str(value)[:64]!r}")
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
    status: Text = ""
    receiver: Text = ""
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
        self.forget(delivery_key(alert))

    def forget(self, key: str) -> None:
        """Forget the delivery :func:`delivery_key` ``key`` (a firing's ``key``): its next copy
        acts. For an alert whose runbook could not plan (no pod list in time): Alertmanager
        re-sends a firing alert every ``repeat_interval``, and that copy is not a duplicate."""
        if self._seen.pop(key, None) is not None:
            self._changed()


def _not_json(name: str) -> None:
    """``NaN``, ``Infinity`` and ``-Infinity``: Python's json takes them, RFC 8259 (section 6)
    does not, and no Alertmanager writes them."""
    raise ValueError(f"{name} is not JSON (RFC 8259 section 6)")


def _where(loc: Sequence[int | str]) -> str:
    """A pydantic error location as a field path, each part cut short (a label name in it can
    be as long as the body)."""
    parts = [str(p) for p in loc]
    return ".".join(
        p if len(p) <= _ERROR_PART_CHARS else p[: _ERROR_PART_CHARS - 3] + "..." for p in parts
    )


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

    def _authorized(self, request: web.Request) -> bool:
        if not self._token:
            return True
        header = request.headers.get(hdrs.AUTHORIZATION, "")
        scheme, _, credential = header.partition(" ")
        # aiohttp decodes header bytes that are not UTF-8 to lone surrogates; surrogateescape
        # gives those bytes back, so any header compares (and fails) instead of raising.
        return scheme.lower() == "bearer" and hmac.compare_digest(
            credential.strip().encode("utf-8", "surrogateescape"), self._token.encode()
        )

    async def _body(self, request: web.Request) -> bytes | web.Response:
        """The body, decompressed, or the answer that refuses it."""
        limit = request.client_max_size
        try:
            async with asyncio.timeout(self._body_timeout):
                raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._answer(413, {"error": f"body over {limit} bytes"})
        except TimeoutError:
            return self._answer(408, {"error": f"body not received within {self._body_timeout:g}s"})
        encoding = request.headers.get(hdrs.CONTENT_ENCODING, "identity").strip().lower()
        if encoding in ("", "identity"):
            return raw
        if encoding not in ("gzip", "x-gzip"):
            return self._answer(415, {"error": "Content-Encoding: only gzip or identity"})
        inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        try:
            body = inflate.decompress(raw, limit + 1)  # never more than the limit in memory
        except zlib.error as exc:
            return self._answer(400, {"error": f"body is not gzip: {exc}"})
        if len(body) > limit:
            return self._answer(413, {"error": f"body over {limit} bytes once decompressed"})
        if not inflate.eof or inflate.unused_data:
            return self._answer(400, {"error": "body is not one whole gzip stream"})
        return body

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
        raw = await self._body(request)
        if isinstance(raw, web.Response):
            return raw
        try:
            data = json.loads(raw, parse_constant=_not_json)
        except RecursionError:
            return self._answer(400, {"error": "malformed JSON: nested too deeply"})
        except ValueError as exc:  # UnicodeDecodeError too: bytes that are not UTF-8
            return self._answer(400, {"error": f"malformed JSON: {exc}"})
        try:
            payload = WebhookPayload.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{_where(e['loc'])}: {e['msg']}"
                for e in exc.errors(include_input=False, include_url=False)
            )
            return self._answer(400, {"error": f"not an Alertmanager v4 payload: {problems}"})
        outcomes = []
        full: str | None = None
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
            if outcome in ("queue_full", "state_not_persisted", "observer"):
                full = outcome
                break  # Alertmanager retries the whole batch; the rest is handled then
        if full and outcomes[-1]["outcome"] == "state_not_persisted":
            return self._answer(
                503, {"error": "remediation state cannot be written, retry", "alerts": outcomes}
            )
        if full:
            why = {
                "queue_full": "remediation queue full",
                "state_not_persisted": "remediation state cannot be written",
            }.get(str(full), "this agent only observes")
            return self._answer(503, {"error": f"{why}, retry", "alerts": outcomes})
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
        if not self._submit(self._firing(alert, rule, node)):
            self.dedupe.release(alert)  # Alertmanager's retry must find it new
            if self._state is not None and not self._state.persisted:
                return "state_not_persisted"
            return "queue_full"
        return "queued"

    def _firing(self, alert: WebhookAlert, rule: AlertRule, node: str) -> Firing:
        ns, pod = alert.labels.get("namespace"), alert.labels.get("pod")
        pod_ref = (ns, pod) if ns and pod else None
        snap = self._latest()
        text = alert.annotations.get("summary") or alert.annotations.get("description") or ""
        labels = ",".join(f"{k}={v}" for k, v in sorted(alert.labels.items()))
        summary = f"alert {alert.labels.get('alertname')} {alert.status} ({labels})" + (
            f": {text}" if text else ""
        )
        if len(summary) > _SUMMARY_CHARS:  # an incident keeps it: bounded
            summary = summary[: _SUMMARY_CHARS - 3] + "..."
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
            summary=summary,
            key=delivery_key(alert),
            snapshot=snap if snap is not None and snap.node_name == node else None,
        )
