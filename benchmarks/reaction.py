"""Reaction time on the real kernel: memory hogs in kubelet-shaped cgroups (tests/kernel_cgroup.py)
grow toward their limit; how soon nodeguard acts after the working set crosses 95 % of the limit,
and how much time that leaves before the kernel OOM-kills the hog. Locally (``nodeguard run
--rules rules/default.yaml`` at the default 5 s interval, dry run, no cluster: the evict action
reports ``refused``, the firing and its incident record are what count) and through Prometheus and
Alertmanager (the shipped alert NodeguardContainerNearLimit with its ``for: 2m``, scraped and
evaluated every 15 s as docs/prometheus-scrape.yml does, grouped as docs/alertmanager.yml does:
group_wait 30 s; rules/alertmanager.yaml maps it to the same evict).

Hogs, all with a 512 MiB limit, watched by one agent, one Prometheus and one Alertmanager:

- ``fast-1..3``: tests/kernel_cgroup.py's hog, 1 MiB every 0.125 s (8 MiB/s), started a third of
  an interval apart so that the crossing falls at different points of the sampling grid.
- ``medium``: 8 MiB/s until the cgroup holds 93 % of the limit, then 0.5 MiB/s (256 KiB every
  0.5 s): 51 s from 95 % to the limit, inside the default rule's 60 s horizon.
- ``slow``: the same, then 0.125 MiB/s (64 KiB every 0.5 s), so that the working set stays above
  95 % for 205 s: long enough for the Alertmanager path (which cannot act before 2 minutes of
  ``for`` and 30 s of ``group_wait``) to deliver before the OOM kill, within the runner's 15
  minutes. It crosses 95 % some 80 s into its slow phase, so the rule's 30 s growth fit sees only
  the slow growth.

Times, all wall clock (``time.time()``):

- crossing: the first time the runner, reading the container's ``memory.usage_in_bytes`` and
  ``memory.stat`` ``total_inactive_file`` itself every 50 ms, sees usage - inactive_file >= 95 % of
  the limit (the kernel's view; the same working set nodeguard computes);
- first sample over: the timestamp of the first agent snapshot (``/snapshot``, polled every
  0.5 s: every snapshot of a 5 s interval is seen) whose container ratio is >= 0.95;
- firing: the incident record's ``time`` (the sample that fired; for the Alertmanager path, when
  the webhook delivery arrived); action: the incident file's modification time, written once the
  actions have run (the incident appears in ``GET /incidents`` at that moment);
- OOM: when the runner saw the hog exit with SIGKILL (polled every 50 ms), confirmed by the
  cgroup's ``memory.oom_control`` ``oom_kill`` counter.

Margin = OOM - action: positive means nodeguard acted first.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common import ROOT, agent
from tests.agent import free_port, get
from tests.kernel_cgroup import (
    KubeletCgroup,
    hog_in,
    kubelet_cgroup,
    process_in,
    writable_memory_controller,
)
from tests.promstack import ALERTMANAGER, PROMETHEUS, _process

MiB = 1 << 20
LIMIT = 512 * MiB
THRESHOLD = 0.95
INTERVAL = 5.0
NODE = "bench-node"

# Like tests/kernel_cgroup.py's HOG, in two phases: ``fast_step`` bytes every ``fast_pause`` s until
# the cgroup's usage (read from ``usage_file``) reaches ``switch`` bytes, then ``slow_step`` every
# ``slow_pause`` s; every page touched. Switching on the cgroup's own count (which also holds the
# interpreter's pages and page tables) puts the 95 % crossing at the same point of the slow phase
# in every run.
RAMP_HOG = r"""
import sys, time
fast_step, fast_pause, switch, slow_step, slow_pause = (
    int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
usage_file = sys.argv[6]
sys.stdin.readline()
chunks, slow = [], False
while True:
    if not slow:
        with open(usage_file) as f:
            slow = int(f.read()) >= switch
    step, pause = (slow_step, slow_pause) if slow else (fast_step, fast_pause)
    chunks.append(bytearray(b"\x01" * step))
    time.sleep(pause)
"""


@contextlib.contextmanager
def ramp_hog_in(
    cg: KubeletCgroup, *, switch: int, slow_step: int, slow_pause: float
) -> Iterator[subprocess.Popen[str]]:
    """tests/kernel_cgroup.py's ``hog_in``, with the two-phase hog above."""
    usage = cg.container_dir / ("memory.usage_in_bytes" if cg.version == 1 else "memory.current")
    with process_in(
        cg,
        [
            sys.executable,
            "-c",
            RAMP_HOG,
            str(MiB),
            "0.125",
            str(switch),
            str(slow_step),
            str(slow_pause),
            str(usage),
        ],
    ) as proc:
        yield proc


@dataclass
class Hog:
    name: str
    rate: str
    cg: KubeletCgroup
    proc: subprocess.Popen[str] | None = None
    started: float | None = None
    crossing: float | None = None
    first_sample_over: float | None = None
    local_firing: float | None = None
    local_action: float | None = None
    local_outcome: str | None = None
    am_firing: float | None = None
    am_action: float | None = None
    am_outcome: str | None = None
    oom: float | None = None
    returncode: int | None = None
    oom_kills: int | None = None
    samples_seen: list[tuple[float, float]] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        def rel(t: float | None) -> float | None:
            return None if t is None or self.crossing is None else t - self.crossing

        return {
            "hog": self.name,
            "rate": self.rate,
            "crossing_after_start_s": None
            if self.crossing is None or self.started is None
            else self.crossing - self.started,
            "first_sample_over_s": rel(self.first_sample_over),
            "local_firing_s": rel(self.local_firing),
            "local_action_s": rel(self.local_action),
            "local_outcome": self.local_outcome,
            "am_action_s": rel(self.am_action),
            "am_outcome": self.am_outcome,
            "oom_s": rel(self.oom),
            "local_margin_s": None
            if self.oom is None or self.local_action is None
            else self.oom - self.local_action,
            "am_margin_s": None
            if self.oom is None or self.am_action is None
            else self.oom - self.am_action,
            "returncode": self.returncode,
            "oom_kills": self.oom_kills,
        }


def _flat(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            k, _, v = line.partition(" ")
            with contextlib.suppress(ValueError):
                out[k] = int(v)
    return out


def _working_set(cg: KubeletCgroup) -> int | None:
    try:
        usage = int((cg.container_dir / "memory.usage_in_bytes").read_text())
    except (OSError, ValueError):
        return None
    inactive = _flat(cg.container_dir / "memory.stat").get("total_inactive_file", 0)
    return max(0, usage - inactive)


@contextlib.contextmanager
def _promstack(
    *, workdir: Path, target: str, webhook: str, token: Path
) -> Iterator[tuple[str, str]]:
    """Prometheus and Alertmanager with the shipped settings (docs/prometheus-scrape.yml,
    docs/alertmanager.yml): scrape and evaluate every 15 s, the shipped alert rules unchanged,
    group_wait 30 s; the nodeguard receiver with the agent's bearer token (``token``, a file)."""
    if PROMETHEUS is None or ALERTMANAGER is None:
        raise RuntimeError("Debian's prometheus and prometheus-alertmanager are needed")
    workdir.mkdir(parents=True, exist_ok=True)
    am_cfg = yaml.safe_load((ROOT / "docs/alertmanager.yml").read_text())
    am_cfg["receivers"] = [
        {"name": "default"},
        {
            "name": "nodeguard",
            "webhook_configs": [
                {
                    "url": webhook,
                    "send_resolved": True,
                    "http_config": {
                        "authorization": {"type": "Bearer", "credentials_file": str(token)}
                    },
                }
            ],
        },
    ]
    (workdir / "alertmanager.yml").write_text(yaml.safe_dump(am_cfg))
    am_port = free_port()
    am = f"http://127.0.0.1:{am_port}"
    am_cmd = [
        ALERTMANAGER,
        f"--config.file={workdir / 'alertmanager.yml'}",
        f"--storage.path={workdir / 'am-data'}",
        f"--web.listen-address=127.0.0.1:{am_port}",
        "--cluster.listen-address=",
    ]
    prom_cfg = yaml.safe_load((ROOT / "docs/prometheus-scrape.yml").read_text())
    prom_cfg["scrape_configs"][0]["static_configs"] = [{"targets": [target]}]
    prom_cfg["rule_files"] = [str(ROOT / "rules/prometheus/nodeguard-alerts.yml")]
    prom_cfg["alerting"] = {
        "alertmanagers": [{"static_configs": [{"targets": [am.removeprefix("http://")]}]}]
    }
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(prom_cfg))
    prom_port = free_port()
    prom = f"http://127.0.0.1:{prom_port}"
    prom_cmd = [
        PROMETHEUS,
        f"--config.file={workdir / 'prometheus.yml'}",
        f"--storage.tsdb.path={workdir / 'prom-data'}",
        f"--web.listen-address=127.0.0.1:{prom_port}",
    ]
    with (
        _process(am_cmd, log=workdir / "alertmanager.log", ready=f"{am}/-/ready"),
        _process(prom_cmd, log=workdir / "prometheus.log", ready=f"{prom}/-/ready"),
    ):
        yield prom, am


class Reaction(threading.Thread):
    """Runs the reaction-time measurement in the background; ``result`` when done."""

    def __init__(self, *, workdir: Path) -> None:
        super().__init__(name="reaction", daemon=True)
        self.workdir = workdir
        self.result: dict[str, Any] = {}

    def run(self) -> None:
        try:
            self.result = self._run()
        except Exception as exc:  # reported in the tables, never kills the runner
            self.result = {"error": f"{type(exc).__name__}: {exc}"}

    def _run(self) -> dict[str, Any]:
        if writable_memory_controller() is None:
            return {"error": "needs root and a writable cgroup memory controller"}
        wd = self.workdir
        wd.mkdir(parents=True, exist_ok=True)
        state = wd / "state"
        token = wd / "webhook-token"
        token.write_text(secrets.token_hex(32))  # the webhook is off without one
        args = [
            f"--webhook.token-file={token}",
            f"--interval={INTERVAL:g}s",
            f"--rules={ROOT / 'rules/default.yaml'}",
            f"--rules={ROOT / 'rules/alertmanager.yaml'}",
            f"--path.state={state}",
            f"--node-name={NODE}",
            "--no-collector.gpu",
        ]
        with contextlib.ExitStack() as stack:
            base = stack.enter_context(agent(args=args, log_path=wd / "agent.log"))
            prom, _ = stack.enter_context(
                _promstack(
                    workdir=wd / "promstack",
                    target=base.removeprefix("http://"),
                    webhook=f"{base}/webhook/alertmanager",
                    token=token,
                )
            )
            hogs = [
                Hog(
                    name=f"fast-{i + 1}",
                    rate="8 MiB/s",
                    cg=stack.enter_context(kubelet_cgroup(limit_bytes=LIMIT)),
                )
                for i in range(3)
            ]
            ramps = [("medium", 256 * 1024, "0.5 MiB/s"), ("slow", 64 * 1024, "0.125 MiB/s")]
            t0 = time.time()
            for name, step, rate in ramps:
                hog = Hog(
                    name=name,
                    rate=f"{rate} from 93 %",
                    cg=stack.enter_context(kubelet_cgroup(limit_bytes=LIMIT)),
                )
                hog.proc = stack.enter_context(
                    ramp_hog_in(hog.cg, switch=int(LIMIT * 0.93), slow_step=step, slow_pause=0.5)
                )
                hog.started = time.time()
                hogs.append(hog)
            for i, hog in enumerate(hogs[:3]):
                if i:
                    time.sleep(INTERVAL / 3)  # three phases of the sampling grid
                hog.proc = stack.enter_context(
                    hog_in(hog.cg, step=MiB, pause=0.125, up_to=4 * LIMIT)
                )
                hog.started = time.time()
            self._watch(hogs, base=base, state=state, deadline=t0 + 480)
            alerts = _alerts(prom)
        return {
            # The earliest the Alertmanager path can act after the crossing: the alert's
            # `for: 2m` and Alertmanager's group_wait of 30 s (scrape and evaluation add 0-30 s).
            "am_floor_s": 150.0,
            "interval_s": INTERVAL,
            "limit_bytes": LIMIT,
            "threshold": THRESHOLD,
            "hogs": [h.row() for h in hogs],
            "prometheus_alerts_at_end": alerts,
            "agent_log": (wd / "agent.log").read_text().splitlines()[-60:],
        }

    def _watch(self, hogs: list[Hog], *, base: str, state: Path, deadline: float) -> None:
        next_snapshot = 0.0
        done_at: float | None = None
        while time.time() < deadline:
            now = time.time()
            for h in hogs:
                if h.proc is not None and h.oom is None and h.proc.poll() is not None:
                    h.oom, h.returncode = now, h.proc.returncode
                    h.oom_kills = _flat(h.cg.container_dir / "memory.oom_control").get("oom_kill")
                if h.crossing is None and h.oom is None:
                    ws = _working_set(h.cg)
                    if ws is not None and ws >= THRESHOLD * LIMIT:
                        h.crossing = now
            if now >= next_snapshot:
                next_snapshot = now + 0.5
                self._poll_snapshot(hogs, base)
                self._poll_incidents(hogs, state)
            if all(h.oom is not None for h in hogs):
                # The Alertmanager path can still deliver for a hog that died just now.
                done_at = done_at or now + 15
                if now >= done_at:
                    break
            time.sleep(0.05)
        self._poll_incidents(hogs, state)

    @staticmethod
    def _poll_snapshot(hogs: list[Hog], base: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            status, body = get(f"{base}/snapshot", timeout=5)
            if status != 200:
                return
            snap = json.loads(body)
            by_id = {c["container_id"]: c for p in snap["pods"] for c in p["containers"]}
            for h in hogs:
                c = by_id.get(h.cg.container_id)
                if c is None or h.first_sample_over is not None:
                    continue
                ws, lim = c["memory"]["working_set_bytes"], c["memory"]["effective_limit_bytes"]
                if ws is not None and lim and ws / lim >= THRESHOLD:
                    h.first_sample_over = snap["timestamp"]

    @staticmethod
    def _poll_incidents(hogs: list[Hog], state: Path) -> None:
        for path in sorted((state / "incidents").glob("*.json")):
            try:
                rec = json.loads(path.read_text())
                mtime = path.stat().st_mtime
            except (OSError, ValueError):
                continue
            if rec.get("kind") != "firing":
                continue
            outcome = ",".join(f"{a['action']}:{a['outcome']}" for a in rec.get("actions", []))
            for h in hogs:
                cid = h.cg.container_id
                if rec["rule"] == "container-near-limit" and rec["target"].endswith(cid):
                    if h.local_action is None:
                        h.local_firing, h.local_action, h.local_outcome = (
                            rec["time"],
                            mtime,
                            outcome,
                        )
                elif (
                    rec["rule"] == "am-container-near-limit"
                    and f"container={cid}" in rec["summary"]
                ) and h.am_action is None:
                    h.am_firing, h.am_action, h.am_outcome = rec["time"], mtime, outcome


def _alerts(prom: str) -> list[dict[str, Any]]:
    with contextlib.suppress(OSError, ValueError, KeyError):
        status, body = get(f"{prom}/api/v1/alerts", timeout=5)
        if status == 200:
            return [
                {
                    "alertname": a["labels"].get("alertname"),
                    "container": a["labels"].get("container"),
                    "state": a["state"],
                    "activeAt": a.get("activeAt"),
                }
                for a in json.loads(body)["data"]["alerts"]
            ]
    return []
