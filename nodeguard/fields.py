"""Saying what was meant: the fields a model allows, and the closest to a misspelt one.

Rule files and action arguments are pydantic models that refuse unknown keys. pydantic says
only "Extra inputs are not permitted"; :func:`unknown_field` says which fields are allowed
and which one was probably meant (``did you mean 'cooldown'?``), as ``nodeguard check`` prints
it. Imports nothing of nodeguard.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel

__all__ = ["allowed_fields", "did_you_mean", "model_at", "unknown_field"]


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``known``, or ``""`` when none is close."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def allowed_fields(model: type[BaseModel]) -> list[str]:
    """The keys a model takes, as a file writes them (its aliases where it has them)."""
    return [f.alias or name for name, f in model.model_fields.items()]


def unknown_field(model: type[BaseModel], name: str) -> str:
    """The message for an unknown key ``name`` of ``model``."""
    allowed = allowed_fields(model)
    return f"unknown field {name!r}{did_you_mean(name, allowed)}; allowed: {', '.join(allowed)}"


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models inside a field's type (``list[Rule]``, ``RateLimit | None``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin is None and not isinstance(annotation, types.UnionType):
        return []
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def model_at(root: type[BaseModel], loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The model that holds the key at ``loc`` (a pydantic error location, keys as aliases),
    ``None`` where the path leaves the models (a free-form mapping)."""
    model = root
    for part in loc[:-1]:
        if isinstance(part, int):
            continue  # an index into a list of models
        field = next(
            (f for n, f in model.model_fields.items() if part in (n, f.alias)),
            None,
        )
        if field is None:
            return None
        inner = _models_in(field.annotation)
        if not inner:
            return None
        model = inner[0]
    return model
