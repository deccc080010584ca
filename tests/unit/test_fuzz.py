"""Fuzzing, derandomized and with a fixed example budget (seconds in CI): webhook bodies against a
real server, and rule files against the loader. Whatever arrives, the webhook answers a 2xx, 4xx
or 503, never a 500, and a rule file loads or fails with ``FILE:LINE: FIELD: message`` lines."""

from __future__ import annotations

import asyncio
import json
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodeguard.alerts.webhook import WebhookReceiver
from nodeguard.rules.load import RuleError, load_rule_file
from tests.support.alerts import WEBHOOK_RULES, RecordingQueue, alert, payload
from tests.support.rule_texts import CHECK_LINE, GOOD_RULE

BUDGET = settings(
    max_examples=300,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=30,
)
ALERT_KEYS = ["status", "labels", "annotations", "startsAt", "endsAt", "fingerprint", "x"]


@st.composite
def deliveries(draw: st.DrawFn) -> tuple[bytes, dict[str, str]]:
    """A body and its headers: a real payload with some fields replaced by anything, or
    anything at all, as JSON or raw bytes, sometimes claiming gzip."""
    kind = draw(st.sampled_from(["mutated", "json", "bytes"]))
    if kind == "mutated":
        data: Any = payload(alert(), alert(status="resolved", fingerprint="b"))
        first = data["alerts"][0]
        for _ in range(draw(st.integers(1, 4))):
            where = draw(st.sampled_from(["top", "alert", "labels"]))
            value = draw(json_values)
            if where == "top":
                data[draw(st.sampled_from(["version", "alerts", "status", "receiver"]))] = value
            elif where == "alert":
                first[draw(st.sampled_from(ALERT_KEYS))] = value
            elif isinstance(first.get("labels"), dict):
                first["labels"][draw(st.text(max_size=8))] = value
        body = json.dumps(data).encode()
    elif kind == "json":
        body = json.dumps(draw(json_values)).encode()
    else:
        body = draw(st.binary(max_size=512))
    headers = {"Authorization": "Bearer s3cret", "Content-Type": "application/json"}
    if draw(st.booleans()):
        headers["Content-Encoding"] = draw(st.sampled_from(["gzip", "identity", "br", "x"]))
    return body, headers


@pytest.fixture(scope="module")
def webhook_url() -> Iterator[str]:
    """The receiver behind a real aiohttp server, in a thread of its own."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    url: list[str] = []

    async def serve() -> web.AppRunner:
        receiver = WebhookReceiver(
            node_name="gpu-1",
            rules=lambda: WEBHOOK_RULES,
            submit=RecordingQueue(capacity=10**6).submit,
            latest=lambda: None,
            global_dry_run=True,
            token="s3cret",
        )
        app = web.Application(client_max_size=1 << 16)
        app.router.add_post("/webhook/alertmanager", receiver.handle)
        runner = web.AppRunner(app, access_log=None, auto_decompress=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url.append(f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}")  # type: ignore[union-attr]
        return runner

    def run() -> None:
        asyncio.set_event_loop(loop)
        runner = loop.run_until_complete(serve())
        started.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(10)
    yield f"{url[0]}/webhook/alertmanager"
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


@BUDGET
@given(delivery=deliveries())
def test_any_webhook_body_is_answered_without_a_server_error(
    webhook_url: str, delivery: tuple[bytes, dict[str, str]]
) -> None:
    body, headers = delivery
    req = urllib.request.Request(webhook_url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            status, answer = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, answer = exc.code, exc.read()
    assert status in (200, 400, 413, 415, 503), (status, answer[:300])
    assert isinstance(json.loads(answer), dict)


@st.composite
def rule_files(draw: st.DrawFn) -> bytes:
    """A rule file: the good one with lines spliced, values replaced or bytes inserted, YAML
    built from anything, or bytes."""
    kind = draw(st.sampled_from(["splice", "replace", "yaml", "bytes"]))
    lines = GOOD_RULE.splitlines(keepends=True)
    if kind == "splice":
        at = draw(st.integers(0, len(lines)))
        extra = draw(st.text(max_size=80))
        return "".join([*lines[:at], extra, *lines[at:]]).encode("utf-8", "surrogatepass")
    if kind == "replace":
        old = draw(st.sampled_from(["0.05", "node", "cordon", "low", '"<"', "RuleSet", "spec"]))
        new = draw(
            st.sampled_from(["&a [*a]", ".nan", "[[[[[[", "? [1]\n: 2", "!!binary AA", "*x"])
            | st.text(max_size=30)
        )
        return GOOD_RULE.replace(old, new, 1).encode("utf-8", "surrogatepass")
    if kind == "yaml":
        return json.dumps(draw(json_values)).encode()  # JSON is YAML
    return draw(st.binary(max_size=1024))


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as d:
        yield Path(d) / "rules.yaml"


@BUDGET
@given(data=rule_files())
def test_any_rule_file_loads_or_fails_with_file_line_field(scratch: Path, data: bytes) -> None:
    scratch.write_bytes(data)
    try:
        load_rule_file(scratch)
    except RuleError as exc:
        assert exc.messages
        for message in exc.messages:
            m = CHECK_LINE.match(message)
            assert m is not None and m["file"] == str(scratch), message
