"""nodeguard's benchmarks, beside node_exporter in the same run; prints the tables.

    .venv/bin/python benchmarks/run.py              # everything, about 11 minutes (root)
    .venv/bin/python benchmarks/run.py --quick      # a smoke run: small N, short soak, no kernel

What runs, all at once where that keeps the total under 15 minutes (see docs/benchmarks.md):

1. synthetic host trees at N = 100, 330 and 1,000 containers (benchmarks/hosts.py);
2. in the background, the footprint run (benchmarks/soak.py: 10 minutes at N = 330, an HA
   pair scraping);
3. in the foreground, per N: the in-process snapshot and render (benchmarks/inprocess.py), then
   ``/metrics`` of real agents beside node_exporter on the synthetic tree (benchmarks/scale.py),
   then CPU per sample of real agents; then ``/metrics`` beside cAdvisor and node_exporter on N
   real cgroups with memory moving, and the value check of nodeguard against cAdvisor
   (benchmarks/peers.py).

The reaction on the real kernel (seconds before an OOM kill) is a run of its own on a quiet
machine: ``python -m benchmarks.reaction`` (benchmarks/reaction.py).

Another program's load on the machine moves every figure, so nodeguard is always set beside
node_exporter and cAdvisor measured in the same loop, and each figure is a median (with the
p90) of repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich import box
from rich.console import Console
from rich.table import Table

from benchmarks import peers, scale
from benchmarks.agreement import FIELDS
from benchmarks.cadvisor_peer import CADVISOR_VERSION, ensure_built
from benchmarks.common import (
    SRC,
    MiB,
    node_exporter,
    node_exporter_binary,
    node_exporter_version,
    nodeguard_version,
    ratio,
)
from benchmarks.hosts import make_host
from benchmarks.soak import Soak


def machine() -> dict[str, str]:
    mem = next(
        int(line.split()[1]) * 1024
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal:")
    )
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return {
        "cpus": f"{os.cpu_count()} x {cpu}",
        "memory": f"{mem / (1 << 30):.1f} GiB",
        "kernel": platform.release(),
        "os": "Debian " + Path("/etc/debian_version").read_text().strip()
        if Path("/etc/debian_version").exists()
        else platform.platform(),
        "python": platform.python_version(),
        "nodeguard": nodeguard_version(),
        "peer": node_exporter_version(),
        "per-container peer": f"cAdvisor {CADVISOR_VERSION} (github.com/google/cadvisor/lib), "
        f"{cadvisor_go_version()}",
        "load at start": " ".join(Path("/proc/loadavg").read_text().split()[:3]),
    }


def cadvisor_go_version() -> str:
    """The Go toolchain the cAdvisor peer was built with (``go version`` of the binary)."""
    from tests.support.controlplane.cluster import find_go

    out = subprocess.run(
        [find_go(), "version", str(ensure_built())], capture_output=True, text=True, check=False
    )
    return out.stdout.strip().split(": ", 1)[-1] or "unknown"


def _ms(pair: list[float]) -> str:
    return f"{pair[0]:.1f} ({pair[1]:.1f})"


def _mib(n: float) -> str:
    return f"{n / MiB:.1f}"


def _ok(value: float, target: float) -> str:
    return "[green]yes[/]" if value <= target else "[red]no[/]"


class Report:
    def __init__(self, *, markdown: bool) -> None:
        self.console = Console(width=160 if not markdown else 400, highlight=False)
        self.box = box.MARKDOWN if markdown else box.SIMPLE_HEAVY

    def table(self, title: str, columns: list[str]) -> Table:
        if self.box is box.MARKDOWN:
            title = f"**{title}**"
        t = Table(title=title, box=self.box, title_justify="left", title_style="bold")
        for c in columns:
            t.add_column(c, justify="left" if c in columns[:1] else "right")
        return t

    def print(self, *things: Any) -> None:
        for t in things:
            self.console.print(t)
            self.console.print()


def print_tables(rep: Report, res: dict[str, Any]) -> None:
    t = rep.table("Machine", ["", ""])
    for k, v in res["machine"].items():
        t.add_row(k, v)
    rep.print(t)

    identical = {n: r.get("identical") for n, r in res["inprocess"].items()}
    rep.print(
        "The fast writer's bytes are prometheus_client's (OpenMetrics and text, every N): "
        + ("yes" if all(identical.values()) else f"NO {identical}")
    )
    if "before" in res:
        rep.print(before_table(rep, res))
    inproc = res["inprocess"]
    t = rep.table(
        "1. One snapshot and one render, in process (ms: median (p90) of "
        f"{res['repeats']} repeats)",
        [
            "N containers",
            "pods",
            "snapshot wall",
            "snapshot CPU, memory moving",
            "snapshot CPU, files unchanged",
            "of which cgroups",
            "processes",
            "render CPU, OpenMetrics",
            "+ gzip",
            "text",
            "same snapshot again (gzip)",
            "prometheus_client's writer",
            "body KiB (OpenMetrics)",
            "series",
        ],
    )
    for n, r in inproc.items():
        t.add_row(
            str(n),
            str(r["pods"]),
            _ms(r["snapshot_wall_ms"]),
            _ms(r["snapshot_cpu_ms"]),
            _ms(r["snapshot_static_cpu_ms"]) if "snapshot_static_cpu_ms" in r else "-",
            f"{r['collectors_ms']['cgroups']:.1f}",
            f"{r['collectors_ms']['processes']:.1f}",
            _ms(r["render_om_cpu_ms"]),
            _ms(r["render_om_gzip_cpu_ms"]),
            _ms(r["render_text_cpu_ms"]),
            _ms(r["render_again_cpu_ms"]) if "render_again_cpu_ms" in r else "-",
            _ms(r["render_plain_om_cpu_ms"]) if "render_plain_om_cpu_ms" in r else "-",
            f"{r['body_om_bytes'] / 1024:.0f}",
            str(r["series"]),
        )
    rep.print(t)

    kern = res.get("kernel_snapshot") or {}
    if "kernel_snapshot_error" in res:
        rep.print(f"1b. real cgroupfs not measured: {res['kernel_snapshot_error']}")
    if kern:
        t = rep.table(
            "1b. One snapshot of real cgroups on this machine's cgroupfs (real /proc and "
            "/dev/kmsg; idle cgroups, and the agent's way with memory moving in every cgroup "
            f"between samples; ms of CPU: median (p90) of {res['repeats']} repeats)",
            [
                "N containers",
                "files held open (the agent's way)",
                "memory moving",
                "of which cgroups",
                "each file opened, read, closed",
                "of which cgroups",
                "x faster",
                "descriptors held",
            ],
        )
        for n, r in kern.items():
            t.add_row(
                str(n),
                _ms(r["held_cpu_ms"]),
                _ms(r["held_moving_cpu_ms"]) if "held_moving_cpu_ms" in r else "-",
                f"{r['held_cgroups_ms']:.1f}",
                _ms(r["plain_cpu_ms"]),
                f"{r['plain_cgroups_ms']:.1f}",
                f"{ratio(r['plain_cpu_ms'][0], r['held_cpu_ms'][0]):.1f}",
                str(r["open_files"]),
            )
        rep.print(t)

    kf = res.get("kernel_files") or {}
    if "per_file" in kf:
        t = rep.table(
            f"1c. One cgroup file on this machine's cgroupfs (v{kf['cgroup_version']}), in a "
            f"loop of {kf['loops']} (us)",
            ["file", "open, read, close", "pread of the held file", "x"],
        )
        for name, r in kf["per_file"].items():
            t.add_row(
                name,
                f"{r['open_read_close_us']:.1f}",
                f"{r['pread_us']:.1f}",
                f"{ratio(r['open_read_close_us'], r['pread_us']):.1f}",
            )
        rep.print(t)
        rep.print(
            f"Kernel memory of {kf['held_files']} held files, charged to the holder's memory "
            f"cgroup: {kf['held_bytes'] / MiB:.1f} MiB ({kf['held_bytes_per_file'] / 1024:.1f} "
            f"KiB a file); {kf['after_close_bytes'] / MiB:.1f} MiB left after closing them."
        )
    elif kf:
        rep.print(f"1c. cgroup file costs not measured: {kf.get('error')}")

    rep.print(scrapes_table(rep, res))
    for thing in peers_tables(rep, res):
        rep.print(thing)

    spc = res["sample_cpu"]
    t = rep.table(
        f"3. CPU per sample of real agents (5 s interval, default rules, no scrapes, "
        f"{res['sample_cpu_seconds']:.0f} s)",
        ["N", "samples", "CPU ms per sample", "share of one core at 5 s", "RSS MiB"],
    )
    for n, r in spc.items():
        t.add_row(
            str(n),
            str(r["samples"]),
            f"{r['cpu_ms_per_sample']:.1f}",
            f"{r['cpu_ms_per_sample'] / 5000 * 100:.2f} %",
            _mib(r["rss"]),
        )
    rep.print(t)

    soak = res["soak"]
    if "error" in soak:
        rep.print(f"4. footprint run failed: {soak['error']}")
    else:
        rows = soak["rows"]
        who = [k for k in ("ng", "bf", "ne") if f"{k}_rss" in rows[0]]
        names = {"ng": "nodeguard", "bf": "before", "ne": "node_exporter"}
        t = rep.table(
            f"4. Footprint over {soak['seconds'] / 60:.0f} minutes at N=330 (5 s interval, default "
            f"rules, an HA pair scraping every 15 s, {soak['pods_replaced']} pods replaced)",
            [
                "t (s)",
                "samples",
                *(f"{names[k]} RSS MiB" for k in who),
                *(f"{names[k]} CPU s" for k in who),
            ],
        )
        for r in rows:
            t.add_row(
                f"{r['t']:.0f}",
                str(r["samples"]),
                *(_mib(r[f"{k}_rss"]) for k in who),
                *(f"{r[f'{k}_cpu']:.1f}" for k in who),
            )
        rep.print(t)
        rep.print(soak_summary(soak))

    rep.print(targets_table(rep, res))


def _scrape(r: dict[str, Any], key: str = "") -> tuple[str, str]:
    """Latency and CPU of a target's first (or, ``key="second_"``, second) scrapes."""
    return _ms(r[f"{key}ms"]), _ms(r[f"{key}cpu_ms"])


