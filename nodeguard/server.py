"""The agent's HTTP endpoints (aiohttp).

- ``GET /metrics``: Prometheus exposition of the latest snapshot and of ``registry``
  (prometheus_client's writers and OpenMetrics negotiation, rendered in a worker thread, gzip;
  :mod:`nodeguard.exposition.handler`).
- ``GET /healthz``: 200 while the sampler keeps sampling; 503 when the latest snapshot (or the
  first, at start) is more than three intervals + 5 s late (a wedged sampler should get the pod
  restarted).
- ``GET /readyz``: 200 once the first snapshot exists, 503 before.
- ``GET /snapshot``: the latest snapshot as JSON (bytes and seconds); 503 before the first.
- ``GET /incidents``: incident summaries, newest first; ``GET /incidents/{id}``: one in full;
  ``GET /incidents/{id}.html``: one as a self-contained HTML page, its timeline as charts
  (:mod:`nodeguard.remediation.incident_page`, the page ``nodeguard incidents ID --html``
  writes); 404 (a page saying so) when unknown.
- ``POST /webhook/alertmanager``: Alertmanager's webhook (:mod:`nodeguard.alerts.webhook`).
"""

from __future__ import annotations

import html
import json
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CollectorRegistry

from nodeguard.connections import ConnectionGuard, deadline_middleware
from nodeguard.exposition.exporter import snapshot_families
from nodeguard.exposition.handler import Exposition, make_metrics_handler
from nodeguard.exposition.metric_filter import MetricFilter
from nodeguard.remediation.incident_page import page
from nodeguard.remediation.incidents import IncidentStore
from nodeguard.sampling.sampler import Sampler
from nodeguard.snapshot import to_jsonable

__all__ = ["make_app"]


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: The newest incidents whose pages the index page links to.
_INDEX_INCIDENTS = 10


def make_app(
    *,
    sampler: Sampler,
    registry: CollectorRegistry,
    incidents: IncidentStore | None = None,
    webhook: Handler | None = None,
    max_body: int = 1 << 20,
    guard: ConnectionGuard | None = None,
    metric_filter: MetricFilter | None = None,
) -> web.Application:
    """The aiohttp application serving the endpoints above from ``sampler.latest``.
    ``registry`` holds the prometheus_client collectors of state that lives on the event loop
    (rules, actions, webhook); ``/metrics`` writes the snapshot's families first, then those,
    both through ``metric_filter``. With ``guard`` (:mod:`nodeguard.connections`), each answer
    is written within its write timeout."""
    interval = sampler.config.interval
    started = time.time()
    stale_after = 3 * interval + 5

    async def healthz(_: web.Request) -> web.Response:
        snap = sampler.latest
        if snap is None:
            waited = time.time() - started
            if waited > stale_after:  # the first sample hangs: let the kubelet restart us
                return web.Response(status=503, text=f"no snapshot after {waited:.0f}s\n")
            return web.Response(text="starting\n")
        age = time.time() - snap.timestamp
        if age > stale_after:
            return web.Response(status=503, text=f"latest snapshot is {age:.0f}s old\n")
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        if sampler.latest is None:
            return web.Response(status=503, text="no snapshot yet\n")
        return web.Response(text="ok\n")

    async def snapshot(_: web.Request) -> web.Response:
        snap = sampler.latest
        if snap is None:
            return web.json_response({"error": "no snapshot yet"}, status=503)
        return web.json_response(to_jsonable(snap), dumps=lambda o: json.dumps(o, indent=1))

    async def index(_: web.Request) -> web.Response:
        links = "".join(
            f'<li><a href="{p}">{p}</a></li>'
            for p in ("/metrics", "/snapshot", "/incidents", "/healthz", "/readyz")
        )
        newest = _newest_pages(incidents)
        return web.Response(
            text=f"<html><body><h1>nodeguard</h1><ul>{links}</ul>{newest}</body></html>",
            content_type="text/html",
        )

    async def incident_list(_: web.Request) -> web.Response:
        records = incidents.list() if incidents else []
        summary = [
            {
                k: r.get(k)
                for k in ("id", "time_utc", "rule", "kind", "target", "dry_run", "summary")
            }
            | {"actions": [f"{a['action']}:{a['outcome']}" for a in r.get("actions", [])]}
            for r in records
        ]
        return web.json_response(summary, dumps=lambda o: json.dumps(o, indent=1))

    async def incident_page(request: web.Request) -> web.Response:
        return _incident_page(incidents, request.match_info["id"])

    async def incident_one(request: web.Request) -> web.Response:
        record = incidents.get(request.match_info["id"]) if incidents else None
        if record is None:
            return web.json_response({"error": "no such incident"}, status=404)
        return web.json_response(record, dumps=lambda o: json.dumps(o, indent=1, default=str))

    # The body limit (413 above it) matters for the Alertmanager webhook, the only POST.
    middlewares = [deadline_middleware(guard)] if guard is not None else []
    app = web.Application(client_max_size=max_body, middlewares=middlewares)
    app.router.add_get("/", index)
    keep = metric_filter.keeps if metric_filter is not None and metric_filter.active else None
    exposition = Exposition(
        latest=lambda: sampler.latest,
        families=lambda snap: snapshot_families(snap, keep=keep),
        keep=keep,
    )
    app.router.add_get("/metrics", make_metrics_handler(exposition=exposition, registry=registry))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/snapshot", snapshot)
    app.router.add_get("/incidents", incident_list)
    # Before /incidents/{id}, whose {id} would take "ID.html" too: the first match wins.
    app.router.add_get("/incidents/{id}.html", incident_page)
    app.router.add_get("/incidents/{id}", incident_one)
    if webhook is not None:
        app.router.add_post("/webhook/alertmanager", webhook)
    return app


def _newest_pages(incidents: IncidentStore | None) -> str:
    """Links to the pages of the newest few incidents, for the index page ("" when none)."""
    ids = incidents.ids()[::-1][:_INDEX_INCIDENTS] if incidents else ()
    pages = "".join(
        f'<li><a href="/incidents/{html.escape(i)}.html">{html.escape(i)}</a></li>' for i in ids
    )
    return f"<h2>Newest incidents</h2><ul>{pages}</ul>" if pages else ""


def _incident_page(incidents: IncidentStore | None, incident: str) -> web.Response:
    """``/incidents/{id}.html``: the record's page, or a 404 page when there is none."""
    record = incidents.get(incident) if incidents else None
    if record is None:
        return web.Response(
            status=404,
            text=f"<html><body><h1>No incident {html.escape(incident)}</h1>"
            '<p>The incidents are listed at <a href="/incidents">/incidents</a>.</p>'
            "</body></html>",
            content_type="text/html",
        )
    try:
        text = page(record=record)
    except (AttributeError, KeyError, TypeError, ValueError, ArithmeticError) as exc:  # edited
        return web.Response(
            status=500,
            text=f"<html><body><h1>Incident {html.escape(incident)} cannot be drawn</h1>"
            f"<p>A field is not as nodeguard writes it ({html.escape(type(exc).__name__)}: "
            f'{html.escape(str(exc))}); <a href="/incidents/{html.escape(incident)}">its '
            "record</a> is as stored.</p></body></html>",
            content_type="text/html",
        )
    return web.Response(text=text, content_type="text/html")
