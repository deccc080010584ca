"""What a Katib experiment's trials really needed, by hyperparameter: the rows of
``nodeguard trials``, the spread of their peaks by each parameter's values, and a request and
limit for each value of the parameter that explains the memory.

A trial's *need* is the largest peak working set of its pods (the records the agents write,
:mod:`nodeguard.remediation.trial_memory`); a trial the kernel OOM-killed needed more than its
limit, by an amount no sample can tell, so its need is taken as :data:`OOM_GUESS` times that
limit and marked not measured. A parameter *explains* the memory by the share of the needs'
variance between its values' groups (eta squared: between-group sum of squares over the total):
at least :data:`EXPLAINS` of it, judged only where the parameter has fewer values than the
trials measured (a parameter with a value per trial, a ``double`` learning rate, explains
everything and nothing). The recommendation for a group: request = need + :data:`REQUEST_ROOM`,
limit = need + :data:`LIMIT_ROOM`, both rounded up to 64 MiB.

Katib puts a parameter's value into the trial template as text (``${trialParameters.X}``,
``applyParameters`` in ``pkg/controller.v1beta1/experiment/manifest/generator.go``) and cannot
compute a memory from a batch size, so values that need different memory are written as
Experiments of their own, each with the parameter's ``feasibleSpace`` cut to its values
(:func:`fragment`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

__all__ = [
    "EXPLAINS",
    "LIMIT_ROOM",
    "NEAR_LIMIT",
    "OOM_GUESS",
    "REQUEST_ROOM",
    "Group",
    "Spread",
    "TrialRow",
    "fragment",
    "quantity",
    "rows",
    "spreads",
]

OOM_GUESS = 1.5
EXPLAINS = 0.5
REQUEST_ROOM = 0.10
LIMIT_ROOM = 0.30
#: A trial whose peak is within 10 % of its limit is flagged.
NEAR_LIMIT = 0.9
_ROUND = 64 << 20
_OUTCOMES = ("Succeeded", "Failed", "EarlyStopped", "MetricsUnavailable", "Killed", "Running")


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialRow:
    """One Trial: ``parameters`` (``spec.parameterAssignments``), ``outcome`` (the first of
    its true ``status.conditions`` of :data:`_OUTCOMES`, else ``Created``/``""``), and its pods'
    records summed up: the largest peaks (bytes), the smallest limit, the largest request,
    the OOM kills summed; ``pods`` 0 when no agent recorded one."""

    name: str
    parameters: Mapping[str, str]
    outcome: str
    pods: int = 0
    peak_working_set_bytes: int | None = None
    peak_anon_bytes: int | None = None
    kernel_peak_bytes: int | None = None
    limit_bytes: int | None = None
    request_bytes: int | None = None
    oom_kills: int = 0

    @property
    def flag(self) -> str:
        """``OOM-killed``, ``near limit`` (peak at least 90 % of the limit) or ``""``."""
        if self.oom_kills:
            return "OOM-killed"
        peak, limit = self.peak_working_set_bytes, self.limit_bytes
        if peak is not None and limit and peak >= NEAR_LIMIT * limit:
            return "near limit"
        return ""

    @property
    def need_bytes(self) -> int | None:
        """What it needed (module docstring); ``None`` when nothing was recorded."""
        if self.oom_kills and self.limit_bytes:
            return int(self.limit_bytes * OOM_GUESS)
        return self.peak_working_set_bytes


def _outcome(trial: Mapping[str, Any]) -> str:
    conditions = (trial.get("status") or {}).get("conditions") or []
    true = {c.get("type") for c in conditions if c.get("status") == "True"}
    return next((o for o in _OUTCOMES if o in true), "Created" if "Created" in true else "")


def rows(
    trials: Sequence[Mapping[str, Any]], records: Mapping[str, Mapping[str, Mapping[str, Any]]]
) -> list[TrialRow]:
    """One row a Trial (by name), its pods' ``records`` (trial -> pod -> record) joined."""
    out = []
    for t in sorted(trials, key=lambda t: str((t.get("metadata") or {}).get("name"))):
        name = str(t["metadata"]["name"])
        params = {
            str(a.get("name")): str(a.get("value"))
            for a in (t.get("spec") or {}).get("parameterAssignments") or []
        }
        pods = list((records.get(name) or {}).values())

        def most(key: str, pods: list[Mapping[str, Any]] = pods) -> int | None:
            values = [p[key] for p in pods if isinstance(p.get(key), int)]
            return max(values) if values else None

        limits = [p["limit_bytes"] for p in pods if isinstance(p.get("limit_bytes"), int)]
        out.append(
            TrialRow(
                name=name,
                parameters=params,
                outcome=_outcome(t),
                pods=len(pods),
                peak_working_set_bytes=most("peak_working_set_bytes"),
                peak_anon_bytes=most("peak_anon_bytes"),
                kernel_peak_bytes=most("kernel_peak_bytes"),
                limit_bytes=min(limits) if limits else None,
                request_bytes=most("request_bytes"),
                oom_kills=sum(int(p.get("oom_kills") or 0) for p in pods),
            )
        )
    return out


