"""Focus sampling and the kernel's notifications (issue 15), on the real kernel where it counts.

- A focused sample re-reads only the hot cgroups; the rest is carried (the same objects), and
  neither the growth history nor the rule engine's state takes carried values for new ones.
- A cgroup v1 memory threshold and a PSI trigger each make the real agent fire long before its
  (here 60 s) interval would.
- Without the privilege to register them (the DaemonSet's read-only /sys and /proc), the agent
  says so once, reports ``nodeguard_collector_available{collector="notify_..."} 0`` and focuses
  on a container near its limit all the same.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nodeguard.paths import HostPaths
from nodeguard.rules.engine import RuleEngine
from nodeguard.rules.schema import Rule
from nodeguard.sampling.sampler import Sampler, SamplerConfig, hot_keys
from nodeguard.snapshot import CgroupMemory, ContainerMemory, NodeSnapshot, PodMemory
from tests.support.agent import get, running_agent, wait_until
from tests.support.hosts import cgroup_memory
from tests.support.kernel_cgroup import (
    PrivateKubepods,
    kubelet_cgroup,
    memory_stall,
    private_kubepods,
    process_in,
    writable_memory_controller,
)

MiB = 1 << 20

# Allocates the number of MiB read from stdin, touching every page, once per line; holds it.
HOLD = (
    "import sys\n"
    "held = []\n"
    "for line in sys.stdin:\n"
    "    b = bytearray(int(line) << 20)\n"
    "    b[::4096] = b'x' * len(b[::4096])\n"
    "    held.append(b)\n"
    "    print('ok', flush=True)\n"
)


@pytest.fixture
def v1() -> None:
    found = writable_memory_controller()
    if found is None:
        pytest.skip("needs root and a writable cgroup memory controller (CI has both)")
    if found[0] != 1:
        pytest.skip("cgroup v1 thresholds: this host has cgroup v2")


@pytest.fixture
def pods(v1: None, tmp_path: Path) -> Iterator[PrivateKubepods]:
    """A kubepods of this test's own: the sampler or the agent reads these cgroups alone."""
    with private_kubepods(tmp_path) as made:
        yield made


@contextlib.contextmanager
def holder(cg: Any) -> Iterator[subprocess.Popen[str]]:
    """A process in ``cg`` that allocates what it is told (:func:`grow`)."""
    with process_in(cg, [sys.executable, "-c", "input()\n" + HOLD]) as proc:
        yield proc


