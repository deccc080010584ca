"""The stub GPUs beside the v2 fixture host: their names and UUIDs, a procfs whose extra host
PIDs are in the fixture's pods, and a ``nodeguard run`` on it with a stub loaded."""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.make_hosts import CID, UID_BE, UID_G
from tests.support.agent import Agent, get, running_agent, wait_until
from tests.support.gpu.stub import (
    StubEnv,
)
from tests.support.hosts import HOSTS

UUID0 = "GPU-0e4d9c2a-7c1b-4f0e-9a55-000000000000"


UUID1 = "GPU-0e4d9c2a-7c1b-4f0e-9a55-000000000001"


H100 = "NVIDIA H100 80GB HBM3"


L40S = "NVIDIA L40S"


V2_HOST = HOSTS / "v2-systemd-containerd"


GUARANTEED_POD = f"/kubepods.slice/kubepods-pod{UID_G.replace('-', '_')}.slice"


BESTEFFORT_POD = (
    "/kubepods.slice/kubepods-besteffort.slice/"
    f"kubepods-besteffort-pod{UID_BE.replace('-', '_')}.slice"
)


#: Host PIDs the stub reports, beside the fixture's own (4242: pod B's CID[3], 5151: pod G's
#: CID[1], 777: containerd, outside kubepods); 31337 has no /proc entry (exited).
EXTRA_PIDS = {
    6001: f"0::{GUARANTEED_POD}/cri-containerd-{CID[1]}.scope\n",
    6002: f"0::{GUARANTEED_POD}/cri-containerd-{CID[2]}.scope\n",
    6003: f"0::{BESTEFFORT_POD}/cri-containerd-{CID[6]}.scope\n",
}


def procfs(root: Path, host: Path = V2_HOST, extra: dict[int, str] | None = None) -> Path:
    """A copy of a fixture host's procfs with more ``<pid>/cgroup`` files."""
    proc = root / "proc"
    shutil.copytree(host / "proc", proc)
    for pid, text in (EXTRA_PIDS if extra is None else extra).items():
        (proc / str(pid)).mkdir()
        (proc / str(pid) / "cgroup").write_text(text)
    return proc


def flags(proc: Path, host: Path = V2_HOST) -> list[str]:
    """``--path.*`` flags for ``proc`` (from :func:`procfs`) and the rest of ``host``."""
    return [f"--path.procfs={proc}", f"--path.sysfs={host / 'sys'}", f"--path.kmsg={host / 'kmsg'}"]


@contextlib.contextmanager
def agent(stub: StubEnv, args: list[str], tmp: Path) -> Iterator[Agent]:
    """``nodeguard run ARGS`` with the stub, once its first sample has a GPU collector."""
    with pytest.MonkeyPatch.context() as mp:
        for key, val in stub.env().items():
            mp.setenv(key, val)
        run_args = [*args, "--interval=100ms", f"--path.state={tmp / 'state'}"]
        with running_agent(args=run_args, log_path=tmp / "agent.log") as base:
            wait_until(
                "the first sample with the GPU collector",
                lambda: 'nodeguard_collector_success{collector="gpu"}' in metrics(base),
                timeout=15,
                step=0.05,
            )
            yield base


def metrics(base: str) -> str:
    """The agent's ``/metrics`` text at ``base``."""
    return get(f"{base}/metrics")[1]


def snapshot_of(base: str) -> dict[str, Any]:
    """The agent's ``/snapshot`` at ``base``."""
    data: dict[str, Any] = json.loads(get(f"{base}/snapshot")[1])
    return data
