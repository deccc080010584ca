"""Cgroup interface files held open between samples and re-read with ``pread(2)`` at offset 0.

A full node has some 440 pod and container cgroups and each sample reads five files of each.
Opening and closing a cgroupfs file costs the kernel far more than producing its few bytes (on
kernel 6.18, cgroup v1, measured by a loop in one process: 11.8 us to open, read and close a
small cgroup file against 1.8 us to ``pread`` it open; 23.6 against 13.2 us for
``memory.stat``; docs/benchmarks.md), so the cgroup walk keeps each file open and re-reads it.

Why re-reading an open file at offset 0 gives fresh values: cgroup interface files are kernfs
files with a ``seq_show`` operation, read through ``seq_read_iter`` (fs/kernfs/file.c), which
restarts the record iterator whenever a read starts at offset 0 and produces the file's whole
text in that one read when the buffer is larger than the text (kernfs files without their own
``seq_start`` have a single record; fs/seq_file.c). ``memory.stat``, the longest, is a few KiB.

What it costs: one descriptor per file (five per cgroup: about 2,200 at 330 containers, 6,700
at 1,000), and the page the kernel keeps as each open seq_file's buffer after its first read,
charged to the agent's own memory cgroup (kernel 6.18, cgroup v1: 4.5-4.8 KiB per file, 10 MiB
for 2,200 files, given back on close; benchmarks/kernel_files.py, docs/benchmarks.md). Callers
give a budget (:func:`descriptor_budget`: at most 8,192 files, under 40 MiB); past it, files are
read with open/read/close as before, so the agent never runs out of descriptors for sockets.
Descriptors of a cgroup that went away are closed at the end of the sample that no longer saw it
(:meth:`OpenFiles.sweep`), so a removed cgroup is never held for longer than one interval.

A directory removed and made again under the same name (a static pod's cgroup) is told apart two
ways: kernfs answers ``ENODEV`` on a file of a removed cgroup, and the directory's inode number,
which the walk gets free from ``getdents`` (``os.DirEntry.inode``), changes. On other file
systems (the synthetic trees of the tests and benchmarks) the inode check is what catches it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import resource
from collections.abc import Callable
from typing import TypeVar

from nodeguard.sources.files import FLAGS, decode, is_absent, read_on, read_optional

__all__ = ["OpenFiles", "descriptor_budget"]

log = logging.getLogger(__name__)
T = TypeVar("T")

_CHUNK = 1 << 16
# Left for everything else the agent opens: sockets (web server, Kubernetes API, webhooks),
# the kernel log, NVML's device nodes, the rule files, inotify.
_RESERVE = 1024
# What to ask RLIMIT_NOFILE's soft limit to be raised to (capped by the hard limit).
_WANTED = 16384
# At most this many files held (about 1,600 containers): each keeps a page of kernel memory
# charged to the agent's cgroup, and the DaemonSet's memory limit must hold them.
_MAX_HELD = 8192
_GONE = (errno.ENODEV, errno.ENOENT, errno.ESTALE, errno.EBADF)


def descriptor_budget(*, raise_limit: bool) -> int:
    """How many cgroup files the agent may hold open: the soft ``RLIMIT_NOFILE`` (getrlimit(2))
    less a reserve of 1,024 for sockets and the rest, at most 8,192 (their kernel memory), 0
    when that leaves nothing.

    With ``raise_limit``, the soft limit is first raised toward 16,384, never above the hard
    limit (a container runtime commonly starts processes at soft 1,024, hard 524,288 or more;
    an unprivileged process may raise its soft limit up to its hard one). Raising it is
    process-wide, so only the agent's own entry point asks for it.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if raise_limit:
        cap = _WANTED if hard == resource.RLIM_INFINITY else min(_WANTED, hard)
        if soft != resource.RLIM_INFINITY and soft < cap:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (cap, hard))
            except (ValueError, OSError) as exc:
                log.warning("could not raise RLIMIT_NOFILE from %d to %d: %s", soft, cap, exc)
            else:
                log.info("RLIMIT_NOFILE soft limit raised from %d to %d", soft, cap)
                soft = cap
    if soft == resource.RLIM_INFINITY:
        soft = _WANTED
    return max(0, min(soft - _RESERVE, _MAX_HELD))