def grow(proc: subprocess.Popen[str], mib: int) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(f"{mib}\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "ok"


def _key(cg: Any) -> str:
    return f"{cg.pod_uid}/{cg.container_id}"


def _container(snapshot: NodeSnapshot, cid: str) -> Any:
    return next(c for _, c in snapshot.containers() if c.container_id == cid)


# -- the sampler and the engine --------------------------------------------------------------
def test_a_focused_sample_rereads_only_the_hot_cgroups(pods: PrivateKubepods) -> None:
    config = SamplerConfig(paths=HostPaths(sysfs=pods.sysfs), node_name="n", focus_interval=0.25)
    sampler = Sampler(config=config)
    try:
        with (
            kubelet_cgroup(pods, limit_bytes=64 * MiB) as hot,
            kubelet_cgroup(pods, limit_bytes=64 * MiB) as cold,
            holder(hot) as hot_proc,
            holder(cold) as cold_proc,
        ):
            grow(hot_proc, 56)  # 56 of 64 MiB and the interpreter: above 80 % of the limit
            grow(cold_proc, 8)
            full = sampler.sample_once()
            keys = hot_keys(full, share=0.8)
            assert _key(hot) in keys and hot.pod_uid in keys
            assert _key(cold) not in keys and cold.pod_uid not in keys
            grow(hot_proc, 4)
            grow(cold_proc, 4)
            focused = sampler.sample_focused(keys)
            assert focused.focused == tuple(sorted({_key(hot), hot.pod_uid}))
            # The hot one is read again; the cold one is carried: the same object, 4 MiB stale.
            before = _container(full, hot.container_id)
            after = _container(focused, hot.container_id)
            assert after.memory.usage_bytes >= before.memory.usage_bytes + 4 * MiB
            assert _container(focused, cold.container_id) is _container(full, cold.container_id)
            assert focused.meminfo is not full.meminfo  # the node is always read again
            assert focused.timestamp > full.timestamp
            assert sampler.samples == {"full": 1, "focused": 1}
            # The next full read finds the hot container as the focused one left it.
            again = sampler.sample_once()
            assert _container(again, hot.container_id).memory == after.memory
            assert _container(again, cold.container_id).memory.usage_bytes > (
                _container(full, cold.container_id).memory.usage_bytes
            )
    finally:
        sampler.close()


def _snapshot(t: float, ws: dict[str, int], *, focused: tuple[str, ...] | None) -> NodeSnapshot:
    """Pods ``uid`` with one container ``c`` each, whose working set is ``ws[uid]`` of 100."""

    def mem(uid: str, v: int) -> CgroupMemory:
        return dataclasses.replace(cgroup_memory(f"/{uid}", used=v), effective_limit_bytes=100)

    pods = tuple(
        PodMemory(
            uid=uid,
            qos_class="burstable",
            memory=mem(uid, v),
            containers=(ContainerMemory(container_id="c", runtime="", memory=mem(uid, v)),),
        )
        for uid, v in ws.items()
    )
    return NodeSnapshot(
        timestamp=t,
        node_name="n",
        meminfo=None,
        pressure=None,
        pods=pods,
        oom=None,
        processes=(),
        collectors=(),
        focused=focused,
    )


def test_carried_values_are_not_new_points_and_carried_targets_keep_their_state() -> None:
    rule = Rule.model_validate(
        {
            "name": "near",
            "scope": "container",
            "when": [{"signal": "container_working_set_limit_ratio", "op": ">=", "value": 0.9}],
            "for": "10s",
            "actions": [{"action": "record"}],
        }
    )
    engine = RuleEngine(rules=[rule])
    # Both at 95 from t=0: their `for` windows start.
    first = _snapshot(0, {"a": 95, "b": 95}, focused=None)
    assert engine.evaluate(first, global_dry_run=True) == []
    # Focused samples of a only, every 0.25 s; b is carried at 95 and must not be taken for
    # flat: its history has the one point it was really read at.
    t = 0.0
    fired: list[str] = []
    while t < 12:
        t += 0.25
        snap = _snapshot(t, {"a": 95, "b": 95}, focused=("a", "a/c"))
        fired += [f.target for f in engine.evaluate(snap, global_dry_run=True)]
    assert fired == ["a/c"]  # a held 10 s on focused samples; b's state was kept, not judged
    assert engine.history.working_set("b/c") == [(0, 95)]
    assert len(engine.history.working_set("a/c")) > 20
    # b's window, started at 0, still runs: the next full sample fires it.
    full = _snapshot(12.5, {"a": 95, "b": 95}, focused=None)
    assert [f.target for f in engine.evaluate(full, global_dry_run=True)] == ["b/c"]


# -- the real agent --------------------------------------------------------------------------
def _rules(path: Path, when: dict[str, Any], scope: str) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "nodeguard.io/v1alpha1",
                "kind": "RuleSet",
                "spec": {
                    "rules": [
                        {
                            "name": "probe",
                            "scope": scope,
                            "when": [when],
                            "cooldown": "10m",
                            "actions": [{"action": "record"}],
                        }
                    ]
                },
            }
        )
    )
    return path


