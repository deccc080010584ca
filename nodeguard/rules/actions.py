"""The argument schemas of the runbook actions a rule may name (checked at load time).

The implementations live in :mod:`nodeguard.remediation.runbook`; adding an action is one
schema here and one function there.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["ACTION_ARGS", "CordonArgs", "EvictArgs", "KatibArgs", "NoArgs"]

_QUANTITY = re.compile(r"^(\d+(\.\d+)?)(Ki|Mi|Gi|Ti|K|M|G|T)?$|^(\d+(\.\d+)?)%$")


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class NoArgs(_Args):
    """An action without arguments."""


class CordonArgs(_Args):
    """``mode``: ``unschedulable`` (default) or ``taint``."""

    mode: Literal["unschedulable", "taint"] = "unschedulable"


class EvictArgs(_Args):
    """What to evict.

    - ``free``: how much working set to free: a quantity (``4Gi``) or a percent of MemTotal
      (``5%``). For a container or pod rule the default is that pod's unit alone; for a node
      rule, ``5%``.
    - ``maxPriority``, ``priorityClasses``, ``namespaces``, ``selector`` (labels, all must
      match; the value ``"*"`` only requires the label): which pods may be evicted at all.
    """

    free: str | None = Field(default=None, max_length=32)  # 32: "1023.999999Gi" is 13
    max_priority: int | None = Field(default=None, alias="maxPriority")
    priority_classes: list[str] | None = Field(default=None, alias="priorityClasses")
    namespaces: list[str] | None = None
    selector: dict[str, str] | None = None

    @field_validator("free")
    @classmethod
    def _quantity(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not _QUANTITY.match(value):
            raise ValueError(f"not a memory quantity or percent: {value!r} (e.g. 4Gi, 5%)")
        number = float(value.rstrip("%KMGTi"))
        if number <= 0 or (value.endswith("%") and number > 100):
            raise ValueError(f"free must be above 0 (and a percent at most 100%): {value!r}")
        return value


class KatibArgs(_Args):
    """``floor``: parallelTrialCount while paused (at least 1: Katib's webhook rejects 0)."""

    floor: int = Field(default=1, ge=1)


#: Action name -> its argument schema.
ACTION_ARGS: dict[str, type[_Args]] = {
    "cordon": CordonArgs,
    "uncordon": CordonArgs,
    "evict": EvictArgs,
    "pause_katib": KatibArgs,
    "resume_katib": NoArgs,
    "record": NoArgs,
}
