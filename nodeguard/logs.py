"""Log lines that repeat are rate-limited, whoever writes them.

At the descriptor limit asyncio's accept loop logged ``socket.accept() out of system resource``
197,309 times in 30 s (87 MB of log): a condition that lasts makes a line per event, and the
log fills the node's disk and buries everything else. :class:`RepeatFilter`, installed on the
root logger's handlers (so it sees the records of every library), lets a burst of
:data:`BURST` records of one kind through per :data:`WINDOW` seconds and drops the rest; the
first record of the next window says how many were dropped. A kind is the logger, the level and
the rendered message (template *and* arguments): what really repeats is the same line, while one
template says different things (every action result is one template with its own rule, target
and outcome; every rule-reload error one template with its own file and line), and keying on the
template once let 5 of 30 action results reach the log. A kind whose drops no later line of its
own reports is reported by the next record of any kind after its window ends, and by
:func:`report_dropped` (the agent calls it when it stops), as one line naming the count and the
line dropped: nothing is dropped without a note.

Audit lines (every action result, firing, refusal and rule-reload error: the log is the audit
trail) are written with ``extra=AUDIT`` and never dropped.

:class:`ClientErrorFilter` turns aiohttp's report of a request it could not parse (a bad chunk
size, an over-long header: the client's fault, answered 400 by aiohttp itself) from an error with
a traceback into one line at info.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from types import MappingProxyType

from aiohttp.http_exceptions import HttpProcessingError

__all__ = [
    "AUDIT",
    "BURST",
    "WINDOW",
    "ClientErrorFilter",
    "RepeatFilter",
    "install_log_filters",
    "report_dropped",
]

#: Records of one kind let through per window.
BURST = 5
#: Seconds of a window.
WINDOW = 60.0
#: ``extra=`` of an audit line: never rate-limited (see the module docstring).
AUDIT: Mapping[str, object] = MappingProxyType({"audit": True})
# Seconds between two sweeps for kinds whose drops are still unreported.
_SWEEP = 1.0
# The filters install_log_filters made, for report_dropped.
_INSTALLED: list[RepeatFilter] = []
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
        self._swept = clock()
        self._noting = False

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "audit", False) or self._noting:
            return True
        now = self._clock()
        passed = self._decide(record, now=now)
        if now - self._swept >= _SWEEP:  # after the decision: a kind's own record says its drops
            self._swept = now
            self._note(ended_before=now - self._window)
        return passed

    def _decide(self, record: logging.LogRecord, *, now: float) -> bool:
        kind = (record.name, record.levelno, _rendered(record))
        state = self._kinds.get(kind)
        if state is None:
            state = self._kinds[kind] = [now, 0, 0]
            if len(self._kinds) > _KINDS:
                self._forget()
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

    def report_dropped(self) -> None:
        """Log one line for every kind with drops not yet reported, whatever its window."""
        self._note(ended_before=None)

    def _forget(self) -> None:
        # The least recently seen kind goes; its drops are said before they are forgotten.
        kind, (_start, _passed, dropped) = self._kinds.popitem(last=False)
        if dropped:
            self._say(kind, int(dropped))

    def _note(self, *, ended_before: float | None) -> None:
        for kind, state in list(self._kinds.items()):
            if state[2] and (ended_before is None or state[0] <= ended_before):
                self._say(kind, int(state[2]))
                del self._kinds[kind]

    def _say(self, kind: tuple[str, int, str], dropped: int) -> None:
        name, level, message = kind
        self._noting = True  # the note itself goes through this filter: let it pass
        try:
            logging.getLogger(__name__).log(
                level,
                "%d more line(s) like this dropped (logger %s) in a %.0fs window: %s",
                dropped,
                name,
                self._window,
                message,
                extra=AUDIT,
            )
        finally:
            self._noting = False


def _rendered(record: logging.LogRecord) -> str:
    try:
        return record.getMessage()
    except Exception:  # a bad format string: the logging module reports it on emit
        return str(record.msg)


def report_dropped() -> None:
    """Make every filter :func:`install_log_filters` installed report its unreported drops."""
    for repeat in _INSTALLED:
        repeat.report_dropped()


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
    _INSTALLED.append(repeat)
    return repeat
