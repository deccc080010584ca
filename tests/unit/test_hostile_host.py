"""Host files written to hurt the collectors: one bad file costs its own entry only.

A fixture host tree is copied and broken one file at a time: bytes that are not text in one
container's ``memory.stat``, a negative ``memory.current``, a 64 MiB cgroup file, an unreadable
cgroup directory, a ``statm`` that is not one, a ``/proc/<pid>/cgroup`` that is not text, a
process named with bytes that are not text. Every other pod, container and process is still
read, the collector reports success, each skip is counted by reason
(``nodeguard_collector_errors_total``) and logged once, and no negative size is exported.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import tempfile
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeguard.paths import HostPaths
from nodeguard.sampling.sampler import Sampler, SamplerConfig
from nodeguard.snapshot import CgroupMemory, NodeSnapshot
from nodeguard.sources.files import MAX_FILE_BYTES, FileTooLargeError, read_optional
from tests.fixtures.make_hosts import CID, UID_B, UID_G
from tests.support.hosts import HOSTS, exposition

NOBODY = 65534


@pytest.fixture
def host() -> Iterator[Path]:
    """A copy of the v2 fixture host in a directory every user can traverse (the unreadable
    directory case reads as an unprivileged user)."""
    top = Path(tempfile.mkdtemp(prefix="nodeguard-host-"))
    top.chmod(0o755)
    shutil.copytree(HOSTS / "v2-systemd-containerd", top / "h")
    for d, _, _ in os.walk(top):
        Path(d).chmod(0o755)
    try:
        yield top / "h"
    finally:
        shutil.rmtree(top)


def _container_dir(root: Path, cid: str) -> Path:
    (found,) = (root / "sys/fs/cgroup").rglob(f"cri-containerd-{cid}.scope")
    return found


def _pod_dir(root: Path, uid: str) -> Path:
    (found,) = (root / "sys/fs/cgroup").rglob(f"*pod{uid.replace('-', '_')}.slice")
    return found


@contextlib.contextmanager
def _as_nobody() -> Iterator[None]:
    """Run as an unprivileged user (root reads any file, so EACCES needs one)."""
    os.seteuid(NOBODY)
    try:
        yield
    finally:
        os.seteuid(0)


def _sample(root: Path, *, as_nobody: bool = False) -> tuple[Sampler, NodeSnapshot]:
    paths = HostPaths(procfs=root / "proc", sysfs=root / "sys", kmsg=root / "kmsg")
    sampler = Sampler(
        config=SamplerConfig(
            paths=paths, node_name="n", collectors=frozenset({"meminfo", "cgroups", "processes"})
        )
    )
    with _as_nobody() if as_nobody else contextlib.nullcontext():
        snap = sampler.sample_once()
    return sampler, snap


def _containers(snap: NodeSnapshot) -> dict[str, CgroupMemory]:
    return {c.container_id: c.memory for _, c in snap.containers()}


def _metrics(snap: NodeSnapshot) -> str:
    return exposition(snap)


def test_one_bad_cgroup_file_costs_its_own_values_only(
    host: Path, caplog: pytest.LogCaptureFixture
) -> None:
    good_sampler, good = _sample(host)
    good_sampler.close()
    stat = _container_dir(host, CID[3]) / "memory.stat"
    stat.write_bytes(stat.read_bytes().replace(b"anon ", b"an\xffon ", 1) + b"\xfe\xff\n")
    (_container_dir(host, CID[1]) / "memory.current").write_text("-4096\n")
    with (_container_dir(host, CID[2]) / "memory.events").open("wb") as f:
        f.truncate(64 << 20)  # 64 MiB: sparse, no disk
    (_pod_dir(host, UID_G) / "memory.max").write_text("lots\n")
    caplog.set_level(logging.WARNING, logger="nodeguard")

    tracemalloc.start()
    try:
        sampler, snap = _sample(host)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, "the 64 MiB file must not be read whole"
    status = next(s for s in snap.collectors if s.name == "cgroups")
    assert (status.success, status.available) == (True, True)
    assert dict(status.skipped) == {"not_text": 1, "malformed": 2, "too_large": 1}

    before, after = _containers(good), _containers(snap)
    assert after.keys() == before.keys()  # every container still there
    bad_stat, negative, huge = after[CID[3]], after[CID[1]], after[CID[2]]
    assert bad_stat.usage_bytes == before[CID[3]].usage_bytes
    assert (bad_stat.anon_bytes, bad_stat.working_set_bytes) == (None, None)
    assert negative.usage_bytes is None
    assert negative.anon_bytes == before[CID[1]].anon_bytes
    assert huge.oom_kills is None and huge.usage_bytes is not None
    for cid in set(before) - {CID[1], CID[2], CID[3]}:
        assert after[cid] == before[cid]

    sampler.sample_once()  # the same files, bad again: counted again, logged once
    assert sampler.latest is not None
    status = next(s for s in sampler.latest.collectors if s.name == "cgroups")
    assert dict(status.skipped) == {"not_text": 2, "malformed": 4, "too_large": 2}
    logged = [r.getMessage() for r in caplog.records if "collector cgroups skips" in r.getMessage()]
    assert len(logged) == 4, logged
    sampler.close()

    text = _metrics(snap)
    for reason, n in {"not_text": 1, "malformed": 2, "too_large": 1}.items():
        assert (
            f'nodeguard_collector_errors_total{{collector="cgroups",reason="{reason}"}} {n}.0'
            in text
        )
    assert 'nodeguard_collector_success{collector="cgroups"} 1.0' in text
    negatives = [ln for ln in text.splitlines() if re.search(r"_bytes\{.*\} -", ln)]
    assert negatives == []


def test_an_unreadable_cgroup_directory_is_counted(host: Path) -> None:
    pod = _pod_dir(host, UID_B)
    pod.chmod(0o000)
    qos = pod.parent
    sampler, snap = _sample(host, as_nobody=True)
    sampler.close()
    status = next(s for s in snap.collectors if s.name == "cgroups")
    assert status.success
    assert status.skipped["unreadable"] >= 1
    uids = {p.uid for p in snap.pods}
    assert UID_G in uids  # the other pods are read
    assert qos.exists()


def test_a_bad_process_costs_that_process_only(host: Path) -> None:
    proc = host / "proc"
    (proc / "4242" / "statm").write_text("garbage\n")
    (proc / "777" / "statm").write_text("1 -5 1 1 0 1 0\n")
    (proc / "5151" / "cgroup").write_bytes(b"0::/kubepods.slice/\xff\xfe.scope\n")
    sampler, snap = _sample(host)
    sampler.close()
    status = next(s for s in snap.collectors if s.name == "processes")
    assert (status.success, dict(status.skipped)) == (True, {"malformed": 2, "not_text": 1})
    by_pid = {p.pid: p for p in snap.processes}
    assert 4242 not in by_pid and 777 not in by_pid
    assert by_pid[5151].cgroup is None and by_pid[5151].name == "pt_main_thread"
    assert 1 in by_pid


def test_a_process_name_is_bounded_text(host: Path) -> None:
    comm = host / "proc" / "4242" / "stat"
    comm.write_bytes(comm.read_bytes().replace(b"(python3)", b"(py\xff\xfethon)"))
    (host / "proc" / "4242" / "status").write_bytes(
        (host / "proc" / "4242" / "status").read_bytes().replace(b"python3", b"py\xff\xfethon", 1)
    )
    sampler, snap = _sample(host)
    sampler.close()
    name = next(p.name for p in snap.processes if p.pid == 4242)
    name.encode("utf-8")  # valid text, whatever the bytes were
    assert len(name) <= 128


def test_a_file_over_the_bound_is_not_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "memory.stat"
    with path.open("wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)
    tracemalloc.start()
    try:
        with pytest.raises(FileTooLargeError):
            read_optional(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * MAX_FILE_BYTES
