"""Reading Katib Experiments for check ``katib-fit``: ``list`` on ``experiments.kubeflow.org``
(``v1beta1``) through :meth:`~nodeguard.kube.client.KubeClient.list_custom`, every namespace
or each ``--namespace``, turned into :mod:`nodeguard.doctor.katib_inputs` by pure functions.

A cluster without the Katib CRD answers 404: no experiments, and one note. A 403 (the
optional ClusterRole of docs/doctor-rbac.yaml not bound) is a note too.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from nodeguard.doctor.katib_inputs import (
    ExperimentView,
    KatibInputs,
    NodeLabels,
    ParameterView,
    TrialParameterView,
)
from nodeguard.kube.client import KubeClient
from nodeguard.kube.errors import Forbidden, NotFound

__all__ = ["experiment_view", "read_katib"]

JSON = dict[str, Any]
GROUP, VERSION, PLURAL = "kubeflow.org", "v1beta1", "experiments"
#: kubeflow/katib pkg/apis/controller/experiments/v1beta1/constants.go
#: ``DefaultTrialParallelCount``, set by experiment_defaults.go ``setDefaultParallelTrialCount``
#: (the mutating webhook) when ``spec.parallelTrialCount`` is unset.
DEFAULT_PARALLEL_TRIAL_COUNT = 3


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def experiment_view(experiment: JSON) -> ExperimentView:
    """An :class:`ExperimentView` from an Experiment object."""
    meta, spec = experiment.get("metadata") or {}, experiment.get("spec") or {}
    template = spec.get("trialTemplate") or {}
    count = spec.get("parallelTrialCount")
    trial_spec = template.get("trialSpec")
    return ExperimentView(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        parallel_trial_count=int(count) if count is not None else DEFAULT_PARALLEL_TRIAL_COUNT,
        parameters=tuple(
            ParameterView(
                name=p.get("name", ""),
                type=p.get("parameterType", ""),
                values=tuple(str(v) for v in (p.get("feasibleSpace") or {}).get("list") or []),
                min=_text((p.get("feasibleSpace") or {}).get("min")),
                max=_text((p.get("feasibleSpace") or {}).get("max")),
                step=_text((p.get("feasibleSpace") or {}).get("step")),
            )
            for p in spec.get("parameters") or []
        ),
        trial_parameters=tuple(
            TrialParameterView(name=t.get("name", ""), reference=t.get("reference", ""))
            for t in template.get("trialParameters") or []
        ),
        trial_spec=json.dumps(trial_spec) if isinstance(trial_spec, dict) else None,
        finished=any(
            c.get("type") in ("Succeeded", "Failed") and c.get("status") == "True"
            for c in (experiment.get("status") or {}).get("conditions") or []
            if isinstance(c, dict)
        ),
    )


def node_labels(node: JSON) -> NodeLabels:
    """A :class:`NodeLabels` from a Node object."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    return NodeLabels(node=meta.get("name", ""), labels=tuple(sorted(labels.items())))


async def read_katib(
    kube: KubeClient, *, namespaces: Sequence[str], nodes: Sequence[JSON]
) -> tuple[KatibInputs, tuple[str, ...]]:
    """The experiments of ``namespaces`` (empty: every namespace) and the labels of
    ``nodes``, and the notes. Raises :mod:`nodeguard.kube.errors` other than forbidden and
    not found."""
    docs: list[JSON] = []
    note = ""
    targets: list[str | None] = [*namespaces] or [None]
    for ns in targets:
        try:
            docs += await kube.list_custom(
                group=GROUP, version=VERSION, plural=PLURAL, namespace=ns
            )
        except NotFound:
            note = "no Katib Experiment CRD (experiments.kubeflow.org): katib-fit not checked"
            break
        except Forbidden:
            note = (
                "Katib Experiments were not read (list experiments.kubeflow.org forbidden): "
                "katib-fit not checked; bind nodeguard-doctor (docs/doctor-rbac.yaml)"
            )
            break
    inputs = KatibInputs(
        experiments=tuple(experiment_view(d) for d in docs),
        node_labels=tuple(node_labels(n) for n in nodes),
    )
    return inputs, (note,) if note else ()