def quantity(value: int) -> str:
    """Bytes as a Kubernetes quantity: ``Gi`` where whole, else ``Mi`` (rounded up)."""
    if value % (1 << 30) == 0:
        return f"{value >> 30}Gi"
    return f"{math.ceil(value / (1 << 20))}Mi"


def _round_up(value: float) -> int:
    return int(math.ceil(value / _ROUND) * _ROUND)


@dataclass(frozen=True, slots=True, kw_only=True)
class Group:
    """The trials with one value of a parameter: their count, the smallest and largest need
    (bytes), whether every need was measured (none OOM-killed), and the recommendation."""

    value: str
    trials: int
    least_bytes: int
    most_bytes: int
    measured: bool
    request_bytes: int
    limit_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Spread:
    """One parameter's groups (in the order of their values, numbers numerically) and the
    share of the needs' variance it explains (0..1)."""

    parameter: str
    groups: list[Group] = field(default_factory=list)
    explained: float = 0.0

    @property
    def explains(self) -> bool:
        """Whether it explains the memory (module docstring)."""
        return self.explained >= EXPLAINS


def _key(value: str) -> tuple[int, float, str]:
    try:
        return (0, float(value), value)
    except ValueError:
        return (1, 0.0, value)


def _group(value: str, members: list[TrialRow]) -> Group:
    needs = [r.need_bytes for r in members if r.need_bytes is not None]
    most = max(needs)
    return Group(
        value=value,
        trials=len(members),
        least_bytes=min(needs),
        most_bytes=most,
        measured=not any(r.oom_kills for r in members),
        request_bytes=_round_up(most * (1 + REQUEST_ROOM)),
        limit_bytes=_round_up(most * (1 + LIMIT_ROOM)),
    )


def spreads(measured: Sequence[TrialRow]) -> list[Spread]:
    """Each parameter's :class:`Spread` over the trials with a need, best explaining first;
    with none measured, ``[]``."""
    have = [r for r in measured if r.need_bytes is not None]
    if not have:
        return []
    mean = sum(r.need_bytes or 0 for r in have) / len(have)
    total = sum(((r.need_bytes or 0) - mean) ** 2 for r in have)
    out = []
    for name in sorted({p for r in have for p in r.parameters}):
        by: dict[str, list[TrialRow]] = {}
        for r in have:
            by.setdefault(r.parameters.get(name, ""), []).append(r)
        between = sum(
            len(m) * (sum(r.need_bytes or 0 for r in m) / len(m) - mean) ** 2 for m in by.values()
        )
        judged = 1 < len(by) < len(have) and total > 0
        groups = [_group(v, by[v]) for v in sorted(by, key=_key)]
        out.append(
            Spread(parameter=name, groups=groups, explained=between / total if judged else 0.0)
        )
    return sorted(out, key=lambda s: -s.explained)


