"""Log lines that repeat are rate-limited, whoever writes them.

At the descriptor limit asyncio's accept loop logged ``socket.accept() out of system resource``
197,309 times in 30 s (87 MB of log): a condition that lasts makes a line per event, and the
log fills the node's disk and buries everything else. :class:`RepeatFilter`, installed on the
root logger's handlers (so it sees the records of every library), lets a burst of
:data:`BURST` records of one kind through per :data:`WINDOW` seconds and drops the rest; the
first record of the next window says how many were dropped. A kind is the logger, the level and
the message template (``record.msg`` before its arguments), so a line that differs only in its
arguments is still one kind.

:class:`ClientErrorFilter` turns aiohttp's report of a request it could not parse (a bad chunk
size, an over-long header: the client's fault, answered 400 by aiohttp itself) from an error with
a traceback into one line at info.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable

from aiohttp.http_exceptions import HttpProcessingError

__all__ = ["BURST", "WINDOW", "ClientErrorFilter", "RepeatFilter", "install_log_filters"]

#: Records of one kind let through per window.
BURST = 5
#: Seconds of a window.
WINDOW = 60.0
# Kinds remembered at once, least recently seen forgotten first: a caller that formats its own
# message (an f-string) makes a kind per message, and the filter must not grow with them.
_KINDS = 1024


class RepeatFilter(logging.Filter):
    """Lets :data:`BURST` records of a kind through per :data:`WINDOW` seconds (see the module
    docstring). ``suppressed`` counts every record dropped. ``clock`` is seconds (monotonic)."""

    def __init__(
        self,
        *,
        burst: int = BURST,
        window: float = WINDOW,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self._burst, self._window, self._clock = burst, window, clock
        # kind -> [window start, records let through in it, records dropped in it]
        self._kinds: OrderedDict[tuple[str, int, str], list[float]] = OrderedDict()
        self.suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        kind = (record.name, record.levelno, str(record.msg))
        now = self._clock()
        state = self._kinds.get(kind)
        if state is None:
            state = self._kinds[kind] = [now, 0, 0]
            if len(self._kinds) > _KINDS:
                self._kinds.popitem(last=False)
        else:
            self._kinds.move_to_end(kind)
        start, passed, dropped = state
        if now - start >= self._window:
            state[:] = [now, 1, 0]
            if dropped:
                # getMessage() applies the arguments once; the record then carries plain text.
                record.msg = (
                    f"{record.getMessage()} [{int(dropped)} more like this dropped in the "
                    f"last {self._window:.0f}s]"
                )
                record.args = None
            return True
        if passed < self._burst:
            state[1] = passed + 1
            return True
        state[2] = dropped + 1
        self.suppressed += 1
        return False


class ClientErrorFilter(logging.Filter):
    """A record whose exception is an ``HttpProcessingError`` below 500 (aiohttp's parser
    refusing a request) loses its traceback and becomes info: see the module docstring."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError) and (exc.code or 400) < 500:
            record.msg = f"{record.getMessage()}: {exc.code} {exc.message}"
            record.args = None
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def install_log_filters(logger: logging.Logger | None = None) -> RepeatFilter:
    """Add :class:`ClientErrorFilter` then one :class:`RepeatFilter` to every handler of
    ``logger`` (the root logger by default); returns the latter. Filters on handlers see the
    records that loggers below propagate, which filters on a logger do not."""
    target = logger or logging.getLogger()
    repeat = RepeatFilter()
    for handler in target.handlers:
        handler.addFilter(ClientErrorFilter())
        handler.addFilter(repeat)
    return repeat
