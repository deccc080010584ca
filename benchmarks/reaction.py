"""Reaction on the real kernel: memory hogs in kubelet-shaped cgroups
(tests/support/kernel_cgroup.py) grow
toward their limits; how soon after their unreclaimable memory crosses 95 % of the limit each
agent fires, and how much time that leaves before the kernel OOM-kills the hog; and page-cache
readers at their limits, which must never fire. Two agents watch the same hogs
at the same time, in one run, at the default 5 s interval:

- ``polling``: ``nodeguard run --focus.interval=0 --no-notify.thresholds --no-notify.psi
  --no-notify.events``: samples every interval and nothing else (nodeguard before issue 15);
- ``focused``: ``nodeguard run`` with the defaults: focus sampling (containers at 80 % of their
  limit or more re-read every 250 ms) and the kernel's notifications (cgroup v1 thresholds at 80 %
  and at the rules' 95 % of each limit, PSI triggers, cgroup v2 ``memory.events``).

Both run the default rule ``container-near-limit`` (unreclaimable memory >= 95 % of the limit and
the predicted time to the limit <= 60 s) with ``maxFirings`` raised from 5 to 1,000 per 10
minutes, so that every one of the hogs can be a firing; dry run, no cluster (the evict action
reports ``refused``, "no Kubernetes API": the firing and its incident record are what count).

Hogs (``1 MiB`` allocations, every page touched):

- four groups of ten: 8 and 32 MiB/s toward 512 MiB and 1 GiB limits; within a group the hogs
  start half a second apart, so that their crossings fall on every phase of the 5 s sampling grid;
  a group starts when the one before it is over;
- the slow-growth cases, from the start: three ``medium`` hogs (8 MiB/s up to 93 % of a 512 MiB
  limit, then 0.5 MiB/s: 51 s from 95 % to the limit) and three ``slow`` ones (then 0.125 MiB/s:
  205 s), growth too slow for a short fit to tell from noise;
- the look-alikes, from the start to the end: page-cache readers (tests/support/kernel_cgroup.py
  ``READER``) re-reading a cold 500 MiB file at 8 and 32 MiB/s in 512 MiB limits. From their
  second pass the cache is active and their working set sits at 95 % of the limit and more,
  while the kernel reclaims it there and kills nothing: a firing on one is a false positive.

Times, all wall clock (``time.time()``):

- crossing: the first time the runner, reading the container's ``memory.stat`` (and v2
  ``memory.current``) itself every 20 ms, sees its unreclaimable memory >= 95 % of the limit,
  computed by the same functions as the agent's (nodeguard.sources.unreclaimable: v1 the anon
  and unevictable lists, v2 ``memory.current`` less the file LRU and reclaimable slab; no swap
  on the benchmark machine): what the rule reads. For a reader, the runner notes when its
  working set (usage - inactive_file, cAdvisor's) first reaches 95 % (the look-alike is real)
  and the most of the limit its unreclaimable memory ever was;
- firing: the incident record's ``time``, the timestamp of the sample that fired;
- action: the incident file's modification time, written once the actions have run;
- OOM: when the runner saw the hog exit with SIGKILL (polled every 20 ms), confirmed by the
  cgroup's ``memory.oom_control`` ``oom_kill`` counter.

Latency = firing - crossing; margin = OOM - action (positive: the agent acted first). Each agent's
CPU time over the whole run is read from ``/proc/<pid>/stat``.

Run: ``python -m benchmarks.reaction [--json FILE] [--quick]`` (root, cgroup v1 or v2 with a
writable memory controller); about 6 minutes, up to 14 GiB of memory and 1 GiB of disk in
``--workdir`` (``--quick``: three hogs in two groups and one reader, about 2 minutes). It prints
the tables; ``--tables-from FILE`` prints them again from a saved result.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common import CLK_TCK, ROOT, MiB, agent
from nodeguard.sources.unreclaimable import unreclaimable_v1, unreclaimable_v2
from tests.support.kernel_cgroup import (
    READER,
    KubeletCgroup,
    cold_file,
    kubelet_cgroup,
    private_kubepods,
    process_in,
    writable_memory_controller,
)

THRESHOLD = 0.95
INTERVAL = 5.0
NODE = "bench-node"
RULE = "container-near-limit"
POLL = 0.02
#: (rate in MiB/s, limit in MiB), ten hogs each.
GROUPS = [(8, 512), (8, 1024), (32, 512), (32, 1024)]
HOGS_PER_GROUP = 10
#: name, bytes per 0.5 s after 93 % of a 512 MiB limit.
SLOW = [("medium", 256 * 1024), ("slow", 64 * 1024)]
SLOW_EACH = 3
#: Page-cache readers: (rate in MiB/s, file in MiB, limit in MiB).
READERS = [(8, 500, 512), (32, 500, 512)]
AGENTS: dict[str, list[str]] = {
    "polling": [
        "--focus.interval=0",
        "--no-notify.thresholds",
        "--no-notify.psi",
        "--no-notify.events",
    ],
    "focused": [],
}

# ``step`` bytes every ``pause`` s until the cgroup's usage (read from ``usage_file``) reaches
# ``switch`` bytes, then ``slow_step`` every ``slow_pause`` s; every page touched. The pause is
# kept on a schedule (not slept after each step), so that the rate holds at 32 MiB/s too.
HOG = r"""
import sys, time
step, pause, switch, slow_step, slow_pause = (
    int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
usage_file = sys.argv[6]
sys.stdin.readline()
chunks, slow, due = [], False, time.monotonic()
while True:
    if not slow and switch:
        with open(usage_file) as f:
            slow = int(f.read()) >= switch
    size, wait = (slow_step, slow_pause) if slow else (step, pause)
    chunks.append(bytearray(b"\x01" * size))
    due += wait
    time.sleep(max(0.0, due - time.monotonic()))
"""


@contextlib.contextmanager
def hog(
    cg: KubeletCgroup, *, rate: float, switch: int = 0, slow_step: int = 0
) -> Iterator[subprocess.Popen[str]]:
    """A hog in ``cg`` allocating 1 MiB at ``rate`` MiB/s (then ``slow_step`` bytes every 0.5 s
    from ``switch`` bytes of usage, when given)."""
    usage = cg.container_dir / ("memory.usage_in_bytes" if cg.version == 1 else "memory.current")
    argv = [sys.executable, "-c", HOG, str(MiB), str(1 / rate), str(switch), str(slow_step)]
    with process_in(cg, [*argv, "0.5", str(usage)]) as proc:
        yield proc


@dataclass
class Hog:
    name: str
    group: str
    cg: KubeletCgroup
    limit: int
    proc: subprocess.Popen[str] | None = None
    started: float | None = None
    crossing: float | None = None
    oom: float | None = None
    returncode: int | None = None
    oom_kills: int | None = None
    firing: dict[str, float] = field(default_factory=dict)
    action: dict[str, float] = field(default_factory=dict)
    outcome: dict[str, str] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        def rel(t: float | None) -> float | None:
            return None if t is None or self.crossing is None else round(t - self.crossing, 3)

        out: dict[str, Any] = {
            "hog": self.name,
            "group": self.group,
            "limit_bytes": self.limit,
            "crossing_after_start_s": None
            if self.crossing is None or self.started is None
            else round(self.crossing - self.started, 3),
            "oom_s": rel(self.oom),
            "returncode": self.returncode,
            "oom_kills": self.oom_kills,
        }
        for name in AGENTS:
            out[f"{name}_firing_s"] = rel(self.firing.get(name))
            out[f"{name}_action_s"] = rel(self.action.get(name))
            out[f"{name}_outcome"] = self.outcome.get(name)
            act = self.action.get(name)
            out[f"{name}_margin_s"] = (
                None if self.oom is None or act is None else round(self.oom - act, 3)
            )
        return out


def _all_killed(hogs: list[Hog]) -> bool:
    """Every hog has been OOM-killed (its ``oom`` time is known)."""
    return all(h.oom is not None for h in hogs)


def _flat(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            k, _, v = line.partition(" ")
            with contextlib.suppress(ValueError):
                out[k] = int(v)
    return out


def _usage(cg: KubeletCgroup) -> int | None:
    name = "memory.usage_in_bytes" if cg.version == 1 else "memory.current"
    try:
        return int((cg.container_dir / name).read_text())
    except (OSError, ValueError):
        return None


def _working_set(cg: KubeletCgroup) -> int | None:
    """cAdvisor's working set: usage - inactive_file, clamped at 0."""
    usage = _usage(cg)
    if usage is None:
        return None
    stat = _flat(cg.container_dir / "memory.stat")
    return max(
        0, usage - stat.get("total_inactive_file" if cg.version == 1 else "inactive_file", 0)
    )


def _unreclaimable(cg: KubeletCgroup) -> int | None:
    """What the rule reads, by the agent's own arithmetic (no swap on the benchmark machine)."""
    stat = _flat(cg.container_dir / "memory.stat")
    if cg.version == 1:
        return unreclaimable_v1(stat=stat)
    return unreclaimable_v2(usage=_usage(cg), stat=stat, swap=0)


def _oom_kills(cg: KubeletCgroup) -> int | None:
    if cg.version == 1:
        return _flat(cg.container_dir / "memory.oom_control").get("oom_kill")
    return _flat(cg.container_dir / "memory.events").get("oom_kill")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def bench_rules(path: Path) -> Path:
    """The default ``container-near-limit`` rule, ``maxFirings`` raised to 1,000 per 10 min."""
    spec = yaml.safe_load((ROOT / "rules/default.yaml").read_text())
    rule = next(r for r in spec["spec"]["rules"] if r["name"] == RULE)
    rule["maxFirings"] = {"count": 1000, "window": "10m"}
    spec["spec"]["rules"] = [rule]
    path.write_text(yaml.safe_dump(spec))
    return path


@dataclass
class Reader:
    """A page-cache reader: it must never fire."""

    name: str
    cg: KubeletCgroup
    limit: int
    rate: int
    started: float | None = None
    ws_crossing: float | None = None
    unreclaimable_max: int = 0
    firing: dict[str, float] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        return {
            "reader": self.name,
            "limit_bytes": self.limit,
            "rate_mib_s": self.rate,
            "working_set_95_after_start_s": None
            if self.ws_crossing is None or self.started is None
            else round(self.ws_crossing - self.started, 3),
            "unreclaimable_max_ratio": round(self.unreclaimable_max / self.limit, 4),
            **{f"{name}_firing_s": self.firing.get(name) for name in AGENTS},
        }


class Watch:
    """The runner's own view of the hogs, the readers and the agents' incident records."""

    def __init__(self, states: dict[str, Path]) -> None:
        self.hogs: list[Hog] = []
        self.readers: list[Reader] = []
        self.states = states
        self._seen: set[Path] = set()

    def step(self) -> None:
        now = time.time()
        for h in self.hogs:
            if h.proc is None or h.oom is not None:
                continue
            if h.proc.poll() is not None:
                h.oom, h.returncode, h.oom_kills = now, h.proc.returncode, _oom_kills(h.cg)
            elif h.crossing is None:
                un = _unreclaimable(h.cg)
                if un is not None and un >= THRESHOLD * h.limit:
                    h.crossing = now
        for r in self.readers:
            r.unreclaimable_max = max(r.unreclaimable_max, _unreclaimable(r.cg) or 0)
            if r.ws_crossing is None and (_working_set(r.cg) or 0) >= THRESHOLD * r.limit:
                r.ws_crossing = now

    def incidents(self) -> None:
        by_id = {h.cg.container_id: h for h in self.hogs}
        readers = {r.cg.container_id: r for r in self.readers}
        for name, state in self.states.items():
            for path in (state / "incidents").glob("*.json"):
                if path in self._seen:
                    continue
                try:
                    rec = json.loads(path.read_text())
                    mtime = path.stat().st_mtime
                except (OSError, ValueError):
                    continue
                self._seen.add(path)
                if rec.get("kind") != "firing" or rec.get("rule") != RULE:
                    continue
                cid = str(rec.get("target", "")).rsplit("/", 1)[-1]
                r = readers.get(cid)
                if r is not None and name not in r.firing:
                    r.firing[name] = round(rec["time"] - (r.started or 0), 3)
                h = by_id.get(cid)
                if h is not None and name not in h.firing:
                    h.firing[name], h.action[name] = rec["time"], mtime
                    h.outcome[name] = ",".join(
                        f"{a['action']}:{a['outcome']}" for a in rec.get("actions", [])
                    )

    def until(self, done: Callable[[], bool], *, deadline: float) -> None:
        last = 0.0
        while time.time() < deadline and not done():
            self.step()
            if time.time() - last >= 0.5:
                last = time.time()
                self.incidents()
            time.sleep(POLL)
        self.incidents()


def run(
    workdir: Path,
    *,
    groups: list[tuple[int, int]] = GROUPS,
    per_group: int = HOGS_PER_GROUP,
    slow_each: int = SLOW_EACH,
    readers: list[tuple[int, int, int]] = READERS,
) -> dict[str, Any]:
    """The measurement; the data behind :func:`tables`."""
    if writable_memory_controller() is None:
        return {"error": "needs root and a writable cgroup memory controller"}
    workdir.mkdir(parents=True, exist_ok=True)
    rules = bench_rules(workdir / "rules.yaml")
    states = {name: workdir / name / "state" for name in AGENTS}
    watch = Watch(states)
    started = time.time()
    with contextlib.ExitStack() as stack:
        # A kubepods of its own: the agents read these hogs alone, never the machine's pods.
        pods = stack.enter_context(private_kubepods(workdir))
        pids: dict[str, int] = {}
        for name, extra in AGENTS.items():
            (workdir / name).mkdir(exist_ok=True)
            base = stack.enter_context(
                agent(
                    args=[
                        f"--interval={INTERVAL:g}s",
                        f"--rules={rules}",
                        f"--path.state={states[name]}",
                        f"--node-name={NODE}",
                        f"--path.sysfs={pods.sysfs}",
                        "--no-collector.gpu",
                        *extra,
                    ],
                    log_path=workdir / name / "agent.log",
                )
            )
            assert base.pid is not None
            pids[name] = base.pid
        cpu0 = {name: _cpu_seconds(pid) for name, pid in pids.items()}
        for i, (rate, file_mib, limit_mib) in enumerate(readers):
            data = cold_file(workdir / f"dataset-{i + 1}", file_mib)
            cg = stack.enter_context(kubelet_cgroup(pods, limit_bytes=limit_mib * MiB))
            r = Reader(name=f"reader {rate} MiB/s", cg=cg, limit=limit_mib * MiB, rate=rate)
            stack.enter_context(
                process_in(cg, [sys.executable, "-c", READER, str(data), str(1 / rate)])
            )
            r.started = time.time()
            watch.readers.append(r)
        slow_limit = 512 * MiB
        for kind, step in SLOW:
            for i in range(slow_each):
                cg = stack.enter_context(kubelet_cgroup(pods, limit_bytes=slow_limit))
                h = Hog(name=f"{kind}-{i + 1}", group=kind, cg=cg, limit=slow_limit)
                h.proc = stack.enter_context(
                    hog(cg, rate=8, switch=int(slow_limit * 0.93), slow_step=step)
                )
                h.started = time.time()
                watch.hogs.append(h)
        for rate, limit_mib in groups:
            group = f"{rate} MiB/s, {limit_mib} MiB"
            limit = limit_mib * MiB
            members: list[Hog] = []
            with contextlib.ExitStack() as inner:
                for i in range(per_group):
                    if i:
                        watch.until(lambda: False, deadline=time.time() + INTERVAL / per_group)
                    cg = inner.enter_context(kubelet_cgroup(pods, limit_bytes=limit))
                    h = Hog(name=f"{rate}/{limit_mib}-{i + 1}", group=group, cg=cg, limit=limit)
                    h.proc = inner.enter_context(hog(cg, rate=rate))
                    h.started = time.time()
                    members.append(h)
                    watch.hogs.append(h)
                ramp = limit_mib / rate
                watch.until(partial(_all_killed, members), deadline=time.time() + 1.5 * ramp + 30)
        watch.until(partial(_all_killed, watch.hogs), deadline=started + 900)
        watch.until(lambda: False, deadline=time.time() + 6)  # a firing just before a kill
        cpu = {name: _cpu_seconds(pid) - cpu0[name] for name, pid in pids.items()}
    return {
        "interval_s": INTERVAL,
        "threshold": THRESHOLD,
        "duration_s": round(time.time() - started, 1),
        "agent_cpu_s": {k: round(v, 2) for k, v in cpu.items()},
        "hogs": [h.row() for h in watch.hogs],
        "readers": [r.row() for r in watch.readers],
        "agent_logs": {
            name: (workdir / name / "agent.log").read_text().splitlines()[-40:] for name in AGENTS
        },
    }


def _summary(rows: list[dict[str, Any]], name: str) -> dict[str, Any]:
    lat = [r[f"{name}_firing_s"] for r in rows if r[f"{name}_firing_s"] is not None]
    margins = [r[f"{name}_margin_s"] for r in rows if r[f"{name}_margin_s"] is not None]
    first = sum(1 for m in margins if m > 0)
    return {
        "latency_median_s": statistics.median(lat) if lat else None,
        "latency_max_s": max(lat) if lat else None,
        "acted_first": first,
        "margin_median_s": statistics.median(margins) if margins else None,
        "margin_min_s": min(margins) if margins else None,
    }


def summarize(res: dict[str, Any]) -> list[dict[str, Any]]:
    """A row per group and agent."""
    out = []
    groups = dict.fromkeys(r["group"] for r in res["hogs"])
    for group in groups:
        rows = [r for r in res["hogs"] if r["group"] == group and r["oom_s"] is not None]
        to_limit = [r["oom_s"] for r in rows]
        for name in AGENTS:
            out.append(
                {
                    "group": group,
                    "agent": name,
                    "hogs": len(rows),
                    "crossing_to_kill_median_s": statistics.median(to_limit) if to_limit else None,
                    **_summary(rows, name),
                }
            )
    return out


def _s(v: float | None, fmt: str = "+.2f") -> str:
    return "-" if v is None else format(v, fmt)


def tables(res: dict[str, Any]) -> str:
    """Markdown: a row per group and agent, then the agents' CPU."""
    if "error" in res:
        return f"reaction not measured: {res['error']}"
    head = (
        "| hogs | 95 % to kill (median) | agent | crossing -> firing, median / max | "
        "acted before the kill | margin, median / least |\n|---|---:|---|---:|---:|---:|\n"
    )
    lines = []
    for s in summarize(res):
        lines.append(
            f"| {s['group']} | {_s(s['crossing_to_kill_median_s'], '.1f')} s | {s['agent']} | "
            f"{_s(s['latency_median_s'])} / {_s(s['latency_max_s'])} s | "
            f"{s['acted_first']} of {s['hogs']} | "
            f"{_s(s['margin_median_s'])} / {_s(s['margin_min_s'])} s |"
        )
    cpu = ", ".join(f"{k} {v:.1f} s" for k, v in res["agent_cpu_s"].items())
    out = head + "\n".join(lines)
    if res.get("readers"):
        out += (
            "\n\n| page-cache reader | working set at 95 % after | unreclaimable, most | "
            + " | ".join(f"{name} firings" for name in AGENTS)
            + " |\n|---|---:|---:|"
            + "---:|" * len(AGENTS)
            + "\n"
        )
        for r in res["readers"]:
            fired = " | ".join(
                "none" if r[f"{n}_firing_s"] is None else f"at {r[f'{n}_firing_s']:.1f} s"
                for n in AGENTS
            )
            out += (
                f"| {r['reader']}, {r['limit_bytes'] // MiB} MiB limit | "
                f"{_s(r['working_set_95_after_start_s'], '.1f')} s | "
                f"{r['unreclaimable_max_ratio']:.1%} | {fired} |\n"
            )
    return out + f"\nAgent CPU over the {res['duration_s']:.0f} s run: {cpu}."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/nodeguard-reaction"))
    parser.add_argument("--json", type=Path, help="write the full result here")
    parser.add_argument("--tables-from", type=Path, help="print the tables of a saved result")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: three hogs in two groups and one page-cache reader, no slow hogs",
    )
    args = parser.parse_args(argv)
    if args.tables_from:
        print(tables(json.loads(args.tables_from.read_text())))
        return 0
    if args.quick:
        res = run(
            args.workdir,
            groups=[(8, 512), (32, 1024)],
            per_group=3,
            slow_each=0,
            readers=[(32, 500, 512)],
        )
    else:
        res = run(args.workdir)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    print(tables(res))
    return 1 if "error" in res else 0


if __name__ == "__main__":
    sys.exit(main())
