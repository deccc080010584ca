"""One ``/dev/kmsg`` record, parsed.

Each read of ``/dev/kmsg`` returns one record
``<prio>,<seq>,<usec since boot>,<flags>[,...];<text>``, followed by optional continuation
lines that start with a space and carry ``KEY=value`` device properties
(Documentation/ABI/testing/dev-kmsg). ``flags`` is ``-`` for a whole record; ``c`` marks a
fragment of a line that later records may continue, and kernels 3.5 to 4.8 also wrote ``+`` on
a record that continues the one before. The hints are not always right: another CPU's records
can come between the fragments of one line (the ABI document says so), which is why the
OOM parser (:mod:`nodeguard.sources.oom_events`) also assembles fragments by their content.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["KmsgRecord", "parse_record"]


@dataclass(frozen=True, slots=True, kw_only=True)
class KmsgRecord:
    """One kernel log record: sequence number (unique per boot), microseconds since boot, the
    flags character (``-``, ``c`` or ``+``) and the message text (first line only)."""

    sequence: int
    usec: int
    message: str
    flags: str = "-"


def parse_record(raw: str) -> KmsgRecord | None:
    """Parse one ``/dev/kmsg`` record; ``None`` for a malformed one. Continuation lines
    (starting with a space, carrying ``KEY=value`` device properties) are dropped; a record's
    own text may start with a space (a fragment of a line) and keeps it."""
    header, sep, message = raw.partition(";")
    if not sep:
        return None
    fields = header.split(",")
    if len(fields) < 3:
        return None
    try:
        sequence = int(fields[1])
        usec = int(fields[2])
    except ValueError:
        return None
    flags = fields[3][:1] if len(fields) > 3 and fields[3] else "-"
    first_line = message.split("\n", 1)[0]
    return KmsgRecord(sequence=sequence, usec=usec, message=first_line, flags=flags)
