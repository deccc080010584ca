"""Pressure stall information (PSI) for memory (Documentation/accounting/psi.rst).

``/proc/pressure/memory`` and each v2 cgroup's ``memory.pressure`` read::

    some avg10=0.00 avg60=0.00 avg300=0.00 total=0
    full avg10=0.00 avg60=0.00 avg300=0.00 total=0

``avg*`` are percentages of wall time over 10 s, 60 s and 300 s; ``total`` is microseconds. With
PSI off (``CONFIG_PSI=n`` or ``psi=0``) the file is absent or reads fail with EOPNOTSUPP: that is
"no data", reported once.
"""

from __future__ import annotations

from nodeguard.paths import HostPaths
from nodeguard.snapshot import Pressure, PressureLine
from nodeguard.sources.files import read_text

__all__ = ["parse_pressure", "read_node_pressure"]


def _parse_line(parts: list[str]) -> PressureLine | None:
    if (  # the kernel's own order, read without a dict (a node has hundreds of these files)
        len(parts) == 4
        and parts[0][:6] == "avg10="
        and parts[1][:6] == "avg60="
        and parts[2][:7] == "avg300="
        and parts[3][:6] == "total="
    ):
        try:
            return PressureLine(
                avg10=float(parts[0][6:]) / 100.0,
                avg60=float(parts[1][6:]) / 100.0,
                avg300=float(parts[2][7:]) / 100.0,
                total_seconds=int(parts[3][6:]) / 1_000_000.0,
            )
        except ValueError:
            return None
    values: dict[str, str] = {}
    for part in parts:
        key, sep, value = part.partition("=")
        if sep:
            values[key] = value
    try:
        return PressureLine(
            avg10=float(values["avg10"]) / 100.0,
            avg60=float(values["avg60"]) / 100.0,
            avg300=float(values["avg300"]) / 100.0,
            total_seconds=int(values["total"]) / 1_000_000.0,
        )
    except (KeyError, ValueError):
        return None


def parse_pressure(text: str) -> Pressure | None:
    """Parse a PSI file; ``None`` when it holds neither a ``some`` nor a ``full`` line.
    Percentages become ratios 0..1 and microseconds become seconds."""
    lines: dict[str, PressureLine | None] = {}
    for raw in text.splitlines():
        parts = raw.split()
        if parts and parts[0] in ("some", "full"):
            lines[parts[0]] = _parse_line(parts[1:])
    if lines.get("some") is None and lines.get("full") is None:
        return None
    return Pressure(some=lines.get("some"), full=lines.get("full"))


def read_node_pressure(*, paths: HostPaths) -> Pressure:
    """``<procfs>/pressure/memory``. Raises :class:`~nodeguard.sources.NoDataError` when PSI is
    off (file absent or EOPNOTSUPP) and ``ValueError`` when the file cannot be parsed."""
    path = paths.proc("pressure", "memory")
    parsed = parse_pressure(read_text(path))
    if parsed is None:
        raise ValueError(f"{path}: no some/full line could be parsed")
    return parsed
