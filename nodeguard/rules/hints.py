"""Warnings for rule files that load but probably do not say what their author meant.

``nodeguard check`` prints them and exits 0; the agent logs them when it loads the file. Two
kinds, each cheap to get wrong and silent at run time:

- a duration without a unit (``for: 30``, ``cooldown: 5``, ``maxFirings.window: 10``): read as
  seconds, where ``5`` meant five minutes as often as five seconds;
- a byte threshold below 1 MiB (``value: 512`` on an amount of memory, a ``bytes`` signal
  named ``*_bytes``; rates per second are left alone): no container or node memory worth acting
  on is that small, so ``512`` is almost surely ``512Mi``. ``0`` is left
  alone (``> 0`` is a real condition).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from nodeguard.rules.safe_yaml import field_path
from nodeguard.rules.schema import Condition, RuleFile
from nodeguard.rules.signals import SIGNALS

__all__ = ["rule_hints"]

MiB = 1 << 20

LineOf = Callable[[Sequence[int | str]], int | None]


def rule_hints(
    *, path: str, rule_file: RuleFile, data: Mapping[str, Any], line_of: LineOf
) -> list[str]:
    """Each warning as ``FILE:LINE: FIELD: warning: message``, in file order. ``data`` is the
    file as parsed (before validation: only it still tells ``30`` from ``30s``); ``line_of``
    gives the line of a location in it."""
    out: list[str] = []

    def say(loc: list[int | str], message: str) -> None:
        out.append(f"{path}:{line_of(loc) or 1}: {field_path(loc)}: warning: {message}")

    raw_rules = data.get("spec", {}).get("rules", [])
    for i, (rule, raw) in enumerate(zip(rule_file.spec.rules, raw_rules, strict=False)):
        for loc, value in _durations(raw, at=["spec", "rules", i]):
            say(
                loc,
                f"{value:g} has no unit, so it is read as {value:g} seconds: write {value:g}s"
                f" (or 5m, 1h) to say so",
            )
        for key, conditions in (("when", rule.when), ("clear", rule.clear or [])):
            written: Any = raw.get(key) if isinstance(raw, Mapping) else None
            for j, cond in enumerate(conditions):
                given = written[j].get("value") if _item(written, j) else None
                # Only a bare number can be missing its unit: "512Ki" says what it means.
                hint = _small_bytes(cond) if _bare_number(given) else None
                if hint:
                    say(["spec", "rules", i, key, j, "value"], hint)
    return out


def _durations(raw: Any, *, at: list[int | str]) -> list[tuple[list[int | str], float]]:
    """The unitless durations of one raw rule: (location, number)."""
    if not isinstance(raw, Mapping):
        return []
    found: list[tuple[list[int | str], float]] = []
    limit = raw.get("maxFirings")
    for loc, value in (
        ([*at, "for"], raw.get("for")),
        ([*at, "cooldown"], raw.get("cooldown")),
        (
            [*at, "maxFirings", "window"],
            limit.get("window") if isinstance(limit, Mapping) else None,
        ),
    ):
        # A number, not a string: YAML's 30 (a string "30" was quoted on purpose). Zero needs no
        # unit.
        if isinstance(value, int | float) and not isinstance(value, bool) and value:
            found.append((loc, float(value)))
    return found


def _item(items: Any, index: int) -> bool:
    """Whether ``items`` is a list whose ``index`` is a mapping (the raw file may be anything)."""
    return isinstance(items, list) and index < len(items) and isinstance(items[index], Mapping)


def _bare_number(value: Any) -> bool:
    """A number as YAML reads it, or a string of digits: what has no unit."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int | float) or (isinstance(value, str) and value.strip().isdigit())


def _small_bytes(cond: Condition) -> str | None:
    """The warning for a byte threshold that is almost surely missing its unit."""
    sig = SIGNALS[cond.signal]
    # Amounts only: a rate in bytes per second (direct reclaim, refaults) is small by nature.
    if sig.unit != "bytes" or not sig.name.endswith("_bytes") or not 0 < cond.value < MiB:
        return None
    return (
        f"{cond.signal} is in bytes and {cond.value:g} bytes is less than 1Mi: if you meant "
        f"{cond.value:g}Mi or {cond.value:g}Gi, write the unit"
    )
