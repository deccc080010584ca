"""Cgroup files held open and re-read with pread (nodeguard/sources/open_files.py): fresh values
on the real kernel's cgroupfs and on plain files, a removed or re-made cgroup never read stale,
descriptors closed when their cgroup goes, the budget kept, and the same snapshot as reading
each file anew."""

from __future__ import annotations

import os
import resource
import secrets
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from nodeguard.collectors.cgroups import CgroupsCollector
from nodeguard.paths import HostPaths
from nodeguard.sampling.sampler import Sampler, SamplerConfig
from nodeguard.snapshot import to_jsonable
from nodeguard.sources import NoDataError
from nodeguard.sources.cgroups import CgroupReader
from nodeguard.sources.open_files import OpenFiles, descriptor_budget
from tests.support.kernel_cgroup import writable_memory_controller

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hosts"


def _ino(path: Path) -> int:
    return os.stat(path).st_ino


def _int(text: str) -> int:
    return int(text)


def _held(sampler: Sampler) -> int:
    """The cgroup files the sampler's cgroups collector holds open now."""
    cgroups = next(c for c in sampler.collectors if isinstance(c, CgroupsCollector))
    return cgroups.reader.open_files


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_rereads_a_plain_file_changed_in_place(tmp_path: Path) -> None:
    d = tmp_path / "cg"
    d.mkdir()
    f = d / "memory.current"
    f.write_text("100\n")
    files = OpenFiles(max_open=10)
    assert files.read(str(f), _int, dir_ino=_ino(d)) == 100
    assert files.open_count == 1
    f.write_text("4096\n")  # same inode, new text
    assert files.read(str(f), _int, dir_ino=_ino(d)) == 4096
    assert files.open_count == 1
    files.close()
    assert files.open_count == 0


def test_same_text_gives_the_same_parsed_object_and_other_parser_parses_again(
    tmp_path: Path,
) -> None:
    f = tmp_path / "memory.events"
    f.write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    calls: list[str] = []

    def parse(text: str) -> dict[str, int]:
        calls.append(text)
        return dict((k, int(v)) for k, v in (ln.split() for ln in text.splitlines()))

    files = OpenFiles(max_open=10)
    first = files.read(str(f), parse, dir_ino=1)
    second = files.read(str(f), parse, dir_ino=1)
    assert first == {"low": 0, "high": 0, "max": 3, "oom": 1, "oom_kill": 1}
    assert second is first and len(calls) == 1
    assert files.read(str(f), lambda t: t.count("\n"), dir_ino=1) == 5  # not parse's value
    f.write_text("low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\n")
    assert files.read(str(f), parse, dir_ino=1) == {
        "low": 0,
        "high": 0,
        "max": 4,
        "oom": 2,
        "oom_kill": 2,
    }
    files.close()


def test_a_directory_made_again_under_the_same_name_is_not_read_stale(tmp_path: Path) -> None:
    # On a plain file system a deleted file stays readable through an open descriptor; the
    # directory's inode number is what tells the new cgroup from the old one.
    d = tmp_path / "pod1"
    d.mkdir()
    (d / "memory.max").write_text("1000\n")
    files = OpenFiles(max_open=10)
    assert files.read(str(d / "memory.max"), _int, dir_ino=_ino(d)) == 1000
    keep = tmp_path / "keep"  # hold the old inode so the new directory cannot reuse its number
    d.rename(keep)
    d.mkdir()
    (d / "memory.max").write_text("2000\n")
    assert _ino(d) != _ino(keep)
    assert files.read(str(d / "memory.max"), _int, dir_ino=_ino(d)) == 2000
    assert files.open_count == 1
    files.close()


def test_sweep_closes_what_the_sample_did_not_read(tmp_path: Path) -> None:
    paths = []
    for i in range(4):
        p = tmp_path / f"f{i}"
        p.write_text(f"{i}\n")
        paths.append(str(p))
    files = OpenFiles(max_open=10)
    before = _fds()
    for path in paths:
        files.read(path, _int, dir_ino=0)
    assert files.sweep() == 0
    assert _fds() == before + 4
    for path in paths[:2]:
        files.read(path, _int, dir_ino=0)
    assert files.sweep() == 2  # f2, f3 not read: their cgroups are gone
    assert files.open_count == 2 and _fds() == before + 2
    files.close()
    assert _fds() == before


