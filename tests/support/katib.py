"""Katib on the test control plane: its real Experiment controller, and stand-ins for the rest.

The Experiment controller (kubeflow/katib v0.19.0, ``pkg/controller.v1beta1/experiment``) is
built from Go modules with the control plane (``tests/support/controlplane/go/katib-experiment-
controller``) and run against the test kube-apiserver with its webhooks off. It is the part
that creates and deletes Trials (``ReconcileTrials``, ``createTrials``, ``deleteTrials``), the
part nodeguard's pause must get right. Katib's other parts cannot run here, so this module
plays them, writing what they would write:

- the suggestion service (a gRPC Deployment in Katib): for each Suggestion, as many
  ``status.suggestions`` assignments as its ``spec.requests``;
- the Trial controller and the kubelet: a Trial is marked Created and Running by
  :meth:`Katib.run_trials`, and Succeeded by :meth:`Katib.finish`.

Experiments are created with every field Katib's defaulting webhook would fill, since it is off.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.support.agent import wait_until
from tests.support.controlplane.cluster import TestCluster, ensure_built, spawn, terminate
from tests.support.kube_helpers import (
    Cluster,
    custom_json,
    given,
)

GROUP, VERSION = "kubeflow.org", "v1beta1"
TRIAL_COUNT = "count/trials.kubeflow.org"


def experiment_body(name: str, *, parallel: int, max_trials: int) -> dict[str, Any]:
    """A random-search Experiment with a batch/v1 Job trial template, every field set that
    Katib's webhook would default (``resumePolicy``, ``maxFailedTrialCount``, ...)."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Experiment",
        "metadata": {"name": name},
        "spec": {
            "objective": {
                "type": "minimize",
                "goal": 0.001,
                "objectiveMetricName": "loss",
                "metricStrategies": [{"name": "loss", "value": "min"}],
            },
            "algorithm": {"algorithmName": "random"},
            "parallelTrialCount": parallel,
            "maxTrialCount": max_trials,
            "maxFailedTrialCount": max_trials,
            "resumePolicy": "Never",
            "parameters": [
                {
                    "name": "lr",
                    "parameterType": "double",
                    "feasibleSpace": {"min": "0.01", "max": "0.05"},
                }
            ],
            "trialTemplate": {
                "primaryContainerName": "training-container",
                "trialParameters": [
                    {"name": "learningRate", "description": "lr", "reference": "lr"}
                ],
                "trialSpec": {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "spec": {
                        "template": {
                            "spec": {
                                "containers": [
                                    {
                                        "name": "training-container",
                                        "image": "registry.k8s.io/pause:3.10",
                                        "args": ["--lr=${trialParameters.learningRate}"],
                                    }
                                ],
                                "restartPolicy": "Never",
                            }
                        }
                    },
                },
                "successCondition": 'status.conditions.#(type=="Complete")#|#(status=="True")#',
                "failureCondition": 'status.conditions.#(type=="Failed")#|#(status=="True")#',
            },
        },
    }


