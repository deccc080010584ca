"""Beside both peers on the real kernel: N real kubelet-shaped cgroups on this machine's memory
controller (``benchmarks.hosts.kernel_host``), memory moving in every one of them
(``benchmarks.kernel_churn``), and in one loop of scrapes (benchmarks/scrape_loop.py):

- ``nodeguard run`` on the real ``/proc``, ``/sys`` and ``/dev/kmsg`` (default rules, a sample
  every second), its first scrape of each snapshot and an HA pair's second;
- the same with ``--metric-allowlist`` set to :data:`MINIMAL` (what the shipped alerts and
  dashboards read);
- the code before (``--before``), when given;
- cAdvisor as the kubelet embeds it (benchmarks/cadvisor_peer.py), watching ``/kubepods``;
- node_exporter, the peer every node runs.

Then the value check (benchmarks/agreement.py): memory stops moving, and once cAdvisor has
housekept since, every container's values from both, each counted as agreeing or not.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.agreement import compare
from benchmarks.cadvisor_peer import cadvisor
from benchmarks.common import ROOT, Proc, agent
from benchmarks.hosts import kernel_host
from benchmarks.kernel_churn import containers_under, kernel_churn
from benchmarks.scrape_loop import Target, scrape_loop
from tests.support.agent import get
from tests.support.kernel_cgroup import writable_memory_controller

__all__ = ["MINIMAL", "beside_peers"]

#: The minimal set: the families the shipped alert rules (rules/prometheus/) and dashboards
#: (grafana/build.py) read, and the agent's own.
MINIMAL = ",".join(
    (
        "nodeguard_node_.*",
        "nodeguard_collector_.*",
        "nodeguard_container_memory_(working_set|limit)_bytes",
        "nodeguard_container_memory_oom_kills_total",
        "nodeguard_gpu_.*",
        "nodeguard_(actions|incidents|rule|rules|remediation|webhook)_.*",
        "nodeguard_build_info",
        "nodeguard_snapshot_timestamp_seconds",
    )
)
_HOUSEKEEPING = 31.0  # cAdvisor's longest interval between housekeepings (15 s, jitter x2)


def _agent_args(state: Path, *extra: str) -> list[str]:
    return [
        "--path.procfs=/proc",
        "--path.sysfs=/sys",
        "--path.kmsg=/dev/kmsg",
        "--interval=1s",
        f"--path.state={state}",
        f"--rules={ROOT / 'rules/default.yaml'}",
        "--no-collector.gpu",
        *extra,
    ]


def _agreement(
    *, nodeguard: str, cadvisor_base: str, root: Path, cgroups: list[Path], version: int
) -> dict[str, Any]:
    """Each container cgroup in ``cgroups`` from both sides: checks per field, once every
    value agrees or cAdvisor has had time for two housekeepings (each 10-15 s apart, jittered up
    to twice that) since memory stopped."""
    containers = {"/" + str(d.relative_to(root)): (d.parent.name[3:], d.name) for d in cgroups}
    deadline = time.monotonic() + 2 * _HOUSEKEEPING
    while True:
        ng_text = get(f"{nodeguard}/metrics", timeout=30)[1]
        cadvisor_text = get(f"{cadvisor_base}/metrics", timeout=60)[1]
        checks = compare(
            nodeguard=ng_text, cadvisor=cadvisor_text, containers=containers, version=version
        )
        if all(c.agrees for c in checks) or time.monotonic() > deadline:
            break
        time.sleep(2)
    agree, total = Counter[str](), Counter[str]()
    for c in checks:
        total[c.what] += 1
        agree[c.what] += c.agrees
    return {"containers": len(containers), "agree": dict(agree), "total": dict(total)}


def beside_peers(
    n: int, *, peer: Proc, rounds: int, workdir: Path, before: Path | None = None
) -> dict[str, Any]:
    """The loop and the value check at ``n`` real containers; ``{"error": ...}`` where the
    kernel part cannot run (not root, no writable memory controller)."""
    found = writable_memory_controller()
    if found is None:
        return {"error": "needs root and a writable cgroup memory controller"}
    version = found[0]
    workdir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        others = set(containers_under(found[1]))  # another run's (the reaction run's hogs)
        root = stack.enter_context(kernel_host(containers=n))
        ours = [d for d in containers_under(root) if d not in others]
        churn = stack.enter_context(contextlib.ExitStack())
        churn.enter_context(kernel_churn(root, cgroups=ours, period=1.0))
        targets = []
        for name, src, extra in (
            ("nodeguard", None, ()),
            ("nodeguard minimal", None, (f"--metric-allowlist={MINIMAL}",)),
            ("before", before, ()),
        ):
            if name == "before" and src is None:
                continue
            wd = workdir / name.replace(" ", "-")
            ng = stack.enter_context(
                agent(
                    args=_agent_args(wd / "state", *extra), log_path=wd.with_suffix(".log"), src=src
                )
            )
            targets.append(Target(name, ng, ng.pid, pair=True))
        cadv = stack.enter_context(
            cadvisor(cgroup_roots=["/kubepods"], log_path=workdir / "cadvisor.log")
        )
        targets += [Target("cadvisor", cadv, cadv.pid), Target("node_exporter", peer, peer.pid)]
        time.sleep(_HOUSEKEEPING / 2)  # cAdvisor's first housekeepings, samples under way
        result = scrape_loop(targets, rounds=rounds, period=1.25)
        churn.close()  # memory stands still: both sides can now be compared
        result["agreement"] = _agreement(
            nodeguard=targets[0].base, cadvisor_base=cadv, root=root, cgroups=ours, version=version
        )
    return result
