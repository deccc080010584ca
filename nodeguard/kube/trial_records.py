"""Where a Katib trial's memory is recorded in the cluster: a ConfigMap beside the Trial.

One ConfigMap a Trial, ``nodeguard-memory-<trial>`` in the Trial's namespace, owned by the
Trial (a plain, non-controller ``ownerReference``: the garbage collector deletes it with the
Trial) and labelled with the experiment and the trial. Its ``data`` has one key a trial pod
(the pod's name) whose value is that pod's record as JSON
(:mod:`nodeguard.remediation.trial_memory`). Each agent writes the keys of its own node's pods
with a JSON merge patch, which replaces those keys alone (RFC 7386), so the agents of a
distributed trial's nodes never overwrite each other, and writing the same record again
changes nothing.

Why not an annotation on the Trial: Katib's Trial controller watches Trials with no
predicate (``pkg/controller.v1beta1/trial/trial_controller.go``: ``c.Watch(source.Kind(...
&trialsv1beta1.Trial{}, &handler.TypedEnqueueRequestForObject...))``) and the Experiment
controller watches them through their controller owner (``experiment_controller.go``,
``handler.TypedEnqueueRequestForOwner ... OnlyControllerOwner()``), so every annotation write
would reconcile the Trial and its Experiment. Katib watches no ConfigMap (the Trial
controller's other watches are the trial job kinds, by controller owner only), so a write here
triggers nothing in it, and Katib never writes it, so nothing overwrites it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from nodeguard.kube.calls import JSON, MERGE_PATCH
from nodeguard.kube.client import KubeClient
from nodeguard.kube.errors import Conflict, NotFound

__all__ = [
    "EXPERIMENT_LABEL",
    "TRIAL_LABEL",
    "TrialGone",
    "TrialRecords",
    "record_name",
]

GROUP, VERSION = "kubeflow.org", "v1beta1"
#: The labels of the records' ConfigMaps (nodeguard's own keys: Katib selects pods and Trials
#: by ``katib.kubeflow.org/*``, and a ConfigMap must match none of its selectors).
EXPERIMENT_LABEL = "nodeguard.io/katib-experiment"
TRIAL_LABEL = "nodeguard.io/katib-trial"
_PREFIX = "nodeguard-memory-"
_MAX_NAME = 253  # a ConfigMap's name is a DNS subdomain


class TrialGone(LookupError):
    """The Trial no longer exists: its record has nowhere to go (a ``LookupError``, which is
    what :mod:`nodeguard.remediation.trial_memory` takes it as)."""


def record_name(trial: str) -> str:
    """The ConfigMap's name for ``trial``: ``nodeguard-memory-<trial>``, or, where that is
    over 253 characters, cut with a digest of the whole trial name."""
    name = _PREFIX + trial
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(trial.encode()).hexdigest()[:10]
    return f"{name[: _MAX_NAME - 11]}-{digest}"


def _label_value(value: str) -> str:
    """A label value is at most 63 characters: a longer name is cut and a digest added."""
    if len(value) <= 63:
        return value
    return f"{value[:52]}-{hashlib.sha256(value.encode()).hexdigest()[:10]}"


class TrialRecords:
    """Writes and reads the records (module docstring) through ``kube``."""

    def __init__(self, *, kube: KubeClient) -> None:
        self._kube = kube

    async def put(
        self, *, namespace: str, trial: str, experiment: str, pod: str, record: Mapping[str, Any]
    ) -> None:
        """Write ``record`` as the value of key ``pod``. Raises :class:`TrialGone` when the
        Trial is gone, or a :mod:`nodeguard.kube.errors` type when the API fails."""
        try:
            owner = await self._kube.get_custom(
                group=GROUP, version=VERSION, plural="trials", namespace=namespace, name=trial
            )
        except NotFound as exc:
            raise TrialGone(f"Trial {namespace}/{trial} is gone") from exc
        body: JSON = {
            "metadata": {
                "name": record_name(trial),
                "labels": {
                    EXPERIMENT_LABEL: _label_value(experiment),
                    TRIAL_LABEL: _label_value(trial),
                    "app.kubernetes.io/managed-by": "nodeguard",
                },
                "ownerReferences": [
                    {
                        "apiVersion": f"{GROUP}/{VERSION}",
                        "kind": "Trial",
                        "name": trial,
                        "uid": owner["metadata"]["uid"],
                    }
                ],
            },
            "data": {pod: json.dumps(dict(record), sort_keys=True, separators=(",", ":"))},
        }
        core, name = self._kube.core, record_name(trial)
        try:
            await self._kube.write(
                core.patch_namespaced_config_map, name, namespace, body, _content_type=MERGE_PATCH
            )
            return
        except NotFound:
            pass
        try:
            await self._kube.write(core.create_namespaced_config_map, namespace, body)
        except Conflict:  # another node's agent made it first: add this pod's key to it
            await self._kube.write(
                core.patch_namespaced_config_map, name, namespace, body, _content_type=MERGE_PATCH
            )

    async def read(self, *, namespace: str, experiment: str) -> dict[str, dict[str, Any]]:
        """Every record of the experiment's trials: trial name -> pod name -> record. A value
        that is not a JSON object is left out."""
        listed = await self._kube.read(
            self._kube.core.list_namespaced_config_map,
            namespace,
            label_selector=f"{EXPERIMENT_LABEL}={_label_value(experiment)}",
        )
        out: dict[str, dict[str, Any]] = {}
        for cm in listed.get("items") or []:
            meta = cm.get("metadata") or {}
            if (meta.get("labels") or {}).get("app.kubernetes.io/managed-by") != "nodeguard":
                continue  # a ConfigMap that only looks like a record
            owners = meta.get("ownerReferences") or []
            trial = next((o.get("name") for o in owners if o.get("kind") == "Trial"), None)
            if not isinstance(trial, str):
                continue
            for pod, text in (cm.get("data") or {}).items():
                try:
                    value = json.loads(text)
                except ValueError:
                    continue
                if isinstance(value, dict):
                    out.setdefault(trial, {})[pod] = value
        return out
