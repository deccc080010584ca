"""Alertmanager webhook deliveries written to hurt: oversized fields, deep JSON, bodies that are
not what their encoding says, headers that are not text, slow bodies, lone surrogates.

Each is answered 4xx (never 500), with the field at fault named where there is one, and counted
in ``requests``; a good delivery afterwards still acts. The same against the agent process, under
its memory limit, is in tests/cluster/test_hostile_agent.py.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from nodeguard.alerts.webhook import LIMITS, WebhookReceiver
from nodeguard.firing import Firing
from nodeguard.remediation.incidents import incident_id
from tests.support.alerts import WEBHOOK_AUTH, RecordingQueue, alert, payload, receiver_of

MAX_BODY = 1 << 20


@pytest.fixture
async def served() -> AsyncIterator[tuple[TestClient[Any, Any], WebhookReceiver, RecordingQueue]]:
    """The receiver as the agent serves it: 1 MiB bodies, aiohttp decompressing nothing."""
    queue = RecordingQueue()
    receiver = receiver_of(queue, body_timeout=0.5)
    app = web.Application(client_max_size=MAX_BODY)
    app.router.add_post("/webhook/alertmanager", receiver.handle)
    server = TestServer(app)
    await server.start_server(auto_decompress=False)
    client = TestClient(server)
    await client.start_server()
    yield client, receiver, queue
    await client.close()


async def send(
    client: TestClient[Any, Any], body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    resp = await client.post(
        "/webhook/alertmanager", data=body, headers={**WEBHOOK_AUTH, **(headers or {})}
    )
    return resp.status, await resp.json()


def _big(**changes: Any) -> bytes:
    a = alert()
    for key, value in changes.items():
        if key in ("labels", "annotations"):
            a[key] = {**a[key], **value}
        else:
            a[key] = value
    return json.dumps(payload(a)).encode()


OVERSIZED = {
    "900 KB fingerprint": (_big(fingerprint="f" * 900_000), "alerts.0.fingerprint"),
    "long fingerprint": (
        _big(fingerprint="f" * (LIMITS["fingerprint"] + 1)),
        "alerts.0.fingerprint",
    ),
    "too many labels": (
        _big(labels={f"l{i}": "v" for i in range(LIMITS["labels"])}),
        "alerts.0.labels",
    ),
    "long label name": (
        _big(labels={"n" * 500_000: "v"}),
        "alerts.0.labels." + "n" * 37 + "....[key]",
    ),
    "long label value": (
        _big(labels={"node": "x" * (LIMITS["label_value"] + 1)}),
        "alerts.0.labels.node",
    ),
    "too many annotations": (
        _big(annotations={f"a{i}": "v" for i in range(LIMITS["annotations"] + 1)}),
        "alerts.0.annotations",
    ),
    "long annotation": (
        _big(annotations={"description": "d" * 900_000}),
        "alerts.0.annotations.description",
    ),
    "long startsAt": (_big(startsAt="2026-11-30T06:00:00." + "1" * 100 + "Z"), "alerts.0.startsAt"),
    "long receiver": (
        json.dumps(payload(alert(), receiver="r" * 300)).encode(),
        "receiver",
    ),
    "lone surrogate in the node label": (
        _big(labels={"node": "\ud800"}).replace(b"\\\\ud800", b"\\ud800"),
        "alerts.0.labels.node",
    ),
    "lone surrogate in the fingerprint": (
        _big(fingerprint="a\udfff").replace(b"\\\\udfff", b"\\udfff"),
        "alerts.0.fingerprint",
    ),
}


@pytest.mark.parametrize("case", sorted(OVERSIZED))
async def test_an_oversized_or_broken_field_is_refused_by_name(served: Any, case: str) -> None:
    client, receiver, queue = served
    body, field = OVERSIZED[case]
    status, answer = await send(client, body)
    assert status == 400
    assert f"{field}:" in answer["error"], answer["error"][:500]
    assert len(answer["error"]) < 1000, "the answer must not echo the input"
    assert queue.items == []
    assert receiver.requests == {400: 1}
    assert (await send(client, json.dumps(payload(alert())).encode()))[0] == 200
    assert len(queue.items) == 1


def _json_deep(depth: int) -> bytes:
    inner = "[" * depth + "]" * depth
    return f'{{"version": "4", "alerts": [], "x": {inner}}}'.encode()


BAD_BODIES = {
    "JSON nested 1,000 deep": (_json_deep(1_000), {}, 400, "nested too deeply"),
    "JSON nested 500,000 deep": (_json_deep(500_000), {}, 400, "nested too deeply"),
    "JSON objects nested deep": (b'{"a":' * 100_000 + b"1" + b"}" * 100_000, {}, 400, "nested"),
    "not UTF-8": (b'{"version": "4", "alerts": [], "r": "\xff\xfe"}', {}, 400, "malformed JSON"),
    "NaN": (b'{"version": "4", "alerts": [], "x": NaN}', {}, 400, "NaN is not JSON"),
    "Infinity": (b'{"version": "4", "alerts": [], "x": -Infinity}', {}, 400, "is not JSON"),
    "gzip that is not gzip": (b"not gzip at all", {"Content-Encoding": "gzip"}, 400, "not gzip"),
    "truncated gzip": (
        gzip.compress(json.dumps(payload(alert())).encode())[:30],
        {"Content-Encoding": "gzip"},
        400,
        "not one whole gzip stream",
    ),
    "gzip with more after it": (
        gzip.compress(json.dumps(payload(alert())).encode()) + b"garbage",
        {"Content-Encoding": "gzip"},
        400,
        "not one whole gzip stream",
    ),
    "gzip bomb": (
        gzip.compress(b" " * (64 << 20), compresslevel=9),
        {"Content-Encoding": "gzip"},
        413,
        "once decompressed",
    ),
    "deflate": (zlib.compress(b"{}"), {"Content-Encoding": "deflate"}, 415, "only gzip"),
    "br": (b"\x0b\x01\x80{}\x03", {"Content-Encoding": "br"}, 415, "only gzip"),
    "zstd": (b"(\xb5/\xfd", {"Content-Encoding": "zstd"}, 415, "only gzip"),
    "two encodings": (
        gzip.compress(gzip.compress(b"{}")),
        {"Content-Encoding": "gzip, gzip"},
        415,
        "only gzip",
    ),
    "over the body limit": (b" " * (MAX_BODY + 1), {}, 413, "body over"),
}


@pytest.mark.parametrize("case", sorted(BAD_BODIES))
async def test_a_bad_body_is_a_client_error(served: Any, case: str) -> None:
    client, receiver, queue = served
    body, headers, code, fragment = BAD_BODIES[case]
    status, answer = await send(client, body, headers)
    assert (status, fragment in answer["error"]) == (code, True), answer
    assert receiver.requests == {code: 1}
    good = gzip.compress(json.dumps(payload(alert())).encode())
    assert (await send(client, good, {"Content-Encoding": "gzip"}))[0] == 200
    assert len(queue.items) == 1


async def _raw_request(client: TestClient[Any, Any], head: bytes, body: bytes = b"") -> bytes:
    reader, writer = await asyncio.open_connection(client.host, client.port)
    try:
        writer.write(head + body)
        await writer.drain()
        return await asyncio.wait_for(reader.read(65536), 10)
    finally:
        writer.close()


async def test_authorization_that_is_not_text_is_401(served: Any) -> None:
    client, receiver, queue = served
    body = json.dumps(payload(alert())).encode()
    for credential in (b"Bearer \xff\xfe\xfd", b"Bearer s3cret\xe9", b"\xc3\x28 s3cret"):
        head = (
            b"POST /webhook/alertmanager HTTP/1.1\r\nHost: x\r\nAuthorization: "
            + credential
            + b"\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\nConnection: close\r\n\r\n"
        )
        answer = await _raw_request(client, head, body)
        assert answer.startswith(b"HTTP/1.1 401 "), answer[:200]
    assert receiver.requests == {401: 3}
    assert queue.items == []


async def test_a_body_that_does_not_come_is_408(served: Any) -> None:
    client, receiver, _ = served
    head = (
        b"POST /webhook/alertmanager HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\n"
        b"Content-Length: 1000\r\n\r\n"
    )
    answer = await _raw_request(client, head, b'{"version": "4",')
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert receiver.requests == {408: 1}


def test_an_incident_id_takes_any_target() -> None:
    firing = Firing(
        rule="r",
        kind="firing",
        scope="node",
        target="gpu-\ud800-1",
        node="gpu-\ud800-1",
        time=0.0,
        steps=(),
        dry_run=True,
        source="alertmanager",
        summary="",
    )
    assert incident_id(firing).startswith("19700101T000000.000000Z-r-firing-gpu-")
