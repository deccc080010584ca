"""Command-line flags made from a pydantic model's fields: an action's arguments
(``nodeguard act evict --max-priority 100``) and an action's settings (``--cordon.mode``).

One field, one flag: named for the field's rule-file key in kebab-case (its alias, else its
name: ``maxPriority`` -> ``--max-priority``; a settings field under its group:
``--cordon.budget-nodes``), or as its :class:`~nodeguard.actions.args.Flag` says; its help is
the field's ``description`` (which gives the default); and its value is validated by the field
itself (the same validators and bounds as a rule file: a memory amount, a percent, a
``NAMESPACE/NAME``), so a bad value is argparse's one-line error, exit status 2. By type:

- ``bool``: a switch (on when given); a ``Literal``: one of its values (``choices``);
- ``list[X]``: repeat the flag for more, each value validated as ``X``;
- ``dict[str, str]``: ``KEY=VALUE``, repeated;
- anything else: one value, validated as the field.

Argument flags default to ``None`` (not given): the model's default applies, the one a rule
without that argument gets. Settings flags default to the field's default.
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from nodeguard.actions.args import Amount, Flag

__all__ = ["FieldFlag", "add_model_flags", "model_values"]

#: A parser or one of its argument groups: where a flag is added.
Flags = argparse._ActionsContainer


def _kebab(name: str) -> str:
    out = "".join(f"-{c.lower()}" if c.isupper() else c for c in name)
    return out.replace("_", "-")


def _optional(annotation: Any) -> Any:
    """``X | None`` -> ``X``."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return annotation


def _bare(annotation: Any) -> Any:
    """The type under ``Annotated[...]`` and ``| None``."""
    annotation = _optional(annotation)
    while typing.get_origin(annotation) is Annotated:
        annotation = _optional(typing.get_args(annotation)[0])
    return annotation


def _validator(annotation: Any, metadata: list[Any]) -> Callable[[str], Any]:
    """An argparse ``type`` that validates the text as the field does."""
    adapter: TypeAdapter[Any] = TypeAdapter(
        Annotated[annotation, *metadata] if metadata else annotation
    )

    def parse(text: str) -> Any:
        try:
            return adapter.validate_python(text)
        except ValidationError as exc:
            raise argparse.ArgumentTypeError(
                "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
            ) from None

    return parse


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"not KEY=VALUE: {text!r}")
    return key, value


class FieldFlag(typing.NamedTuple):
    """A field of a model and its flag: ``key`` as the model takes it (the alias, as a rule
    file writes it), the flag's ``dest``, and ``pairs``: the flag gives ``KEY=VALUE`` pairs
    for a mapping."""

    key: str
    dest: str
    pairs: bool


def add_model_flags(
    parser: Flags,
    *,
    model: type[BaseModel],
    prefix: str | None = None,
    aliases: bool = False,
    defaults: bool = False,
) -> list[FieldFlag]:
    """Add a flag per field of ``model`` (``--NAME``, or ``--PREFIX.NAME`` and with
    ``aliases`` also ``--NAME``); returns each field's dest, for :func:`model_values`.
    ``defaults``: a flag not given holds the field's default (settings), else ``None``
    (arguments, whose defaults the model applies). Raises ``ValueError`` for a field with no
    ``description`` (its help)."""
    out = []
    for name, info in model.model_fields.items():
        flag = next((m for m in info.metadata if isinstance(m, Flag)), Flag())
        if not flag.cli:
            continue
        key = info.alias or name
        base = flag.name or _kebab(key)
        names = [f"--{prefix}.{base}", f"--{base}"] if prefix and aliases else []
        names = names or [f"--{prefix}.{base}" if prefix else f"--{base}"]
        dest = f"{prefix or 'arg'}_{name}"
        if info.description is None:
            raise ValueError(f"{model.__name__}.{name}: no description (its flag's help)")
        kw = _kind(name, info, flag)
        parser.add_argument(
            *names,
            *flag.aliases,
            dest=dest,
            default=info.default if defaults else kw.pop("default", None),
            help=info.description.replace("%", "%%"),
            **kw,
        )
        out.append(FieldFlag(key=key, dest=dest, pairs=kw.get("type") is _label))
    return out


def _kind(name: str, info: FieldInfo, flag: Flag) -> dict[str, Any]:
    """argparse's ``action``/``type``/``choices``/``metavar`` for a field."""
    bare = _bare(info.annotation)
    metadata = [m for m in info.metadata if not isinstance(m, Flag)]
    if bare is bool:
        return {"action": "store_true", "default": False}
    if typing.get_origin(bare) is Literal:
        return {"choices": list(typing.get_args(bare))}
    metavar = flag.metavar or (
        "AMOUNT" if bare is Amount else "COUNT" if bare is int else _kebab(name).upper()
    )
    if typing.get_origin(bare) is list:
        (item,) = typing.get_args(bare)
        return {"action": "append", "type": _validator(item, []), "metavar": metavar}
    if typing.get_origin(bare) is dict:
        return {"action": "append", "type": _label, "metavar": metavar}
    return {"type": _validator(_optional(info.annotation), metadata), "metavar": metavar}


def model_values(
    args: argparse.Namespace, flags: list[FieldFlag], *, given: bool = True
) -> dict[str, Any]:
    """The fields' values on the command line, keyed as a rule file writes them. ``given``:
    only those given (a flag left out, or a switch left off, is left out: the model's default
    applies); else every flag's value (settings, whose flags hold their defaults)."""
    out: dict[str, Any] = {}
    for f in flags:
        value = getattr(args, f.dest)
        if given and (value is None or value is False):
            continue
        out[f.key] = dict(value) if f.pairs and value is not None else value
    return out
