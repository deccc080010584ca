"""Reading host files where absence is "no data" and nothing is guessed."""

from __future__ import annotations

import errno
from pathlib import Path

from nodeguard.sources import NoDataError

__all__ = ["read_flat_keyed", "read_optional", "read_text"]


def read_text(path: Path) -> str:
    """A host file's text. Raises :class:`NoDataError` when the file does not exist or the kernel
    answers EOPNOTSUPP (a PSI file with PSI off reads that way); other OS errors propagate."""
    try:
        return path.read_text()
    except FileNotFoundError as exc:
        raise NoDataError(f"{path} does not exist") from exc
    except OSError as exc:
        if exc.errno == errno.EOPNOTSUPP:
            raise NoDataError(f"{path}: not supported by this kernel") from exc
        raise


def read_optional(path: Path) -> str | None:
    """A host file's text, or ``None`` when it does not exist, is not supported, or belongs to
    a cgroup removed while we read it (kernfs answers ENODEV). Used for the many per-cgroup
    files that only some kernels or controllers have; other OS errors propagate."""
    try:
        return read_text(path)
    except NoDataError:
        return None
    except OSError as exc:
        if exc.errno == errno.ENODEV:
            return None
        raise


def parse_flat_keyed(text: str) -> dict[str, int]:
    """Parse a flat-keyed file (``key value`` lines: ``memory.stat``, ``memory.events``,
    ``memory.oom_control``) into ``{key: int}``; lines that are not that shape are skipped."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 2:
            continue
        try:
            out[parts[0]] = int(parts[1])
        except ValueError:
            continue
    return out


def read_flat_keyed(path: Path) -> dict[str, int] | None:
    """:func:`parse_flat_keyed` of a file, ``None`` when the file is absent."""
    text = read_optional(path)
    return None if text is None else parse_flat_keyed(text)
