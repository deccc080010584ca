"""Katib trials' memory: what the agent keeps of each trial pod (its peaks, never a pod that is
no trial's, never a second record of one that ended), when it saves the state (a peak that
creeps up is saved once it has grown 5 % in all), how it writes (an API failure retried, a
Trial gone dropped), and what ``nodeguard trials`` makes of the records (the spread by
parameter, the recommendation, the fragment)."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from typing import Any

import pytest
import yaml

from nodeguard.cli.trial_fit import (
    OOM_GUESS,
    TrialRow,
    fragment,
    quantity,
    rows,
    spreads,
)
from nodeguard.kube.objects import pod_meta
from nodeguard.remediation.trial_memory import RecordWriter, TrialMemory
from nodeguard.snapshot import ContainerMemory, NodeSnapshot, PodMemory
from tests.support.hosts import cgroup_memory

MiB = 1 << 20
#: An Experiment's spec as the API returns it: a Job trial template, a metrics sidecar.
SPEC: dict[str, Any] = {
    "parameters": [
        {"name": "batch_size", "parameterType": "int", "feasibleSpace": {"min": "16", "max": "64"}},
        {"name": "lr", "parameterType": "double", "feasibleSpace": {"min": "0.01", "max": "0.1"}},
    ],
    "trialTemplate": {
        "primaryContainerName": "train",
        "trialSpec": {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "spec": {
                "template": {
                    "spec": {
                        "containers": [
                            {"name": "train", "resources": {"requests": {"cpu": "1"}}},
                            {"name": "metrics-logger"},
                        ]
                    }
                }
            },
        },
    },
}


def _pod(name: str, *, trial: str | None, phase: str = "Running") -> dict[str, Any]:
    labels = {"katib.kubeflow.org/trial": trial, "katib.kubeflow.org/experiment": "e"}
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"uid-{name}",
            "labels": labels if trial else {},
        },
        "spec": {
            "nodeName": "n",
            "containers": [
                {"name": "main", "resources": {"limits": {"memory": "64Mi"}}},
            ],
        },
        "status": {
            "phase": phase,
            "qosClass": "Burstable",
            "containerStatuses": [{"name": "main", "containerID": f"containerd://c-{name}"}],
        },
    }


def _snap(t: float, pods: dict[str, tuple[int, dict[str, Any] | None]]) -> NodeSnapshot:
    """Pods by name: (bytes used, the pod's JSON, or None: gone from the pod list)."""
    mems, meta = [], {}
    for name, (used, pod) in pods.items():
        c = ContainerMemory(
            container_id=f"c-{name}", runtime="", memory=cgroup_memory(f"/p/{name}/c", used=used)
        )
        mems.append(
            PodMemory(
                uid=f"uid-{name}",
                qos_class="burstable",
                memory=cgroup_memory(f"/p/{name}", used=used),
                containers=(c,),
            )
        )
        if pod is not None:
            meta[f"uid-{name}"] = pod_meta(pod)
    return NodeSnapshot(
        timestamp=t,
        node_name="n",
        meminfo=None,
        pressure=None,
        pods=tuple(mems),
        oom=None,
        processes=(),
        collectors=(),
        pod_meta=meta,
    )


def test_a_trial_pod_is_tracked_to_its_end_and_a_look_alike_never() -> None:
    state: dict[str, Any] = {}
    saves: list[int] = []
    memory = TrialMemory(node="n", state=state, changed=lambda: saves.append(1), write=None)
    trial, other = _pod("t1-pod", trial="t1"), _pod("pandas", trial=None)
    for t, used in enumerate((10, 30, 20)):
        memory.observe(_snap(t, {"t1-pod": (used * MiB, trial), "pandas": (900 * MiB, other)}))
    assert memory.tracked == 1 and list(state["pods"]) == ["uid-t1-pod"]
    record = state["pods"]["uid-t1-pod"]
    assert record["peak_working_set_bytes"] == 30 * MiB  # the peak, not the last
    assert record["containers"]["main"]["peak_anon_bytes"] == 30 * MiB
    assert (record["trial"], record["experiment"], record["limit_bytes"]) == ("t1", "e", 64 * MiB)
    done = _pod("t1-pod", trial="t1", phase="Succeeded")
    memory.observe(_snap(3, {"t1-pod": (MiB, done)}))
    assert memory.tracked == 0 and state["pending"]["uid-t1-pod"]["phase"] == "Succeeded"
    # Its cgroup and pod-list entry stay a while: no second record replaces the first.
    memory.observe(_snap(4, {"t1-pod": (MiB, done)}))
    assert memory.tracked == 0
    assert state["pending"]["uid-t1-pod"]["peak_working_set_bytes"] == 30 * MiB


def test_a_pod_gone_from_the_list_ends_and_no_cluster_tracks_nothing() -> None:
    state: dict[str, Any] = {}
    memory = TrialMemory(node="n", state=state, changed=lambda: None, write=None)
    memory.observe(_snap(0, {"t1-pod": (5 * MiB, _pod("t1-pod", trial="t1"))}))
    memory.observe(_snap(1, {"t1-pod": (5 * MiB, None)}))
    assert state["pending"]["uid-t1-pod"]["phase"] == "Deleted"
    bare = TrialMemory(node="n", state={}, changed=lambda: None, write=None)
    bare.observe(dataclasses.replace(_snap(0, {"t1-pod": (MiB, None)}), pod_meta=None))
    assert bare.tracked == 0


def test_a_creeping_peak_is_saved_once_it_has_grown_five_percent() -> None:
    saves: list[int] = []
    memory = TrialMemory(node="n", state={}, changed=lambda: saves.append(1), write=None)
    trial = _pod("t1-pod", trial="t1")
    for i in range(100):  # 1 % a sample: about one save in five
        memory.observe(_snap(i, {"t1-pod": (int(100 * MiB * 1.01**i), trial)}))
    assert 15 <= len(saves) <= 25


def test_the_writer_retries_a_failing_api_and_drops_a_gone_trial() -> None:
    async def scenario() -> tuple[list[str], dict[str, Any], int]:
        calls: list[str] = []
        failures = iter([True, True])

        async def write(record: dict[str, Any]) -> None:
            calls.append(record["pod"])
            if record["pod"] == "gone":
                raise LookupError("Trial ml/t0 is gone")
            if next(failures, False):
                raise OSError("503")

        pending = {"a": {"pod": "p", "namespace": "ml"}, "b": {"pod": "gone", "namespace": "ml"}}
        writer = RecordWriter(pending=pending, write=write, changed=lambda: None)
        for _ in range(200):
            writer.soon()
            await asyncio.sleep(0.05)
            if not pending:
                break
            writer._retry_at = 0.0  # the backoff's wait, skipped
        return calls, pending, writer.written

    calls, pending, written = asyncio.run(scenario())
    # The failing record goes to the back: the gone Trial's is dropped meanwhile, not held up.
    assert calls == ["p", "gone", "p", "p"] and pending == {} and written == 1


def _row(name: str, batch: str, peak: int, *, oom: int = 0, lr: str = "") -> TrialRow:
    return TrialRow(
        name=name,
        parameters={"batch_size": batch, "lr": lr or name},
        outcome="Succeeded",
        pods=1,
        peak_working_set_bytes=peak,
        limit_bytes=64 * MiB,
        oom_kills=oom,
    )


def test_the_parameter_that_explains_the_memory_and_its_recommendation() -> None:
    found = [
        _row("a", "16", 30 * MiB),
        _row("b", "16", 34 * MiB),
        _row("c", "64", 60 * MiB),
        _row("d", "64", 64 * MiB),
    ]
    best, *rest = spreads(found)
    # Between-group squares 4 * 15**2 = 900 of the total 17**2 + 13**2 + 13**2 + 17**2 = 916,
    # within 16 over 4 - 2 degrees of freedom: omega squared (900 - 8) / (916 + 8).
    assert best.parameter == "batch_size" and best.explained == pytest.approx(892 / 924)
    assert [(s.parameter, s.explained) for s in rest] == [("lr", 0.0)]  # a value a trial
    g16, g64 = best.groups
    # request: 34 MiB + 10 % up to 64 MiB; 64 MiB + 10 % (+ 30 %) up to 128 MiB.
    assert (g16.request_bytes, g16.limit_bytes) == (64 * MiB, 64 * MiB)
    assert (g64.request_bytes, g64.limit_bytes) == (128 * MiB, 128 * MiB)
    assert found[3].flag == "near limit" and found[0].flag == ""
    text = fragment(experiment="ml/e", spread=best, every=found, spec=SPEC)
    one, two = (d["spec"] for d in yaml.safe_load_all(text))
    # batch_size is an int range 16 to 64: cut half-way between the classes' values (16 and
    # 64: at 40), each class its part of the range, its type kept.
    for doc, space, memory in (
        (one, {"min": "16", "max": "40"}, "64Mi"),
        (two, {"min": "41", "max": "64"}, "128Mi"),
    ):
        batch, lr = doc["parameters"]
        assert batch == {"name": "batch_size", "parameterType": "int", "feasibleSpace": space}
        assert lr == SPEC["parameters"][1]  # the others as they were
        job = doc["trialTemplate"]["trialSpec"]["spec"]["template"]["spec"]
        train, sidecar = job["containers"]
        assert train["resources"] == {
            "requests": {"memory": memory, "cpu": "1"},
            "limits": {"memory": memory},
        }
        assert "resources" not in sidecar  # only the primary container's


def test_an_oom_killed_trial_needs_more_than_its_limit() -> None:
    killed = _row("k", "64", 60 * MiB, oom=1)
    assert killed.flag == "OOM-killed" and killed.need_bytes == int(64 * MiB * OOM_GUESS)
    (_, spread), *_ = [(s.parameter, s) for s in spreads([killed, _row("a", "16", 30 * MiB)])]
    assert not spread.explains  # two trials, two values: not judged


def test_no_record_and_no_explaining_parameter() -> None:
    empty = TrialRow(name="t", parameters={"x": "1"}, outcome="Running")
    assert spreads([empty]) == []
    assert "no trial's memory is recorded yet" in fragment(
        experiment="ml/e", spread=None, every=[empty], spec=SPEC
    )
    same = [_row(n, "16" if n in "ab" else "64", 40 * MiB, lr="0.1") for n in "abcd"]
    text = fragment(experiment="ml/e", spread=spreads(same)[0], every=same, spec=SPEC)
    assert "no parameter explains" in text
    (doc,) = yaml.safe_load_all(text)
    assert "parameters" not in doc["spec"]
    job = doc["spec"]["trialTemplate"]["trialSpec"]["spec"]["template"]["spec"]
    assert job["containers"][0]["resources"]["limits"] == {"memory": "64Mi"}
    # A template in a ConfigMap: the resources said in words.
    bare = fragment(experiment="ml/e", spread=None, every=same, spec={})
    assert "set resources {requests: {memory: 64Mi}" in bare


def test_rows_join_the_records_and_quantities_round_up() -> None:
    trials: list[dict[str, Any]] = [
        {
            "metadata": {"name": "t1"},
            "spec": {"parameterAssignments": [{"name": "batch_size", "value": "16"}]},
            "status": {"conditions": [{"type": "Succeeded", "status": "True"}]},
        },
        {"metadata": {"name": "t0"}, "spec": {}},
    ]
    records = {
        "t1": {
            "t1-master-0": {"peak_working_set_bytes": 5 * MiB, "limit_bytes": 8 * MiB},
            "t1-worker-0": {
                "peak_working_set_bytes": 7 * MiB,
                "limit_bytes": 8 * MiB,
                "oom_kills": 1,
            },
        }
    }
    t0, t1 = rows(trials, records)
    assert (t0.name, t0.pods, t0.outcome) == ("t0", 0, "")
    assert (t1.pods, t1.peak_working_set_bytes, t1.oom_kills, t1.outcome) == (
        2,
        7 * MiB,
        1,
        "Succeeded",
    )
    assert [quantity(v) for v in (1 << 30, 64 * MiB, 64 * MiB + 1)] == ["1Gi", "64Mi", "65Mi"]


def test_a_permanent_refusal_is_dropped_and_a_hand_edited_state_is_cleaned() -> None:
    class Refused(Exception):
        transient = False

    async def scenario() -> tuple[dict[str, Any], int]:
        async def write(record: dict[str, Any]) -> None:
            if record["pod"] == "refused":
                raise Refused("403: policy nodeguard-own-configmaps")

        pending = {"a": {"pod": "refused", "namespace": "ml"}, "b": {"pod": "p", "namespace": "ml"}}
        writer = RecordWriter(pending=pending, write=write, changed=lambda: None)
        writer.soon()
        for _ in range(40):
            await asyncio.sleep(0.05)
        return pending, writer.written

    pending, written = asyncio.run(scenario())
    assert pending == {} and written == 1
    good = {k: "x" for k in ("namespace", "pod", "uid", "trial", "experiment", "node")}
    state: dict[str, Any] = {
        "pods": {
            "u1": {**good, "peak_working_set_bytes": "big", "oom_kills": True, "containers": 3},
            "u2": "garbage",
            "u3": {"pod": "p"},
        },
        "pending": {"p1": "str"},
        "ended": ["u9", 7],
    }
    memory = TrialMemory(node="n", state=state, changed=lambda: None, write=None)
    assert list(state["pods"]) == ["u1"] and state["pending"] == {} and state["ended"] == ["u9"]
    assert "peak_working_set_bytes" not in state["pods"]["u1"]
    assert "oom_kills" not in state["pods"]["u1"] and state["pods"]["u1"]["containers"] == {}
    memory.observe(_snap(0, {"t1-pod": (5 * MiB, _pod("t1-pod", trial="t1"))}))  # no crash
    assert (memory.tracked, memory.pending) == (1, 1)  # u1 is not on the pod list: it ended


def test_each_pod_against_its_own_limit_and_the_primary_container() -> None:
    trials: list[dict[str, Any]] = [
        {"metadata": {"name": "t"}, "spec": {"parameterAssignments": []}},
    ]
    launcher = {"peak_working_set_bytes": 400 * MiB, "limit_bytes": 512 * MiB}
    worker = {
        "peak_working_set_bytes": 31 * 1024 * MiB,
        "limit_bytes": 32 * 1024 * MiB,
        "oom_kills": 1,
    }
    (row,) = rows(trials, {"t": {"launcher": launcher, "worker-0": worker}})
    # The killed worker's need is from its own 32 GiB limit, not the launcher's 512 MiB.
    assert row.need_bytes == int(32 * 1024 * MiB * OOM_GUESS)
    assert row.limit_bytes == 32 * 1024 * MiB and row.flag == "OOM-killed"
    # Katib's metrics sidecar: the training container's own numbers, not the pod's.
    pod = {
        "peak_working_set_bytes": 90 * MiB,
        "limit_bytes": 164 * MiB,
        "request_bytes": 100 * MiB,
        "containers": {
            "train": {"peak_working_set_bytes": 62 * MiB, "limit_bytes": 64 * MiB},
            "metrics-logger-and-collector": {"peak_working_set_bytes": 20 * MiB},
        },
    }
    (row,) = rows(trials, {"t": {"p": pod}}, container="train")
    assert (row.peak_working_set_bytes, row.limit_bytes, row.flag) == (
        62 * MiB,
        64 * MiB,
        "near limit",
    )
    # Garbage in a record is no data: no crash, no negative size, no OOM kill from -1.
    junk = {"peak_working_set_bytes": -500, "oom_kills": "abc", "limit_bytes": True}
    (row,) = rows(trials, {"t": {"p": junk}})
    assert (row.need_bytes, row.oom_kills, row.limit_bytes) == (None, 0, None)


def test_a_double_a_missing_value_and_untried_values() -> None:
    found = [
        _row("a", "16", 30 * MiB, lr="0.01"),
        _row("b", "16", 31 * MiB, lr="0.01"),
        _row("c", "64", 60 * MiB, lr="0.02"),
        _row("d", "64", 62 * MiB, lr="0.03"),
        _row("e", "64", 61 * MiB, lr="0.04"),
        TrialRow(
            name="f",
            parameters={"lr": "0.05"},
            outcome="",
            pods=1,
            peak_working_set_bytes=200 * MiB,
        ),
    ]
    # lr is a double: never judged, however well its many values split the needs.
    best = spreads(found, skip=frozenset({"lr"}))[0]
    assert best.parameter == "batch_size" and [g.value for g in best.groups] == ["16", "64"]
    assert sum(g.trials for g in best.groups) == 5  # f has no batch_size: not in its groups
    spec = copy.deepcopy(SPEC)
    spec["parameters"][0] = {
        "name": "batch_size",
        "parameterType": "discrete",
        "feasibleSpace": {"list": ["16", "32", "64", "128"]},
    }
    docs = [
        d["spec"]
        for d in yaml.safe_load_all(
            fragment(experiment="ml/e", spread=best, every=found, spec=spec)
        )
    ]
    lists = [d["parameters"][0]["feasibleSpace"]["list"] for d in docs]
    assert lists == [["16"], ["64", "32", "128"]]  # untried: with the largest class


def test_a_memory_bound_to_a_trial_parameter_and_odd_templates() -> None:
    spec = copy.deepcopy(SPEC)
    spec["parameters"].append(
        {"name": "mem", "parameterType": "discrete", "feasibleSpace": {"list": ["64", "128"]}}
    )
    spec["trialTemplate"]["trialParameters"] = [
        {"name": "memory", "reference": "mem"},
        {"name": "learningRate", "reference": "lr"},
    ]
    train = spec["trialTemplate"]["trialSpec"]["spec"]["template"]["spec"]["containers"][0]
    train["resources"] = {"limits": {"memory": "${trialParameters.memory}Mi"}, "requests": None}
    train["args"] = ["--lr=${trialParameters.learningRate}"]
    every = [_row("a", "16", 30 * MiB)]
    (doc,) = yaml.safe_load_all(fragment(experiment="ml/e", spread=None, every=every, spec=spec))
    tt = doc["spec"]["trialTemplate"]
    # The memory no longer comes from "mem": Katib refuses a trial parameter the template
    # does not use, so it goes, and "mem" with it; lr is still used.
    assert [t["name"] for t in tt["trialParameters"]] == ["learningRate"]
    job = tt["trialSpec"]["spec"]["template"]["spec"]["containers"][0]
    assert job["resources"] == {"limits": {"memory": "64Mi"}, "requests": {"memory": "64Mi"}}
    missing = copy.deepcopy(SPEC)
    missing["trialTemplate"]["primaryContainerName"] = "nope"
    text = fragment(experiment="ml/e", spread=None, every=every, spec=missing)
    assert "# no container nope in the trial template" in text
    killed = [_row("k", "16", 60 * MiB, oom=1), _row("j", "16", 62 * MiB, oom=1)]
    assert "a guess above their limit" in fragment(
        experiment="ml/e", spread=None, every=killed, spec=SPEC
    )


def test_a_range_that_memory_does_not_grow_along_and_a_guess_only_where_guessed() -> None:
    found = [
        _row("a", "16", 60 * MiB),
        _row("b", "16", 62 * MiB),
        _row("c", "32", 20 * MiB),
        _row("d", "32", 21 * MiB),
        _row("e", "64", 61 * MiB),
        _row("f", "64", 63 * MiB),
    ]
    best = spreads(found)[0]
    assert best.parameter == "batch_size" and best.explains
    text = fragment(experiment="ml/e", spread=best, every=found, spec=SPEC)
    assert "memory does not grow along batch_size's range" in text
    lists = [d["spec"]["parameters"][0]["feasibleSpace"] for d in yaml.safe_load_all(text)]
    assert lists == [{"list": ["16", "64"]}, {"list": ["32"]}]
    # A launcher OOM-killed at 100 MiB beside a worker measured at 1 GiB of its 4 GiB: the
    # trial's need is the worker's measure, not a guess.
    trials: list[dict[str, Any]] = [{"metadata": {"name": "t"}, "spec": "not an object"}]
    launcher = {"peak_working_set_bytes": 99 * MiB, "limit_bytes": 100 * MiB, "oom_kills": 1}
    worker = {"peak_working_set_bytes": 1024 * MiB, "limit_bytes": 4096 * MiB}
    (row,) = rows(trials, {"t": {"l": launcher, "w": worker}})
    assert row.need_bytes == 1024 * MiB and row.parameters == {}
    assert spreads([row])[0:1] == [] or all(g.measured for s in spreads([row]) for g in s.groups)


def test_many_parameters_share_one_column_and_the_numbers_fit() -> None:
    import io

    from rich.console import Console

    from nodeguard.cli.trials import _table

    params = {p: "0.001" for p in ("lr", "momentum", "batch_size", "optimizer", "dropout")}
    found = [
        TrialRow(
            name=f"bert-finetune-sweep-2026-12-07-{i}",
            parameters=params,
            outcome="Failed",
            pods=1,
            peak_working_set_bytes=8000 * MiB,
            limit_bytes=8192 * MiB,
            oom_kills=1,
        )
        for i in range(2)
    ]
    out = io.StringIO()
    Console(file=out, width=80).print(_table(found, sorted(params)))
    text = out.getvalue()
    assert all(len(line) <= 80 for line in text.splitlines())
    for shown in ("7.8 GiB", "8.0 GiB", "OOM-killed", "parameters"):
        assert shown in text, text
