"""A fault-injecting proxy in front of the test kube-apiserver, to stop nodeguard "at the worst
moment": right after its cordon, between two members of a gang, while its claim is in flight.

The proxy terminates TLS with the API server's own serving certificate (so a kubeconfig that
trusts the test CA trusts it), and forwards every request upstream over TLS as the admin user;
responses stream back (watches too). Rules match a method and a path (regular expression) and
either **hold** the request until the test releases it (the agent then sits inside that call,
where the test kills it with SIGKILL or stops the API server) or **fail** it with a status. It
runs on its own event loop in a thread, so synchronous and asynchronous tests can both use it.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web

from tests.support.agent import free_port
from tests.support.controlplane.cluster import TestCluster

_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
}


@dataclass
class Rule:
    """Requests matching ``method`` and ``path`` (a regular expression searched in the path
    with its query). ``hold``: wait for :meth:`release`; else answer ``status``. ``times``: how
    many requests it applies to (then it lets them through). ``hit`` is set at the first."""

    method: str
    path: str
    hold: bool = True
    status: int = 503
    times: int = 1
    skip: int = 0
    #: Hold the answer instead: the request reaches the API server at once, its answer waits.
    after: bool = False
    hit: threading.Event = field(default_factory=threading.Event)
    matched: int = 0
    _released: asyncio.Event | None = None
    _loop: asyncio.AbstractEventLoop | None = None

    def matches(self, method: str, path: str) -> bool:
        if method != self.method or not re.search(self.path, path):
            return False
        if self.skip > 0:  # let the first ones through
            self.skip -= 1
            return False
        return self.matched < self.times

    def release(self) -> None:
        """Let the held requests go on (upstream)."""
        if self._loop is not None and self._released is not None:
            self._loop.call_soon_threadsafe(self._released.set)

    def drop(self) -> None:
        """Answer the held requests with ``status`` instead: the request is lost, as when a
        connection breaks before it reaches the API server."""
        self.hold = False
        self.release()

    def wait_hit(self, timeout: float = 30.0) -> None:
        """Block until a request matched. Raises ``AssertionError`` on timeout."""
        if not self.hit.wait(timeout):
            raise AssertionError(f"no {self.method} {self.path} within {timeout}s")


class ApiProxy:
    """The proxy; :attr:`kubeconfig` points a client at it. ``seen``: ``(method, path)`` of
    every request, in order."""

    def __init__(self, *, control_plane: TestCluster, workdir: Path) -> None:
        self.cp = control_plane
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.kubeconfig = control_plane.write_kubeconfig(
            workdir / "proxy-kubeconfig", server=self.url
        )
        self.rules: list[Rule] = []
        self.seen: list[tuple[str, str]] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    # -- rules ---------------------------------------------------------------------------------
    def hold(
        self, method: str, path: str, *, times: int = 1, skip: int = 0, after: bool = False
    ) -> Rule:
        """Hold the next ``times`` matching requests (after letting ``skip`` through) until
        :meth:`Rule.release`; ``after``: forward them at once and hold their answers (a
        write done at the API server whose answer is slow to come back)."""
        rule = Rule(method=method, path=path, times=times, skip=skip, after=after)
        rule._loop = self._loop
        rule._released = asyncio.Event()
        self.rules.append(rule)
        return rule

    def fail(
        self, method: str, path: str, *, status: int = 503, times: int = 1, skip: int = 0
    ) -> Rule:
        """Answer the next ``times`` matching requests (after ``skip``) with ``status``."""
        rule = Rule(method=method, path=path, hold=False, status=status, times=times, skip=skip)
        self.rules.append(rule)
        return rule

    def clear(self) -> None:
        """Release every held request and drop every rule."""
        for rule in self.rules:
            rule.release()
        self.rules = []

    # -- serving -------------------------------------------------------------------------------
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        method, path = request.method, request.path_qs
        self.seen.append((method, path))
        # The whole request first: held and then released after its client died, it still
        # reaches the API server, as a request already on the wire does.
        body = await request.read()
        late: Rule | None = None
        for rule in self.rules:
            if rule.matches(method, path):
                rule.matched += 1
                rule.hit.set()
                if not rule.hold:
                    return web.json_response(
                        {"kind": "Status", "status": "Failure", "code": rule.status},
                        status=rule.status,
                    )
                assert rule._released is not None
                if rule.after:
                    late = rule
                    break
                await rule._released.wait()
                if not rule.hold:  # dropped while held
                    return web.json_response(
                        {"kind": "Status", "status": "Failure", "code": rule.status},
                        status=rule.status,
                    )
                break
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        try:
            upstream = await self._session.request(
                method,
                self.cp.server_url + path,
                data=body or None,
                headers=headers,
                # Forward the headers as sent: aiohttp would add a Content-Type of its own to a
                # body that came without one (the client's Lease calls send none).
                skip_auto_headers=("Content-Type", "User-Agent", "Accept-Encoding"),
                timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
            )
        except aiohttp.ClientError as exc:  # the API server is down: as a dead endpoint would
            raise web.HTTPBadGateway(text=str(exc)) from exc
        if late is not None:
            answer = await upstream.read()  # done at the API server; the answer waits
            assert late._released is not None
            await late._released.wait()
            held = web.Response(status=upstream.status, body=answer)
            for k, v in upstream.headers.items():
                if k.lower() not in _HOP:
                    held.headers[k] = v
            upstream.release()
            return held
        response = web.StreamResponse(status=upstream.status)
        for k, v in upstream.headers.items():
            if k.lower() not in _HOP:
                response.headers[k] = v
        try:
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
        except (aiohttp.ClientError, ConnectionResetError):
            pass  # the client (an agent the test killed) is gone: its answer goes nowhere
        finally:
            upstream.release()
        return response

    async def _start(self) -> None:
        pki = self.cp.pki
        client_ssl = ssl.create_default_context(cafile=str(pki.ca_cert))
        client_ssl.load_cert_chain(str(pki.admin_cert), str(pki.admin_key))
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_ssl))
        server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ssl.load_cert_chain(str(pki.serving_cert), str(pki.serving_key))
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=server_ssl).start()

    async def _stop(self) -> None:
        # The upstream connections first: a watch being relayed ends, and its handler with it.
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)

    async def _cancel_rest(self) -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def stop(self) -> None:
        self.clear()
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=30)
        asyncio.run_coroutine_threadsafe(self._cancel_rest(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


@contextmanager
def api_proxy(*, control_plane: TestCluster, workdir: Path) -> Iterator[ApiProxy]:
    """A running :class:`ApiProxy` for the block."""
    proxy = ApiProxy(control_plane=control_plane, workdir=workdir)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()
