"""Starting the real ``nodeguard run`` process for end-to-end tests."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from tests.support.controlplane.cluster import terminate

T = TypeVar("T")


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, *, timeout: float = 5.0) -> tuple[int, str]:
    """GET a URL; ``(status, body)`` also for 4xx/5xx."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def wait_ready(
    url: str,
    *,
    proc: subprocess.Popen[Any],
    log_path: Path,
    what: str,
    timeout: float,
    request_timeout: float = 1.0,
    interval: float = 0.05,
) -> None:
    """Poll ``url`` until it answers 200 (:func:`wait_until`). Raises ``RuntimeError`` with the
    process's log when the process exits first or ``timeout`` seconds pass."""

    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        with contextlib.suppress(OSError):
            return get(url, timeout=request_timeout)[0] == 200
        return False

    try:
        wait_until(f"{what} ready", ready, timeout=timeout, step=interval)
    except AssertionError:
        raise RuntimeError(f"{what} not ready at {url}:\n{log_path.read_text()[-3000:]}") from None


def _timed_out(what: str, detail: Callable[[], object] | None) -> str:
    return f"timed out waiting for {what}" + ("" if detail is None else f":\n{detail()}")


def wait_until(
    what: str,
    predicate: Callable[[], T | None],
    *,
    timeout: float,
    step: float = 0.1,
    detail: Callable[[], object] | None = None,
) -> T:
    """Call ``predicate`` every ``step`` seconds until it returns something true, and return
    that. Fails the test (AssertionError naming ``what``, with ``detail()``: a log, the last
    values seen) when ``timeout`` seconds pass first: a hang guard, never a speed bound. The
    one wait of the tests (``tests/unit/test_test_rules.py`` holds that no other module loops
    on a clock)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, _timed_out(what, detail)
        time.sleep(step)


async def wait_until_async(
    what: str,
    predicate: Callable[[], T | None],
    *,
    timeout: float,
    step: float = 0.05,
    detail: Callable[[], object] | None = None,
) -> T:
    """:func:`wait_until` inside a running event loop: it sleeps on the loop, so the code under
    test (a watch, a worker) runs between the calls of ``predicate``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, _timed_out(what, detail)
        await asyncio.sleep(step)


def kill_9(pid: int, *, timeout: float = 10.0) -> None:
    """SIGKILL the process and wait until it is gone (or a zombie: dead, not yet reaped)."""
    os.kill(pid, signal.SIGKILL)
    wait_until("the process to die", lambda: exited(pid), timeout=timeout, step=0.02)


def exited(pid: int) -> bool:
    """Whether process ``pid`` is gone or a zombie (dead, not yet reaped by its parent)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


class Agent(str):
    """The agent's base URL, with its process ID."""

    pid: int


@contextlib.contextmanager
def running_agent(
    *,
    args: list[str],
    log_path: Path,
    ready_timeout: float = 20.0,
    env: dict[str, str] | None = None,
    preexec: Callable[[], None] | None = None,
) -> Iterator[Agent]:
    """Run ``nodeguard run ARGS`` on a free loopback port until the block ends; yields the base
    URL once ``/readyz`` answers 200. The process's output goes to ``log_path``; ``preexec``
    runs in the child before the agent starts (a cgroup to join, a limit to set)."""
    port = free_port()
    cmd = [sys.executable, "-m", "nodeguard", "run", f"--listen-address=127.0.0.1:{port}", *args]
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            preexec_fn=preexec,  # noqa: PLW1509  (tests start the agent from one thread)
        )
        base = Agent(f"http://127.0.0.1:{port}")
        base.pid = proc.pid
        try:
            wait_ready(
                f"{base}/readyz",
                proc=proc,
                log_path=log_path,
                what="nodeguard",
                timeout=ready_timeout,
            )
            yield base
        finally:
            terminate(proc, timeout=10)
