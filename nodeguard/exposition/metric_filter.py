"""Which metric families ``/metrics`` keeps: ``--metric-allowlist`` / ``--metric-denylist``, as
kube-state-metrics spells them.

Each flag takes a comma-separated list of regular expressions, each matched against the whole name a
family's series carry in Prometheus (a counter's with ``_total``): an exact name or a pattern such
as ``nodeguard_pod_memory_.*``. An allowlist keeps only what it matches, a denylist drops what it
matches; they are mutually exclusive (as in kube-state-metrics), and neither is the default: every
family. A dropped family is neither built nor written
(:class:`~nodeguard.collectors.families.DroppedFamily`), so dropping the big per-pod and
per-container families saves their cost (docs/benchmarks.md measures a minimal set). It applies to
the agent's own families too (rules, actions, webhook, connections).

The flags are read by :mod:`nodeguard.cli.run_flags` (``nodeguard run``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["MetricFilter"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricFilter:
    """``allow`` or ``deny`` (never both): patterns matched against whole names; neither keeps
    every family."""

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.allow and self.deny:
            raise ValueError("--metric-allowlist and --metric-denylist are mutually exclusive")
        for pattern in (*self.allow, *self.deny):
            re.compile(pattern)  # re.error names the pattern's fault

    @property
    def active(self) -> bool:
        return bool(self.allow or self.deny)

    def keeps(self, name: str) -> bool:
        """Whether the family whose series are named ``name`` is written."""
        if self.allow:
            return _matcher(self.allow).fullmatch(name) is not None
        if self.deny:
            return _matcher(self.deny).fullmatch(name) is None
        return True


_COMPILED: dict[tuple[str, ...], re.Pattern[str]] = {}


def _matcher(patterns: tuple[str, ...]) -> re.Pattern[str]:
    found = _COMPILED.get(patterns)
    if found is None:
        found = _COMPILED[patterns] = re.compile("|".join(f"(?:{p})" for p in patterns))
    return found
