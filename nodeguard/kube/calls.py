"""One API call off the event loop: the client's own threads, the raw response parsed as JSON,
failures translated, reads retried.

Every call runs in a worker thread (the client is blocking), so the event loop that samples and
serves ``/metrics`` never waits on the API server. The threads are the client's own
(:data:`API_THREADS` of them), not asyncio's default executor: with the API server frozen, every
call blocks for its whole read timeout, and calls that shared the default executor with the
sampler and the ``/metrics`` render starved both (``/metrics`` timed out 4 scrapes in 5). Calls
beyond the threads wait in the client's own queue. Reads are retried with capped exponential
backoff on server errors (tenacity); writes are not retried here: whether a write may be
repeated is the caller's decision.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import urllib3
from kubernetes.client.exceptions import ApiException
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

from nodeguard.kube.errors import ServerError
from nodeguard.kube.translate import translate_error

__all__ = [
    "API_THREADS",
    "JSON",
    "KUBE_THREAD_PREFIX",
    "MERGE_PATCH",
    "REQUEST_TIMEOUT_SECONDS",
    "ApiCalls",
    "dry_run_option",
]

JSON = dict[str, Any]
#: The content type of a JSON merge patch (RFC 7386).
MERGE_PATCH = "application/merge-patch+json"
_TIMEOUT = (5.0, 15.0)  # connect, read (seconds)
#: The name prefix of the client's threads (a command's exit looks for those still in a call).
KUBE_THREAD_PREFIX = "kube-api"
#: The longest one API call (a LIST, a GET) waits for its answer: connect plus read, seconds.
REQUEST_TIMEOUT_SECONDS = _TIMEOUT[0] + _TIMEOUT[1]
#: Threads for API calls: the pod watch holds one for as long as each watch lasts, and actions,
#: Events and webhook claims are rarely more than a few at once.
API_THREADS = 4
T = TypeVar("T")


def dry_run_option(dry_run: bool) -> dict[str, str]:
    """The generated methods' ``dry_run`` argument for a server-side dry run (``dryRun=All``:
    admission, validation and PDB checks run; nothing is persisted), or none."""
    return {"dry_run": "All"} if dry_run else {}


class ApiCalls:
    """Runs the client's generated (or :mod:`~nodeguard.kube.core`) methods in the client's
    threads. ``read_attempts`` bounds retries of reads on :class:`ServerError`."""

    def __init__(self, *, read_attempts: int) -> None:
        self._read_attempts = read_attempts
        self._threads = ThreadPoolExecutor(
            max_workers=API_THREADS, thread_name_prefix=KUBE_THREAD_PREFIX
        )

    def close(self) -> None:
        """Stop the threads; calls still queued for a thread are dropped."""
        self._threads.shutdown(wait=False, cancel_futures=True)

    async def in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in one of the client's own threads (never asyncio's default executor,
        which the sampler and ``/metrics`` use), with the caller's context variables, as
        ``asyncio.to_thread`` runs it."""
        call = functools.partial(contextvars.copy_context().run, fn, *args)
        return await asyncio.get_running_loop().run_in_executor(self._threads, call)

    async def write(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> JSON:
        """Run one API call once, off the event loop; the response body as a dict, exactly as
        the API returns it (camelCase keys), ``{}`` for an empty body. Raises a
        :mod:`nodeguard.kube.errors` type chained from the client's exception."""
        return await self.in_thread(functools.partial(_blocking, fn, **kwargs), *args)

    async def read(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> JSON:
        """Like :meth:`write`, retried with capped exponential backoff on
        :class:`ServerError` (reads are safe to repeat)."""
        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(ServerError),
            stop=stop_after_attempt(self._read_attempts),
            wait=wait_exponential_jitter(multiplier=0.2, max=5.0, jitter=0.2),
            reraise=True,
        ):
            with attempt:
                return await self.write(fn, *args, **kwargs)
        raise AssertionError("unreachable")  # pragma: no cover


def _blocking(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> JSON:
    try:
        resp = fn(*args, _preload_content=False, _request_timeout=_TIMEOUT, **kwargs)
        data = resp.data
    except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
        # Only the client's and the transport's failures are API outcomes; a bug raises.
        raise translate_error(exc) from exc
    if not data:
        return {}
    try:
        parsed: JSON = json.loads(data)
    except ValueError as exc:
        raise ServerError(f"the API answered something that is not JSON: {exc}") from exc
    return parsed
