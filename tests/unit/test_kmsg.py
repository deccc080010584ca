"""OOM kills from the kernel log: record parsing, pairing, counting once across restarts."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from nodeguard.paths import HostPaths
from nodeguard.sources.kmsg import OomEventParser, OomLogReader, parse_record
from nodeguard.sources.oom_events import ParsedKill
from tests.fixtures.make_hosts import B_SLICE, CID, UID_B, kmsg, oom_records
from tests.support.hosts import HOSTS, host_paths

BOOT = 1_700_000_000.0


def test_parse_record() -> None:
    r = parse_record("6,1234,5000000,-;hello world\n SUBSYSTEM=acpi\n")
    assert r is not None
    assert (r.sequence, r.usec, r.message, r.flags) == (1234, 5_000_000, "hello world", "-")
    assert parse_record("garbage") is None
    assert parse_record("6,x,1,-;msg") is None
    # A fragment of a line keeps its leading space and its flag (c: continued, +: continues).
    frag = parse_record("6,9,1,+; as a result of limit of /kubepods")
    assert frag is not None and (frag.flags, frag.message) == (
        "+",
        " as a result of limit of /kubepods",
    )
    assert parse_record("6,9,1;no flags field") == parse_record("6,9,1,-;no flags field")


def _feed(records: list[str]) -> list[ParsedKill]:
    parser = OomEventParser()
    kills: list[ParsedKill] = []
    for i, text in enumerate(records):
        rec = parse_record(f"3,{10 + i},{2_000_000 + i},-;{text}")
        assert rec is not None
        kills += parser.feed(record=rec, boot_time=BOOT)
    return kills + parser.flush()


def test_pairs_context_and_kill() -> None:
    memcg = f"/kubepods/burstable/pod{UID_B}/{CID[3]}"
    records = oom_records(
        memcg=memcg, pid=99, comm="python3", anon_kb=65_000, constraint="CONSTRAINT_MEMCG"
    )
    kills = _feed(records)
    assert len(kills) == 1
    k = kills[0].kill
    assert not kills[0].repeat
    assert (k.pid, k.process, k.constraint) == (99, "python3", "CONSTRAINT_MEMCG")
    assert k.task_memcg == memcg
    assert k.oom_memcg == f"/kubepods/burstable/pod{UID_B}"
    assert (k.pod_uid, k.container_id) == (UID_B, CID[3])
    assert k.anon_rss_bytes == 65_000 * 1024
    assert k.file_rss_bytes == 1200 * 1024
    assert k.time == BOOT + 2.000002
    assert k.sequence == 12


def test_kill_without_context_still_counts() -> None:
    kills = _feed(
        [
            "Out of memory: Killed process 12 (dd) total-vm:1kB, "
            "anon-rss:4kB, file-rss:0kB, shmem-rss:0kB, UID:0"
        ]
    )
    assert len(kills) == 1
    kill = kills[0].kill
    assert kill.task_memcg is None and kill.pod_uid is None
    assert kill.anon_rss_bytes == 4096
    assert kill.constraint == "CONSTRAINT_NONE"  # from the prefix: a node OOM


def test_fixture_log_counts(v2_host: HostPaths) -> None:
    oom = OomLogReader(paths=v2_host).read()
    assert oom.total == 2
    assert oom.by_constraint == {
        "CONSTRAINT_MEMCG": 1,
        "CONSTRAINT_NONE": 1,
        "CONSTRAINT_CPUSET": 0,
        "CONSTRAINT_MEMORY_POLICY": 0,
    }
    assert oom.by_container == {f"{UID_B}/{CID[3]}": 1}
    assert [(k.pid, k.container_id) for k in oom.recent] == [(4100, CID[3]), (333, None)]
    assert oom.recent[0].time == 1_700_000_000 + 5003.0  # the "Killed process" record


def _copy_host(tmp_path: Path) -> HostPaths:
    root = tmp_path / "host"
    shutil.copytree(HOSTS / "v2-systemd-containerd", root)
    return HostPaths(
        procfs=root / "proc", sysfs=root / "sys", kmsg=root / "kmsg", state=tmp_path / "state"
    )


def test_counted_once_across_restarts(tmp_path: Path) -> None:
    paths = _copy_host(tmp_path)
    first = OomLogReader(paths=paths)
    assert first.read().total == 2
    assert first.read().total == 2  # the same records read again are not new kills
    first.close()

    # Restart: the ring buffer still holds the same records plus one new kill.
    more = oom_records(
        memcg=f"/kubepods/burstable/pod{UID_B}/{CID[4]}",
        pid=5000,
        comm="hog",
        anon_kb=1000,
        constraint="CONSTRAINT_MEMCG",
    )
    text = paths.kmsg.read_text()
    last_seq = int(text.strip().splitlines()[-1].split(",")[1])
    paths.kmsg.write_text(
        text + "".join(f"6,{last_seq + 1 + i},{9_000_000 + i},-;{r}\n" for i, r in enumerate(more))
    )
    second = OomLogReader(paths=paths)
    oom = second.read()
    assert oom.total == 3
    assert oom.by_constraint == {
        "CONSTRAINT_MEMCG": 2,
        "CONSTRAINT_NONE": 1,
        "CONSTRAINT_CPUSET": 0,
        "CONSTRAINT_MEMORY_POLICY": 0,
    }
    assert oom.by_container == {f"{UID_B}/{CID[3]}": 1, f"{UID_B}/{CID[4]}": 1}
    assert [k.pid for k in oom.recent] == [4100, 333, 5000]


def test_new_boot_starts_over(tmp_path: Path) -> None:
    paths = _copy_host(tmp_path)
    OomLogReader(paths=paths).read()
    boot_id = paths.procfs / "sys/kernel/random/boot_id"
    boot_id.write_text("11111111-2222-3333-4444-555555555555\n")
    paths.kmsg.write_text(kmsg(["Linux version 6.1.0"]))
    assert OomLogReader(paths=paths).read().total == 0


def test_without_state_dir_nothing_is_written(tmp_path: Path) -> None:
    oom = OomLogReader(paths=host_paths("v2-systemd-containerd")).read()
    assert oom.total == 2
    assert not list(tmp_path.iterdir())


def _log_with(tmp_path: Path, records: list[str]) -> HostPaths:
    paths = _copy_host(tmp_path)
    paths.kmsg.write_text(kmsg(records))
    return paths


def test_old_kernel_kill_record_of_its_own(tmp_path: Path) -> None:
    # Before 5.1 the kernel chose a victim in one record and killed it in another.
    paths = _log_with(
        tmp_path,
        [
            "Memory cgroup out of memory: Kill process 77 (java) score 999 or sacrifice child",
            "Killed process 77 (java) total-vm:4000000kB, anon-rss:2000000kB, file-rss:0kB, "
            "shmem-rss:0kB",
            "oom_reaper: reaped process 77 (java), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB",
        ],
    )
    oom = OomLogReader(paths=paths).read()
    assert oom.total == 1
    assert oom.recent[0].pid == 77 and oom.recent[0].anon_rss_bytes == 2_000_000 * 1024


def test_known_constraints_start_at_zero(tmp_path: Path) -> None:
    oom = OomLogReader(paths=_log_with(tmp_path, ["Linux version 6.1.0"])).read()
    assert oom.total == 0
    assert oom.by_constraint == {
        "CONSTRAINT_NONE": 0,
        "CONSTRAINT_CPUSET": 0,
        "CONSTRAINT_MEMORY_POLICY": 0,
        "CONSTRAINT_MEMCG": 0,
    }


def test_container_counts_never_go_down(tmp_path: Path) -> None:
    # More kills than the bounded list of recent kills keeps: counts stay exact.
    memcg_a = f"/kubepods/burstable/pod{UID_B}/{CID[3]}"
    memcg_b = f"/kubepods/burstable/pod{UID_B}/{CID[4]}"
    records: list[str] = []
    for i in range(300):
        records += oom_records(
            memcg=memcg_a, pid=1000 + i, comm="a", anon_kb=1, constraint="CONSTRAINT_MEMCG"
        )
    for i in range(100):
        records += oom_records(
            memcg=memcg_b, pid=5000 + i, comm="b", anon_kb=1, constraint="CONSTRAINT_MEMCG"
        )
    paths = _log_with(tmp_path, records)
    oom = OomLogReader(paths=paths).read()
    assert oom.by_container == {f"{UID_B}/{CID[3]}": 300, f"{UID_B}/{CID[4]}": 100}
    assert len(oom.recent) == 256
    assert OomLogReader(paths=paths).read().by_container[f"{UID_B}/{CID[3]}"] == 300


def test_restart_in_the_middle_of_a_group_kill(tmp_path: Path) -> None:
    # The agent reads the header, the first kill and the group line, restarts, then reads the
    # other members: records already counted are read again to rebuild the event, so the
    # members still belong to the container, and nothing is counted twice.
    c3 = f"{B_SLICE}/cri-containerd-{CID[3]}.scope"
    head = [
        f"oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
        f"oom_memcg={c3},task_memcg={c3},task=python3,pid=10,uid=0",
        "Memory cgroup out of memory: Killed process 10 (python3) total-vm:2kB, anon-rss:1kB, "
        "file-rss:0kB, shmem-rss:0kB",
        f"Tasks in {c3} are going to be killed due to memory.oom.group set",
    ]
    tail = [
        "Memory cgroup out of memory: Killed process 10 (python3) total-vm:2kB, anon-rss:1kB, "
        "file-rss:0kB, shmem-rss:0kB",
        "Memory cgroup out of memory: Killed process 11 (w) total-vm:2kB, anon-rss:1kB, "
        "file-rss:0kB, shmem-rss:0kB",
    ]
    paths = _log_with(tmp_path, head)
    first = OomLogReader(paths=paths)
    assert first.read().by_container == {f"{UID_B}/{CID[3]}": 1}
    first.close()
    paths.kmsg.write_text(kmsg([*head, *tail]))
    oom = OomLogReader(paths=paths).read()
    assert oom.by_container == {f"{UID_B}/{CID[3]}": 2}
    assert oom.repeats_by_container == {f"{UID_B}/{CID[3]}": 1}
    assert oom.total == 2


def test_state_of_an_older_agent_is_read(tmp_path: Path) -> None:
    # Before repeats were kept, a container's entry was [victims, last counted].
    paths = _copy_host(tmp_path)
    boot_id = (paths.procfs / "sys/kernel/random/boot_id").read_text().strip()
    assert paths.state is not None
    paths.state.mkdir()
    (paths.state / "kmsg-oom.json").write_text(
        json.dumps(
            {
                "boot_id": boot_id,
                "last_sequence": 10_000,
                "total": 7,
                "by_constraint": {"CONSTRAINT_MEMCG": 7},
                "by_container": {f"{UID_B}/{CID[3]}": [7, time.time()]},
                "recent": [],
            }
        )
    )
    oom = OomLogReader(paths=paths).read()
    assert (oom.total, oom.by_container, oom.repeats_by_container) == (
        7,
        {f"{UID_B}/{CID[3]}": 7},
        {},
    )


def test_a_containers_count_expires_a_day_after_its_last_kill(tmp_path: Path) -> None:
    # On the reader's own (here fake) wall clock: kept for 24 h after the kill was counted,
    # gone after, and the node's totals are kept.
    now = [1_800_000_000.0]
    paths = _copy_host(tmp_path)
    reader = OomLogReader(paths=paths, clock=lambda: now[0])
    assert reader.read().by_container == {f"{UID_B}/{CID[3]}": 1}
    now[0] += 24 * 3600 - 1
    assert reader.read().by_container == {f"{UID_B}/{CID[3]}": 1}
    now[0] += 2
    oom = reader.read()
    assert oom.by_container == {}
    assert oom.total == 2
    # The expiry is saved: a restart the next moment does not bring the count back.
    again = OomLogReader(paths=paths, clock=lambda: now[0]).read()
    assert (again.by_container, again.total) == ({}, 2)
