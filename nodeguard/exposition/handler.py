"""``GET /metrics``: negotiated as prometheus_client negotiates it, written by the fast writer
(:mod:`nodeguard.exposition.render`) and checked against the library's writers in the tests,
rendered off the event loop, and written once per snapshot however many servers scrape it.

The body has two parts. The snapshot's families (every collector's, built from an immutable
snapshot: :func:`nodeguard.exposition.exporter.snapshot_families`) are written in a worker thread;
the agent's own families (rule engine, webhook, actions, connections: prometheus_client collectors
over state the event loop changes, a few dozen series) are collected on the loop and written by
prometheus_client after them.

What stays prometheus_client's: the content negotiation (``choose_encoder``: OpenMetrics when
Prometheus asks for it, else the text format; ``gzip_accepted``), the ``name[]`` filter
(``restricted_registry``), the writers of the agent's own families and of every format the fast
writer does not write (anything but the text format 0.0.4 and OpenMetrics 1.0.0), and the
definition of the bytes: the plain path (:func:`plain_body`) renders the same families through
the library, and the tests hold the fast path to it.

One snapshot, one render. The snapshot part of a body, and its gzip stream up to that point, are
kept for the latest snapshot, per format: a second scrape of the same snapshot (a Prometheus HA pair
scrapes every target twice per interval) writes and compresses only the agent's own families, and
both scrapers get one well-formed gzip member. The gzip stream is made of a raw deflate stream per
family, each ending in a full flush (which resets the compressor's history), so a family written the
same as last time brings its compressed bytes along and only the families that changed are
compressed again (:class:`nodeguard.exposition.render.Chunk`); the CRC-32 and length of the whole
are counted over the bytes.

OpenMetrics with the default ``escaping=underscores``: prometheus_client 0.26 escapes every sample
name character by character in Python (``openmetrics/exposition.py``: ``_escape`` with
``_is_legacy_labelname_rune``). Escaping only changes names outside the legacy character set, and no
name nodeguard writes is one (:class:`~nodeguard.collectors.families.Family` refuses them; the tests
check the agent's own), so for the agent's own families the ``allow-utf-8`` writer, which leaves
names alone, gives identical bytes; the Content-Type is still the one ``choose_encoder`` chose.
"""

from __future__ import annotations

import asyncio
import functools
import struct
import threading
import zlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

from aiohttp import hdrs, web
from prometheus_client import CollectorRegistry
from prometheus_client import exposition as text_exposition
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector

from nodeguard.collectors.families import Family, exposed_name
from nodeguard.exposition.render import Chunk, Renderer
from nodeguard.snapshot import NodeSnapshot

__all__ = ["Exposition", "encoder_for", "fast_format", "make_metrics_handler", "plain_body"]

Encoder = Callable[[Collector], bytes]
Format = Literal["text", "openmetrics"]
#: gzip at level 1, zlib's fastest: at 330 containers (about 800 KiB) it takes a third of
#: aiohttp's default level 6 for a body 8 % larger (docs/benchmarks.md).
GZIP_LEVEL = 1
_EOF = b"# EOF\n"


class _Collected(Collector):
    """Families already collected, handed to a writer."""

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


def fast_format(encoder: Encoder) -> Format | None:
    """Which format the fast writer writes for the library's ``encoder``: the text format 0.0.4
    (``generate_latest`` with its default escaping), OpenMetrics 1.0.0 (escaping underscores or
    allow-utf-8: the same bytes for legacy names); ``None`` for anything else (other versions,
    dots or values escaping), which the library writes."""
    if encoder is text_exposition.generate_latest:
        return "text"
    if (
        isinstance(encoder, functools.partial)
        and encoder.func is openmetrics.generate_latest
        and not encoder.args
        and encoder.keywords.get("version") == "1.0.0"
        and encoder.keywords.get("escaping") in (openmetrics.UNDERSCORES, openmetrics.ALLOWUTF8)
    ):
        return "openmetrics"
    return None


def plain_body(
    *,
    families: Sequence[Family],
    own: Sequence[Metric],
    encoder: Encoder,
    names: Sequence[str] = (),
) -> bytes:
    """The body as prometheus_client writes it: ``families`` then ``own``, restricted to the
    sample names in ``names`` when there are any (the library's ``name[]`` filter). The
    definition the fast path is held to."""
    # The parts describe nothing (what they hold depends on the snapshot), so the filter must
    # ask each of them; without this flag the restricted registry skips them.
    registry = CollectorRegistry(auto_describe=False, support_collectors_without_names=True)
    registry.register(_Collected([f.to_prometheus() for f in families]))
    registry.register(_Collected(own))
    target: Collector = registry.restricted_registry(names) if names else registry
    return encoder(target)


# gzip's member header (RFC 1952): deflate, no name, no time, unknown OS
_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"


