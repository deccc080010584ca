"""Bounds on the agent's HTTP connections: how many, how long a client may take to ask, to
send its body and to take its answer.

aiohttp gives the parts: ``keepalive_timeout`` closes a connection idle between requests (and,
from aiohttp 3.14.1, one that has not completed a request head), ``client_max_size`` bounds a
body, ``max_line_size``/``max_field_size``/``max_headers`` bound a request head. It has no cap
on connections and, before 3.14.1, no deadline for the first request head: 150 connections that
sent nothing were all still open after 45 s, and at the descriptor limit ``/metrics``,
``/healthz`` and every collector failed (EMFILE). :class:`ConnectionGuard` is the protocol
factory the listening socket is created with (around aiohttp's ``web.Server``):

- at most :attr:`ConnectionLimits.max_connections` at once. At the cap, a new connection takes
  the place of the oldest one that is waiting on its client (one that never sent a whole
  request head, is still sending its body, or sits idle after a request) and has had a moment
  (50 ms) to send; one whose request is in its socket, not yet read, goes last. When all of
  those are younger (a flood of new connections), a few more are let in and the surplus closed
  after that moment, oldest first among those still waiting, so that stalled connections, even
  a flood of new ones, cannot lock out the kubelet's probes and Prometheus, which send their
  request at once; only when every connection is being answered is the new one answered 503
  and closed;
- a connection that has not sent a whole request head within ``header_timeout`` seconds of
  opening is closed (aiohttp's ``keepalive_timeout`` does the same between requests);
- :func:`deadline_middleware` reads each request's body within ``body_timeout`` seconds (408
  and the connection closed otherwise) before the handler runs, and writes each answer within
  ``write_timeout`` seconds, or closes the connection (a client that never reads would hold the
  answer's buffers for ever).

:func:`connection_cap` keeps the cap within the descriptors the process may open, leaving the
collectors' share (:mod:`nodeguard.sources.open_files`) alone. Counts are exported by
:class:`ConnectionsCollector`.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import resource
import sys
import termios
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = [
    "ConnectionGuard",
    "ConnectionLimits",
    "ConnectionsCollector",
    "connection_cap",
    "deadline_middleware",
]

log = logging.getLogger(__name__)

# Descriptors the agent needs besides its HTTP connections and held cgroup files: the listening
# sockets, the Kubernetes client's pool, the kernel log, NVML's device nodes, rule files, the
# files a sample opens one at a time, stdio.
_OTHER_DESCRIPTORS = 128
# The listening socket's backlog. asyncio accepts up to this many connections per wake-up, and
# those closed to make room hold their descriptors until the loop runs again; the kernel drops
# the SYNs of a full backlog, so a small one makes a probe wait for the client's retry (1 s).
_BACKLOG = 128
_MIN_CONNECTIONS = 4
# A connection younger than this is not closed to make room: its client (a probe) has had no
# time to send its request yet.
_GRACE = 0.05
# When every connection waiting on its client is younger than the grace (a flood of new ones),
# up to this many more than the cap are let in and the surplus closed once the grace is over,
# oldest first, among those that still have not asked: a probe among the new ones has asked by
# then. connection_cap() counts them within the backlog's share.
_SURGE = 32
_REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 21\r\n"
    b"Connection: close\r\n\r\ntoo many connections\n"
)

Closed = Literal["header_timeout", "body_timeout", "write_timeout", "evicted", "refused"]
# Connection states: waiting on the client (may make room for a new one) or being answered.
_WAITING = ("new", "body", "idle")


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionLimits:
    """The bounds (seconds, a count). ``idle_timeout`` is aiohttp's ``keepalive_timeout``."""

    max_connections: int = 64
    header_timeout: float = 10.0
    idle_timeout: float = 60.0
    body_timeout: float = 10.0
    write_timeout: float = 30.0


