"""Reading host files where absence is "no data" and nothing is guessed.

A full node has hundreds of cgroups and each sample reads five files of each, so
:func:`read_optional` reads with ``os.open``/``os.read`` on plain string paths: ``Path.read_text``
costs several times more in Python than the kernel spends answering (docs/benchmarks.md). The
text is what ``Path.read_text`` returns: decoded with the locale's encoding, newlines
translated.
"""

from __future__ import annotations

import codecs
import errno
import locale
import os
from pathlib import Path

from nodeguard.sources import NoDataError

__all__ = [
    "FLAGS",
    "MAX_FILE_BYTES",
    "FileTooLargeError",
    "decode",
    "is_absent",
    "parse_flat_keyed",
    "read_file",
    "read_optional",
    "read_text",
]

# What Path.read_text() decodes with, by its canonical name ("utf-8": bytes.decode's fast path).
_ENCODING = codecs.lookup(locale.getpreferredencoding(False)).name
#: How host files are opened: read-only, not inherited by the processes nodeguard starts.
FLAGS = os.O_RDONLY | os.O_CLOEXEC
_CHUNK = 1 << 16
#: The most of one host file that is read.
MAX_FILE_BYTES = 1 << 20


class FileTooLargeError(ValueError):
    """A host file longer than :data:`MAX_FILE_BYTES`: not read on, not parsed."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(f"{path}: longer than {MAX_FILE_BYTES} bytes")


def read_on(fd: int, first: bytes, *, path: str | Path, pread: bool = False) -> bytes:
    """The rest of a file after ``first`` (what one read gave), read to its end with ``read``
    (or ``pread`` from the offset after ``first``). Raises :class:`FileTooLargeError` past
    :data:`MAX_FILE_BYTES`."""
    chunks = [first]
    size = len(first)
    while chunk := (os.pread(fd, _CHUNK, size) if pread else os.read(fd, _CHUNK)):
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_FILE_BYTES:
            raise FileTooLargeError(path)
    return b"".join(chunks)


def decode(data: bytes) -> str:
    """A file's bytes as ``Path.read_text`` gives them: the locale's encoding, universal
    newlines."""
    text = data.decode(_ENCODING)
    if "\r" in text:  # universal newlines, as text mode reads
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def read_file(path: str | Path) -> str:
    """A host file's text; OS errors propagate (``FileNotFoundError`` included), and so do
    :class:`FileTooLargeError` and ``UnicodeDecodeError``."""
    fd = os.open(path, FLAGS)
    try:
        data = os.read(fd, _CHUNK)
        # Read on to the end: a seq_file (procfs, cgroupfs) may return less than asked and more.
        if data:
            data = read_on(fd, data, path=path)
    finally:
        os.close(fd)
    return decode(data)


def read_text(path: Path) -> str:
    """A host file's text. Raises :class:`NoDataError` when the file does not exist or the kernel
    answers EOPNOTSUPP (a PSI file with PSI off reads that way); other OS errors propagate, and
    so do :class:`FileTooLargeError` and ``UnicodeDecodeError``. For the node's own files, read
    once a sample (:func:`read_optional` is the fast one)."""
    try:
        return read_file(path)
    except FileNotFoundError as exc:
        raise NoDataError(f"{path} does not exist") from exc
    except OSError as exc:
        if exc.errno == errno.EOPNOTSUPP:
            raise NoDataError(f"{path}: not supported by this kernel") from exc
        raise


def read_optional(path: str | Path) -> str | None:
    """A host file's text, or ``None`` when it does not exist, is not supported, or belongs to
    a cgroup removed while we read it (kernfs answers ENODEV). Used for the many per-cgroup
    files that only some kernels or controllers have; other OS errors propagate, and so do
    :class:`FileTooLargeError` and ``UnicodeDecodeError``."""
    try:
        return read_file(path)
    except OSError as exc:
        if is_absent(exc):
            return None
        raise


def is_absent(exc: OSError) -> bool:
    """Whether an error reading a host file means "no data": the file does not exist, the
    kernel does not support it here (EOPNOTSUPP), or its cgroup was removed (kernfs answers
    ENODEV, fs/kernfs/file.c)."""
    return isinstance(exc, FileNotFoundError) or exc.errno in (errno.EOPNOTSUPP, errno.ENODEV)


def parse_flat_keyed(text: str, keys: frozenset[str] | None = None) -> dict[str, int]:
    """Parse a flat-keyed file (``key value`` lines: ``memory.stat``, ``memory.events``,
    ``memory.oom_control``) into ``{key: int}``; lines that are not that shape are skipped.
    With ``keys``, only those keys are kept, with the same values (a cgroup v2 ``memory.stat``
    has some 60 lines, of which nodeguard needs three)."""
    if keys is not None and _plain(text):
        return _pick(text, keys)
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 2:
            continue
        if keys is not None and parts[0] not in keys:
            continue
        try:
            out[parts[0]] = int(parts[1])
        except ValueError:
            continue
    return out


def _plain(text: str) -> bool:
    """Whether ``text`` is ASCII with no white space but single spaces and ``\n`` line ends and
    no line that starts with a space: where :func:`_pick` finds what the line loop finds."""
    return (
        text.isascii()
        and "\t" not in text
        and "\r" not in text
        and "\v" not in text
        and "\f" not in text
        and "\x1c" not in text
        and "\x1d" not in text
        and "\x1e" not in text
        and "\x1f" not in text
        and "\n " not in text
        and not text.startswith(" ")
    )


def _pick(text: str, keys: frozenset[str]) -> dict[str, int]:
    """The loop of :func:`parse_flat_keyed` for a :func:`_plain` text, by searching for each key
    at a line start. A line ``key value`` there splits into exactly the key and the rest; the
    rest (any further token or spaces included) converts with ``int`` exactly when the loop's
    two-token line would; later lines win. The keys come in no particular order."""
    found: dict[str, int] = {}
    t = "\n" + text
    for key in keys:
        needle = f"\n{key} "
        at = t.find(needle)
        while at >= 0:
            start = at + len(needle)
            end = t.find("\n", start)
            token = t[start:] if end < 0 else t[start:end]
            try:
                value = int(token)
            except ValueError:
                pass
            else:
                found[key] = value  # the later line wins, as in the loop
            at = t.find(needle, start)
    return found