def scrapes_table(rep: Report, res: dict[str, Any]) -> Any:
    t = rep.table(
        f"2. GET /metrics of real processes on the synthetic tree (memory moving every second, "
        f"agents sampling every second), {res['scrape_rounds']} rounds in one loop (ms: median "
        "(p90); Prometheus's Accept and gzip; CPU: the process's over each scrape)",
        [
            "N",
            "nodeguard latency",
            "CPU",
            "HA pair's second: latency",
            "CPU",
            "node_exporter latency",
            "CPU",
            "CPU ratio",
            "before: latency",
            "CPU",
            "nodeguard gzip / body KiB",
            "RSS MiB ng / ne",
        ],
    )
    for n, r in res["scrapes"].items():
        ng, ne, bf = r["nodeguard"], r["node_exporter"], r.get("before")
        t.add_row(
            str(n),
            *_scrape(ng),
            *_scrape(ng, "second_"),
            *_scrape(ne),
            f"{ratio(ng['cpu_ms'][0], ne['cpu_ms'][0]):.2f}",
            *(_scrape(bf) if bf else ("-", "-")),
            f"{ng['wire'] / 1024:.0f} / {ng['body'] / 1024:.0f}",
            f"{_mib(ng['rss'])} / {_mib(ne['rss'])}",
        )
    return t


