"""The console the commands print their tables on.

On a terminal, rich's own. Piped (no TTY: ``nodeguard snapshot | less``, a CI log, a file), rich
still pads each line to the width it lays out for (a table's title centred over it, a wrapped
line filled to the edge); that padding is cut, so what was written ends at its last character.
"""

from __future__ import annotations

import io
import sys
from typing import IO, TextIO, cast

from rich.console import Console

__all__ = ["stdout_console"]


class _Unpadded(io.TextIOBase):
    """A text stream that writes each complete line to ``out`` without its trailing spaces. A
    partial line is held until its newline, or written as it is by :meth:`flush` (rich ends
    every ``print`` with a newline, so that is only a caller's own ``end=""``)."""

    def __init__(self, out: TextIO) -> None:
        super().__init__()
        self._out = out
        self._tail = ""

    def write(self, s: str) -> int:
        lines = (self._tail + s).split("\n")
        self._tail = lines.pop()
        for line in lines:
            self._out.write(line.rstrip(" ") + "\n")
        return len(s)

    def flush(self) -> None:
        if self._tail:
            self._out.write(self._tail)
            self._tail = ""
        self._out.flush()

    def isatty(self) -> bool:
        return False


def stdout_console() -> Console:
    """The :class:`rich.console.Console` on stdout; piped, without trailing padding."""
    if sys.stdout.isatty():
        return Console()
    # A TextIOBase is a text stream to rich; typeshed's IO[str] is a protocol it does not name.
    return Console(file=cast(IO[str], _Unpadded(sys.stdout)))
