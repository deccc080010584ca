"""Progress for long steps (a Go build, waiting on another process's build): a line when the
step starts, one every :data:`EVERY` seconds while it lasts, and one with its time at the end,
on stderr, so nobody watches a silent terminal for minutes. Waiting on another process's
build lock is such a step too (:func:`take_lock`)."""

from __future__ import annotations

import contextlib
import fcntl
import sys
import threading
import time
from collections.abc import Iterator
from typing import IO

__all__ = ["EVERY", "step", "take_lock"]

#: Seconds between two "still ..." lines.
EVERY = 30.0


@contextlib.contextmanager
def step(what: str, *, every: float = EVERY) -> Iterator[None]:
    """Say ``what`` is under way, keep saying so, and say how long it took."""
    started = time.monotonic()
    done = threading.Event()

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def beat() -> None:
        while not done.wait(every):
            say(f"  ... still {what} ({time.monotonic() - started:.0f}s)")

    say(f"{what} ...")
    thread = threading.Thread(target=beat, name="progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
    say(f"{what}: done in {time.monotonic() - started:.0f}s")


def take_lock(lock: IO[str], *, what: str) -> None:
    """Take an exclusive ``flock`` on an open file, saying so while another process holds it
    (building ``what``)."""
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        with step(f"waiting for another process that builds {what} ({lock.name})"):
            fcntl.flock(lock, fcntl.LOCK_EX)