class _Held:
    """One open file: its descriptor, its directory's inode, the sample it was last read in,
    and its last bytes with what they parsed to."""

    __slots__ = ("data", "fd", "generation", "ino", "parse", "value")

    def __init__(self, *, fd: int, ino: int, generation: int) -> None:
        self.fd, self.ino, self.generation = fd, ino, generation
        self.data: bytes | None = None  # the bytes last read, when one read held them all
        self.parse: object = None
        self.value: object = None


class OpenFiles:
    """Files kept open by path, re-read with ``pread`` at offset 0; at most ``max_open`` at once
    (0: every read opens, reads and closes, as :func:`~nodeguard.sources.files.read_optional`).

    ``read(path, parse, dir_ino=...)`` is ``parse(text)`` of the file now, or ``None`` when the
    file does not exist, is not supported, or its cgroup was removed (``read_optional``'s
    contract; other OS errors and ``parse``'s own propagate). When the text is the same as at
    the last read, the last result is returned without parsing again: most cgroup files
    (``memory.max``, ``memory.events``, ``memory.pressure`` of a cgroup that does not stall)
    read the same from one sample to the next, and ``parse`` must return a value that is never
    changed afterwards. ``dir_ino`` is the inode number of the file's directory as listed this
    sample. ``sweep()`` after each sample closes what that sample did not read. Not
    thread-safe: one sampler thread uses it.
    """

    def __init__(self, *, max_open: int) -> None:
        self._max_open = max_open
        self._open: dict[str, _Held] = {}
        self._generation = 0

    @property
    def open_count(self) -> int:
        """Descriptors held now."""
        return len(self._open)

    def read(self, path: str, parse: Callable[[str], T], *, dir_ino: int) -> T | None:
        """The parsed file now (see the class docstring)."""
        held = self._open.get(path)
        if held is not None:
            if held.ino == dir_ino:
                try:
                    data = os.pread(held.fd, _CHUNK, 0)
                except OSError as exc:
                    if exc.errno not in _GONE:
                        raise
                    self._drop(path)  # cgroup removed (and maybe made again): open anew
                else:
                    held.generation = self._generation
                    if data == held.data and parse is held.parse:  # the common case: as before
                        return held.value  # type: ignore[return-value]  # parse's, for this text
                    return self._parsed(held, data, parse, path)
            else:
                self._drop(path)
        if len(self._open) >= self._max_open:
            text = read_optional(path)
            return None if text is None else parse(text)
        try:
            fd = os.open(path, FLAGS)
        except OSError as exc:
            if is_absent(exc):
                return None
            raise
        try:
            data = os.pread(fd, _CHUNK, 0)
        except OSError as exc:
            os.close(fd)
            if is_absent(exc):
                return None
            raise
        held = _Held(fd=fd, ino=dir_ino, generation=self._generation)
        self._open[path] = held
        return self._parsed(held, data, parse, path)

    def _parsed(self, held: _Held, data: bytes, parse: Callable[[str], T], path: str) -> T:
        first = data
        if len(data) == _CHUNK:  # never a cgroup file in practice; bounded all the same
            data = read_on(held.fd, data, path=path, pread=True)
        value = parse(decode(data))
        # A file longer than one read is never taken as unchanged by its first chunk alone.
        # The bytes kept are a copy: pread's result sits at the start of a 64 KiB allocation,
        # and keeping thousands of those fragmented the heap (+7 MiB RSS over 10 minutes at 330
        # containers, docs/benchmarks.md).
        held.data = bytes(memoryview(first)) if len(first) < _CHUNK else None
        held.parse, held.value = parse, value
        return value

    def sweep(self) -> int:
        """Close every file not read since the last sweep; start the next sample. Returns how
        many were closed."""
        gone = [p for p, h in self._open.items() if h.generation != self._generation]
        for path in gone:
            self._drop(path)
        self._generation += 1
        return len(gone)

    def _drop(self, path: str) -> None:
        held = self._open.pop(path, None)
        if held is None:
            return
        with contextlib.suppress(OSError):  # a failed close has nothing left to release
            os.close(held.fd)

    def close(self) -> None:
        """Close every held file; later reads open, read and close each file."""
        self._max_open = 0
        for path in list(self._open):
            self._drop(path)
