"""``nodeguard doctor``'s ``katib-fit`` check against the test kube-apiserver with Katib's CRDs
(tests/fixtures/katib): an Experiment whose trial's memory request is bound to a categorical
parameter, four trials in parallel against a 64 GiB quota, and the same sweep at two trials in
a namespace where it fits, which yields no finding; the shipped read-only ClusterRole lists
Experiments (test_doctor.py binds it)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.support.agent import wait_until
from tests.support.controlplane.cluster import TestCluster
from tests.support.doctor_cluster import run_doctor
from tests.support.kube_helpers import Cluster

GiB = 2**30

SWEEP: dict[str, Any] = {
    "apiVersion": "kubeflow.org/v1beta1",
    "kind": "Experiment",
    "metadata": {"name": "sweep"},
    "spec": {
        "objective": {"type": "minimize", "objectiveMetricName": "loss"},
        "algorithm": {"algorithmName": "random"},
        "parallelTrialCount": 4,
        "maxTrialCount": 12,
        "parameters": [
            {
                "name": "mem",
                "parameterType": "categorical",
                "feasibleSpace": {"list": ["2Gi", "8Gi", "32Gi"]},
            }
        ],
        "trialTemplate": {
            "primaryContainerName": "train",
            "trialParameters": [{"name": "memory", "reference": "mem"}],
            "trialSpec": {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "spec": {
                    "template": {
                        "spec": {
                            # A class above everything else here: training-priority is clean.
                            "priorityClassName": "nodeguard-test-high",
                            "restartPolicy": "Never",
                            "containers": [
                                {
                                    "name": "train",
                                    "image": "pause",
                                    "resources": {
                                        "requests": {"memory": "${trialParameters.memory}"},
                                        "limits": {"memory": "${trialParameters.memory}"},
                                    },
                                }
                            ],
                        }
                    }
                },
            },
        },
    },
}


def _scene(cluster: Cluster, *, parallel: int) -> str:
    ns = cluster.namespace("doctor-katib")
    cluster.core.create_namespaced_resource_quota(
        ns,
        client.V1ResourceQuota.model_validate(
            {"metadata": {"name": "compute"}, "spec": {"hard": {"requests.memory": "64Gi"}}}
        ),
    )
    # A default request, so that the quota refuses no pod for naming none (quota-limitrange).
    cluster.core.create_namespaced_limit_range(
        ns,
        client.V1LimitRange.model_validate(
            {
                "metadata": {"name": "defaults"},
                "spec": {"limits": [{"type": "Container", "defaultRequest": {"memory": "1Gi"}}]},
            }
        ),
    )
    body = copy.deepcopy(SWEEP)
    body["spec"]["parallelTrialCount"] = parallel
    cluster.custom.create_namespaced_custom_object(
        "kubeflow.org", "v1beta1", ns, "experiments", body
    )
    return ns


def test_parallel_trials_past_the_quota_and_a_sweep_that_fits(
    cluster: Cluster, control_plane: TestCluster
) -> None:
    tight, roomy = _scene(cluster, parallel=4), _scene(cluster, parallel=2)

    def report(ns: str) -> tuple[int, dict[str, Any], str]:
        rc, out, err = run_doctor(control_plane.kubeconfig_path, "--json", f"--namespace={ns}")
        return rc, json.loads(out), err

    wait_until("the experiment listed", lambda: report(tight)[1]["findings"] != [], timeout=30)
    rc, got, err = report(tight)
    (finding,) = got["findings"]
    assert (rc, finding["check"], finding["severity"]) == (1, "katib-fit", "error"), err
    assert finding["objects"] == [{"kind": "Experiment", "namespace": tight, "name": "sweep"}]
    facts = {e["label"]: e.get("bytes", e.get("text")) for e in finding["evidence"]}
    assert facts == {
        "parallelTrialCount": "4",
        "largest trial request": 32 * GiB,
        "at": "mem=32Gi",
        "quota hard requests.memory": 64 * GiB,
        "trials that fit": "2",
    }
    # The fix, applied as printed (its JSON merge patch), makes the experiment fit: clean.
    patch = json.loads(finding["fix"].rsplit(" -p ", 1)[1].strip("'"))
    cluster.custom.patch_namespaced_custom_object(
        "kubeflow.org", "v1beta1", tight, "experiments", "sweep", patch
    )
    assert report(tight)[:2] == (0, {"findings": [], "worst": None, "exit_status": 0})
    assert report(roomy)[:2] == (0, {"findings": [], "worst": None, "exit_status": 0})


def test_trials_above_the_limit_range_max_are_what_the_api_server_refuses(
    cluster: Cluster, control_plane: TestCluster
) -> None:
    ns = cluster.namespace("doctor-katib-max")
    cluster.core.create_namespaced_limit_range(
        ns,
        client.V1LimitRange.model_validate(
            {
                "metadata": {"name": "ceiling"},
                "spec": {"limits": [{"type": "Container", "max": {"memory": "16Gi"}}]},
            }
        ),
    )
    body = copy.deepcopy(SWEEP)
    cluster.custom.create_namespaced_custom_object(
        "kubeflow.org", "v1beta1", ns, "experiments", body
    )
    # The 32Gi trial's pod, as the Job controller would make it: refused by LimitRanger.
    trial_pod = copy.deepcopy(body["spec"]["trialTemplate"]["trialSpec"]["spec"]["template"])
    trial_pod["metadata"] = {"name": "trial-32gi"}
    trial_pod["spec"]["containers"][0]["resources"] = {
        "requests": {"memory": "32Gi"},
        "limits": {"memory": "32Gi"},
    }
    with pytest.raises(ApiException) as refused:
        cluster.core.create_namespaced_pod(ns, client.V1Pod.model_validate(trial_pod))
    assert refused.value.status == 403
    assert "maximum memory usage per Container is 16Gi" in str(refused.value.body)
    rc, out, err = run_doctor(control_plane.kubeconfig_path, "--json", f"--namespace={ns}")
    (finding,) = json.loads(out)["findings"]
    assert (rc, finding["check"], finding["objects"][1]["name"]) == (1, "katib-fit", "ceiling"), err
    facts = {e["label"]: e.get("bytes", e.get("text")) for e in finding["evidence"]}
    assert (facts["at"], facts["Container max memory (ceiling)"]) == ("mem=32Gi", 16 * GiB)
