"""The footprint run: one ``nodeguard run`` sampling a full node (330 containers) at the default
5 s interval with the default rules for ``--soak`` seconds (10 minutes), scraped every 15 s as
Prometheus would, with pod churn (10 pods replaced by new ones every minute, as a busy node
sees) and memory moving in every cgroup every 5 s (``benchmarks.hosts.Churn``), beside its own
node_exporter scraped on the same schedule. RSS and CPU of both every 30 s.

Samples are counted exactly: every sample opens the tree's ``proc/meminfo`` once, and an inotify
watch counts the opens. CPU per sample here includes the rule engine and the share of the scrapes.
"""

from __future__ import annotations

import ctypes
import errno
import os
import random
import shutil
import struct
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, Scraper, agent, cpu_seconds, node_exporter, rss_bytes
from benchmarks.hosts import Churn, HostTree, rename_pods

SCRAPE_EVERY = 15.0
RECORD_EVERY = 30.0
CHURN_EVERY = 60.0
CHURN_PODS = 10
MOVE_EVERY = 5.0  # memory moves in every cgroup (benchmarks.hosts.Churn) once an interval

_IN_OPEN = 0x20
_IN_CLOSE_NOWRITE = 0x10
_IN_NONBLOCK = os.O_NONBLOCK


class OpenCounter:
    """Counts opens of one file (inotify IN_OPEN); ``count()`` reads what has arrived. Closes are
    watched too: inotify merges an event with an identical unread one before it, and an open
    always follows a close, so no open is merged away."""

    def __init__(self, path: Path) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd = self._libc.inotify_init1(_IN_NONBLOCK)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        if (
            self._libc.inotify_add_watch(self._fd, str(path).encode(), _IN_OPEN | _IN_CLOSE_NOWRITE)
            < 0
        ):
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {path}")
        self._count = 0

    def count(self) -> int:
        while True:
            try:
                data = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                return self._count
            except OSError as exc:
                if exc.errno == errno.EAGAIN:
                    return self._count
                raise
            offset = 0
            while offset < len(data):
                _, mask, _, length = struct.unpack_from("iIII", data, offset)
                if mask & _IN_OPEN:
                    self._count += 1
                offset += 16 + length

    def close(self) -> None:
        os.close(self._fd)


class Soak(threading.Thread):
    """Runs the footprint measurement in the background; ``result`` when done."""

    def __init__(self, *, tree: HostTree, seconds: float, workdir: Path) -> None:
        super().__init__(name="soak", daemon=True)
        self.tree, self.seconds, self.workdir = tree, seconds, workdir
        self.result: dict[str, Any] = {}

    def run(self) -> None:
        try:
            self.result = self._run()
        except Exception as exc:
            self.result = {"error": f"{type(exc).__name__}: {exc}"}

    def _run(self) -> dict[str, Any]:
        wd = self.workdir
        wd.mkdir(parents=True, exist_ok=True)
        rng = random.Random(88)
        moving = Churn(self.tree.root, rng=random.Random(89))
        counter = OpenCounter(self.tree.root / "proc/meminfo")
        args = [
            *self.tree.flags,
            f"--path.state={wd / 'state'}",
            f"--rules={ROOT / 'rules/default.yaml'}",
            "--no-collector.gpu",
        ]
        rows: list[dict[str, float]] = []
        with (
            agent(args=args, log_path=wd / "agent.log") as ng,
            node_exporter(log_path=wd / "node_exporter.log") as ne,
        ):
            ng_s, ne_s = Scraper(ng), Scraper(ne)
            start = time.monotonic()
            samples0 = counter.count()
            cpu0 = (cpu_seconds(ng.pid), cpu_seconds(ne.pid))
            next_scrape = next_record = start
            next_churn = start + CHURN_EVERY
            next_move = start
            scrapes = churned = 0
            while True:
                now = time.monotonic()
                if now >= next_move:
                    moving.step()
                    next_move += MOVE_EVERY
                if now >= next_record:
                    rows.append(
                        {
                            "t": now - start,
                            "ng_rss": rss_bytes(ng.pid),
                            "ne_rss": rss_bytes(ne.pid),
                            "ng_cpu": cpu_seconds(ng.pid) - cpu0[0],
                            "ne_cpu": cpu_seconds(ne.pid) - cpu0[1],
                            "samples": counter.count() - samples0,
                        }
                    )
                    next_record += RECORD_EVERY
                    if now - start >= self.seconds:
                        break
                if now >= next_scrape:
                    ng_s.scrape()
                    ne_s.scrape()
                    scrapes += 1
                    next_scrape += SCRAPE_EVERY
                if now >= next_churn:
                    churned += rename_pods(self.tree, count=CHURN_PODS, rng=rng)
                    moving.relist()
                    next_churn += CHURN_EVERY
                time.sleep(
                    max(
                        0.0,
                        min(next_record, next_scrape, next_churn, next_move) - time.monotonic(),
                    )
                )
            ng_s.close()
            ne_s.close()
        counter.close()
        shutil.rmtree(self.tree.root, ignore_errors=True)
        return {"rows": rows, "scrapes": scrapes, "pods_replaced": churned, "seconds": self.seconds}
