"""The stub NVML for the GPU tests: building it with gcc, writing scenarios, and running
``nodeguard`` against it in a subprocess.

NVML is loaded once per process (pynvml keeps the library), so every scenario runs in its own
process, with ``LD_LIBRARY_PATH`` naming the directory whose ``libnvidia-ml.so.1`` is the stub
build wanted (the dynamic loader reads that variable at process start). The scenario format is
described at the top of ``nvml_stub.c``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).with_name("nvml_stub.c")
#: Build variants: directory name -> extra gcc flags. Older drivers lack the newer symbols.
VARIANTS = {
    "full": [],
    "no-procs-v3": ["-DNO_PROCS_V3"],  # the process lists' _v2 only
    "no-procs": ["-DNO_PROCS_V3", "-DNO_PROCS_V2"],  # neither symbol pynvml calls
    "no-mps": ["-DNO_MPS"],  # compute and graphics lists, no MPS list
    "no-memory-v2": ["-DNO_MEMORY_V2"],
}

# NVML return codes (nvml.h), as the scenarios use them.
NOT_SUPPORTED = 3
DRIVER_NOT_LOADED = 9
UNKNOWN = 999


def build(out: Path) -> dict[str, Path]:
    """Compile every variant into ``out/<variant>/libnvidia-ml.so.1``; the directories."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise RuntimeError("gcc not found: the GPU tests build a stub libnvidia-ml.so with it")
    dirs: dict[str, Path] = {}
    for name, flags in VARIANTS.items():
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        cmd = [
            gcc,
            "-shared",
            "-fPIC",
            "-O1",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-fvisibility=hidden",
            "-Wl,-soname,libnvidia-ml.so.1",
            *flags,
            "-o",
            str(d / "libnvidia-ml.so.1"),
            str(SOURCE),
        ]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        dirs[name] = d
    # A library file that cannot be loaded: a host without a usable driver, also where a real
    # one is installed (LD_LIBRARY_PATH is searched first and the loader stops at this file).
    broken = out / "no-driver"
    broken.mkdir(exist_ok=True)
    (broken / "libnvidia-ml.so.1").write_bytes(b"not a library\n")
    dirs["no-driver"] = broken
    return dirs


@dataclass
class Scenario:
    """What the stub driver reports; ``lines()`` is the scenario file."""

    gpus: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    driver: str = "550.54.15"

    def gpu(
        self,
        index: int,
        uuid: str,
        *,
        total: int,
        reserved: int,
        used: int,
        mig: int = 0,
        name: str = "NVIDIA H100 80GB HBM3",
    ) -> Scenario:
        free = total - reserved - used
        self.gpus.append(f"gpu {index} {uuid} {total} {reserved} {used} {free} {mig} {name}")
        return self

    def mig(
        self, gpu: int, slot: int, uuid: str, *, gi: int, ci: int, total: int, used: int
    ) -> Scenario:
        """A MIG device of GPU ``gpu`` at handle index ``slot`` (no reserved memory)."""
        self.extra.append(f"mig {gpu} {slot} {uuid} {gi} {ci} {total} 0 {used} {total - used}")
        return self

    def proc(
        self, gpu: int, pid: int, used: int | None, *, slot: int = -1, list: str = "compute"
    ) -> Scenario:
        """A process in one of NVML's lists (``compute``, ``graphics``, ``mps``) of GPU ``gpu``
        (``slot``: its MIG device); ``used`` ``None`` is NVML_VALUE_NOT_AVAILABLE."""
        self.extra.append(f"proc {gpu} {slot} {pid} {'na' if used is None else used} {list}")
        return self

    def add(self, line: str) -> Scenario:
        """Any other directive (``proc``, ``mig``, ``fail``, ``lost``, ``init``); written after
        the ``gpu`` lines, which it refers to."""
        self.extra.append(line)
        return self

    def write(self, path: Path) -> Path:
        path.write_text("\n".join([f"driver {self.driver}", *self.gpus, *self.extra]) + "\n")
        return path


@dataclass(frozen=True)
class StubEnv:
    """The environment of a process that uses the stub: which build, which scenario."""

    library_dir: Path
    scenario: Path
    log: Path

    def variables(self) -> dict[str, str]:
        """Only the variables that point a new process at the stub."""
        return {
            "LD_LIBRARY_PATH": ":".join(
                p for p in (str(self.library_dir), os.environ.get("LD_LIBRARY_PATH", "")) if p
            ),
            "NVML_STUB_SCENARIO": str(self.scenario),
            "NVML_STUB_LOG": str(self.log),
        }

    def env(self) -> dict[str, str]:
        """This process's environment with :meth:`variables`."""
        return {**os.environ, **self.variables()}

    def calls(self) -> list[str]:
        """The init/shutdown calls the stub logged, in order."""
        if not self.log.exists():
            return []
        return [line.split()[0] for line in self.log.read_text().splitlines()]


def snapshot_json(stub: StubEnv, flags: list[str]) -> dict[str, Any]:
    """``nodeguard snapshot --json FLAGS`` against the stub, parsed."""
    proc = subprocess.run(
        [sys.executable, "-m", "nodeguard", "snapshot", "--json", *flags],
        env=stub.env(),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def collector(snap: dict[str, Any], name: str) -> dict[str, Any]:
    """A collector's status in a snapshot's JSON."""
    found: dict[str, Any] = next(c for c in snap["collectors"] if c["name"] == name)
    return found


def samples(body: str, name: str) -> dict[frozenset[tuple[str, str]], float]:
    """Every sample of one metric in an exposition: label set -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[frozenset[tuple[str, str]], float] = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            if s.name == name:
                out[frozenset(s.labels.items())] = s.value
    return out


def value(body: str, name: str, **labels: str) -> float | None:
    """The one sample of ``name`` whose labels include ``labels``; ``None`` if there is none."""
    want = set(labels.items())
    found = [v for k, v in samples(body, name).items() if want <= k]
    assert len(found) <= 1, f"{name}{labels} matches {len(found)} samples"
    return found[0] if found else None


def fixture_host_env(out: Path) -> dict[str, str]:
    """Variables that give a ``nodeguard`` process two stub GPUs whose processes are the
    fixture host v2-systemd-containerd's pod processes (PID 5151: pod G's container 1, on GPU 0;
    4242: pod B's container 3, on GPU 1): for end-to-end tests that want GPU series on that
    host. Builds the stub into ``out``."""
    gib, mib = 1 << 30, 1 << 20
    libs = build(out / "lib")
    scenario = (
        Scenario()
        .gpu(0, "GPU-0e4d9c2a-7c1b-4f0e-9a55-000000000000", total=80 * gib, reserved=512 * mib,
             used=10 * gib)
        .gpu(1, "GPU-0e4d9c2a-7c1b-4f0e-9a55-000000000001", total=80 * gib, reserved=512 * mib,
             used=20 * gib)
        .add(f"proc 0 -1 5151 {10 * gib}")
        .add(f"proc 1 -1 4242 {20 * gib}")
    )  # fmt: skip
    stub = StubEnv(
        library_dir=libs["full"], scenario=scenario.write(out / "scenario"), log=out / "calls"
    )
    return stub.variables()
