"""The rule file schema (``apiVersion: nodeguard.io/v1alpha1``, ``kind: RuleSet``), in pydantic.

Unknown keys, unknown signals, unknown actions, bad action arguments, negative durations and
duplicate rule names are errors at load time, never at 3 a.m. when the rule trips. Example::

    apiVersion: nodeguard.io/v1alpha1
    kind: RuleSet
    spec:
      rules:
        - name: node-memory-low
          scope: node
          when:
            - {signal: node_memory_available_ratio, op: "<", value: 0.05}
          for: 1m
          clear:
            - {signal: node_memory_available_ratio, op: ">=", value: 0.10}
          cooldown: 5m
          maxFirings: {count: 3, window: 1h}
          actions:
            - action: cordon
            - action: evict
              args: {free: "5%", maxPriority: 1000}
          resolve:
            - action: uncordon
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PositiveInt,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from nodeguard.actions.registry import ACTIONS, ArgumentError
from nodeguard.fields import did_you_mean
from nodeguard.firing import Step
from nodeguard.kube.objects import parse_bytes
from nodeguard.rules.signals import SIGNALS, Scope
from nodeguard.units import parse_duration

__all__ = [
    "API_VERSION",
    "ActionSpec",
    "AlertRule",
    "Condition",
    "Rule",
    "RuleFile",
]

API_VERSION = "nodeguard.io/v1alpha1"


Duration = Annotated[float, BeforeValidator(parse_duration)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


_UNIT_WORDS = {"ratio": "a ratio", "bytes": "in bytes", "seconds": "in seconds", "count": "a count"}


_COMPARE: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}


# What people write for the four comparisons; each gets the one it surely means. Equality is
# not offered: a sampled value (bytes, a ratio) is almost never exactly the threshold.
_OP_TYPOS = {
    "=>": "did you mean '>='?",
    "=<": "did you mean '<='?",
    "≥": "did you mean '>='?",
    "≤": "did you mean '<='?",
    "gt": "did you mean '>'?",
    "ge": "did you mean '>='?",
    "gte": "did you mean '>='?",
    "lt": "did you mean '<'?",
    "le": "did you mean '<='?",
    "lte": "did you mean '<='?",
    "==": "a sampled value is almost never exactly the threshold: use '>=' or '<='",
    "=": "a sampled value is almost never exactly the threshold: use '>=' or '<='",
    "!=": "a sampled value is almost never exactly the threshold: use '>' or '<'",
}


def _known_scope(scope: Any) -> Any:
    """A scope that is not one of :data:`Scope`'s, with the closest named."""
    allowed = get_args(Scope)
    if isinstance(scope, str) and scope not in allowed:
        raise ValueError(
            f"unknown scope {scope!r}{did_you_mean(scope, allowed)} (one of: {', '.join(allowed)})"
        )
    return scope


