"""nodeguard's image, built from the repository's Dockerfile as ``docker build`` would, where no
image registry is reachable.

- The base: the Dockerfile's ``PYTHON_IMAGE`` (``python:3.11-slim-bookworm``) comes from a
  registry; here a Debian bookworm root made from Debian packages by ``mmdebstrap`` (minbase,
  Python 3.11, venv and pip: what the Dockerfile's stages use) stands in for it, imported into
  buildah's storage as ``localhost/nodeguard-base:bookworm`` and passed as ``--build-arg
  PYTHON_IMAGE``. The root filesystem is cached (``~/.cache/nodeguard/image``).
- The build: Debian's ``buildah bud`` (chroot isolation: no daemon, no OCI runtime) of the
  unchanged Dockerfile and ``.dockerignore``. Its ``pip`` steps take wheels from a wheelhouse
  downloaded here for the base's Python (cp311, manylinux up to glibc 2.36) and mounted into
  the build with a ``pip.conf`` that says ``no-index``: every dependency still comes from a
  binary wheel, as ``--only-binary=:all:`` demands.
- buildah keeps its storage under a directory of the test's own (``vfs`` driver, no overlay
  or FUSE needed), removed afterwards.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support import progress

__all__ = ["BASE", "Buildah", "base_rootfs", "build", "missing_tools"]

REPO = Path(__file__).resolve().parents[2]
SUITE = "bookworm"
#: What the Dockerfile's stages need of the base: Python with venv (both stages), pip (the
#: build stage's ``pip wheel``), certificates; ``python`` on PATH as in the python image.
PACKAGES = ("python3", "python3-venv", "python3-pip", "python-is-python3", "ca-certificates")
BASE = f"localhost/nodeguard-base:{SUITE}"
CACHE_ENV = "NODEGUARD_IMAGE_CACHE"
DEFAULT_CACHE = Path.home() / ".cache" / "nodeguard" / "image"
#: The base's glibc (bookworm: 2.36) and Python (3.11): the wheels must fit them.
GLIBC = "2_36"
PYTHON = "3.11"


def missing_tools() -> list[str]:
    """The Debian packages this needs that are not installed (scripts/test installs them)."""
    return [tool for tool in ("buildah", "mmdebstrap") if shutil.which(tool) is None]


def _run(cmd: Sequence[str], *, what: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(cmd), capture_output=True, text=True, check=False, **kw)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-40:])
        raise RuntimeError(f"{what} failed ({done.returncode}): {' '.join(cmd)}\n{tail}")
    return done


def base_rootfs(*, cache_dir: Path | None = None) -> Path:
    """A tarball of a Debian root with :data:`PACKAGES` (mmdebstrap, minbase), cached."""
    root = Path(cache_dir or os.environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser()
    key = hashlib.sha256(f"{SUITE} {platform.machine()} {' '.join(PACKAGES)}".encode())
    tar = root / f"debian-{SUITE}-{key.hexdigest()[:12]}.tar"
    if tar.is_file():
        return tar
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        progress.take_lock(lock, what="the image's Debian base")
        if tar.is_file():
            return tar
        partial = tar.with_suffix(".partial")
        with progress.step(f"mmdebstrap: a Debian {SUITE} root with {', '.join(PACKAGES)}"):
            _run(
                [
                    "mmdebstrap",
                    "--variant=minbase",
                    f"--include={','.join(PACKAGES)}",
                    "--format=tar",
                    SUITE,
                    str(partial),
                ],
                what="mmdebstrap",
            )
        partial.rename(tar)
    return tar


def _platforms(machine: str) -> list[str]:
    """Every manylinux tag the base's glibc runs (pip takes them as given, newest first)."""
    newest = int(GLIBC.split("_")[1])
    tags = [f"manylinux_2_{minor}_{machine}" for minor in range(newest, 4, -1)]
    return tags + [f"{name}_{machine}" for name in ("manylinux2014", "manylinux2010", "manylinux1")]


def _wheelhouse(directory: Path) -> Path:
    """Binary wheels of nodeguard's dependencies (and of its build backend) for the base."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    wanted = [*project["project"]["dependencies"], *project["build-system"]["requires"]]
    directory.mkdir(parents=True, exist_ok=True)
    machine = platform.machine()
    with progress.step(f"downloading {len(wanted)} requirements' wheels for Python {PYTHON}"):
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--disable-pip-version-check",
                "--only-binary=:all:",
                f"--python-version={PYTHON}",
                "--implementation=cp",
                *(f"--abi={abi}" for abi in (f"cp{PYTHON.replace('.', '')}", "abi3", "none")),
                *(f"--platform={p}" for p in _platforms(machine)),
                "--dest",
                str(directory),
                *wanted,
            ],
            what="pip download",
        )
    return directory


@dataclass(frozen=True)
class Buildah:
    """buildah with storage of its own under ``root``."""

    root: Path

    def __call__(self, *args: str, what: str = "buildah") -> str:
        cmd = [
            "buildah",
            f"--root={self.root / 'storage'}",
            f"--runroot={self.root / 'run'}",
            "--storage-driver=vfs",
            *args,
        ]
        return _run(cmd, what=what).stdout.strip()

    def command(self, *args: str) -> list[str]:
        """The command line of ``buildah ARGS`` (to run it in the background)."""
        return [
            "buildah",
            f"--root={self.root / 'storage'}",
            f"--runroot={self.root / 'run'}",
            "--storage-driver=vfs",
            *args,
        ]

    def config(self, image: str) -> dict[str, Any]:
        """The image's OCI configuration (entrypoint, cmd, user, env, ports)."""
        data: dict[str, Any] = json.loads(self("inspect", "--type=image", image))
        config: dict[str, Any] = data["OCIv1"]["config"]
        return config

    def remove_all(self) -> None:
        """Every container and image of this storage, then the storage itself."""
        subprocess.run(self.command("rm", "--all"), capture_output=True, check=False)
        subprocess.run(self.command("rmi", "--all", "--force"), capture_output=True, check=False)
        shutil.rmtree(self.root, ignore_errors=True)


def build(buildah: Buildah, *, work: Path, tag: str) -> str:
    """The image of the repository's Dockerfile, tagged ``tag``; its name."""
    with progress.step(f"importing the Debian root as {BASE}"):
        ctr = buildah("from", "scratch")
        buildah("add", ctr, str(base_rootfs()), "/")
        buildah(
            "config",
            "--env=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "--env=LANG=C.UTF-8",
            ctr,
        )
        buildah("commit", "--rm", ctr, BASE)
    wheels = _wheelhouse(work / "wheelhouse")
    pip_conf = work / "pip.conf"
    pip_conf.write_text("[global]\nno-index = true\nfind-links = /wheelhouse\n")
    with progress.step("buildah bud of the Dockerfile"):
        buildah(
            "bud",
            "--isolation=chroot",
            "--network=host",
            f"--build-arg=PYTHON_IMAGE={BASE}",
            f"--volume={wheels}:/wheelhouse:ro",
            f"--volume={pip_conf}:/etc/pip.conf:ro",
            f"--tag={tag}",
            str(REPO),
            what="buildah bud",
        )
    return tag