def peers_tables(rep: Report, res: dict[str, Any]) -> list[Any]:
    found = res.get("peers") or {}
    if not found:
        return []
    errors = [
        f"2b. beside both peers not measured: {r['error']}" for r in found.values() if "error" in r
    ]
    if errors:
        return errors[:1]
    t = rep.table(
        f"2b. Beside both peers: N real cgroups (kubelet's cgroupfs layout), memory moving in "
        f"every one every second; {res['scrape_rounds']} rounds in one loop (ms: median (p90); "
        "Prometheus's Accept and gzip; CPU: the process's over each scrape)",
        [
            "N",
            "nodeguard latency",
            "CPU",
            "HA second: CPU",
            "minimal set: latency",
            "CPU",
            "cAdvisor latency",
            "CPU",
            "node_exporter latency",
            "CPU",
            "CPU: ng / ne",
            "ng / cAdvisor",
            "before: CPU",
            "gzip / body KiB: ng, minimal, cAdvisor, ne",
            "RSS MiB: ng, cAdvisor, ne",
        ],
    )
    for n, r in found.items():
        ng, mini, ca, ne = (
            r["nodeguard"],
            r["nodeguard minimal"],
            r["cadvisor"],
            r["node_exporter"],
        )
        bf = r.get("before")
        t.add_row(
            str(n),
            *_scrape(ng),
            _ms(ng["second_cpu_ms"]),
            *_scrape(mini),
            *_scrape(ca),
            *_scrape(ne),
            f"{ratio(ng['cpu_ms'][0], ne['cpu_ms'][0]):.2f}",
            f"{ratio(ng['cpu_ms'][0], ca['cpu_ms'][0]):.2f}",
            _ms(bf["cpu_ms"]) if bf else "-",
            ", ".join(
                f"{x['wire'] / 1024:.0f} / {x['body'] / 1024:.0f}" for x in (ng, mini, ca, ne)
            ),
            ", ".join(_mib(x["rss"]) for x in (ng, ca, ne)),
        )
    check = rep.table(
        "2c. Value check, nodeguard against cAdvisor, every live container once memory stood "
        "still (containers agreeing / containers)",
        ["N", "containers", *(what for what, *_ in FIELDS)],
    )
    for n, r in found.items():
        a = r["agreement"]
        check.add_row(
            str(n),
            str(a["containers"]),
            *(f"{a['agree'].get(w, 0)} / {a['total'].get(w, 0)}" for w, *_ in FIELDS),
        )
    return [t, check]