def connection_cap(*, wanted: int, held_files: int) -> int:
    """How many connections the process can afford: ``wanted``, at most what the soft
    ``RLIMIT_NOFILE`` leaves once ``held_files`` (the cgroup files the sampler keeps open), the
    agent's other descriptors and a backlog's worth of connections being closed are counted,
    and at least 4."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    room = soft - held_files - _OTHER_DESCRIPTORS - _BACKLOG - _SURGE
    return max(_MIN_CONNECTIONS, min(wanted, room))


def _unread(handler: web.RequestHandler) -> int:
    """Bytes the client has sent that the connection has not read yet (``FIONREAD``, tcp(7)
    ``SIOCINQ``); 0 when it cannot be told."""
    transport = handler.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return 0
    try:
        got = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except OSError:
        return 0
    return int.from_bytes(got, sys.byteorder)


class _Refuse(asyncio.Protocol):
    """Answers 503 and closes: a connection over the cap when none can make room."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(_REFUSAL)
        transport.close()


class ConnectionGuard:
    """The protocol factory of the listening sockets, around aiohttp's ``web.Server``
    (``runner.server``, given to :meth:`listen`); see the module docstring. ``closed`` counts
    connections closed by a bound, by reason."""

    def __init__(self, *, limits: ConnectionLimits) -> None:
        self._limits = limits
        self._server: web.Server | None = None
        # connection -> (its state, when it opened); pruned to the server's open connections
        # (aiohttp's RequestHandler takes no weak references)
        self._state: dict[web.RequestHandler, str] = {}
        self._trim_due: asyncio.TimerHandle | None = None
        self._opened: dict[web.RequestHandler, float] = {}
        self.closed: dict[Closed, int] = dict.fromkeys(
            ("header_timeout", "body_timeout", "write_timeout", "evicted", "refused"), 0
        )

    @property
    def limits(self) -> ConnectionLimits:
        return self._limits

    @property
    def open(self) -> int:
        """Connections open now (not counting those closed and not yet let go)."""
        if self._server is None:
            return 0
        return sum(1 for c in self._server.connections if self._state.get(c) != "closed")

    async def listen(self, *, server: web.Server, host: str | None, port: int) -> asyncio.Server:
        """Listen on ``host:port`` (every address when ``host`` is ``None``), each connection
        served by ``server`` within the bounds; the caller closes the returned server before
        cleaning up the aiohttp runner. Raises ``OSError`` when the address cannot be bound."""
        self._server = server
        loop = asyncio.get_running_loop()
        # asyncio accepts up to `backlog` connections per wake-up, and those closed to make
        # room hold their descriptors until the loop runs again: with the backlog at the cap,
        # at most twice the cap are open at once, which connection_cap() leaves room for.
        return await loop.create_server(self, host, port, backlog=self._limits.max_connections)

    def __call__(self) -> asyncio.BaseProtocol:
        assert self._server is not None, "listen() first"
        self._prune()
        loop = asyncio.get_running_loop()
        cap = self._limits.max_connections
        if self.open >= cap and not self._make_room(grown_only=True):
            # New connections join the server's list a turn later: count them here.
            pending = sum(1 for st in self._state.values() if st != "closed")
            if max(self.open, pending) < cap + _SURGE:
                if self._trim_due is None:
                    self._trim_due = loop.call_later(_GRACE, self._trim)
            elif not self._make_room(grown_only=False):
                self.closed["refused"] += 1
                return _Refuse()
        handler = self._server()
        self._state[handler] = "new"
        self._opened[handler] = loop.time()
        loop.call_later(self._limits.header_timeout, self._first_head_due, handler)
        return handler

    def _prune(self) -> None:
        """Forget the connections aiohttp no longer holds. A connection joins the server's list
        only in its ``connection_made``, which asyncio calls on the loop's next turn, so the
        newest are kept until they have had a second to join."""
        assert self._server is not None
        live = set(self._server.connections)
        settled = asyncio.get_running_loop().time() - 1.0
        for gone in [c for c, t in self._opened.items() if t < settled and c not in live]:
            self._opened.pop(gone, None)
            self._state.pop(gone, None)

    def _make_room(self, *, grown_only: bool) -> bool:
        """Close the oldest connection that is waiting on its client, among those that have had
        the grace to send (only those when ``grown_only``, else those first); a connection whose
        request is already in its socket, not yet read (a probe's), goes last. Whether one was
        found."""
        assert self._server is not None
        grown = asyncio.get_running_loop().time() - _GRACE
        waiting = []
        for i, c in enumerate(self._server.connections):
            if self._state.get(c, "new") not in _WAITING:
                continue
            opened = self._opened.get(c, 0.0)
            young = opened >= grown
            if not (young and grown_only):
                waiting.append((_unread(c) > 0, young, opened, i, c))
        if not waiting:
            return False
        *_, oldest = min(waiting)
        self._close(oldest, "evicted")
        return True

    def _trim(self) -> None:
        """The grace of a surge is over: close what is over the cap, oldest first among the
        connections still waiting on their clients (those being answered are left)."""
        self._trim_due = None
        while self.open > self._limits.max_connections and self._make_room(grown_only=False):
            pass

    def _first_head_due(self, handler: web.RequestHandler) -> None:
        if self._state.get(handler) == "new":
            self._close(handler, "header_timeout")

    def _close(self, handler: web.RequestHandler, reason: Closed) -> None:
        self.closed[reason] += 1
        self._state[handler] = "closed"
        handler.force_close()
        log.debug("connection closed: %s", reason)

    def request_started(self, handler: web.RequestHandler, *, body: bool) -> None:
        """A whole request head arrived on ``handler``'s connection; its ``body`` follows."""
        self._state[handler] = "body" if body else "busy"

    def body_received(self, handler: web.RequestHandler) -> None:
        """The request's body arrived: the answer is being made."""
        if self._state.get(handler) == "body":
            self._state[handler] = "busy"

    def request_done(self, handler: web.RequestHandler) -> None:
        """The answer was written; the connection waits for its next request."""
        if self._state.get(handler) == "busy":
            self._state[handler] = "idle"

    def timed_out(self, handler: web.RequestHandler, reason: Closed) -> None:
        """A body or an answer took too long: close the connection."""
        self._close(handler, reason)


