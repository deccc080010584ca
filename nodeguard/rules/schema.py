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

import math
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PositiveInt,
    PrivateAttr,
    field_validator,
    model_validator,
)

from nodeguard.actions.registry import ACTIONS, ArgumentError
from nodeguard.firing import Step
from nodeguard.rules.signals import SIGNALS, Scope

__all__ = [
    "API_VERSION",
    "ActionSpec",
    "AlertRule",
    "Condition",
    "Rule",
    "RuleFile",
    "parse_duration",
]

API_VERSION = "nodeguard.io/v1alpha1"
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
# Anchored and unambiguous (each part ends in a unit), so a match costs linear time; the
# unanchored search of each part from every position was quadratic in the length, and a
# 60,000-digit `for:` held the event loop for 92 s.
_WHOLE = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
#: Characters of a duration string: ``1d23h59m59s999ms`` is 16.
MAX_DURATION_CHARS = 32


def _shown(value: Any) -> str:
    """A value for an error message, cut to 40 characters (the value may be huge)."""
    text = repr(value) if isinstance(value, str | int | float) else type(value).__name__
    return text if len(text) <= 40 else f"{text[:37]}..."


def parse_duration(value: Any) -> float:
    """``"90s"``, ``"1m30s"``, ``"500ms"``, ``"2h"`` or a number of seconds, as seconds.
    Raises ``ValueError`` for anything else: a negative or non-finite duration (``.nan`` or
    ``.inf`` would switch timing off), a string over :data:`MAX_DURATION_CHARS` characters."""
    if isinstance(value, bool):
        raise ValueError("a duration, not a boolean")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        if text.startswith("-"):
            raise ValueError(f"negative duration {_shown(value)}")
        if len(text) > MAX_DURATION_CHARS:
            raise ValueError(
                f"not a duration: {len(text)} characters (at most {MAX_DURATION_CHARS})"
            )
        if not _WHOLE.fullmatch(text):
            raise ValueError(f"not a duration: {_shown(value)} (use e.g. 30s, 5m, 1h30m)")
        seconds = sum(float(m.group(1)) * _UNIT[m.group(2)] for m in _PART.finditer(text))
    else:
        raise ValueError(f"not a duration: {_shown(value)}")
    if not math.isfinite(seconds):
        raise ValueError(f"not a finite duration: {_shown(value)}")
    if seconds < 0:
        raise ValueError(f"negative duration {_shown(value)}")
    return seconds


Duration = Annotated[float, BeforeValidator(parse_duration)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Condition(_Strict):
    """``signal op value``: for example ``node_memory_available_ratio < 0.05``."""

    signal: str
    op: Literal[">", ">=", "<", "<="]
    value: float = Field(allow_inf_nan=False)

    @field_validator("signal")
    @classmethod
    def _known(cls, name: str) -> str:
        if name not in SIGNALS:
            raise ValueError(f"unknown signal {name!r} (known: {', '.join(sorted(SIGNALS))})")
        return name

    def holds(self, observed: float | None) -> bool:
        """Whether the observed value satisfies the condition; no data never does."""
        if observed is None:
            return False
        return {
            ">": observed > self.value,
            ">=": observed >= self.value,
            "<": observed < self.value,
            "<=": observed <= self.value,
        }[self.op]

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
            raise ValueError(
                f"unknown action {self.action!r} (known: {', '.join(sorted(ACTIONS))})"
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
    scope: Scope
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


class RuleFile(_Strict):
    """A whole rule file."""

    api_version: Literal["nodeguard.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["RuleSet"]
    metadata: _Metadata = Field(default_factory=_Metadata)
    spec: _Spec