def before_table(rep: Report, res: dict[str, Any]) -> Any:
    b = res["before"]
    t = rep.table(
        "0. The code before the changes and after, measured in the same run (medians, ms: CPU; "
        "render with gzip, of a new snapshot each time; scrapes from tables 2 and 2b's loops)",
        [
            "N",
            "snapshot before",
            "after",
            "render before",
            "after",
            "x faster",
            "scrape, synthetic: before",
            "after",
            "x faster",
            "scrape, real cgroups: before",
            "after",
            "x faster",
        ],
    )
    for n, now in res["inprocess"].items():
        was = b["inprocess"][n]
        sw, sn = res["scrapes"][n]["before"], res["scrapes"][n]["nodeguard"]
        kernel = (res.get("peers") or {}).get(n) or {}
        kb, kn = kernel.get("before"), kernel.get("nodeguard")
        t.add_row(
            str(n),
            f"{was['snapshot_cpu_ms'][0]:.1f}",
            f"{now['snapshot_cpu_ms'][0]:.1f}",
            f"{was['render_om_gzip_cpu_ms'][0]:.1f}",
            f"{now['render_om_gzip_cpu_ms'][0]:.1f}",
            f"{ratio(was['render_om_gzip_cpu_ms'][0], now['render_om_gzip_cpu_ms'][0]):.1f}",
            f"{sw['cpu_ms'][0]:.1f}",
            f"{sn['cpu_ms'][0]:.1f}",
            f"{ratio(sw['cpu_ms'][0], sn['cpu_ms'][0]):.1f}",
            f"{kb['cpu_ms'][0]:.1f}" if kb else "-",
            f"{kn['cpu_ms'][0]:.1f}" if kn else "-",
            f"{ratio(kb['cpu_ms'][0], kn['cpu_ms'][0]):.1f}" if kb and kn else "-",
        )
    return t


