"""``GET /metrics``: prometheus_client's exposition, negotiated as its own handler negotiates it,
rendered off the event loop.

Why not prometheus_client's aiohttp handler (``make_aiohttp_handler``): it collects and renders
on the event loop, and at 330 containers (some 4,600 series) a render takes 50-130 ms of CPU
(docs/benchmarks.md), time in which the Alertmanager webhook, the rule engine and the health
probes would wait. Here the state that lives on the loop (the rule engine's and the webhook's
counters, plain dicts the loop changes) is collected on the loop, which is quick (tens of
series), and the snapshot's families, built from an immutable snapshot, are collected and
everything is written in a worker thread.

What stays prometheus_client's: the content negotiation (``choose_encoder``: OpenMetrics when
Prometheus asks for it, else the text format; ``gzip_accepted``), the ``name[]`` filter
(``restricted_registry``), and the writers (``generate_latest`` of either format).

One substitution, for speed, with the same bytes: for OpenMetrics with the default
``escaping=underscores`` (what Prometheus 2.x and 3.x get when they do not ask for UTF-8 names),
prometheus_client 0.26 escapes every sample name character by character in Python
(``openmetrics/exposition.py``: ``_escape`` with ``_is_legacy_labelname_rune``), some 60 % of
the render. Escaping only changes names outside the legacy character set
(``[a-zA-Z_][a-zA-Z0-9_]*``; a metric name with ``:`` and a label name starting with ``__``,
which allow-utf-8 quotes, are the other differences), and no name nodeguard writes is one of
them (checked by ``tests/test_exposition.py`` over every family), so the ``allow-utf-8`` writer,
which leaves names alone and escapes label values with ``str.replace``, gives identical bytes; the
Content-Type is still the one ``choose_encoder`` chose. (Upstream: prometheus/client_python
#1177 and #1204 change how the sample-name escape treats ``:``; none of our names has one.)
"""

from __future__ import annotations

import asyncio
import functools
import gzip
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

from aiohttp import hdrs, web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector

__all__ = ["encoder_for", "make_metrics_handler", "render"]

Encoder = Callable[[Collector], bytes]


class _Collected(Collector):
    """Families already collected (on the event loop), handed to the writer in a thread."""

    def __init__(self, metrics: Sequence[Metric]) -> None:
        self._metrics = metrics

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        return iter(self._metrics)


def encoder_for(accept: str) -> tuple[Encoder, str]:
    """prometheus_client's writer and Content-Type for an ``Accept`` header
    (``exposition.choose_encoder``), with the OpenMetrics underscores writer swapped for the
    allow-utf-8 one, which writes the same bytes for legacy names (module docstring)."""
    encoder, content_type = choose_encoder(accept)
    if (
        isinstance(encoder, functools.partial)
        and encoder.func is openmetrics.generate_latest
        and encoder.keywords.get("escaping") == openmetrics.UNDERSCORES
        and not encoder.args
    ):
        encoder = functools.partial(
            openmetrics.generate_latest,
            escaping=openmetrics.ALLOWUTF8,
            version=encoder.keywords.get("version", "1.0.0"),
        )
    return encoder, content_type


def render(
    *, accept: str, names: Sequence[str], parts: Iterable[Collector], accept_encoding: str = ""
) -> tuple[bytes, dict[str, str]]:
    """The ``/metrics`` body and its headers: ``parts`` collected in order, restricted to the
    sample names in ``names`` when there are any (prometheus_client's ``name[]``), written in
    the format ``accept`` asks for, gzipped when ``accept_encoding`` allows it
    (``gzip_accepted``). Blocking: call it in a worker thread.

    gzip at level 1, zlib's fastest: at 330 containers (760 KiB) it takes 7 ms against 16 ms at
    aiohttp's default level 6, for a body 8 % larger (193 against 179 KiB; docs/benchmarks.md).
    """
    # Our collectors describe nothing (their families depend on the snapshot), so the filter
    # must ask each of them; without this flag prometheus_client's restricted registry skips
    # collectors it has no names for, and name[] answered nothing of the snapshot.
    registry = CollectorRegistry(auto_describe=False, support_collectors_without_names=True)
    for part in parts:
        registry.register(part)
    encoder, content_type = encoder_for(accept)
    target: Collector = registry.restricted_registry(names) if names else registry
    body = encoder(target)
    headers: dict[str, str] = {hdrs.CONTENT_TYPE: content_type}
    headers[hdrs.VARY] = hdrs.ACCEPT_ENCODING  # caches must not hand gzip to whom asked plain
    if gzip_accepted(accept_encoding):
        body = gzip.compress(body, compresslevel=1)
        headers[hdrs.CONTENT_ENCODING] = "gzip"
    return body, headers


def make_metrics_handler(
    *, snapshot: Collector, registry: CollectorRegistry
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The aiohttp handler of ``/metrics``: ``snapshot`` (collected in a worker thread: it must
    read only immutable data) then ``registry`` (collected on the event loop); written and
    gzipped (when the client accepts it) in the worker thread too. The worker threads are the
    handler's own (two: Prometheus HA pairs scrape at once), so a render never waits behind
    anything else queued in asyncio's default executor."""
    threads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="metrics")

    async def metrics(request: web.Request) -> web.Response:
        accept = ",".join(request.headers.getall(hdrs.ACCEPT, []))
        accept_encoding = ",".join(request.headers.getall(hdrs.ACCEPT_ENCODING, []))
        names = request.query.getall("name[]", [])
        on_loop = _Collected(list(registry.collect()))
        body, headers = await asyncio.get_running_loop().run_in_executor(
            threads,
            functools.partial(
                render,
                accept=accept,
                names=names,
                parts=(snapshot, on_loop),
                accept_encoding=accept_encoding,
            ),
        )
        return web.Response(body=body, headers=headers)

    return metrics
