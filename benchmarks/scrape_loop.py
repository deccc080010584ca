"""Scrapes of several exporters in one loop, each timed and its CPU counted scrape by scrape.

Each round scrapes every target once, as Prometheus would (its ``Accept``, gzip, a kept-alive
connection), in a rotating order; a target marked ``pair`` is scraped a second time at once,
as the other server of a Prometheus HA pair does within the same interval. Rounds are
``period`` apart, longer than the agents' sampling interval, so that each round's first scrape
of an agent meets a snapshot it has not rendered yet (checked: the scrape's
``nodeguard_snapshot_timestamp_seconds`` differs from the last round's; a round that met the
same snapshot is counted apart and left out of the first-scrape figures).

CPU per scrape: the process's CPU time (every thread's ``schedstat``, in nanoseconds) over the
scrape. Work the exporter does meanwhile in the background (an agent's sample, cAdvisor's
housekeeping) lands in a few scrapes only, and the median leaves those out.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

from benchmarks.common import Scraper, cpu_ns, median, p90, rss_bytes

__all__ = ["Target", "scrape_loop"]

_TIMESTAMP = re.compile(rb"^nodeguard_snapshot_timestamp_seconds (\S+)$", re.M)


@dataclass(slots=True)
class Target:
    """An exporter to scrape: a name, its base URL, its process, whether an HA pair's second
    scrape follows each first."""

    name: str
    base: str
    pid: int
    pair: bool = False
    first_ms: list[float] = field(default_factory=list)
    first_cpu_ms: list[float] = field(default_factory=list)
    second_ms: list[float] = field(default_factory=list)
    second_cpu_ms: list[float] = field(default_factory=list)
    stale: int = 0
    wire: int = 0
    body: int = 0
    last_snapshot: bytes | None = None


def _timed(scraper: Scraper, pid: int) -> tuple[float, float, Any]:
    c0 = cpu_ns(pid)
    got = scraper.scrape()
    return got.seconds * 1e3, (cpu_ns(pid) - c0) / 1e6, got


def scrape_loop(targets: list[Target], *, rounds: int, period: float) -> dict[str, Any]:
    """Run the rounds; per target: median and p90 of latency and CPU, first and second scrape,
    body sizes, rounds that met a snapshot already rendered, RSS at the end."""
    scrapers = {t.name: Scraper(t.base) for t in targets}
    for t in targets:  # warm: connections, first-render allocations
        scrapers[t.name].scrape()
    for i in range(rounds):
        started = time.monotonic()
        for t in targets[i % len(targets) :] + targets[: i % len(targets)]:
            ms, cpu, got = _timed(scrapers[t.name], t.pid)
            found = _TIMESTAMP.search(got.body)
            snapshot = found.group(1) if found else None
            if snapshot is not None and snapshot == t.last_snapshot:
                t.stale += 1
            else:
                t.first_ms.append(ms)
                t.first_cpu_ms.append(cpu)
            t.last_snapshot = snapshot
            t.wire, t.body = got.wire_bytes, got.body_bytes
            if t.pair:
                ms, cpu, _ = _timed(scrapers[t.name], t.pid)
                t.second_ms.append(ms)
                t.second_cpu_ms.append(cpu)
        time.sleep(max(0.0, period - (time.monotonic() - started)))
    for s in scrapers.values():
        s.close()
    return {
        t.name: {
            "ms": [median(t.first_ms), p90(t.first_ms)],
            "cpu_ms": [median(t.first_cpu_ms), p90(t.first_cpu_ms)],
            "second_ms": [median(t.second_ms), p90(t.second_ms)] if t.pair else None,
            "second_cpu_ms": [median(t.second_cpu_ms), p90(t.second_cpu_ms)] if t.pair else None,
            "scrapes": len(t.first_ms),
            "stale": t.stale,
            "wire": t.wire,
            "body": t.body,
            "rss": rss_bytes(t.pid),
        }
        for t in targets
    }
