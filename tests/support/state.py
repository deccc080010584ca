"""State files as successive agent processes open them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nodeguard.statefile import StateFile

_states: dict[Path, StateFile] = {}


def state_at(*, path: Path, **kw: Any) -> StateFile:
    """A StateFile at ``path`` as a new agent process would open it: the previous one opened
    here (the "process" before the restart) lets go of the directory first, as a dead process
    does."""
    old = _states.pop(path, None)
    if old is not None:
        old.release()
    state = StateFile(path=path, **kw)
    _states[path] = state
    return state