def deadline_middleware(guard: ConnectionGuard) -> Middleware:
    """An aiohttp middleware that reads the request's body within ``body_timeout`` (408
    otherwise; the handler's own read then returns it at once), runs the handler, and writes
    its answer within ``write_timeout`` (else the connection is closed: the client does not
    read); it tells ``guard`` what the connection is waiting for meanwhile."""

    @web.middleware
    async def deadline(request: web.Request, handler: Handler) -> web.StreamResponse:
        protocol = request.protocol
        # A body declared over the limit is the handler's to refuse (413, in its own counts).
        body = request.can_read_body and (request.content_length or 0) <= request.client_max_size
        guard.request_started(protocol, body=body)
        try:
            if body:
                try:
                    async with asyncio.timeout(guard.limits.body_timeout):
                        await request.read()
                except TimeoutError:
                    guard.timed_out(protocol, "body_timeout")
                    return web.Response(status=408, text="request body too slow\n")
                except ConnectionError:  # closed (by the client, or to make room): no one to tell
                    return web.Response(status=400, text="connection lost\n")
                except RuntimeError:
                    # aiohttp's StreamReader raises RuntimeError("Connection closed.") when the
                    # connection was already gone as the read began (closed to make room).
                    if protocol.connected:
                        raise
                    return web.Response(status=400, text="connection lost\n")
                guard.body_received(protocol)
            response = await handler(request)
            if not response.prepared:
                try:
                    async with asyncio.timeout(guard.limits.write_timeout):
                        await response.prepare(request)
                        await response.write_eof()
                except TimeoutError:
                    guard.timed_out(protocol, "write_timeout")
                except ConnectionError:
                    # The client went (or its connection was closed to make room) while the
                    # answer was written: no one to tell, as aiohttp's own finish_response.
                    pass
            return response
        finally:
            guard.request_done(protocol)

    return deadline


class ConnectionsCollector(Collector):
    """``nodeguard_http_connections`` (open now) and
    ``nodeguard_http_connections_closed_total{reason}`` (closed by a bound)."""

    def __init__(self, *, guard: ConnectionGuard) -> None:
        self._guard = guard

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        current = GaugeMetricFamily(
            "nodeguard_http_connections",
            f"HTTP connections open (at most {self._guard.limits.max_connections})",
        )
        current.add_metric([], self._guard.open)
        closed = CounterMetricFamily(
            "nodeguard_http_connections_closed",
            "HTTP connections closed by a bound: header_timeout (no whole request head in "
            "time), body_timeout (no whole body in time), write_timeout (the answer not taken "
            "in time), evicted (made room for a new one), refused (over the cap, 503)",
            labels=["reason"],
        )
        for reason, n in sorted(self._guard.closed.items()):
            closed.add_metric([reason], n)
        yield from (current, closed)