class Condition(_Strict):
    """``signal op value``: for example ``node_memory_available_ratio < 0.05``. The value is in
    the signal's unit (a ``bytes`` signal also takes a quantity such as ``8Gi``, a ``seconds``
    signal a duration such as ``5m``) and within its declared range: a threshold that can
    never trip (``ratio < -0.05``, a ratio compared with 30) is a load error."""

    signal: str
    op: Literal[">", ">=", "<", "<="]
    value: float = Field(allow_inf_nan=False)

    @field_validator("signal")
    @classmethod
    def _known(cls, name: str) -> str:
        if name not in SIGNALS:
            close = did_you_mean(name, SIGNALS)
            raise ValueError(
                f"unknown signal {name!r}{close} (known: {', '.join(sorted(SIGNALS))})"
            )
        return name

    @field_validator("op", mode="before")
    @classmethod
    def _known_op(cls, op: Any) -> Any:
        if isinstance(op, str) and op.strip() in _OP_TYPOS:
            raise ValueError(f"{op.strip()!r} is not a comparison: {_OP_TYPOS[op.strip()]}")
        return op

    @field_validator("value", mode="before")
    @classmethod
    def _in_unit(cls, value: Any, info: ValidationInfo) -> Any:
        sig = SIGNALS.get(info.data.get("signal", ""))
        if sig is None or not isinstance(value, str):
            return value
        if sig.unit == "ratio" and value.strip().endswith("%"):
            number = value.strip().removesuffix("%").strip()
            try:
                write = f"write {float(number) / 100:g}"
            except ValueError:
                write = "write 0.05 for 5 %"
            raise ValueError(f"{sig.name} is a ratio, not a percent: {write} for {value!r}")
        if sig.unit == "bytes":
            try:
                return parse_bytes(value.strip(), exact=True)
            except ValueError:
                raise ValueError(
                    f"{sig.name} is in bytes: {value!r} is not a quantity (8Gi, 500M, or bytes)"
                ) from None
        if sig.unit == "seconds":
            return parse_duration(value)
        return value

    @field_validator("value")
    @classmethod
    def _in_range(cls, value: float, info: ValidationInfo) -> float:
        sig = SIGNALS.get(info.data.get("signal", ""))
        op = info.data.get("op")
        if sig is None or op is None:
            return value
        valid = sig.valid
        where = f"{sig.name} is {_UNIT_WORDS.get(sig.unit, sig.unit)}, {valid}"
        shown = f"{value:.0f}" if sig.unit == "bytes" else f"{value:g}"
        if value not in valid:
            hint = " (a ratio: 5 % is 0.05)" if sig.unit == "ratio" and 1 < value <= 100 else ""
            never = (op in ("<", "<=") and value < valid.low) or (
                op in (">", ">=") and value > valid.high
            )
            verdict = "never holds" if never else "always holds"
            raise ValueError(f"{where}: {shown} is outside it, so the condition {verdict}{hint}")
        if (op == "<" and value == valid.low) or (op == ">" and value == valid.high):
            raise ValueError(f"{where}: {sig.name} {op} {shown} never holds")
        return value

    def holds(self, observed: float | None) -> bool:
        """Whether the observed value satisfies the condition; no data never does."""
        if observed is None:
            return False
        return _COMPARE[self.op](observed, self.value)

    def __str__(self) -> str:
        return f"{self.signal} {self.op} {self.value:g}"


class ActionSpec(_Strict):
    """One runbook step: an action by its registered name and its arguments, parsed at load
    time by the action's own argument model (:mod:`nodeguard.actions.registry`): an unknown
    action or a bad argument is a load error."""

    action: str
    args: dict[str, Any] = Field(default_factory=dict)
    _step: Step | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _check_args(self) -> ActionSpec:
        action = ACTIONS.get(self.action)
        if action is None:
            close = did_you_mean(self.action, ACTIONS)
            raise ValueError(
                f"unknown action {self.action!r}{close} (known: {', '.join(sorted(ACTIONS))})"
            )
        try:
            parsed = action.parse(self.args)
        except ArgumentError as exc:
            raise ValueError(str(exc)) from None
        self._step = Step(action=self.action, args=parsed)
        return self

    @property
    def step(self) -> Step:
        """The step to run: the action and its arguments, parsed when the file was loaded."""
        assert self._step is not None  # set by the validator of every instance
        return self._step


class RateLimit(_Strict):
    """At most ``count`` firings per ``window``."""

    count: PositiveInt
    window: Duration

    @field_validator("window")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("the window must be longer than 0s")
        return value


