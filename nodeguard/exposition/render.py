"""The fast writer of ``/metrics``: families in the Prometheus text format 0.0.4 or OpenMetrics
1.0.0, byte for byte what prometheus_client's writers write, for a fraction of their cost.

prometheus_client defines both formats here (``exposition.generate_latest`` and
``openmetrics.exposition.generate_latest``); this module is held to it by the tests, which
render every golden body and thousands of random snapshots and families (label values with
quotes, backslashes, newlines and non-ASCII; NaN, +Inf, -Inf, 0, -0.0, huge counters; families
and series appearing and disappearing between renders) through both and compare the bytes
(``tests/unit/test_render.py``).

What makes it fast: a series' label text only changes when pods come and go, and whole
families stay the same from one sample to the next (limits, OOM counters, limit hits, pod
info), so the writer keeps each series' label text between renders, by family and label values,
and each family's last text: a family whose samples equal the last ones is that text again
(:class:`Chunk`), and in the others only the values are written anew. What the library does on
every render for every sample (a ``Sample`` tuple and a label dict, a sort, the escaping of
each label value) is done once per series.

What is the same in both formats, and so shared: sample lines (names in the legacy character
set are never escaped; label values escape ``\\``, newline and ``"``; labels sorted by name;
values as ``floatToGoString`` writes them). What differs: a counter's HELP and TYPE name
(``<name>_total`` in the text format, ``<name>`` in OpenMetrics), the HELP escaping (OpenMetrics
also escapes ``"``), and OpenMetrics' closing ``# EOF``, which :meth:`Renderer.render` leaves to
its caller (the body goes on with the agent's own families).
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.utils import floatToGoString

from nodeguard.collectors.families import Family, Value

__all__ = ["Chunk", "Renderer", "go_float"]

# sample name -> label values -> the line up to its value (name, labels, space), as written by
# the last render
_Lines = dict[str, dict[tuple[str, ...], str]]


_INT_EXACT = 1 << 53  # ints below it are floats without rounding
_EXPONENTS = tuple(f"e+{n:02d}" for n in range(16))


def go_float(value: Value) -> str:
    """``floatToGoString(value)``, prometheus_client's text of a sample value, with a quick way
    for the common case, an int of 0 to 2**53 (bytes, counts): ``123.0`` below a million,
    ``1.234567e+06`` from 7 digits on (Go's exponent form, which the library mimics). Held to
    the library's function by the tests."""
    if type(value) is int and 0 <= value < _INT_EXACT:
        digits = str(value)
        if value < 1_000_000:
            return digits + ".0"
        significant = digits.rstrip("0")
        exponent = _EXPONENTS[len(digits) - 1]
        if len(significant) == 1:
            return significant + exponent
        return f"{significant[0]}.{significant[1:]}{exponent}"
    text: str = floatToGoString(value)  # type: ignore[no-untyped-call]
    return text


def _escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _label_text(names: tuple[str, ...], values: tuple[str, ...]) -> str:
    """``{a="x",b="y"}`` with the labels sorted by name, as both library writers sort them
    (``sorted(labels.items())``); ``""`` without labels."""
    if not names:
        return ""
    pairs = sorted(zip(names, values, strict=False))  # the library zips too
    return "{" + ",".join(f'{k}="{_escape_label_value(v)}"' for k, v in pairs) + "}"


def _header(family: Family, *, openmetrics: bool) -> str:
    if openmetrics:
        text = family.help.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
        name = family.name
    else:
        text = family.help.replace("\\", "\\\\").replace("\n", "\\n")
        name = family.sample_name
    return f"# HELP {name} {text}\n# TYPE {name} {family.kind}\n"


@dataclass(slots=True, eq=False)
class Chunk:
    """One family as written: its text in UTF-8 (HELP, TYPE, samples), the label values and
    values it was written from, and, once asked for, its raw deflate stream ending in a full
    flush (so that chunks deflated at different times are one valid stream:
    :meth:`deflated`)."""

    data: bytes
    keys: list[tuple[str, ...]]
    values: list[Value]
    header: str
    _deflated: bytes | None = None

    def deflated(self, compressor: zlib._Compress) -> bytes:
        """``data`` as raw deflate ending in a full flush, made with ``compressor`` the first
        time. A full flush resets the compressor's history, so the blocks that follow never
        refer to data before them, and the bytes before it end on a byte boundary: kept chunks
        and new ones concatenate into one valid deflate stream."""
        if self._deflated is None:
            self._deflated = compressor.compress(self.data) + compressor.flush(zlib.Z_FULL_FLUSH)
        return self._deflated


class Renderer:
    """Writes families as chunks of text; keeps each series' line, and each family's chunk per
    format, for the next render. Thread-safe (one render at a time)."""

    def __init__(self) -> None:
        self._lines: _Lines = {}
        self._chunks: dict[bool, dict[str, Chunk]] = {True: {}, False: {}}
        self._lock = threading.Lock()

    def render(self, families: Iterable[Family], *, openmetrics: bool) -> list[Chunk]:
        """The exposition of ``families`` in OpenMetrics 1.0.0 (without ``# EOF``) or in the
        text format 0.0.4, a chunk per family. A family whose header and samples equal the last
        one written under its name is that chunk again (unless a value is a float zero: ``0.0``
        and ``-0.0`` are equal and written differently). Label texts are kept for the families
        written anew (those whose values move); chunks of families this render did not have
        are forgotten."""
        with self._lock:
            chunks: list[Chunk] = []
            kept_lines: _Lines = {}
            last_chunks = self._chunks[openmetrics]
            kept_chunks: dict[str, Chunk] = {}
            for family in families:
                name = family.sample_name
                header = _header(family, openmetrics=openmetrics)
                last = last_chunks.get(name)
                if (
                    last is not None
                    and not family.float_zero
                    and last.header == header
                    and last.values == family.values
                    and last.keys == family.keys
                ):
                    chunk = last  # its label texts are let go: most such families never change
                else:
                    out = [header]
                    old = self._lines.get(name) or {}
                    self._write(family, old=old, new=kept_lines.setdefault(name, {}), out=out)
                    data = "".join(out).encode()
                    chunk = Chunk(data=data, keys=family.keys, values=family.values, header=header)
                kept_chunks[name] = chunk
                chunks.append(chunk)
            self._lines = kept_lines
            self._chunks[openmetrics] = kept_chunks
            return chunks

    @staticmethod
    def _write(
        family: Family,
        *,
        old: dict[tuple[str, ...], str],
        new: dict[tuple[str, ...], str],
        out: list[str],
    ) -> None:
        names, name = family.labels, family.sample_name
        append, get = out.append, old.get
        for values, value in zip(family.keys, family.values, strict=True):
            head = get(values)
            if head is None:
                head = f"{name}{_label_text(names, values)} "
            new[values] = head
            append(head)
            append(go_float(value) + "\n")