class Katib:
    """Katib's Experiment controller running against ``control_plane``, and the stand-ins
    for its suggestion service and Trial controller (threads of this process)."""

    def __init__(self, *, control_plane: TestCluster, cluster: Cluster, log_path: Path) -> None:
        self.cp, self.cluster, self.log_path = control_plane, cluster, log_path
        self._proc: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._running: set[tuple[str, str]] = set()  # trials the stand-in marks Running
        self._lock = threading.Lock()

    def start(self) -> None:
        binary = ensure_built().katib_controller
        self._proc = spawn([str(binary), f"--kubeconfig={self.cp.kubeconfig_path}"], self.log_path)

        def started() -> bool:
            if self._proc.poll() is not None:
                raise RuntimeError(f"Katib's controller exited:\n{self.log_tail()}")
            return '"Starting workers"' in self.log()

        wait_until("Katib's controller to start", started, timeout=120, detail=self.log_tail)
        self._thread = threading.Thread(target=self._loop, name="katib-stand-ins", daemon=True)
        self._thread.start()

    def wait_quota_counts_trials(self, *, timeout: float = 120.0) -> None:
        """Wait until the ResourceQuota controller counts Trials: a probe quota made now has
        ``count/trials.kubeflow.org`` in its ``status.used``. The controller finds a CRD's
        resources by discovery every 30 s (kubernetes ``cmd/kube-controller-manager/app/
        core.go``: ``resourceQuotaController.Sync(ctx, discoveryFunc, 30*time.Second)``), and a
        quota made before that is counted only at its next full resync (5 min,
        ``--resource-quota-sync-period``) or a Trial event in its namespace: until then
        admission refuses a Trial create as "status unknown for quota", not "exceeded quota",
        and a test could pass on the wrong refusal. So: a fresh probe every 2 s."""
        ns = self.cluster.namespace("katib-quota-probe")
        core = self.cluster.core
        probes = itertools.count()

        def counted() -> bool:
            """A fresh probe quota, read 20 times 0.1 s apart: counted, or deleted."""
            name = f"probe-{next(probes)}"
            core.create_namespaced_resource_quota(
                ns,
                client.V1ResourceQuota.model_validate(
                    {"metadata": {"name": name}, "spec": {"hard": {TRIAL_COUNT: "0"}}}
                ),
            )
            for _ in range(20):
                used = given(core.read_namespaced_resource_quota(name, ns).status).used or {}
                if TRIAL_COUNT in used:
                    return True
                time.sleep(0.1)
            core.delete_namespaced_resource_quota(name, ns)
            return False

        try:
            wait_until("the quota controller to count Trials", counted, timeout=timeout, step=0)
        finally:
            core.delete_namespace(ns)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        terminate(self._proc, timeout=10)

    def log(self) -> str:
        """The controller's log."""
        return self.log_path.read_text(errors="replace")

    def log_tail(self) -> str:
        """The end of the controller's log: a failed wait's ``detail``."""
        return self.log()[-2500:]

    # -- the stand-ins -------------------------------------------------------------------------
    def _loop(self) -> None:
        custom = self.cluster.custom
        while not self._stop.is_set():
            with contextlib.suppress(ApiException, OSError):
                suggestions = custom.list_cluster_custom_object(GROUP, VERSION, "suggestions")
                for s in custom_json(suggestions)["items"]:
                    self._suggest(s)
                trials = custom.list_cluster_custom_object(GROUP, VERSION, "trials")
                for t in custom_json(trials)["items"]:
                    self._trial(t)
            self._stop.wait(0.1)

    def _suggest(self, s: dict[str, Any]) -> None:
        have = list((s.get("status") or {}).get("suggestions") or [])
        wanted = int(s["spec"].get("requests") or 0)
        if len(have) >= wanted:
            return
        name, ns = s["metadata"]["name"], s["metadata"]["namespace"]
        for _ in range(wanted - len(have)):
            have.append(
                {
                    "name": f"{name}-{uuid.uuid4().hex[:8]}",
                    "parameterAssignments": [{"name": "lr", "value": "0.02"}],
                }
            )
        status = {**(s.get("status") or {}), "suggestions": have, "suggestionCount": len(have)}
        self.cluster.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, ns, "suggestions", name, {"status": status}
        )

    def _trial(self, t: dict[str, Any]) -> None:
        conditions = (t.get("status") or {}).get("conditions") or []
        if conditions:
            return
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.cluster.custom.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            t["metadata"]["namespace"],
            "trials",
            t["metadata"]["name"],
            {
                "status": {
                    "startTime": now,
                    "conditions": [
                        _condition("Created", now),
                        _condition("Running", now),
                    ],
                }
            },
        )

    # -- for tests -----------------------------------------------------------------------------
    def experiment(self, namespace: str, name: str, *, parallel: int, max_trials: int) -> None:
        """Create an experiment (the CRDs must be served: the ``cluster`` fixture installs
        them)."""
        body = experiment_body(name, parallel=parallel, max_trials=max_trials)
        self.cluster.custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "experiments", body
        )

    def trials(self, namespace: str, experiment: str) -> dict[str, dict[str, Any]]:
        """The experiment's Trials by name."""
        listed = self.cluster.custom.list_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            "trials",
            label_selector=f"katib.kubeflow.org/experiment={experiment}",
        )
        items = custom_json(listed)["items"]
        return {t["metadata"]["name"]: t for t in items}

    def runs(self, namespace: str, experiment: str, count: int) -> bool:
        """Whether ``count`` of the experiment's trials run (:meth:`running`)."""
        return len(self.running(namespace, experiment)) == count

    def running(self, namespace: str, experiment: str) -> set[str]:
        """Names of the experiment's trials marked Running and not finished."""
        return {
            n
            for n, t in self.trials(namespace, experiment).items()
            if _has(t, "Running") and not _has(t, "Succeeded")
        }

    def finish(self, namespace: str, trial: str) -> None:
        """Mark a trial Succeeded, as its Trial controller would when its job completes."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.cluster.custom.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            namespace,
            "trials",
            trial,
            {
                "status": {
                    "completionTime": now,
                    "conditions": [
                        _condition("Created", now),
                        _condition("Running", now, status="False"),
                        _condition("Succeeded", now),
                    ],
                }
            },
        )


def _condition(kind: str, now: str, *, status: str = "True") -> dict[str, str]:
    return {
        "type": kind,
        "status": status,
        "reason": f"Trial{kind}",
        "message": "set by the test's stand-in Trial controller",
        "lastUpdateTime": now,
        "lastTransitionTime": now,
    }


def _has(trial: dict[str, Any], kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True"
        for c in (trial.get("status") or {}).get("conditions") or []
    )


@contextlib.contextmanager
def running_katib(
    *, control_plane: TestCluster, cluster: Cluster, log_path: Path
) -> Iterator[Katib]:
    """Katib's controller and stand-ins for the block."""
    katib = Katib(control_plane=control_plane, cluster=cluster, log_path=log_path)
    katib.start()
    try:
        katib.wait_quota_counts_trials()
        yield katib
    finally:
        katib.stop()


def experiment(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    """Experiment ``ns/name`` as JSON."""
    exp = custom_json(
        cluster.custom.get_namespaced_custom_object(GROUP, VERSION, ns, "experiments", name)
    )
    return exp


def started_trials(katib: Katib, ns: str, name: str, running: int) -> dict[str, str]:
    """Wait until ``running`` trials run; their names -> UIDs."""
    wait_until(
        f"{running} running trials",
        lambda: katib.runs(ns, name, running),
        timeout=30,
        detail=katib.log_tail,
    )
    return {n: t["metadata"]["uid"] for n, t in katib.trials(ns, name).items()}


def quota_refusals(katib: Katib, ns: str) -> int:
    """Trial creations Katib's controller logged as refused by an enforced ResourceQuota in
    ``ns``: "exceeded quota" (k8s.io/apiserver resourcequota ``CheckRequest``), not "status
    unknown for quota", which a quota the quota controller has not counted yet answers."""
    return sum(
        1
        for line in katib.log().splitlines()
        if "Trial create error" in line and "exceeded quota" in line and ns in line
    )


def nodeguard_command() -> list[str]:
    """The ``nodeguard`` command of this interpreter."""
    return [sys.executable, "-m", "nodeguard"]
