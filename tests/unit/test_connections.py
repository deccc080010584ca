"""The web server's bounds, in process: connections that never ask are closed, the cap makes
room by closing the oldest idle connection, a client that does not take its answer is cut off;
and a log line that repeats is rate-limited."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from nodeguard.connections import (
    ConnectionGuard,
    ConnectionLimits,
    connection_cap,
    deadline_middleware,
)
from nodeguard.logs import ClientErrorFilter, RepeatFilter

LIMITS = ConnectionLimits(
    max_connections=8, header_timeout=0.5, idle_timeout=0.5, body_timeout=0.5, write_timeout=0.5
)


@pytest.fixture
async def served() -> AsyncIterator[tuple[ConnectionGuard, int]]:
    guard = ConnectionGuard(limits=LIMITS)

    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def big(_: web.Request) -> web.Response:
        return web.Response(body=b"x" * (32 << 20))

    app = web.Application(middlewares=[deadline_middleware(guard)])
    app.router.add_get("/ok", ok)
    app.router.add_get("/big", big)
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=LIMITS.idle_timeout)
    await runner.setup()
    assert runner.server is not None
    listener = await guard.listen(server=runner.server, host="127.0.0.1", port=0)
    port = listener.sockets[0].getsockname()[1]
    yield guard, port
    listener.close()
    await runner.cleanup()


async def _get(port: int, path: str = "/ok") -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    data = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return data


async def _closed_by_server(reader: asyncio.StreamReader, within: float) -> bool:
    try:
        return await asyncio.wait_for(reader.read(1 << 20), within) == b""
    except (TimeoutError, ConnectionError):
        return False


async def test_a_connection_that_never_asks_is_closed(served: Any) -> None:
    guard, port = served
    silent = await asyncio.open_connection("127.0.0.1", port)
    trickle = await asyncio.open_connection("127.0.0.1", port)
    trickle[1].write(b"GET /ok HTTP/1.1\r\nHost: x\r\n")  # a head that never ends
    assert await _closed_by_server(silent[0], within=5)
    assert await _closed_by_server(trickle[0], within=5)
    assert guard.closed["header_timeout"] == 2
    assert (await _get(port)).startswith(b"HTTP/1.1 200")


async def test_at_the_cap_the_oldest_idle_connection_makes_room(served: Any) -> None:
    guard, port = served
    stalled = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3 * 8)]
    await asyncio.sleep(0.1)  # past the grace a new connection has to send its request
    for _ in range(5):  # each new request evicts a stalled connection, never waits behind them
        assert (await _get(port)).startswith(b"HTTP/1.1 200")
    assert guard.open <= LIMITS.max_connections
    # The flood itself made room oldest first (none refused), then each request evicted one.
    assert guard.closed["refused"] == 0
    assert guard.closed["evicted"] >= 3 * 8 - LIMITS.max_connections + 1
    for _, writer in stalled:
        writer.close()


async def test_room_is_never_made_by_closing_a_request_not_yet_read(served: Any) -> None:
    guard, port = served
    # The oldest of a flood of new connections, all within the grace: its request is in its
    # socket, not yet read, when the next one needs room (what the accept loop can meet).
    probe = socket.create_connection(("127.0.0.1", port))
    await asyncio.sleep(0.005)
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(LIMITS.max_connections)]
    await asyncio.sleep(0.005)
    probe.sendall(b"GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    # On loopback the request is in the probe's socket now; the loop has not turned since.
    assert guard._make_room(grown_only=False)
    probe.settimeout(0.2)
    answer = await asyncio.to_thread(probe.recv, 1 << 16)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    assert guard.closed["evicted"] == 1
    for s in (probe, *held):
        s.close()


async def test_a_client_that_does_not_read_is_cut_off(served: Any) -> None:
    guard, port = served
    _reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1024)
    writer.transport.pause_reading()  # type: ignore[attr-defined]
    writer.write(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.sleep(3)
    assert guard.closed["write_timeout"] == 1
    writer.close()
    assert (await _get(port)).startswith(b"HTTP/1.1 200")


def test_the_cap_fits_the_descriptor_limit() -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
        assert connection_cap(wanted=64, held_files=0) == 64
        # 1024 - 708 held - 128 other - 128 being closed - 32 of a surge
        assert connection_cap(wanted=64, held_files=708) == 28
        assert connection_cap(wanted=64, held_files=1000) == 4
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _record(msg: str, *args: object, exc: BaseException | None = None) -> logging.LogRecord:
    return logging.LogRecord(
        "asyncio",
        logging.ERROR,
        __file__,
        1,
        msg,
        args,
        (type(exc), exc, None) if exc else None,
    )


def test_a_line_that_repeats_is_rate_limited() -> None:
    now = [0.0]
    repeat = RepeatFilter(burst=5, window=60.0, clock=lambda: now[0])
    passed = [repeat.filter(_record("socket.accept() out of system resource")) for _ in range(197)]
    assert passed.count(True) == 5 and repeat.suppressed == 192
    other = [repeat.filter(_record("collector %s failed", f"c{i}")) for i in range(7)]
    assert other == [True] * 7  # each its own line: the arguments are part of what repeats
    now[0] = 61.0
    record = _record("socket.accept() out of system resource")
    assert repeat.filter(record)
    assert record.getMessage().endswith("[192 more like this dropped in the last 60s]")
    for i in range(5000):  # a kind per message (f-strings): what is remembered stays bounded
        repeat.filter(_record(f"line {i}"))
    assert len(repeat._kinds) <= 1024


def test_a_request_aiohttp_cannot_parse_is_one_line() -> None:
    from aiohttp.http_exceptions import BadHttpMessage

    record = _record("Error handling request from %s", "127.0.0.1", exc=BadHttpMessage("bad"))
    assert ClientErrorFilter().filter(record)
    assert (record.levelno, record.exc_info) == (logging.INFO, None)
    assert "400" in record.getMessage()
