"""The Alertmanager webhook receiver (payload version 4).

``POST /webhook/alertmanager``, configured in Alertmanager as a ``webhook_configs`` receiver
with ``send_resolved: true`` (docs/alertmanager.yml). For each alert of a delivery, decided by
the alert's own ``status`` (a batch can mix firing and resolved):

- duplicate: ``(fingerprint, startsAt, status)`` was already handled (an HA Alertmanager pair
  delivers each notification twice; a retry after a 503 repeats the batch) -> nothing. Each
  agent remembers what it handled, and with a cluster the delivery is also claimed on its
  target Node (:mod:`nodeguard.alerts.claims`), so it acts once whichever agent the Service
  sends it to;
- stale: a firing whose instance (fingerprint, startsAt) was already resolved -> nothing;
- unmatched: no alert rule maps its ``alertname`` and labels -> nothing;
- otherwise a :class:`~nodeguard.rules.engine.Firing` for the node named by the node label
  (default ``node``) goes to the remediator's queue, the same path as local rules.

Answers: 401 without the configured bearer token (or with one that is not text), 408 when the
body does not arrive within the body timeout, 413 over the body limit (also once
decompressed), 415 for a ``Content-Encoding`` other than gzip, 400 for a body that is not what
its encoding says, malformed or too deeply nested JSON, a payload without the v4 fields (unknown
fields are ignored) or with a field over its bound (:data:`LIMITS`, named in the answer), 503
when the queue is full (Alertmanager retries; what was queued is deduplicated), 200 once every
alert is queued or deliberately skipped, with the outcome of each in the body.

The bounds are on bytes, not only counts: everything remembered of an alert (the dedupe keys,
the incident summary) is made of fields whose length the payload model bounds, so 20,000
remembered deliveries cannot grow past a few MiB whatever is sent (900 KB fingerprints once
made 100 deliveries cost 87 MB).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hmac
import json
import logging
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal

from aiohttp import hdrs, web
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
)

from nodeguard.alerts.claims import AlertClaims
from nodeguard.rules.engine import Firing
from nodeguard.rules.schema import AlertRule
from nodeguard.snapshot import NodeSnapshot

__all__ = ["LIMITS", "AlertDedupe", "WebhookPayload", "WebhookReceiver"]

log = logging.getLogger(__name__)

Outcome = Literal[
    "queued", "duplicate", "stale", "unmatched", "no_node", "nothing_to_undo", "queue_full"
]


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
    """One alert of a delivery (Alertmanager's webhook payload, ``alerts[]``). ``startsAt`` must
    be an RFC 3339 time: it is half of the alert instance's identity. Every field is bounded
    (:data:`LIMITS`)."""

    status: Literal["firing", "resolved"]
    labels: dict[LabelName, LabelValue] = Field(max_length=LIMITS["labels"])
    annotations: dict[LabelName, AnnotationValue] = Field(
        default_factory=dict, max_length=LIMITS["annotations"]
    )
    starts_at: Time = Field(alias="startsAt", min_length=1)
    ends_at: Time = Field(default="", alias="endsAt")
    fingerprint: Fingerprint

    @field_validator("starts_at")
    @classmethod
    def _rfc3339(cls, value: str) -> str:
        if _instant(value) is None:
            raise ValueError(f"not an RFC 3339 time: {value!r}")
        return value


class WebhookPayload(_Loose):
    """The delivery: version ``"4"`` and its alerts; group fields are not needed."""

    version: Literal["4"]
    status: Text = ""
    receiver: Text = ""
    alerts: list[WebhookAlert]


class AlertDedupe:
    """Handled alert deliveries, each remembered for ``ttl`` seconds (bounded to ``limit``
    entries, oldest forgotten first), and the instances already resolved."""

    def __init__(
        self,
        *,
        ttl: float = 24 * 3600.0,
        limit: int = 20000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._ttl, self._limit, self._clock = ttl, limit, clock
        self._seen: OrderedDict[tuple[str, str, str], float] = OrderedDict()
        self._resolved: OrderedDict[str, str] = OrderedDict()  # fingerprint -> startsAt

    def _prune(self) -> None:
        now = self._clock()
        while self._seen and (
            next(iter(self._seen.values())) < now or len(self._seen) > self._limit
        ):
            self._seen.popitem(last=False)
        while len(self._resolved) > self._limit:
            self._resolved.popitem(last=False)

    def check(self, alert: WebhookAlert) -> Outcome | None:
        """``duplicate``/``stale`` if the alert must not act, else ``None``."""
        self._prune()
        key = (alert.fingerprint, alert.starts_at, alert.status)
        if key in self._seen:
            # An alert that keeps firing is re-sent every repeat_interval: keep its key alive
            # for as long as it does, or it would act again when the key expired.
            self._seen[key] = self._clock() + self._ttl
            self._seen.move_to_end(key)
            return "duplicate"
        resolved_start = self._resolved.get(alert.fingerprint)
        # RFC 3339 times from one Alertmanager compare correctly as strings only when their
        # formats match; compare as instants instead.
        if alert.status == "firing" and resolved_start is not None:
            start, resolved = _instant(alert.starts_at), _instant(resolved_start)
            if start is not None and resolved is not None and start <= resolved:
                return "stale"
        return None

    def handled(self, alert: WebhookAlert) -> None:
        """Remember the alert as acted on (or deliberately skipped)."""
        self._seen[(alert.fingerprint, alert.starts_at, alert.status)] = self._clock() + self._ttl
        if alert.status == "resolved":
            previous = self._resolved.get(alert.fingerprint)
            if previous is None or (_instant(alert.starts_at) or 0.0) >= (
                _instant(previous) or 0.0
            ):
                self._resolved[alert.fingerprint] = alert.starts_at
                self._resolved.move_to_end(alert.fingerprint)


def _where(loc: Sequence[int | str]) -> str:
    """A pydantic error location as a field path, each part cut short (a label name in it can
    be as long as the body)."""
    parts = [str(p) for p in loc]
    return ".".join(
        p if len(p) <= _ERROR_PART_CHARS else p[: _ERROR_PART_CHARS - 3] + "..." for p in parts
    )


def _instant(rfc3339: str) -> float | None:
    text = rfc3339.strip().replace("Z", "+00:00")
    if "." in text:  # Go prints nanoseconds; Python takes microseconds
        head, _, tail = text.partition(".")
        digits = "".join(ch for ch in tail if ch.isdigit())
        zone = tail[len(digits) :]
        text = f"{head}.{digits[:6]}{zone}"
    try:
        return dt.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


class WebhookReceiver:
    """The aiohttp handler. ``rules()`` gives the alert rules in force, ``submit(firing)`` queues
    (False when full), ``latest()`` the agent's latest snapshot (evidence for its own node).
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
        claims: AlertClaims | None = None,
        room: Callable[[], bool] = lambda: True,
        body_timeout: float = 10.0,
    ) -> None:
        self._node, self._rules, self._submit, self._latest = node_name, rules, submit, latest
        self._dry, self._token, self._node_label = global_dry_run, token, node_label
        self.dedupe = dedupe or AlertDedupe()
        self._claims, self._room, self._body_timeout = claims, room, body_timeout
        self.counts: dict[tuple[str, str], int] = {}
        self.requests: dict[int, int] = {}

    def _answer(self, status: int, body: dict[str, Any]) -> web.Response:
        self.requests[status] = self.requests.get(status, 0) + 1
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
        if not self._authorized(request):
            return self._answer(401, {"error": "missing or wrong bearer token"})
        raw = await self._body(request)
        if isinstance(raw, web.Response):
            return raw
        try:
            data = json.loads(raw)
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
        skip = self.dedupe.check(alert)
        if skip is not None:
            return skip
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
        actions = rule.actions if alert.status == "firing" else rule.resolve
        if not actions:
            self.dedupe.handled(alert)
            return "nothing_to_undo"
        if not self._room():
            return "queue_full"  # before claiming: Alertmanager's retry must still find it new
        if self._claims is not None:
            claim = await self._claims.claim(
                node=node,
                fingerprint=alert.fingerprint,
                starts_at=alert.starts_at,
                status=alert.status,
            )
            if claim in ("duplicate", "stale"):
                self.dedupe.handled(alert)
                return "duplicate" if claim == "duplicate" else "stale"
        firing = self._firing(alert, rule, node)
        if not self._submit(firing):
            return "queue_full"
        self.dedupe.handled(alert)
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
        if len(summary) > _SUMMARY_CHARS:
            summary = summary[: _SUMMARY_CHARS - 3] + "..."
        return Firing(
            rule=rule.name,
            kind="firing" if alert.status == "firing" else "resolved",
            scope="pod" if pod_ref else "node",
            target=f"{ns}/{pod}" if pod_ref else node,
            node=node,
            time=time.time(),
            actions=tuple(rule.actions if alert.status == "firing" else rule.resolve),
            dry_run=self._dry or bool(rule.dry_run),
            pod_ref=pod_ref,
            source="alertmanager",
            summary=summary,
            snapshot=snap if snap is not None and snap.node_name == node else None,
        )
