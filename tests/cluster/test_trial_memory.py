"""End to end: Katib trials' real memory, by hyperparameter. Four Trials of one Experiment
(Katib's CRDs on the test kube-apiserver, each Trial as Katib's Experiment controller makes
it), each with a pod on one node whose container is a real memory cgroup (64 MiB limit,
under a private kubepods the agent reads alone) holding a process that allocates: batch_size
16 trials 12 and 16 MiB, batch_size 64 trials 40 MiB and past the limit, which the kernel
OOM-kills.

The agent samples them and is SIGKILLed while the trials run; the processes end, the pods
end (the OOM-killed one Failed), and a new agent on the same state writes each pod's record
to its Trial's ConfigMap through an API server that fails the first writes (503): the peaks
are the first agent's (the processes are gone: nothing is left to sample), and the kernel's
own peak agrees. ``nodeguard trials`` then shows the table, finds that batch_size explains
the memory, and recommends per value."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodeguard.kube.client import KubeClient
from nodeguard.kube.trial_records import TrialRecords, record_name
from tests.support.agent import kill_9, running_agent, wait_until
from tests.support.kernel_cgroup import (
    hog_in,
    pod_container,
    private_kubepods,
    writable_memory_controller,
)
from tests.support.kube_helpers import Cluster, custom_json, given, katib_trial
from tests.support.remediation import metric_value

MiB = 1 << 20
LIMIT = 64 * MiB
#: trial -> (batch_size, bytes its process allocates)
TRIALS = {
    "random-b16-one": ("16", 12 * MiB),
    "random-b16-two": ("16", 16 * MiB),
    "random-b64-one": ("64", 40 * MiB),
    "random-b64-two": ("64", 4 * LIMIT),  # OOM-killed at the limit
}
KILLED = "random-b64-two"
# The interpreter's own memory in the cgroup, above what the process allocates.
OVERHEAD = 24 * MiB

pytestmark = pytest.mark.kernel


@pytest.fixture
def require_kernel() -> None:
    if writable_memory_controller() is None:
        pytest.skip("needs root and a writable cgroup memory controller (CI has both)")


def _records(kubeconfig: Path, ns: str) -> dict[str, dict[str, Any]]:
    async def read() -> dict[str, dict[str, Any]]:
        kube = KubeClient.load(kubeconfig=kubeconfig)
        try:
            return await TrialRecords(kube=kube).read(namespace=ns, experiment="random")
        finally:
            kube.close()

    return asyncio.run(read())


def _trials_cli(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nodeguard", "trials", *args, f"--kubeconfig={kubeconfig}"],
        capture_output=True,
        check=False,
        text=True,
        timeout=60,
        env={"COLUMNS": "80", "PATH": "/usr/bin:/bin"},
    )


def test_trials_memory_recorded_across_kill_9_and_api_failures(
    require_kernel: None, cluster: Cluster, tmp_path: Path, proxied: Any, control_plane: Any
) -> None:
    ns, node = cluster.namespace("trials"), cluster.node(memory="16Gi")
    exp = cluster.katib_experiment(ns)
    batch_size: dict[str, Any] = {
        "name": "batch_size",
        "parameterType": "discrete",
        "feasibleSpace": {"list": ["16", "64"]},
    }
    exp = custom_json(
        cluster.custom.patch_namespaced_custom_object(
            "kubeflow.org",
            "v1beta1",
            ns,
            "experiments",
            "random",
            {
                "spec": {
                    "parameters": [*exp["spec"]["parameters"], batch_size],
                    "trialTemplate": _batch_size_in(exp["spec"]["trialTemplate"]),
                }
            },
        )
    )
    pods: dict[str, tuple[str, str]] = {}
    for i, (trial, (batch, _)) in enumerate(TRIALS.items()):
        katib_trial(
            cluster,
            namespace=ns,
            experiment=exp,
            name=trial,
            parameters={"batch_size": batch, "lr": f"0.0{i + 1}"},
        )
        pod = cluster.pod(
            namespace=ns,
            node=node,
            name=f"{trial}-pod",
            request="32Mi",
            limit="64Mi",
            labels={"katib.kubeflow.org/experiment": "random", "katib.kubeflow.org/trial": trial},
        )
        cid = pod["status"]["containerStatuses"][0]["containerID"].split("://")[1]
        pods[trial] = (pod["metadata"]["uid"], cid)
    # A pod that is no trial's: never tracked, never recorded.
    cluster.pod(namespace=ns, node=node, name="preprocess", request="32Mi", limit="64Mi")
    state = tmp_path / "state"
    with private_kubepods(tmp_path) as kp:
        cgs = {
            t: pod_container(kp, pod_uid=uid, container_id=cid, limit_bytes=LIMIT)
            for t, (uid, cid) in pods.items()
        }
        args = [
            f"--kubeconfig={proxied.kubeconfig}",
            f"--node-name={node}",
            f"--path.sysfs={kp.sysfs}",
            "--interval=100ms",
            f"--path.state={state}",
            "--no-collector.processes",
        ]
        with (
            running_agent(args=args, log_path=tmp_path / "agent-1.log") as base,
            contextlib.ExitStack() as hogs,
        ):
            wait_until(
                "the four trial pods tracked",
                lambda: metric_value(base, "nodeguard_trial_pods", state="tracked") == 4,
                timeout=30,
            )
            # 1 MiB every 20 ms: the OOM-killed one reaches its limit in about 1.3 s, sampled
            # every 100 ms on its way.
            procs = {
                t: hogs.enter_context(hog_in(cgs[t], step=MiB, pause=0.02, up_to=size))
                for t, (_, size) in TRIALS.items()
            }
            assert procs[KILLED].wait(timeout=60) == -9  # the kernel's OOM kill
            for t, p in procs.items():
                if t != KILLED:
                    assert p.stdout is not None and p.stdout.readline() == "survived\n"
            # Sampled at their peaks (and the kill counted), then killed mid-trial.
            wait_until("the peaks saved", lambda: _saved(state, pods), timeout=30)
            kill_9(base.pid)
        # The processes are gone: a sample now sees nothing of what they used.
        for trial in TRIALS:
            cluster.finish_pod(
                ns, f"{trial}-pod", phase="Failed" if trial == KILLED else "Succeeded"
            )
        failing = proxied.fail("PATCH", r"/configmaps/", status=503, times=2)
        with running_agent(args=args, log_path=tmp_path / "agent-2.log") as base:
            found = wait_until(
                "the four records",
                lambda: (
                    (r := _records(control_plane.kubeconfig_path, ns))
                    and sum(len(v) for v in r.values()) == 4
                    and r
                ),
                timeout=60,
            )
            wait_until(
                "nothing left to write",
                lambda: metric_value(base, "nodeguard_trial_pods", state="pending") == 0,
                timeout=15,
            )
    assert failing.matched == 2  # the API server failed them; retried with backoff
    assert isinstance(found, dict) and set(found) == set(TRIALS)
    for trial, (_, size) in TRIALS.items():
        (record,) = found[trial].values()
        assert record["pod"] == f"{trial}-pod" and record["node"] == node
        assert record["limit_bytes"] == LIMIT and record["request_bytes"] == 32 * MiB
        peak = record["peak_working_set_bytes"]
        if trial == KILLED:
            assert record["phase"] == "Failed" and record["oom_kills"] >= 1
            # Sampled on its way up; the kernel's own peak is the limit it was killed at.
            assert LIMIT // 2 <= peak <= LIMIT + MiB  # the pod cgroup: its own kernel memory too
            assert record["kernel_peak_bytes"] >= LIMIT - MiB
        else:
            assert record["phase"] == "Succeeded" and record["oom_kills"] == 0
            assert size <= peak <= size + OVERHEAD, (trial, record)
            assert record["peak_anon_bytes"] >= size
        # The kernel's high-water mark counts at least what was sampled.
        assert record["kernel_peak_bytes"] >= peak
    # The preprocessing pod is no trial's: no ConfigMap but the trials'.
    cms = cluster.core.list_namespaced_config_map(ns, label_selector="nodeguard.io/katib-trial")
    names = sorted(str(given(c.metadata).name) for c in cms.items)
    assert names == sorted(map(record_name, TRIALS))
    (owner,) = given(given(cms.items[0].metadata).owner_references)
    assert (owner.kind, owner.controller) == ("Trial", None)

    # Katib's Trial controller marks each Trial's end (its job's condition).
    for trial in TRIALS:
        _mark(cluster, ns, trial, "Failed" if trial == KILLED else "Succeeded")
    kubeconfig = control_plane.kubeconfig_path
    doc = json.loads(_trials_cli(kubeconfig, f"{ns}/random", "--json").stdout)
    assert doc["explained_by"] == "batch_size"
    rows = {r["name"]: r for r in doc["trials"]}
    assert rows[KILLED]["flag"] == "OOM-killed" and rows[KILLED]["need_bytes"] == 96 * MiB
    spread = next(s for s in doc["spreads"] if s["parameter"] == "batch_size")
    groups = {g["value"]: g for g in spread["groups"]}
    # 16: the larger trial's peak (16 MiB and the interpreter) plus 10 %, up to 64 MiB; 64:
    # the OOM-killed trial's guess, 1.5 times its 64 MiB limit, plus 10 % (30 %): 128 MiB.
    assert (groups["16"]["request_bytes"], groups["16"]["limit_bytes"]) == (64 * MiB, 64 * MiB)
    assert (groups["64"]["request_bytes"], groups["64"]["limit_bytes"]) == (128 * MiB, 128 * MiB)
    assert groups["64"]["measured"] is False and groups["16"]["measured"] is True
    # Each class an Experiment of its own: the example Experiment's parameters with batch_size
    # cut to the class's values, its template's primary container given the memory.
    docs = [d["spec"] for d in yaml.safe_load_all(doc["fragment"])]
    assert [
        next(p["feasibleSpace"] for p in d["parameters"] if p["name"] == "batch_size") for d in docs
    ] == [{"list": ["16"]}, {"list": ["64"]}]
    assert [p["name"] for p in docs[0]["parameters"]] == ["lr", "momentum", "batch_size"]
    (train,) = docs[1]["trialTemplate"]["trialSpec"]["spec"]["template"]["spec"]["containers"]
    assert train["resources"]["limits"] == {"cpu": "0.5", "memory": "128Mi"}  # its CPU kept
    text = _trials_cli(kubeconfig, f"{ns}/random")
    assert text.returncode == 0, text.stderr
    assert all(len(line) <= 80 for line in text.stdout.splitlines()), text.stdout
    killed_row = next(ln for ln in text.stdout.splitlines() if ln.startswith(f" {KILLED}"))
    assert killed_row.split()[-2:] == ["1", "Failed,"], text.stdout  # OOM kills, outcome
    assert "OOM-killed" in text.stdout and "By batch_size (explains" in text.stdout
    assert "By lr: a double, not judged" in text.stdout  # the Experiment says so
    assert {r["name"]: r["outcome"] for r in doc["trials"]} == {
        t: "Failed" if t == KILLED else "Succeeded" for t in TRIALS
    }
    missing = _trials_cli(kubeconfig, f"{ns}/no-such")
    assert missing.returncode == 4 and "no Experiment" in missing.stderr


def _saved(state: Path, pods: dict[str, tuple[str, str]]) -> bool:
    """Whether the state file holds every trial pod with its peak (the OOM-killed one's half
    its limit at least, and its OOM kill)."""
    try:
        doc = json.loads((state / "remediation-state.json").read_text())
    except (OSError, ValueError):
        return False
    tracked = doc.get("sections", {}).get("trial_memory", {}).get("pods", {})
    uids = {uid: t for t, (uid, _) in pods.items()}
    return set(tracked) >= set(uids) and all(
        (tracked[u].get("peak_working_set_bytes") or 0) >= min(TRIALS[uids[u]][1], LIMIT // 2)
        and (uids[u] != KILLED or tracked[u].get("oom_kills"))
        for u in uids
    )


def _mark(cluster: Cluster, ns: str, trial: str, kind: str) -> None:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    conditions = [
        {"type": t, "status": s, "reason": f"Trial{t}", "lastTransitionTime": now}
        for t, s in (("Created", "True"), ("Running", "False"), (kind, "True"))
    ]
    cluster.custom.patch_namespaced_custom_object_status(
        "kubeflow.org", "v1beta1", ns, "trials", trial, {"status": {"conditions": conditions}}
    )


def _batch_size_in(template: dict[str, Any]) -> dict[str, Any]:
    """The example's trial template with its hard-coded ``--batch-size=16`` made a trial
    parameter, as a user tuning it writes it."""
    text = json.dumps(template).replace(
        "--batch-size=16", "--batch-size=${trialParameters.batchSize}"
    )
    out: dict[str, Any] = json.loads(text)
    out["trialParameters"].append({"name": "batchSize", "reference": "batch_size"})
    return out
