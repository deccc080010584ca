"""The cgroup v1 memory thresholds held: a few levels of each limited container's limit
(:mod:`nodeguard.sampling.notify.thresholds`), within a budget of descriptors."""

from __future__ import annotations

from collections.abc import Sequence

from nodeguard.sampling.notify.kinds import NotifyStatus, Wakeup, WarnOnce, Watched
from nodeguard.sampling.notify.readers import LoopReaders
from nodeguard.sampling.notify.thresholds import Threshold, register

__all__ = ["ThresholdSet"]


class ThresholdSet:
    """Thresholds by container key; ``by_fd``: each threshold by its eventfd. Keeps ``status``
    (``registered``: thresholds held) up to date."""

    def __init__(self, *, status: NotifyStatus, readers: LoopReaders, warn: WarnOnce) -> None:
        self._status = status
        self._readers = readers
        self._warn = warn
        self._by_key: dict[str, list[Threshold]] = {}
        self.by_fd: dict[int, Threshold] = {}

    def consume(self, fd: int) -> list[Wakeup] | None:
        """The wakeup of the threshold on eventfd ``fd`` (none where it had not fired);
        ``None`` where ``fd`` is not one of them."""
        th = self.by_fd.get(fd)
        if th is None:
            return None
        return [Wakeup("threshold", th.key)] if th.consume() else []

    def sync(
        self, watched: Sequence[Watched], *, levels: Sequence[float], max_thresholds: int
    ) -> None:
        """Thresholds at each of ``levels`` (shares) of each container's limit, the first
        ``max_thresholds // len(levels)`` containers only; gone containers lose theirs. A
        registration refused by the kernel or its permissions stops the rest (they would fail
        alike); a cgroup gone meanwhile (``FileNotFoundError``) is skipped."""
        status = self._status
        wanted = {w.key: w for w in watched}
        for key in [k for k in self._by_key if k not in wanted]:
            self.drop(key)
        budget = max_thresholds // max(1, len(levels))
        for w in list(wanted.values())[: max(0, budget)]:
            current = self._by_key.get(w.key)
            limit = w.limit or 0
            if (
                current
                and current[0].cgroup == w.directory
                and current[-1].level == int(limit * levels[-1])
            ):
                continue  # registered, and the limit has not moved
            if current:
                self.drop(w.key)
            made: list[Threshold] = []
            try:
                for level in levels:
                    made.append(register(key=w.key, cgroup=w.directory, level=int(limit * level)))
            except OSError as exc:
                for th in made:
                    th.close()
                status.error = f"{w.directory}: {exc}"
                self._warn.warn(
                    f"threshold:{type(exc).__name__}",
                    "cgroup v1 memory thresholds not available (%s): focus sampling only",
                    exc,
                )
                if not isinstance(exc, FileNotFoundError):
                    break  # a kernel or permission refusal: the others would fail alike
                continue
            self._by_key[w.key] = made
            for th in made:
                self.by_fd[th.event_fd] = th
                self._readers.watch(th.event_fd)
        status.registered = sum(len(t) for t in self._by_key.values())
        status.available = status.registered > 0

    def drop(self, key: str) -> None:
        """Unregister (close) the thresholds of container ``key``, if any."""
        for th in self._by_key.pop(key, []):
            self.by_fd.pop(th.event_fd, None)
            self._readers.unwatch(th.event_fd)
            th.close()

    def drop_all(self) -> None:
        for key in list(self._by_key):
            self.drop(key)