def _firings(state: Path) -> list[dict[str, Any]]:
    out = []
    for f in sorted((state / "incidents").glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            rec = json.loads(f.read_text())
            if rec.get("kind") == "firing":
                out.append(rec)
    return out


def _firing(state: Path, target: str) -> dict[str, Any] | None:
    return next((rec for rec in _firings(state) if rec["target"] == target), None)


def _metric(base: str, name: str, **labels: str) -> float | None:
    text = get(f"{base}/metrics")[1]
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    series = f"{name}{{{want}}}" if want else name
    m = re.search(rf"^{re.escape(series)} (\S+)$", text, re.M)
    return None if m is None else float(m.group(1))


def test_a_v1_threshold_fires_the_agent_long_before_the_interval(
    pods: PrivateKubepods, tmp_path: Path
) -> None:
    rules = _rules(
        tmp_path / "rules.json",
        {"signal": "container_working_set_limit_ratio", "op": ">=", "value": 0.5},
        "container",
    )
    state = tmp_path / "state"
    with kubelet_cgroup(pods, limit_bytes=256 * MiB) as cg, holder(cg) as proc:
        args = [
            f"--path.sysfs={pods.sysfs}",
            "--interval=60s",
            f"--rules={rules}",
            f"--path.state={state}",
            "--no-collector.processes",
            # No PSI trigger: on a busy machine the node's own stalls would ask for full
            # samples, and the count below is of the threshold's doing alone.
            "--no-notify.psi",
        ]
        with running_agent(args=args, log_path=tmp_path / "agent.log") as base:
            # The first full sample set thresholds on the container (the pod has no limit of
            # its own) at 50 % (the rule) and 80 % (focus): the only cgroup it reads.
            log = (tmp_path / "agent.log").read_text
            registered = wait_until(
                "the thresholds registered",
                lambda: _metric(base, "nodeguard_notify_registered", kind="threshold"),
                timeout=30,
                detail=log,
            )
            assert registered == 2.0
            # The status says so too, long before the next full sample.
            available = _metric(base, "nodeguard_collector_available", collector="notify_threshold")
            assert available == 1.0
            time.sleep(1)
            assert _firings(state) == []
            grow(proc, 160)  # from a few MiB to 62 % of the limit at once
            wait_until("the firing", lambda: _firing(state, _key(cg)), timeout=30, detail=log)
            # Counted, not timed: still the one full sample of the start, so the firing came
            # from a sample the threshold woke, not from the 60 s interval's next one.
            assert (_metric(base, "nodeguard_notify_wakeups_total", kind="threshold") or 0) >= 1
            assert _metric(base, "nodeguard_sampler_samples_total", kind="full") == 1.0


def test_a_psi_trigger_fires_the_agent_long_before_the_interval(v1: None, tmp_path: Path) -> None:
    # Pressure left by an earlier test only decays: the rule asks for 3 points more than now.
    line = Path("/proc/pressure/memory").read_text().splitlines()[0]
    before = float(re.search(r"avg10=(\S+)", line).group(1)) / 100  # type: ignore[union-attr]
    level = round(before + 0.03, 4)
    rules = _rules(
        tmp_path / "rules.json",
        {"signal": "node_psi_some_avg10", "op": ">", "value": level},
        "node",
    )
    state = tmp_path / "state"
    args = [
        "--interval=60s",
        f"--rules={rules}",
        f"--path.state={state}",
        "--node-name=psi-node",
        "--no-collector.processes",
    ]
    with running_agent(args=args, log_path=tmp_path / "agent.log") as base:
        time.sleep(1)
        if _firings(state):
            pytest.fail("the node was under memory pressure before the test made any")
        with memory_stall(workdir=tmp_path, seconds=30):
            # Not 60 s: the start's sample did not fire and the interval's next is 60 s away,
            # past this wait's guard, so only a sample the trigger woke can have fired.
            rec = wait_until(
                "the firing",
                lambda: _firing(state, "psi-node"),
                timeout=25,
                detail=(tmp_path / "agent.log").read_text,
            )
            assert (_metric(base, "nodeguard_notify_wakeups_total", kind="psi") or 0) >= 1
            assert rec["values"]["node_psi_some_avg10"] > level


@contextlib.contextmanager
def read_only(source: str, target: Path) -> Iterator[Path]:
    """``source`` bound read-only at ``target``, as the DaemonSet mounts /proc and /sys."""
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "--bind", source, str(target)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(target)], check=True)
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


def test_without_the_privilege_it_says_so_once_and_focuses_all_the_same(
    pods: PrivateKubepods, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    with (
        read_only("/proc", tmp_path / "proc") as procfs,
        read_only(str(pods.root), tmp_path / "ro/sys/fs/cgroup/memory"),
        kubelet_cgroup(pods, limit_bytes=64 * MiB) as cg,
        holder(cg) as proc,
    ):
        args = [
            "--interval=1s",
            f"--path.procfs={procfs}",
            f"--path.sysfs={tmp_path / 'ro/sys'}",
            f"--path.state={state}",
            "--no-collector.processes",
            "--no-collector.kmsg",
        ]
        log_path = tmp_path / "agent.log"
        with running_agent(args=args, log_path=log_path) as base:
            grow(proc, 56)  # above 80 % of the limit: focused, by sampling alone
            wait_until(
                "8 focused samples",
                lambda: (
                    (_metric(base, "nodeguard_sampler_samples_total", kind="focused") or 0) >= 8
                ),
                timeout=60,
                step=0.2,
                detail=log_path.read_text,
            )
            assert _metric(base, "nodeguard_focus_targets") == 2.0  # the pod and the container
            for kind in ("threshold", "psi"):
                available = _metric(
                    base, "nodeguard_collector_available", collector=f"notify_{kind}"
                )
                assert available == 0.0
            time.sleep(2.5)  # more full samples: each tries again, none says so again
            text = log_path.read_text()
        said = [
            len(re.findall(r"memory thresholds not available \(.*Read-only file system", text)),
            len(re.findall(r"PSI trigger on \S+ not available \(.*Read-only file system", text)),
        ]
        assert said == [1, 1], text