def soak_summary(soak: dict[str, Any]) -> str:
    rows = soak["rows"]
    first, last = rows[1] if len(rows) > 1 else rows[0], rows[-1]
    half = next((r for r in rows if r["t"] >= rows[-1]["t"] / 2), first)
    span = last["t"] - rows[0]["t"] or 1.0
    names = {"ng": "nodeguard", "bf": "the code before", "ne": "node_exporter"}
    parts = []
    for k, name in names.items():
        if f"{k}_rss" not in last:
            continue
        parts.append(
            f"{name} {_mib(last[f'{k}_rss'])} MiB at the end "
            f"({(last[f'{k}_rss'] - first[f'{k}_rss']) / MiB:+.1f} MiB since "
            f"t={first['t']:.0f} s, {(last[f'{k}_rss'] - half[f'{k}_rss']) / MiB:+.1f} MiB over "
            f"the second half), {last[f'{k}_cpu'] / span * 100:.2f} % of a core"
        )
    return "RSS and CPU over the run: " + "; ".join(parts) + "."


def targets_table(rep: Report, res: dict[str, Any]) -> Any:
    t = rep.table(
        "6. Targets (issue 16), at 330 containers with memory moving", ["target", "measured", "met"]
    )
    r330 = res["inprocess"].get(330) or next(iter(res["inprocess"].values()))
    k = (res.get("peers") or {}).get(330) or {}
    s330 = res["scrapes"].get(330) or next(iter(res["scrapes"].values()))
    for where, loop in (("real cgroups", k), ("synthetic tree", s330)):
        if "nodeguard" not in loop:
            continue
        ng, ne = loop["nodeguard"], loop["node_exporter"]
        for what, key in (("CPU", "cpu_ms"), ("latency", "ms")):
            t.add_row(
                f"/metrics scrape {what} <= node_exporter's ({where})",
                f"{ng[key][0]:.1f} against {ne[key][0]:.1f} ms",
                _ok(ng[key][0], ne[key][0]),
            )
    cpu = r330["snapshot_cpu_ms"][0]
    t.add_row("one snapshot <= 20 ms of CPU (synthetic tree)", f"{cpu:.1f} ms", _ok(cpu, 20))
    k330 = (res.get("kernel_snapshot") or {}).get(330)
    if k330:
        for what, key in (("memory moving", "held_moving_cpu_ms"), ("idle", "held_cpu_ms")):
            kcpu = k330[key][0]
            t.add_row(
                f"one snapshot <= 20 ms of CPU (real cgroupfs, {what})",
                f"{kcpu:.1f} ms",
                _ok(kcpu, 20),
            )
    big = res["inprocess"].get(1000)
    if big:
        for what, a, b in (
            ("snapshot CPU", big["snapshot_cpu_ms"][0], r330["snapshot_cpu_ms"][0]),
            (
                "render CPU (gzip)",
                big["render_om_gzip_cpu_ms"][0],
                r330["render_om_gzip_cpu_ms"][0],
            ),
        ):
            t.add_row(
                f"1,000 containers <= 3.3x 330: {what}",
                f"{ratio(a, b):.2f}x",
                _ok(ratio(a, b), 3.3),
            )
        k1000 = (res.get("peers") or {}).get(1000) or {}
        if "nodeguard" in k1000 and "nodeguard" in k:
            a, b = k1000["nodeguard"]["cpu_ms"][0], k["nodeguard"]["cpu_ms"][0]
            t.add_row(
                "1,000 containers <= 3.3x 330: scrape CPU (real cgroups)",
                f"{ratio(a, b):.2f}x",
                _ok(ratio(a, b), 3.3),
            )
    soak = res["soak"]
    if "rows" in soak and "bf_rss" in soak["rows"][-1]:
        last = soak["rows"][-1]
        t.add_row(
            "RSS no higher than the code before (10-minute footprint run, same run)",
            f"{_mib(last['ng_rss'])} against {_mib(last['bf_rss'])} MiB",
            _ok(last["ng_rss"], last["bf_rss"]),
        )
    if "rows" in soak:
        rows = soak["rows"]
        last, half = rows[-1], next(r for r in rows if r["t"] >= rows[-1]["t"] / 2)
        growth = (last["ng_rss"] - half["ng_rss"]) / MiB
        t.add_row(
            "no RSS growth (second half of the run, < 1 MiB)",
            f"{growth:+.1f} MiB",
            _ok(growth, 1.0),
        )
    if "nodeguard" in k:
        first, second = k["nodeguard"]["cpu_ms"][0], k["nodeguard"]["second_cpu_ms"][0]
        t.add_row(
            "an HA pair's second scrape of a snapshot served from the kept body",
            f"{second:.1f} against {first:.1f} ms of CPU",
            _ok(second, first / 2),
        )
        agreement = k["agreement"]
        agree, total = sum(agreement["agree"].values()), sum(agreement["total"].values())
        t.add_row(
            "nodeguard and cAdvisor agree (every field of every live container)",
            f"{agree} / {total}",
            _ok(total - agree, 0),
        )
    return t


