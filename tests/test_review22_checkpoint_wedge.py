"""Review of issue 22 point 4: a write-ahead checkpoint that fails on a full disk wedges the
state file for good.

statefile.py: "A write that fails ... keeps the old file ... :attr:`StateFile.persisted` turns
False until a write succeeds ... Writes are tried again every ``retry_seconds``." A failed
:meth:`StateFile.checkpoint` asks for a generation and raises, but never wakes the writer task;
:meth:`StateFile.persist` starts the writer only when there is none, so once the writer has
run (it waits on its wake event) the waiter waits for ever and no write is tried again: with
the disk free again, ``persisted`` stays False, the remediator's step never resumes and every
new firing and delivery is refused (state_not_persisted) until the agent restarts."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from nodeguard.statefile import StateFile, StateNotPersisted
from tests.fullfs import PAGE, can_mount, fill, small_tmpfs


@pytest.mark.skipif(not can_mount(), reason="mounting a tmpfs needs root")
async def test_review22_a_failed_checkpoint_is_written_once_the_disk_has_room(
    tmp_path: Path,
) -> None:
    with small_tmpfs(tmp_path / "fs", size=16 * PAGE) as fs:
        state = StateFile(path=fs / "state.json", node="node-a", retry_seconds=0.05)
        journal = state.section("journal")
        journal["e"] = {"next": 0, "progress": {}}
        state.save()
        assert await state.persist()  # the writer task has run and waits for the next request
        filler = fill(fs)
        journal["e"]["progress"]["0"] = {"inflight": {"done": ["ns/pod"]}}
        with pytest.raises(StateNotPersisted):
            state.checkpoint()  # an eviction's note, just after the eviction
        assert not state.persisted
        filler.unlink()  # room again
        try:
            ok = await asyncio.wait_for(state.persist(), timeout=5)
        except TimeoutError:
            ok = None
        state.release()
        assert ok is True, "persist() never returned: no write was tried after the disk freed"
        assert state.persisted
