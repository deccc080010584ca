"""The agent as a real process under the DaemonSet's memory limit, watched while it is attacked.

:func:`limited_agent` starts ``nodeguard run`` inside a memory cgroup of this machine with the
limit of daemonset/base/daemonset.yaml; :class:`Watch` asks ``/healthz`` every 0.2 s (each must
answer 200 within 1 s) and reads the process's RSS, throughout the attack.
"""

from __future__ import annotations

import contextlib
import os
import resource
import secrets
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import yaml

from tests.support.agent import Agent, running_agent
from tests.support.kernel_cgroup import remove_cgroups, writable_memory_controller

ROOT = Path(__file__).resolve().parents[2]


def daemonset_memory_limit() -> int:
    """The agent container's memory limit in bytes, from daemonset/base/daemonset.yaml."""
    doc = yaml.safe_load((ROOT / "daemonset/base/daemonset.yaml").read_text())
    (container,) = doc["spec"]["template"]["spec"]["containers"]
    text = str(container["resources"]["limits"]["memory"])
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
    return int(text[:-2]) * units[text[-2:]]


def liveness_probe() -> tuple[float, int]:
    """The agent's livenessProbe in daemonset/base/daemonset.yaml: ``(timeoutSeconds,
    failureThreshold)``, the kubelet restarting the container after that many failures in a
    row (core/v1 Probe)."""
    doc = yaml.safe_load((ROOT / "daemonset/base/daemonset.yaml").read_text())
    (container,) = doc["spec"]["template"]["spec"]["containers"]
    probe = container["livenessProbe"]
    return float(probe["timeoutSeconds"]), int(probe["failureThreshold"])


def scrape_timeout() -> float:
    """The ServiceMonitor's scrapeTimeout in seconds (daemonset/base/servicemonitor.yaml):
    a scrape slower than that is a target down for Prometheus."""
    doc = yaml.safe_load((ROOT / "daemonset/base/servicemonitor.yaml").read_text())
    (endpoint,) = doc["spec"]["endpoints"]
    text = str(endpoint["scrapeTimeout"])
    assert text.endswith("s"), text
    return float(text[:-1])


def rss_bytes(pid: int) -> int:
    """VmRSS of a process (proc(5)); 0 once it has gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class Watch:
    """Asks ``/healthz`` every 0.2 s and samples RSS in a thread until stopped; ``failures``
    are the probes that did not answer 200 within ``timeout`` seconds (1 s unless told; with
    what happened)."""

    def __init__(self, base: Agent, *, timeout: float = 1.0) -> None:
        self.base = base
        self.timeout = timeout
        self.failures: list[str] = []
        self.slowest = 0.0
        self.probes = 0
        self.in_a_row = 0  # the most failures in a row
        self.max_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        run = 0
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                with urllib.request.urlopen(f"{self.base}/healthz", timeout=self.timeout) as resp:
                    ok = resp.status == 200
                    what = f"status {resp.status}"
            except Exception as exc:
                ok, what = False, f"{type(exc).__name__}: {exc}"
            took = time.monotonic() - started
            self.probes += 1
            self.slowest = max(self.slowest, took)
            if not ok or took > self.timeout:
                self.failures.append(f"{what} after {took:.2f}s")
                run += 1
                self.in_a_row = max(self.in_a_row, run)
            else:
                run = 0
            self.max_rss = max(self.max_rss, rss_bytes(self.base.pid))
            self._stop.wait(0.2)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def check(self, *, limit: int, failure_threshold: int = 1) -> None:
        """No ``failure_threshold`` probes in a row failed (by default: none failed); RSS
        stayed below ``limit``."""
        assert self.probes > 0
        assert self.in_a_row < failure_threshold, (self.probes, self.failures[:10])
        assert 0 < self.max_rss < limit, self.max_rss


@contextlib.contextmanager
def memory_cgroup(limit: int) -> Iterator[Path]:
    """A memory cgroup of this machine with ``limit`` bytes, removed afterwards."""
    found = writable_memory_controller()
    if found is None:
        raise RuntimeError("needs root and a writable cgroup memory controller")
    version, root = found
    path = root / f"nodeguard-hostile-{secrets.token_hex(4)}"
    path.mkdir()
    try:
        (path / ("memory.max" if version == 2 else "memory.limit_in_bytes")).write_text(str(limit))
        yield path
    finally:
        remove_cgroups([path])


def oom_kills(cgroup: Path) -> int:
    """OOM kills in the cgroup (v1 ``memory.oom_control``, v2 ``memory.events``)."""
    for name in ("memory.oom_control", "memory.events"):
        with contextlib.suppress(OSError):
            for line in (cgroup / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    return 0


@contextlib.contextmanager
def limited_agent(
    *, args: list[str], log_path: Path, open_files: int | None = None
) -> Iterator[tuple[Agent, Path]]:
    """``nodeguard run ARGS`` in a memory cgroup with the DaemonSet's limit (and, with
    ``open_files``, that RLIMIT_NOFILE, soft and hard); yields the agent and the cgroup, and
    checks on the way out that the kernel OOM-killed nothing in it."""
    with memory_cgroup(daemonset_memory_limit()) as cgroup:

        def preexec() -> None:
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))
            if open_files is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))

        with running_agent(args=args, log_path=log_path, preexec=preexec) as base:
            yield base, cgroup
            assert oom_kills(cgroup) == 0
