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

Memory is bounded: at most :data:`MAX_KINDS` kinds are remembered, oldest window first. A kind whose
window has ended is forgotten for room (its next record would open a new window anyway), its
drops said first. When all of them are inside their window (a node whose 1,100 containers each
log one line a sample), a kind not remembered is never let in by forgetting one that is (it
would be forgotten in turn just before it comes round, and nothing would be limited): it is
counted in its logger and level's *overflow*, limited as one kind (:data:`BURST` per window),
whose drops are said as "N line(s) of M kind(s)".

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
from dataclasses import dataclass, field
from types import MappingProxyType

from aiohttp.http_exceptions import HttpProcessingError

__all__ = [
    "AUDIT",
    "BURST",
    "MAX_KINDS",
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
#: Kinds remembered at once (see the module docstring): a caller that formats its own message
#: (an f-string) makes a kind per message, and the filter must not grow with them.
MAX_KINDS = 1024
# Overflows kept apart (one a logger and level); more loggers than this share one a level.
_OVERFLOWS = 64


@dataclass
class _Overflow:
    """The kinds of one logger and level that found no room, limited as one kind."""

    start: float
    passed: int = 0
    dropped: int = 0
    # Hashes of the kinds dropped (at most MAX_KINDS: M is then "at least"), and one of them.
    kinds: set[int] = field(default_factory=set)
    sample: str = ""

    def said(self) -> str:
        many = "+" if len(self.kinds) >= MAX_KINDS else ""
        return f"{self.dropped} line(s) of {len(self.kinds)}{many} kind(s)"


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
        # kind -> [window start, records let through in it, records dropped in it], in the
        # order the windows started (a kind's new window moves it to the end).
        self._kinds: OrderedDict[tuple[str, int, str], list[float]] = OrderedDict()
        self._overflow: dict[tuple[str, int], _Overflow] = {}
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
            if not self._room(now=now):
                return self._overflowed(record, kind, now=now)
            state = self._kinds[kind] = [now, 0, 0]
        start, passed, dropped = state
        if now - start >= self._window:
            state[:] = [now, 1, 0]
            self._kinds.move_to_end(kind)
            if dropped:
                self._annotate(record, f"{int(dropped)} more like this")
            return True
        if passed < self._burst:
            state[1] = passed + 1
            return True
        state[2] = dropped + 1
        self.suppressed += 1
        return False

    def _room(self, *, now: float) -> bool:
        """Whether a kind may be remembered: kinds whose window has ended (the oldest come
        first) are forgotten for it, their drops said; a kind inside its window never is."""
        while len(self._kinds) >= MAX_KINDS:
            kind, (start, _passed, dropped) = next(iter(self._kinds.items()))
            if now - start < self._window:
                return False
            del self._kinds[kind]
            if dropped:
                self._say(kind, int(dropped))
        return True

    def _overflowed(
        self, record: logging.LogRecord, kind: tuple[str, int, str], *, now: float
    ) -> bool:
        key = (record.name, record.levelno)
        if key not in self._overflow and len(self._overflow) >= _OVERFLOWS:
            key = ("", record.levelno)
        over = self._overflow.get(key)
        if over is None:
            over = self._overflow[key] = _Overflow(start=now)
        if now - over.start >= self._window:
            if over.dropped:
                self._annotate(record, f"{over.said()} not remembered")
            self._overflow[key] = _Overflow(start=now, passed=1)
            return True
        if over.passed < self._burst:
            over.passed += 1
            return True
        over.dropped += 1
        if len(over.kinds) < MAX_KINDS:
            over.kinds.add(hash(kind))
        over.sample = over.sample or kind[2]
        self.suppressed += 1
        return False

    def _annotate(self, record: logging.LogRecord, what: str) -> None:
        # getMessage() applies the arguments once; the record then carries plain text.
        record.msg = f"{record.getMessage()} [{what} dropped in the last {self._window:.0f}s]"
        record.args = None

    def report_dropped(self) -> None:
        """Log one line for every kind with drops not yet reported, whatever its window."""
        self._note(ended_before=None)

    def _note(self, *, ended_before: float | None) -> None:
        for kind, state in list(self._kinds.items()):
            ended = ended_before is not None and state[0] <= ended_before
            if state[2] and (ended or ended_before is None):
                self._say(kind, int(state[2]))
                del self._kinds[kind]
            elif ended:
                del self._kinds[kind]  # its next record opens a new window anyway
        for key, over in list(self._overflow.items()):
            if ended_before is None or over.start <= ended_before:
                if over.dropped:
                    self._say_overflow(key, over)
                del self._overflow[key]

    def _say(self, kind: tuple[str, int, str], dropped: int) -> None:
        name, level, message = kind
        self._log(
            level,
            "%d more line(s) like this dropped (logger %s) in a %.0fs window: %s",
            dropped,
            name,
            self._window,
            message,
        )

    def _say_overflow(self, key: tuple[str, int], over: _Overflow) -> None:
        name, level = key
        self._log(
            level,
            "%s dropped (logger %s) in a %.0fs window, over the %d kinds remembered; one: %s",
            over.said(),
            name or "(many)",
            self._window,
            MAX_KINDS,
            over.sample,
        )

    def _log(self, level: int, msg: str, *args: object) -> None:
        self._noting = True  # the note itself goes through this filter: let it pass
        try:
            logging.getLogger(__name__).log(level, msg, *args, extra=AUDIT)
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
