"""The state file on a real full filesystem, its writes off the event loop, and its clock
across restarts whatever the wall clock does."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from nodeguard import statefile
from nodeguard.statefile import StateFile
from tests.support.fullfs import PAGE, can_mount, fill, small_tmpfs

needs_root = pytest.mark.skipif(not can_mount(), reason="mounting a tmpfs needs root")


@needs_root
def test_a_short_write_on_a_full_filesystem_keeps_the_old_file(tmp_path: Path) -> None:
    # The fault: write(2) on a nearly full filesystem wrote one page of the new state and said
    # so; the count was ignored and the truncated JSON replaced the good file.
    with small_tmpfs(tmp_path / "fs", size=16 * PAGE) as fs:
        path = fs / "state.json"
        state = StateFile(path=path, node="node-a")
        state.section("alerts")["seen"] = {"k0": 1.0}
        state.save()
        good = path.read_bytes()
        filler = fill(fs, leave=PAGE)  # one page left: less than the new state needs
        state.section("alerts")["seen"] = {f"k{i:05d}": float(i) for i in range(800)}
        state.save()
        assert path.read_bytes() == good  # the old file, whole
        assert json.loads(good)["sections"]["alerts"]["seen"] == {"k0": 1.0}
        assert not state.persisted and state.save_failures == 1
        assert sorted(os.listdir(fs)) == ["filler", "state.json", "state.json.lock"]
        with pytest.raises(statefile.StateNotPersisted):
            state.checkpoint()  # a write-ahead record that cannot be written stops the step
        assert path.read_bytes() == good and state.save_failures == 2
        filler.unlink()  # room again: the next write succeeds and the agent acts again
        state.save()
        assert state.persisted
        state.release()
        again = StateFile(path=path, node="node-a")
        assert len(again.section("alerts")["seen"]) == 800 and again.recovered is None
        again.release()


async def test_a_flood_of_saves_costs_a_few_writes_off_the_event_loop(tmp_path: Path) -> None:
    state = StateFile(path=tmp_path / "state.json", node="node-a")
    seen = state.section("alerts").setdefault("seen", {})
    for i in range(300):  # 300 alerts of one delivery, each taken and saved
        seen[f"k{i}"] = float(i)
        state.save()
    assert state.writes == 0  # asked for, not written on the event loop
    assert await state.persist()
    assert state.writes <= 2  # the first request's write, and one covering the other 299
    data = json.loads((tmp_path / "state.json").read_text())
    assert len(data["sections"]["alerts"]["seen"]) == 300
    await asyncio.gather(*(state.persist() for _ in range(10)))  # nothing new: no write
    assert state.writes <= 2
    state.close()


class Machine:
    """A fake wall clock and boot clock; ``boot`` is the kernel's boot ID."""

    def __init__(self) -> None:
        self.wall, self.up, self.boot = 1_000_000.0, 500.0, "boot-1"

    def open(self, path: Path) -> StateFile:
        return StateFile(
            path=path,
            node="node-a",
            clock=lambda: self.wall,
            uptime=lambda: self.up,
            boot_id=self.boot,
        )

    def run(self, seconds: float) -> None:
        self.wall += seconds
        self.up += seconds


@pytest.mark.parametrize("step", [-7200.0, 7200.0, 0.0], ids=["back", "forward", "none"])
def test_the_state_clock_continues_by_boot_time_across_a_restart(
    tmp_path: Path, step: float
) -> None:
    m = Machine()
    path = tmp_path / "state.json"
    first = m.open(path)
    m.run(30)
    first.save()
    saved = first.now()
    first.release()  # killed
    m.run(5)  # five seconds down...
    m.wall += step  # ...while the wall clock was stepped
    second = m.open(path)
    assert second.now() == pytest.approx(saved + 5)
    m.wall -= 3 * step  # stepped again, while running: the state clock does not move
    m.up += 1
    assert second.now() == pytest.approx(saved + 6)
    second.release()


def test_after_a_reboot_the_wall_clock_counts_never_backwards(tmp_path: Path) -> None:
    m = Machine()
    path = tmp_path / "state.json"
    first = m.open(path)
    first.save()
    saved = first.now()
    first.release()
    m.boot, m.up, m.wall = "boot-2", 20.0, m.wall + 100  # rebooted, 100 s later
    second = m.open(path)
    assert second.now() == pytest.approx(saved + 100)
    second.save()
    second.release()
    m.boot, m.up, m.wall = "boot-3", 20.0, m.wall - 3600  # rebooted, the clock an hour back
    third = m.open(path)
    assert third.now() == pytest.approx(saved + 100)  # no time passed, never negative time
    third.release()