def fragment(
    *, experiment: str, spread: Spread | None, every: Sequence[TrialRow], spec: Mapping[str, Any]
) -> str:
    """The YAML a user pastes (module docstring), from the Experiment's ``spec``: one
    document a memory class of ``spread``'s values, each the Experiment's ``parameters`` with
    that parameter's ``feasibleSpace`` cut to the class's values and its ``trialTemplate``
    with the primary container's memory request and limit set; where no parameter explains
    the memory, one document with the request and limit that fit every trial (``every``'s
    largest need). A template kept in a ConfigMap is not read: the resources are written as
    a comment for it."""
    head = f"# nodeguard trials {experiment}: memory by what the trials used"
    measured = [r for r in every if r.need_bytes is not None]
    if not measured:
        return f"{head}\n# no trial's memory is recorded yet\n"
    if spread is None or not spread.explains:
        g = _group("", measured)
        why = "# no parameter explains the spread: one request and limit fits every trial"
        doc = _document(spec, request=g.request_bytes, limit=g.limit_bytes)
        return f"{head}\n{why}\n{doc}"
    classes: dict[tuple[int, int], list[Group]] = {}
    for g in spread.groups:
        classes.setdefault((g.request_bytes, g.limit_bytes), []).append(g)
    out = [
        head,
        f"# {spread.parameter} explains {spread.explained:.0%} of the spread. Katib puts a "
        "value into the",
        "# template as text and cannot derive a memory from it: one Experiment a class.",
    ]
    for (request, limit), groups in classes.items():
        values = [g.value for g in groups]
        guess = "" if all(g.measured for g in groups) else " (OOM-killed: a guess, rerun)"
        out += [
            "---",
            f"# {spread.parameter} {', '.join(values)}: request {quantity(request)}, "
            f"limit {quantity(limit)}{guess}",
            _document(
                spec, request=request, limit=limit, parameter=spread.parameter, values=values
            ).rstrip("\n"),
        ]
    return "\n".join(out) + "\n"


def _document(
    spec: Mapping[str, Any],
    *,
    request: int,
    limit: int,
    parameter: str | None = None,
    values: Sequence[str] = (),
) -> str:
    """``spec: {parameters, trialTemplate}`` of one memory class, as YAML."""
    params = copy.deepcopy(list(spec.get("parameters") or []))
    if parameter is not None:
        p = next((p for p in params if p.get("name") == parameter), None)
        if p is None:  # assigned to the trials, but no longer in the Experiment
            p = {"name": parameter}
            params.append(p)
        numeric = all(_key(v)[0] == 0 for v in values)
        # Katib's feasibleSpace.list is read for categorical and discrete parameters only.
        p["parameterType"] = "discrete" if numeric else "categorical"
        p["feasibleSpace"] = {"list": list(values)}
    template = copy.deepcopy(dict(spec.get("trialTemplate") or {}))
    primary = str(template.get("primaryContainerName") or "")
    resources = {"requests": {"memory": quantity(request)}, "limits": {"memory": quantity(limit)}}
    found = _set_memory(template.get("trialSpec"), name=primary, resources=resources)
    body: dict[str, Any] = {"parameters": params} if parameter else {}
    text = ""
    if found:
        body["trialTemplate"] = template
    else:
        text = (
            f"# the trial template is not in the Experiment: in its container {primary or '?'}"
            f" set resources {{requests: {{memory: {quantity(request)}}}, limits: "
            f"{{memory: {quantity(limit)}}}}}\n"
        )
    if body:
        text += yaml.safe_dump({"spec": body}, sort_keys=False, width=100)
    return text


def _set_memory(node: Any, *, name: str, resources: Mapping[str, Any]) -> bool:
    """Set the memory of every container named ``name`` in ``node`` (a trial spec: a Job's,
    a PyTorchJob's replicas', ...), its other resources kept; whether one was found."""
    found = False
    if isinstance(node, dict):
        for c in node.get("containers") or []:
            if isinstance(c, dict) and c.get("name") == name:
                res = c.setdefault("resources", {})
                for kind in ("requests", "limits"):
                    res.setdefault(kind, {})["memory"] = resources[kind]["memory"]
                found = True
        for key, value in node.items():
            if key != "containers":
                found |= _set_memory(value, name=name, resources=resources)
    elif isinstance(node, list):
        for value in node:
            found |= _set_memory(value, name=name, resources=resources)
    return found