def test_budget_is_kept_and_reads_past_it_are_still_right(tmp_path: Path) -> None:
    files = OpenFiles(max_open=2)
    for i in range(5):
        (tmp_path / f"f{i}").write_text(f"{i * 7}\n")
    got = [files.read(str(tmp_path / f"f{i}"), _int, dir_ino=0) for i in range(5)]
    assert got == [0, 7, 14, 21, 28]
    assert files.open_count == 2
    assert files.read(str(tmp_path / "absent"), _int, dir_ino=0) is None
    files.close()
    assert OpenFiles(max_open=0).read(str(tmp_path / "f4"), _int, dir_ino=0) == 28


def test_descriptor_budget_raises_the_soft_limit_within_the_hard_one() -> None:
    code = (
        "import resource; from nodeguard.sources.open_files import descriptor_budget;"
        "print(descriptor_budget(raise_limit=False), descriptor_budget(raise_limit=True),"
        " *resource.getrlimit(resource.RLIMIT_NOFILE))"
    )

    def limited(soft: int, hard: int) -> list[int]:
        def pre() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

        out = subprocess.run(
            [sys.executable, "-c", code],
            preexec_fn=pre,
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).parents[2],
        )
        return [int(x) for x in out.stdout.split()]

    # A runtime's usual start: soft 1024 and a high hard limit (524288 with containerd 2; this
    # machine's own, as lowering is all an unprivileged or capability-less root may do):
    # raised toward 16384, 1024 kept back, at most 8192 held (their kernel memory).
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY or hard > 524288:
        hard = 524288
    assert hard >= 4096, "this machine's hard RLIMIT_NOFILE is too low for the test"
    want = min(16384, hard)
    assert limited(1024, hard) == [0, min(want - 1024, 8192), want, hard]
    # A hard limit below what is wanted: raised to it and no further.
    assert limited(1024, 4096) == [0, 3072, 4096, 4096]
    # Nothing to hold open when the hard limit leaves no room past the reserve.
    assert limited(512, 1024) == [0, 0, 1024, 1024]
    assert descriptor_budget(raise_limit=False) >= 0


@pytest.mark.parametrize("host", sorted(p.name for p in FIXTURES.iterdir() if p.is_dir()))
def test_snapshot_with_files_held_open_equals_reading_them_anew(host: str) -> None:
    root = FIXTURES / host
    paths = HostPaths(procfs=root / "proc", sysfs=root / "sys", kmsg=root / "kmsg")

    def pods(max_open: int) -> list[object]:
        sampler = Sampler(
            config=SamplerConfig(
                paths=paths,
                node_name="n",
                collectors=frozenset({"meminfo", "cgroups"}),
                max_open_files=max_open,
            )
        )
        try:
            snaps = [sampler.sample_once() for _ in range(3)]  # opened, then re-read twice
            held = _held(sampler)
        finally:
            sampler.close()
        assert _held(sampler) == 0
        if max_open and snaps[0].pods:
            assert held > 0
        return [to_jsonable(s)["pods"] for s in snaps]

    plain, held = pods(0), pods(10_000)
    assert held == plain
    assert plain[0] == plain[2]


@pytest.fixture
def memory_root() -> Path:
    found = writable_memory_controller()
    if found is None:
        pytest.skip("needs root and a writable cgroup memory controller (CI has both)")
    return found[1]


