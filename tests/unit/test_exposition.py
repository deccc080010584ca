"""``/metrics`` (nodeguard/exposition/handler.py): prometheus_client's negotiation and writers, the
OpenMetrics writer swap that must give the library's own bytes, the ``name[]`` filter, gzip, and
the render kept off the event loop."""

from __future__ import annotations

import asyncio
import gzip
import re
import threading
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.exposition import choose_encoder

from nodeguard.collectors.families import Family
from nodeguard.exposition.exporter import snapshot_families
from nodeguard.exposition.handler import Exposition, encoder_for, make_metrics_handler, plain_body
from nodeguard.snapshot import NodeSnapshot
from tests.support.hosts import fixture_snapshot

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hosts"
# What Prometheus 2.x sends (scrape.go, acceptHeader for the default scrape protocols).
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
_LEGACY_METRIC = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")  # and no ':' (client_python #1177)
_LEGACY_LABEL = re.compile(r"^(?!__)[a-zA-Z_][a-zA-Z0-9_]*$")  # allow-utf-8 quotes "__x"


HOSTS = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())


@pytest.mark.parametrize("host", HOSTS)
def test_openmetrics_swap_writes_the_librarys_own_bytes(host: str) -> None:
    families = snapshot_families(fixture_snapshot(host))
    lib, lib_type = choose_encoder(PROMETHEUS_ACCEPT)
    ours, our_type = encoder_for(PROMETHEUS_ACCEPT)
    assert our_type == lib_type
    assert lib_type.startswith("application/openmetrics-text; version=1.0.0")
    assert ours is not lib  # swapped
    body = plain_body(families=families, own=(), encoder=ours)
    assert body == plain_body(families=families, own=(), encoder=lib)
    assert body.endswith(b"# EOF\n") and b"nodeguard_node_memory_available_bytes" in body


@pytest.mark.parametrize("host", HOSTS)
def test_every_name_written_is_a_legacy_name(host: str) -> None:
    """What makes the swap exact: escaping changes only names outside [a-zA-Z_][a-zA-Z0-9_]*."""
    families = [f.to_prometheus() for f in snapshot_families(fixture_snapshot(host))]
    assert len(families) > 20
    for family in families:
        assert _LEGACY_METRIC.match(family.name), family.name
        for sample in family.samples:
            assert _LEGACY_METRIC.match(sample.name), sample.name
            for label in sample.labels:
                assert _LEGACY_LABEL.match(label), (sample.name, label)


def test_other_formats_are_the_librarys_choice() -> None:
    for accept in ("", "text/plain;version=0.0.4", "application/openmetrics-text;version=0.0.1"):
        assert encoder_for(accept) == choose_encoder(accept)
    utf8 = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8"
    assert encoder_for(utf8)[1] == choose_encoder(utf8)[1]


class _Blocking:
    """Snapshot families that wait for ``release``: a slow render."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Event()

    def __call__(self, snapshot: NodeSnapshot | None) -> list[Family]:
        self.started.set()
        assert self.release.wait(timeout=30), "never released"
        family = Family(
            name="nodeguard_test_value_bytes", kind="gauge", help="a value", labels=["pod"]
        )
        family.add(("a",), 1.0)
        family.add(("b",), 2.0)
        return [family]


async def test_render_runs_off_the_event_loop_and_serves_both_parts() -> None:
    blocking = _Blocking()
    registry = CollectorRegistry()
    actions = Counter("nodeguard_test_actions", "actions", registry=registry)
    actions.inc(3)
    app = web.Application()
    exposition = Exposition(latest=lambda: None, families=blocking)
    app.router.add_get("/metrics", make_metrics_handler(exposition=exposition, registry=registry))

    async def ping(_: web.Request) -> web.Response:
        return web.Response(text="pong")

    app.router.add_get("/ping", ping)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            scrape = asyncio.create_task(
                session.get(
                    f"{base}/metrics",
                    headers={"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"},
                )
            )
            assert await asyncio.to_thread(blocking.started.wait, 10)
            # The render is stuck in its thread; the loop still answers.
            async with session.get(f"{base}/ping", timeout=aiohttp.ClientTimeout(5)) as r:
                assert await r.text() == "pong"
            assert not scrape.done()
            blocking.release.set()
            resp = await scrape
            raw = await resp.read()
            assert resp.headers["Content-Type"] == choose_encoder(PROMETHEUS_ACCEPT)[1]
            assert resp.headers.get("Content-Encoding") == "gzip"
            assert resp.headers.get("Vary") == "Accept-Encoding"
            body = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
            text = body.decode()
            lines = [ln for ln in text.splitlines() if not ln.startswith("#")]
            assert lines == [
                'nodeguard_test_value_bytes{pod="a"} 1.0',
                'nodeguard_test_value_bytes{pod="b"} 2.0',
                "nodeguard_test_actions_total 3.0",
                lines[3],  # the counter's _created, a wall-clock time
            ]
            assert lines[3].startswith("nodeguard_test_actions_created ")
            assert text.endswith("# EOF\n") and text.count("# EOF") == 1

            # prometheus_client's name[] filter, over both parts (the snapshot's collectors
            # describe nothing: they must still be asked); the text format.
            async with session.get(
                f"{base}/metrics",
                params=[
                    ("name[]", "nodeguard_test_actions_total"),
                    ("name[]", "nodeguard_test_value_bytes"),
                ],
            ) as r:
                filtered = await r.text()
                assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            assert sorted(ln for ln in filtered.splitlines() if not ln.startswith("#")) == [
                "nodeguard_test_actions_total 3.0",
                'nodeguard_test_value_bytes{pod="a"} 1.0',
                'nodeguard_test_value_bytes{pod="b"} 2.0',
            ]
    finally:
        blocking.release.set()
        await runner.cleanup()