class Rule(_Strict):
    """A rule: when all ``when`` conditions hold for ``for`` on one target of ``scope``, it
    fires (once per target), runs ``actions`` in order, and stays firing until all ``clear``
    conditions hold (or, without ``clear``, until ``when`` no longer holds); then it runs
    ``resolve``. ``cooldown`` is the least time between two firings on one target;
    ``maxFirings`` caps firings over all targets; ``dryRun`` can only add dry run, never
    remove the global one."""

    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    description: str = ""
    scope: Annotated[Scope, BeforeValidator(_known_scope)]
    when: list[Condition] = Field(min_length=1)
    for_: Duration = Field(default=0.0, alias="for")
    clear: list[Condition] | None = Field(default=None, min_length=1)
    cooldown: Duration = 300.0
    max_firings: RateLimit | None = Field(default=None, alias="maxFirings")
    dry_run: bool | None = Field(default=None, alias="dryRun")
    actions: list[ActionSpec] = Field(min_length=1)
    resolve: list[ActionSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _scopes_match(self) -> Rule:
        for cond in [*self.when, *(self.clear or [])]:
            scope = SIGNALS[cond.signal].scope
            if scope != self.scope:
                raise ValueError(
                    f"signal {cond.signal!r} is a {scope} signal, but the rule's scope is "
                    f"{self.scope}"
                )
        return self


class AlertRule(_Strict):
    """Maps an Alertmanager alert to actions: ``alertname`` plus label ``matchers`` (all equal;
    ``"*"`` only requires the label). A firing alert runs ``actions`` on the node named by the
    alert's node label (default ``node``), on the pod named by ``namespace``/``pod`` where the
    alert has them; a resolved alert runs ``resolve`` (the undo: uncordon, resume_katib), if
    any."""

    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    description: str = ""
    alertname: str = Field(min_length=1)
    matchers: dict[str, str] = Field(default_factory=dict)
    dry_run: bool | None = Field(default=None, alias="dryRun")
    actions: list[ActionSpec] = Field(min_length=1)
    resolve: list[ActionSpec] = Field(default_factory=list)

    def matches(self, labels: dict[str, str]) -> bool:
        """Whether an alert's labels select this rule."""
        if labels.get("alertname") != self.alertname:
            return False
        return all(
            k in labels if v == "*" else labels.get(k) == v for k, v in self.matchers.items()
        )


class _Metadata(_Strict):
    name: str = ""
    description: str = ""


class _Spec(_Strict):
    # Unique names are checked by the loader, which can point at the duplicate's line.
    rules: list[Rule] = Field(default_factory=list)
    alerts: list[AlertRule] = Field(default_factory=list)


def _known_api(value: Any) -> Any:
    if isinstance(value, str) and value != API_VERSION:
        raise ValueError(f"unknown apiVersion {value!r}: this nodeguard reads {API_VERSION}")
    return value


def _known_kind(value: Any) -> Any:
    if isinstance(value, str) and value != "RuleSet":
        raise ValueError(f"unknown kind {value!r}: a rule file is kind RuleSet")
    return value


class RuleFile(_Strict):
    """A whole rule file."""

    api_version: Annotated[Literal["nodeguard.io/v1alpha1"], BeforeValidator(_known_api)] = Field(
        alias="apiVersion"
    )
    kind: Annotated[Literal["RuleSet"], BeforeValidator(_known_kind)]
    metadata: _Metadata = Field(default_factory=_Metadata)
    spec: _Spec
    _lines: list[int] = PrivateAttr(default_factory=list)
    _hints: list[str] = PrivateAttr(default_factory=list)

    def set_hints(self, hints: list[str]) -> None:
        """The warnings of :func:`nodeguard.rules.hints.rule_hints` for this file."""
        self._hints = hints

    def hints(self) -> list[str]:
        """Warnings: the file loads, but probably does not say what was meant."""
        return list(self._hints)

    def set_name_lines(self, lines: list[int]) -> None:
        """Where each name is in the file (rules, then alert rules), for messages."""
        self._lines = lines

    def name_lines(self) -> list[int]:
        """The line of each rule's, then each alert rule's name (1 when not known)."""
        count = len(self.spec.rules) + len(self.spec.alerts)
        return self._lines if len(self._lines) == count else [1] * count