def _by_size(res: dict[str, Any]) -> dict[str, Any]:
    """A run's figures as JSON gives them back, with the tables keyed by N as ints again."""
    for key in ("inprocess", "kernel_snapshot", "scrapes", "peers", "sample_cpu"):
        if isinstance(res.get(key), dict):
            res[key] = {int(n): v for n, v in res[key].items()}
    if "before" in res:
        res["before"]["inprocess"] = {int(n): v for n, v in res["before"]["inprocess"].items()}
    return res


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sizes", default="100,330,1000", help="container counts (default 100,330,1000)"
    )
    parser.add_argument("--repeats", type=int, default=30, help="in-process repeats (default 30)")
    parser.add_argument(
        "--rounds", type=int, default=30, help="rounds of scrapes per N and loop (default 30)"
    )
    parser.add_argument(
        "--soak", type=float, default=600.0, help="footprint run seconds (default 600)"
    )
    parser.add_argument("--sample-cpu-seconds", type=float, default=90.0)
    parser.add_argument(
        "--no-kernel",
        action="store_true",
        help="skip the parts on the real kernel (table 1b, the loop beside cAdvisor)",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, short runs, no kernel")
    parser.add_argument("--markdown", action="store_true", help="tables as Markdown")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument(
        "--before",
        type=Path,
        help="a tree holding another nodeguard package (the code before a change): measured "
        "in the same run, in process and over HTTP, beside this one",
    )
    parser.add_argument(
        "--tables-from",
        type=Path,
        metavar="JSON",
        help="print the tables of an earlier run's --json and stop",
    )
    args = parser.parse_args()
    if args.tables_from:
        print_tables(
            Report(markdown=args.markdown), _by_size(json.loads(args.tables_from.read_text()))
        )
        return 0
    if args.quick:
        args.sizes, args.repeats, args.rounds, args.soak = "100,330", 5, 8, 60.0
        args.sample_cpu_seconds, args.no_kernel = 15.0, True
    sizes = [int(s) for s in args.sizes.split(",")]
    started = time.monotonic()
    node_exporter_binary()  # install the peer first, or stop with how to
    if not args.no_kernel:
        print(f"cAdvisor peer: {ensure_built()}", flush=True)  # built once, then cached
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    workdir = Path(tempfile.mkdtemp(prefix="nodeguard-bench-", dir=base))
    os.chdir(workdir)  # `python -m nodeguard` in the agents must not find another tree's package
    print(f"nodeguard from {SRC}; work directory {workdir}", flush=True)
    res: dict[str, Any] = {
        "machine": machine()
        | ({"nodeguard before": nodeguard_version(args.before)} if args.before else {}),
        "repeats": args.repeats,
        "scrape_rounds": args.rounds,
        "sample_cpu_seconds": args.sample_cpu_seconds,
    }
    try:
        res["kernel_snapshot"] = {}
        if not args.no_kernel:
            print(f"[{time.monotonic() - started:4.0f}s] cgroup file costs", flush=True)
            res["kernel_files"] = scale.kernel_files()
        if not args.no_kernel:
            for n in sizes:
                print(f"[{time.monotonic() - started:4.0f}s] real cgroupfs, N={n}", flush=True)
                try:
                    res["kernel_snapshot"][n] = scale.kernel_inprocess(n, repeats=args.repeats)
                except RuntimeError as exc:  # not root, no writable memory controller
                    res["kernel_snapshot_error"] = str(exc).strip().splitlines()[-1]
                    print(f"real cgroupfs skipped: {res['kernel_snapshot_error']}", flush=True)
                    break
        trees = {n: make_host(workdir / f"host-{n}", containers=n) for n in sizes}
        soak_n = 330 if 330 in sizes else sizes[0]
        soak = Soak(
            tree=make_host(workdir / "soak-host", containers=soak_n),
            seconds=args.soak,
            workdir=workdir / "soak",
            before=args.before,
        )
        soak.start()
        res["inprocess"] = {}
        before: dict[str, dict[int, Any]] = {"inprocess": {}}
        for n, tree in trees.items():
            print(f"[{time.monotonic() - started:4.0f}s] in process, N={n}", flush=True)
            res["inprocess"][n] = scale.inprocess(tree, repeats=args.repeats)
            if args.before:
                before["inprocess"][n] = scale.inprocess(
                    tree, repeats=args.repeats, src=args.before
                )
        res["scrapes"], res["peers"] = {}, {}
        with node_exporter(log_path=workdir / "node_exporter.log") as peer:
            for n, tree in trees.items():
                print(
                    f"[{time.monotonic() - started:4.0f}s] /metrics beside node_exporter, N={n}",
                    flush=True,
                )
                res["scrapes"][n] = scale.scrapes(
                    tree,
                    peer=peer,
                    rounds=args.rounds,
                    workdir=workdir / f"scrape-{n}",
                    before=args.before,
                )
        if args.before:
            res["before"] = before
        print(f"[{time.monotonic() - started:4.0f}s] CPU per sample of real agents", flush=True)
        res["sample_cpu"] = scale.sample_cpu(
            list(trees.values()), seconds=args.sample_cpu_seconds, workdir=workdir / "sample-cpu"
        )
        with node_exporter(log_path=workdir / "node_exporter-2.log") as peer:
            for n in [] if args.no_kernel else sizes:
                print(
                    f"[{time.monotonic() - started:4.0f}s] real cgroups beside cAdvisor and "
                    f"node_exporter, N={n}",
                    flush=True,
                )
                res["peers"][n] = peers.beside_peers(
                    n,
                    peer=peer,
                    rounds=args.rounds,
                    workdir=workdir / f"peers-{n}",
                    before=args.before,
                )
        print(
            f"[{time.monotonic() - started:4.0f}s] waiting for the footprint run",
            flush=True,
        )
        soak.join()
        res["soak"] = soak.result
    finally:
        if not args.keep:
            os.chdir("/")
            shutil.rmtree(workdir, ignore_errors=True)
    res["elapsed_s"] = time.monotonic() - started
    if args.json:
        args.json.write_text(json.dumps(res, indent=1, default=str))
    print_tables(Report(markdown=args.markdown), res)
    print(f"total {res['elapsed_s'] / 60:.1f} minutes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
