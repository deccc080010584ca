"""The footprint run: one ``nodeguard run`` sampling a full node (330 containers) at the default
5 s interval with the default rules for ``--soak`` seconds (10 minutes), scraped every 15 s by
an HA pair of Prometheus servers (two scrapes, one after the other), with pod churn (10 pods
replaced by new ones every minute, as a busy node sees) and memory moving in every cgroup every
5 s (``benchmarks.hosts.Churn``), beside its own node_exporter scraped on the same schedule and,
with ``before``, the code before a change on the same tree. RSS and CPU of each every 30 s.

Samples are counted exactly: every sample opens the tree's ``proc/meminfo`` once, and an inotify
watch counts the opens. CPU per sample here includes the rule engine and the share of the scrapes.
"""

from __future__ import annotations

import contextlib
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

from benchmarks.common import (
    ROOT,
    Proc,
    Scraper,
    agent,
    cpu_seconds,
    node_exporter,
    rss_bytes,
)
from benchmarks.hosts import Churn, HostTree, rename_pods
from tests.support.agent import Agent

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

    def __init__(
        self, *, tree: HostTree, seconds: float, workdir: Path, before: Path | None = None
    ) -> None:
        super().__init__(name="soak", daemon=True)
        self.tree, self.seconds, self.workdir = tree, seconds, workdir
        self.before = before
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

        def args(state: str) -> list[str]:
            return [
                *self.tree.flags,
                f"--path.state={wd / state}",
                f"--rules={ROOT / 'rules/default.yaml'}",
                "--no-collector.gpu",
            ]

        rows: list[dict[str, float]] = []
        with contextlib.ExitStack() as stack:
            procs: dict[str, Agent | Proc] = {
                "ng": stack.enter_context(agent(args=args("state"), log_path=wd / "agent.log"))
            }
            if self.before is not None:
                procs["bf"] = stack.enter_context(
                    agent(args=args("state-before"), log_path=wd / "before.log", src=self.before)
                )
            procs["ne"] = stack.enter_context(node_exporter(log_path=wd / "node_exporter.log"))
            scrapers = {k: Scraper(p) for k, p in procs.items()}
            start = time.monotonic()
            samples0 = counter.count()
            cpu0 = {k: cpu_seconds(p.pid) for k, p in procs.items()}
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
                    row = {"t": now - start, "samples": counter.count() - samples0}
                    for k, p in procs.items():
                        row[f"{k}_rss"] = rss_bytes(p.pid)
                        row[f"{k}_cpu"] = cpu_seconds(p.pid) - cpu0[k]
                    rows.append(row)
                    next_record += RECORD_EVERY
                    if now - start >= self.seconds:
                        break
                if now >= next_scrape:
                    for _ in range(2):  # an HA pair: both servers scrape every target
                        for scraper in scrapers.values():
                            scraper.scrape()
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
            for scraper in scrapers.values():
                scraper.close()
        counter.close()
        shutil.rmtree(self.tree.root, ignore_errors=True)
        return {"rows": rows, "scrapes": scrapes, "pods_replaced": churned, "seconds": self.seconds}


def main(argv: list[str] | None = None) -> int:
    """The footprint run alone: ``python -m benchmarks.soak [--before DIR] [--seconds N]
    [--json FILE]``; prints CPU and RSS of each agent at the end."""
    import argparse
    import json
    import tempfile

    from benchmarks.hosts import make_host

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--before", type=Path, help="the code before a change (a source tree)")
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--containers", type=int, default=330)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="nodeguard-soak-") as tmp:
        soak = Soak(
            tree=make_host(Path(tmp) / "host", containers=args.containers),
            seconds=args.seconds,
            workdir=Path(tmp) / "soak",
            before=args.before,
        )
        soak.start()
        soak.join()
    res = soak.result
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    if "error" in res:
        print(res["error"])
        return 1
    last = res["rows"][-1]
    for who in ("ng", "bf", "ne"):
        if f"{who}_cpu" in last:
            print(
                f"{who}: CPU {last[f'{who}_cpu']:.1f} s over {last['t']:.0f} s, "
                f"RSS {last[f'{who}_rss'] / (1 << 20):.1f} MiB"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
