"""What check ``katib-fit`` reads: Katib Experiments (``kubeflow.org/v1beta1``, plural
``experiments``) as plain, frozen types, parsed by :mod:`nodeguard.doctor.read_katib`.

The fields are those of kubeflow/katib pkg/apis/controller/experiments/v1beta1
(experiment_types.go): ``spec.parallelTrialCount``, ``spec.parameters[]`` (``name``,
``parameterType``, ``feasibleSpace``) and ``spec.trialTemplate`` (``trialParameters[]`` with
``name`` and ``reference``; ``trialSpec``). The trial spec is kept as the JSON text Katib
substitutes into (pkg/controller.v1beta1/experiment/manifest/generator.go ``applyParameters``
replaces ``${trialParameters.<name>}`` in the serialized template, then parses it).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ExperimentView", "KatibInputs", "NodeLabels", "ParameterView", "TrialParameterView"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ParameterView:
    """One ``spec.parameters[]`` entry: its ``parameterType`` (``int``, ``double``,
    ``discrete``, ``categorical``) and ``feasibleSpace`` (``list``, ``min``, ``max``,
    ``step``, as the strings the API stores; ``None``: not set)."""

    name: str
    type: str
    values: tuple[str, ...] = ()
    min: str | None = None
    max: str | None = None
    step: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialParameterView:
    """One ``spec.trialTemplate.trialParameters[]`` entry: the placeholder ``name``
    (``${trialParameters.<name>}``) and the experiment parameter it takes its value from
    (``reference``)."""

    name: str
    reference: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ExperimentView:
    """A Katib Experiment: ``parallel_trial_count`` as Katib runs it (the default, 3, when
    unset), its parameters and trial parameters, and ``trial_spec`` (the
    ``trialTemplate.trialSpec`` as JSON text; ``None`` when the template comes from a
    ConfigMap, ``trialTemplate.configMap``, which the doctor does not read); ``finished``: a
    ``Succeeded`` or ``Failed`` condition is true (it starts no more trials)."""

    namespace: str
    name: str
    parallel_trial_count: int
    parameters: tuple[ParameterView, ...]
    trial_parameters: tuple[TrialParameterView, ...]
    trial_spec: str | None
    finished: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeLabels:
    """A node's ``metadata.labels``, for a trial template's ``nodeSelector``."""

    node: str
    labels: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class KatibInputs:
    """The experiments in scope, and the labels of the nodes in scope."""

    experiments: tuple[ExperimentView, ...] = ()
    node_labels: tuple[NodeLabels, ...] = ()

    def labels_of(self, node: str) -> dict[str, str]:
        """``node``'s labels (empty when not known)."""
        return next((dict(n.labels) for n in self.node_labels if n.node == node), {})