@dataclass(slots=True)
class _Part:
    """The snapshot part of a body in one format: its chunks (a family each), and the CRC-32
    and length of their bytes, counted once."""

    chunks: list[Chunk]
    lock: threading.Lock = field(default_factory=threading.Lock)
    _sums: tuple[int, int] | None = None

    def body(self) -> bytes:
        return b"".join(c.data for c in self.chunks)

    def gzip(self) -> tuple[bytes, int, int]:
        """The gzip header and every chunk's raw deflate stream (full flushes between them;
        chunks kept from an earlier render bring theirs), the CRC-32 and the length of the
        part: what a body's gzip stream goes on from."""
        with self.lock:
            compressor = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)
            deflated = b"".join([_GZIP_HEADER, *(c.deflated(compressor) for c in self.chunks)])
            if self._sums is None:
                crc, size = 0, 0
                for chunk in self.chunks:
                    crc = zlib.crc32(chunk.data, crc)
                    size += len(chunk.data)
                self._sums = (crc, size)
            return deflated, *self._sums


class Exposition:
    """``/metrics`` of the latest snapshot: ``latest()`` gives it (``None`` before the first),
    ``families(snapshot)`` its families (build info alone before the first snapshot);
    ``keep(exposed name)``, when given, drops the agent's own families the metric filter drops
    (the snapshot's are dropped where ``families`` makes them)."""

    def __init__(
        self,
        *,
        latest: Callable[[], NodeSnapshot | None],
        families: Callable[[NodeSnapshot | None], list[Family]],
        keep: Callable[[str], bool] | None = None,
    ) -> None:
        self._latest = latest
        self._families = families
        self._keep = keep
        self._renderer = Renderer()
        self._lock = threading.Lock()
        self._parts: dict[Format, _Part] = {}
        self._parts_of: object = object()  # the snapshot self._parts belong to

    def own(self, metrics: Sequence[Metric]) -> list[Metric]:
        """The agent's own families that the metric filter keeps."""
        if self._keep is None:
            return list(metrics)
        return [m for m in metrics if self._keep(exposed_name(name=m.name, kind=m.type))]

    def _part(self, snapshot: NodeSnapshot | None, fmt: Format) -> _Part:
        """The snapshot part in ``fmt``, rendered at most once per snapshot: a scrape that
        comes while it is rendered waits for it."""
        with self._lock:
            if self._parts_of is not snapshot:
                self._parts, self._parts_of = {}, snapshot
            part = self._parts.get(fmt)
            if part is None:
                chunks = self._renderer.render(
                    self._families(snapshot), openmetrics=fmt == "openmetrics"
                )
                part = self._parts[fmt] = _Part(chunks=chunks)
            return part

    def render(
        self, *, accept: str, names: Sequence[str], own: Sequence[Metric], accept_encoding: str = ""
    ) -> tuple[bytes, dict[str, str]]:
        """The ``/metrics`` body and its headers: the snapshot's families, then ``own`` (the
        agent's own, collected on the loop), in the format ``accept`` asks for, gzipped when
        ``accept_encoding`` allows it. Blocking: call it in a worker thread."""
        snapshot = self._latest()
        encoder, content_type = encoder_for(accept)
        headers: dict[str, str] = {
            hdrs.CONTENT_TYPE: content_type,
            hdrs.VARY: hdrs.ACCEPT_ENCODING,  # caches must not hand gzip to whom asked plain
        }
        own = self.own(own)
        fmt = fast_format(encoder)
        gzipped = gzip_accepted(accept_encoding)
        if gzipped:
            headers[hdrs.CONTENT_ENCODING] = "gzip"
        if names or fmt is None:
            body = plain_body(
                families=self._families(snapshot), own=own, encoder=encoder, names=names
            )
            if gzipped:
                body = zlib.compress(body, GZIP_LEVEL, wbits=31)
            return body, headers
        part = self._part(snapshot, fmt)
        tail = encoder(_Collected(own))
        if fmt == "openmetrics" and not tail.endswith(_EOF):  # the library always closes it
            tail += _EOF
        if not gzipped:
            return part.body() + tail, headers
        head, crc, size = part.gzip()
        compressor = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)
        rest = compressor.compress(tail) + compressor.flush()
        trailer = struct.pack("<II", zlib.crc32(tail, crc), (size + len(tail)) & 0xFFFFFFFF)
        return head + rest + trailer, headers


def make_metrics_handler(
    *, exposition: Exposition, registry: CollectorRegistry
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The aiohttp handler of ``/metrics``: ``registry`` (the agent's own families) collected on
    the event loop; the snapshot's families, the writing and gzip in a worker thread. The
    threads are the handler's own (two: a Prometheus HA pair scrapes at once), so a render never
    waits behind anything else queued in asyncio's default executor."""
    threads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="metrics")

    async def metrics(request: web.Request) -> web.Response:
        accept = ",".join(request.headers.getall(hdrs.ACCEPT, []))
        accept_encoding = ",".join(request.headers.getall(hdrs.ACCEPT_ENCODING, []))
        names = request.query.getall("name[]", [])
        own = list(registry.collect())
        body, headers = await asyncio.get_running_loop().run_in_executor(
            threads,
            functools.partial(
                exposition.render,
                accept=accept,
                names=names,
                own=own,
                accept_encoding=accept_encoding,
            ),
        )
        return web.Response(body=body, headers=headers)

    return metrics
