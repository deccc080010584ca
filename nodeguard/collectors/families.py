"""Metric families as collectors write them: the one shape both writers of ``/metrics`` read.

A collector renders its part of a snapshot as :class:`Family` objects, made by a
:class:`Families` factory that applies the metric filter (``--metric-allowlist`` /
``--metric-denylist``; :mod:`nodeguard.exposition.metric_filter`): a family the filter drops is a
:class:`DroppedFamily`, whose ``add`` does nothing, so a dropped family costs neither its series
nor their rendering.

Two writers read families: :mod:`nodeguard.exposition.render` (the fast path, what ``/metrics``
serves) and prometheus_client's own writers over :meth:`Family.to_prometheus` (the plain path, which
defines the formats: the tests render every golden body and thousands of random snapshots both ways
and compare the bytes).

Names are Prometheus legacy names (``[a-zA-Z_][a-zA-Z0-9_]*``, no ``:``; label names not starting
with ``__``), checked when a family is made: for those, every escaping scheme writes them as
they are, which is what lets the fast writer skip name escaping.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

__all__ = ["DroppedFamily", "Families", "Family", "Kind", "exposed_name"]

Kind = Literal["gauge", "counter"]
_METRIC_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_LABEL_NAME = re.compile(r"(?!__)[a-zA-Z_][a-zA-Z0-9_]*")
Value = float | int


class Family:
    """One metric family and its samples, in the order they were added.

    - ``name``: the family name; a counter's is given without ``_total`` (as prometheus_client's
      ``CounterMetricFamily`` keeps it) and its samples are written ``<name>_total``.
    - ``kind``: ``gauge`` or ``counter``; ``help``: the HELP text, as written (escaped by the
      writer); ``labels``: the label names, in the order of each sample's values.
    - ``keys`` and ``values``: each sample's label values and value, in two lists (no tuple per
      sample: a render of 1,000 containers adds some 14,000 samples); values are numbers
      (bytes, seconds, counts), written as prometheus_client writes them
      (``floatToGoString``: ``1.2e+08``, ``NaN``, ``+Inf``).
    """

    __slots__ = ("float_zero", "help", "keys", "kind", "labels", "name", "values")

    def __init__(self, *, name: str, kind: Kind, help: str, labels: Sequence[str] = ()) -> None:
        if kind == "counter":
            name = name.removesuffix("_total")
        if not _METRIC_NAME.fullmatch(name):
            raise ValueError(f"not a legacy metric name: {name!r}")
        bad = [label for label in labels if not _LABEL_NAME.fullmatch(label)]
        if bad or len(set(labels)) != len(labels):
            raise ValueError(f"{name}: bad or repeated label names {list(labels)!r}")
        self.name = name
        self.kind = kind
        self.help = help
        self.labels = tuple(labels)
        self.keys: list[tuple[str, ...]] = []
        self.values: list[Value] = []
        #: Whether a value is a float 0 (``0.0`` or ``-0.0``, equal numbers that are written
        #: differently): the writer then never takes the family for the last one it wrote.
        self.float_zero = False

    @property
    def sample_name(self) -> str:
        """The name each sample is written under (``<name>_total`` for a counter)."""
        return self.name + "_total" if self.kind == "counter" else self.name

    def add(self, values: tuple[str, ...], value: Value) -> None:
        """One sample: ``values`` in the order of :attr:`labels`."""
        if value == 0 and type(value) is float:
            self.float_zero = True
        self.keys.append(values)
        self.values.append(value)

    @property
    def samples(self) -> list[tuple[tuple[str, ...], Value]]:
        """``(label values, value)`` of each sample, in order."""
        return list(zip(self.keys, self.values, strict=True))

    def to_prometheus(self) -> Metric:
        """The same family as prometheus_client's ``GaugeMetricFamily`` /
        ``CounterMetricFamily``: what the library's writers render (the plain path)."""
        cls = CounterMetricFamily if self.kind == "counter" else GaugeMetricFamily
        metric = cls(self.name, self.help, labels=list(self.labels))
        for values, value in zip(self.keys, self.values, strict=True):
            metric.add_metric(list(values), value)
        return metric


class DroppedFamily(Family):
    """A family the metric filter drops: made and added to like any other, never written."""

    __slots__ = ()

    def add(self, values: tuple[str, ...], value: Value) -> None:
        return None


def exposed_name(*, name: str, kind: str) -> str:
    """The name a family's series carry in Prometheus (what the metric filter matches): a
    counter's with ``_total``, an info's with ``_info``, any other's as it is."""
    if kind == "counter":
        return name + "_total"
    if kind == "info":
        return name + "_info"
    return name


class Families:
    """Makes the families of one render; ``keep(exposed name)`` says which the filter keeps
    (all, by default). ``prefix`` is put before every name and ``note`` after every HELP text."""

    def __init__(
        self, *, keep: Callable[[str], bool] | None = None, prefix: str = "", note: str = ""
    ) -> None:
        self._keep = keep
        self._prefix = prefix
        self._note = note

    def gauge(self, name: str, help: str, labels: Sequence[str] = ()) -> Family:
        return self._make(name=name, kind="gauge", help=help, labels=labels)

    def counter(self, name: str, help: str, labels: Sequence[str] = ()) -> Family:
        return self._make(
            name=name.removesuffix("_total"), kind="counter", help=help, labels=labels
        )

    def _make(self, *, name: str, kind: Kind, help: str, labels: Sequence[str]) -> Family:
        full, text = self._prefix + name, help + self._note
        if self._keep is None or self._keep(exposed_name(name=full, kind=kind)):
            return Family(name=full, kind=kind, help=text, labels=labels)
        return DroppedFamily(name=full, kind=kind, help=text, labels=labels)