def test_real_cgroupfs_reread_removed_and_made_again(memory_root: Path) -> None:
    version = 2 if (memory_root / "cgroup.controllers").exists() else 1
    limit_file = "memory.max" if version == 2 else "memory.limit_in_bytes"
    d = memory_root / f"nodeguard-openfiles-{secrets.token_hex(4)}"
    d.mkdir()
    files = OpenFiles(max_open=100)
    try:
        (d / limit_file).write_text(str(64 << 20))
        path = str(d / limit_file)
        assert files.read(path, _int, dir_ino=_ino(d)) == 64 << 20
        # Re-read at offset 0 through the same descriptor: the kernel's new value, every time.
        for mib in (32, 48, 16):
            (d / limit_file).write_text(str(mib << 20))
            assert files.read(path, _int, dir_ino=_ino(d)) == mib << 20
        stat = str(d / "memory.stat")
        first = files.read(stat, str, dir_ino=_ino(d))
        again = files.read(stat, str, dir_ino=_ino(d))
        assert first is not None and again == first  # the whole file, not the rest of it
        assert first.startswith("cache " if version == 1 else "anon ")
        assert files.open_count == 2

        # Removed: kernfs answers ENODEV on the held descriptor; that is "no data".
        old_ino = _ino(d)
        d.rmdir()
        assert files.read(stat, str, dir_ino=old_ino) is None
        assert files.open_count == 1

        # Made again under the same name, and read with the inode the walk would not have
        # noticed changing: ENODEV on the held descriptor, then the new cgroup's value.
        d.mkdir()
        (d / limit_file).write_text(str(8 << 20))
        assert files.read(path, _int, dir_ino=old_ino) == 8 << 20
        assert files.open_count == 1
    finally:
        files.close()
        if d.exists():
            d.rmdir()
    assert not d.exists()


def test_cgroup_source_closes_the_files_of_a_pod_that_went(tmp_path: Path) -> None:
    root = tmp_path / "host"
    shutil.copytree(FIXTURES / "v2-systemd-containerd", root, symlinks=True)
    paths = HostPaths(procfs=root / "proc", sysfs=root / "sys", kmsg=root / "kmsg")
    source = CgroupReader(paths=paths, max_open_files=10_000)
    _, pods = source.read(mem_total=None)
    held = source.open_files
    assert len(pods) >= 2 and held >= 5 * len(pods)
    gone = next(
        p for p in (root / "sys/fs/cgroup/kubepods.slice").rglob("*-pod*.slice") if p.is_dir()
    )
    cgroups = 1 + sum(1 for c in gone.iterdir() if c.is_dir())
    shutil.rmtree(gone)
    _, after = source.read(mem_total=None)
    assert len(after) == len(pods) - 1
    assert source.open_files == held - 5 * cgroups
    source.close()
    assert source.open_files == 0


def test_files_are_closed_when_the_kubepods_hierarchy_goes(tmp_path: Path) -> None:
    root = tmp_path / "host"
    shutil.copytree(FIXTURES / "v2-systemd-containerd", root, symlinks=True)
    paths = HostPaths(procfs=root / "proc", sysfs=root / "sys", kmsg=root / "kmsg")
    source = CgroupReader(paths=paths, max_open_files=10_000)
    source.read(mem_total=None)
    assert source.open_files > 0
    shutil.rmtree(root / "sys/fs/cgroup/kubepods.slice")  # the kubelet is gone
    with pytest.raises(NoDataError):
        source.read(mem_total=None)
    assert source.open_files == 0


def test_close_waits_for_the_sample_in_flight_and_nothing_reopens(tmp_path: Path) -> None:
    root = FIXTURES / "v2-systemd-containerd"
    paths = HostPaths(procfs=root / "proc", sysfs=root / "sys", kmsg=root / "kmsg")
    sampler = Sampler(
        config=SamplerConfig(
            paths=paths, node_name="n", collectors=frozenset({"cgroups"}), max_open_files=10_000
        )
    )
    first = sampler.sample_once()
    assert _held(sampler) > 0
    done = threading.Event()
    results: list[object] = []

    def sample() -> None:
        while not done.is_set():
            results.append(to_jsonable(sampler.sample_once())["pods"])

    worker = threading.Thread(target=sample)
    worker.start()
    try:
        sampler.close()  # while samples run in the other thread
        assert _held(sampler) == 0
    finally:
        done.set()
        worker.join(timeout=30)
    assert not worker.is_alive()
    assert _held(sampler) == 0  # later samples read without holding files
    assert results and all(r == to_jsonable(first)["pods"] for r in results)
