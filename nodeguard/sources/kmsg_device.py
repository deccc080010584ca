"""Reading ``/dev/kmsg``: each read one record, non-blocking, from where the last one stopped
(Documentation/ABI/testing/dev-kmsg).

A fresh open starts at the oldest record still in the ring buffer; a read at the end fails with
EAGAIN, and EPIPE means records were overwritten before they were read (the next read goes on
from the oldest left). A fixture tree's ``kmsg`` is a regular file of records, one a line, read
whole every time.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import NamedTuple

from nodeguard.sources import NoDataError

__all__ = ["Drained", "KmsgDevice"]


class Drained(NamedTuple):
    """The records read (raw text, one a string); ``from_start``: they are the whole log again
    (a regular file), not only those since the last read."""

    records: list[str]
    from_start: bool


class KmsgDevice:
    """The kernel log at ``path``, opened at the first :meth:`drain`."""

    def __init__(self, *, path: Path) -> None:
        self._path = path
        self._fd: int | None = None
        self._is_device = False

    def _open(self) -> int:
        if self._fd is None:
            path = self._path
            try:
                self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            except FileNotFoundError as exc:
                raise NoDataError(f"{path} does not exist") from exc
            except PermissionError as exc:
                raise NoDataError(
                    f"{path}: permission denied (needs CAP_SYSLOG, and in a container the "
                    "device allowed by the runtime: see the DaemonSet's kernel-log component)"
                ) from exc
            self._is_device = stat.S_ISCHR(os.fstat(self._fd).st_mode)
        return self._fd

    def drain(self) -> Drained:
        """Every record that arrived since the last drain (a regular file: all of it). Raises
        :class:`NoDataError` when the log cannot be opened for lack of the file or of
        permission (``CAP_SYSLOG`` with ``kernel.dmesg_restrict=1``), ``OSError`` when a read
        fails otherwise."""
        fd = self._open()
        if not self._is_device:
            os.lseek(fd, 0, os.SEEK_SET)
            chunks = []
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
            text = b"".join(chunks).decode("utf-8", "replace")
            return Drained(text.splitlines(), from_start=True)
        out: list[str] = []
        while True:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # records overwritten before we read them; go on from the next
                raise
            if not chunk:
                break
            out.append(chunk.decode("utf-8", "replace"))
        return Drained(out, from_start=False)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
