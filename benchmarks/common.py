"""What every benchmark shares: the repository on ``sys.path``, process CPU and RSS from procfs, a
scraper that asks as Prometheus asks, the peer (Debian's node_exporter) and the agent.

The agent always runs from this working tree (``PYTHONPATH`` set to it), never from a copy of
nodeguard installed into the virtual environment, and ``NODEGUARD_SRC`` can point it at another
tree (docs/benchmarks.md measures the code before a change that way).
"""

from __future__ import annotations

import contextlib
import gzip
import http.client
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The nodeguard source tree the agent and the in-process measurements run.
SRC = Path(os.environ.get("NODEGUARD_SRC") or ROOT).resolve()
for _p in dict.fromkeys((str(ROOT), str(SRC))):  # SRC ends up first: its nodeguard wins
    if _p in sys.path:
        sys.path.remove(_p)
    sys.path.insert(0, _p)

from tests.support.agent import Agent, free_port, running_agent, wait_ready  # noqa: E402
from tests.support.controlplane.cluster import terminate  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
MiB = 1 << 20

# What Prometheus 2.42 (Debian 12's) sends on every scrape: it prefers OpenMetrics and gzip.
PROMETHEUS_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
    "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Accept-Encoding": "gzip",
    "User-Agent": "Prometheus/2.42.0",
    "X-Prometheus-Scrape-Timeout-Seconds": "10",
}


def env_with_src(src: Path | None = None) -> dict[str, str]:
    """The environment for a child that must import nodeguard from ``src`` (:data:`SRC`)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src or SRC), str(ROOT)])}
    if src is not None:
        env["NODEGUARD_SRC"] = str(src)
    return env


# -- statistics ----------------------------------------------------------------------------------
def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def p90(xs: Sequence[float]) -> float:
    """The 90th percentile (nearest rank)."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(0.9 * len(s) + 0.5) - 1))]


def ratio(a: float, b: float) -> float:
    return a / b if b else float("inf")


# -- procfs --------------------------------------------------------------------------------------
def cpu_ns(pid: int) -> int:
    """CPU time of a process (all its threads), in nanoseconds: the sum of each thread's
    ``schedstat`` (time on the CPU, to the nanosecond), precise enough to time one scrape,
    where utime and stime count clock ticks of 10 ms."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):  # a thread that just ended
            total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
    return total


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of proc(5)


def rss_bytes(pid: int) -> int:
    """VmRSS of a process, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise ValueError(f"no VmRSS for {pid}")


# -- scraping ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Scrape:
    seconds: float
    wire_bytes: int
    body_bytes: int
    content_type: str
    body: bytes = b""


class Scraper:
    """GETs ``/metrics`` over one kept-alive connection with Prometheus's headers."""

    def __init__(self, base: str) -> None:
        host, _, port = base.removeprefix("http://").partition(":")
        self._host, self._port = host, int(port)
        self._conn: http.client.HTTPConnection | None = None

    def scrape(self, path: str = "/metrics") -> Scrape:
        for attempt in (1, 2):
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=30)
            try:
                start = time.perf_counter()
                self._conn.request("GET", path, headers=PROMETHEUS_HEADERS)
                resp = self._conn.getresponse()
                wire = resp.read()
                elapsed = time.perf_counter() - start
            except (OSError, http.client.HTTPException):
                self.close()
                if attempt == 2:
                    raise
                continue
            if resp.status != 200:
                raise RuntimeError(f"{path}: HTTP {resp.status}")
            body = gzip.decompress(wire) if resp.getheader("Content-Encoding") == "gzip" else wire
            return Scrape(
                seconds=elapsed,
                wire_bytes=len(wire),
                body_bytes=len(body),
                content_type=resp.getheader("Content-Type") or "",
                body=body,
            )
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


# -- the peer: Debian's prometheus-node-exporter -------------------------------------------------
NODE_EXPORTER_PACKAGE = "prometheus-node-exporter"


def node_exporter_binary() -> str:
    """The node_exporter binary; installs Debian's package when missing and we are root."""
    found = shutil.which("prometheus-node-exporter")
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        print(f"installing {NODE_EXPORTER_PACKAGE} (the peer) with apt-get ...", flush=True)
        cmd = ["apt-get", "install", "-y", "--no-install-recommends", NODE_EXPORTER_PACKAGE]
        if subprocess.run(cmd, capture_output=True, check=False).returncode != 0:
            subprocess.run(["apt-get", "update"], capture_output=True, check=False)
            subprocess.run(cmd, capture_output=True, check=False)
        found = shutil.which("prometheus-node-exporter")
        if found:
            return found
    raise SystemExit(
        "node_exporter (the peer) is not installed and could not be installed: run, as root,\n"
        f"  apt-get install -y --no-install-recommends {NODE_EXPORTER_PACKAGE}"
    )


def node_exporter_version() -> str:
    out = subprocess.run(
        [node_exporter_binary(), "--version"], capture_output=True, text=True, check=False
    )
    first = (out.stdout or out.stderr).splitlines()
    return first[0] if first else "unknown"


class Proc(str):
    """A base URL with the process ID behind it."""

    pid: int


@contextlib.contextmanager
def serving(
    cmd: Sequence[str], *, port: int, log_path: Path, what: str, timeout: float
) -> Iterator[Proc]:
    """Run ``cmd`` (an exporter listening on loopback ``port``) until the block ends; yields
    its base URL once ``/metrics`` answers 200. Its output goes to ``log_path``."""
    with log_path.open("w") as log:
        proc = subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT)
        base = Proc(f"http://127.0.0.1:{port}")
        base.pid = proc.pid
        try:
            wait_ready(
                f"{base}/metrics",
                proc=proc,
                log_path=log_path,
                what=what,
                timeout=timeout,
                request_timeout=timeout / 4,
            )
            yield base
        finally:
            terminate(proc, timeout=10)


@contextlib.contextmanager
def node_exporter(*, log_path: Path) -> Iterator[Proc]:
    """Debian's node_exporter with its default collectors on a free loopback port, reading this
    machine's /proc and /sys (what it reads on every node); yields its base URL."""
    port = free_port()
    cmd = [node_exporter_binary(), f"--web.listen-address=127.0.0.1:{port}"]
    with serving(cmd, port=port, log_path=log_path, what="node_exporter", timeout=20) as base:
        yield base


# -- the agent -----------------------------------------------------------------------------------
@contextlib.contextmanager
def agent(
    *, args: list[str], log_path: Path, ready_timeout: float = 60.0, src: Path | None = None
) -> Iterator[Agent]:
    """``nodeguard run ARGS`` from ``src`` (:data:`SRC`) (tests/support/agent.py's
    ``running_agent``),
    logging at warning so the log does not cost CPU; yields its base URL (with ``.pid``)."""
    with running_agent(
        args=["--log.level=warning", *args],
        log_path=log_path,
        ready_timeout=ready_timeout,
        env=env_with_src(src),
    ) as base:
        yield base


def nodeguard_version(src: Path | None = None) -> str:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import nodeguard, sys; print(nodeguard.__version__, nodeguard.__file__)",
        ],
        capture_output=True,
        text=True,
        env=env_with_src(src),
        cwd="/",
        check=False,
    )
    return out.stdout.strip() or out.stderr.strip()
