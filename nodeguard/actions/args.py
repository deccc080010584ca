"""Argument models of actions, and the memory amounts they take.

Each action declares a pydantic model of its arguments (extra keys forbidden); rule files and
``nodeguard act`` both go through it, so a rule's ``evict`` and ``nodeguard act evict`` take the
same arguments with the same defaults. Arguments are parsed once, when a rule file is loaded or
the command line read: a memory amount (``free: 4Gi``) is a Kubernetes quantity or a percent,
and an unparsable one is an error at load time, never when the rule trips.

The same fields are the flags of ``nodeguard act ACTION`` (:mod:`nodeguard.cli.model_flags`):
each field is a flag named for its rule-file key in kebab-case (``maxPriority`` ->
``--max-priority``), its help is the field's ``description``, and the flag's value is validated
by the field itself, so a flag and a rule file accept and refuse the same text. A field whose
flag differs says so with :class:`Flag` in its ``Annotated`` metadata.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer

from nodeguard.kube.objects import parse_bytes

__all__ = ["ActionArgs", "Amount", "Count", "Flag", "MemoryAmount", "Percent", "parse_amount"]


class ActionArgs(BaseModel):
    """Base of every action's argument model: frozen, unknown keys are errors, fields may be
    given by their camelCase alias (as in rule files) or their name."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class Flag:
    """How a field of an argument (or settings) model is spelled on the command line, where
    the default spelling does not fit (``Annotated[list[str] | None, Flag(name="namespace",
    metavar="NAMESPACE")]``).

    - ``name``: the flag without ``--`` (default: the field's alias, else its name, in
      kebab-case); ``aliases``: other spellings, with their ``--``.
    - ``metavar``: the value's name in the usage line, a unit the help explains (default:
      ``AMOUNT`` for a memory amount, ``COUNT`` for a whole number, else the name upper-cased).
    - ``cli``: ``False`` where the command line gives the value another way (``cordon``'s
      ``mode`` is the ``--cordon.mode`` setting); the field keeps its default there.
    """

    name: str | None = None
    aliases: tuple[str, ...] = ()
    metavar: str | None = None
    cli: bool = True


def _count(value: Any) -> Any:
    if isinstance(value, str) and not value.isdigit():
        raise ValueError(f"not a count (0 or more): {value!r}")
    return value


def _percent(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        number = float(value.strip().removesuffix("%"))
    except ValueError:
        raise ValueError(f"not a percent: {value!r}") from None
    if not 0 < number <= 100:  # also refuses nan
        raise ValueError(f"a percent above 0 and at most 100: {value!r}")
    return number


#: A whole number, 0 or more (``"5"`` as text: digits only).
Count = Annotated[int, BeforeValidator(_count), Field(ge=0)]
#: A percent above 0 and at most 100 (``"10"`` or ``"10%"`` as text).
Percent = Annotated[float, BeforeValidator(_percent), Field(gt=0, le=100)]


@dataclass(frozen=True, slots=True)
class Amount:
    """A memory amount: ``bytes`` (a quantity) or ``fraction`` (a percent, as 0..1) of a
    whole the action knows (a node's usable memory, a GPU's memory). ``text`` is what was
    written; ``0`` means "one unit, whatever its size" where the action says so."""

    text: str
    bytes: int | None = None
    fraction: float | None = None

    def of(self, whole: int | None) -> int | None:
        """In bytes: the quantity, or the fraction of ``whole`` (``None`` when the whole is
        not known)."""
        if self.bytes is not None:
            return self.bytes
        if whole is None or self.fraction is None:
            return None
        return int(whole * self.fraction)

    def __str__(self) -> str:
        return self.text


def parse_amount(value: Any) -> Amount:
    """``"4Gi"``, ``"500M"``, ``"4k"``, ``"1e9"``, ``"0"`` (Kubernetes quantities, as
    ``kubernetes.utils.parse_quantity`` reads them, in bytes) or ``"5%"`` (above 0, at most
    100). Raises ``ValueError`` otherwise, and for a negative or fractional-byte amount."""
    if isinstance(value, Amount):
        return value
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError(f"not a memory quantity or percent: {value!r} (e.g. 4Gi, 5%)")
    text = str(value).strip()
    if text.endswith("%"):
        try:
            percent = float(text[:-1])
        except ValueError:
            raise ValueError(f"not a percent: {text!r} (e.g. 5%)") from None
        if not 0 < percent <= 100:  # also refuses nan
            raise ValueError(f"a percent must be above 0 and at most 100: {text!r}")
        return Amount(text=text, fraction=percent / 100.0)
    if len(text) > 32:
        raise ValueError(f"a memory quantity of at most 32 characters, not {text[:32]!r}...")
    try:
        amount = parse_bytes(text, exact=True)
    except ValueError:
        raise ValueError(
            f"not a memory quantity or percent: {text!r} (Kubernetes quantities: 4Gi, 500M, "
            "4k; or a percent: 5%)"
        ) from None
    if amount < 0:
        raise ValueError(f"a negative amount of memory: {text!r}")
    return Amount(text=text, bytes=amount)


#: A field holding an :class:`Amount`, written and read back as its text.
MemoryAmount = Annotated[
    Amount, BeforeValidator(parse_amount), PlainSerializer(str, return_type=str)
]
