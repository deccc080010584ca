"""kustomize, the tool users run (``kubectl apply -k`` embeds it), built from Go modules.

The version is pinned in ``go/kustomize/go.mod`` (a ``tool`` directive) with its ``go.sum``; the
binary is built once and cached outside the repository, under
``${NODEGUARD_KUSTOMIZE_CACHE:-~/.cache/nodeguard/kustomize}/<key>/kustomize``, the key changing
with ``go.mod``/``go.sum``. A cold build downloads the modules through the Go module proxy and
takes about a minute on 2 cores.

    python -m tests.support.deploy.kustomize build daemonset/  # kustomize build, building it first
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.support.controlplane.cluster import cached_go_build

MODULE = Path(__file__).resolve().parent / "go" / "kustomize"
PACKAGE = "sigs.k8s.io/kustomize/kustomize/v5"
CACHE_ENV = "NODEGUARD_KUSTOMIZE_CACHE"
DEFAULT_CACHE = Path.home() / ".cache" / "nodeguard" / "kustomize"


class KustomizeError(RuntimeError):
    """kustomize could not be built, or a build of manifests failed."""


def version() -> str:
    """The pinned kustomize version (from go.mod)."""
    m = re.search(rf"^\s*{re.escape(PACKAGE)}\s+(v\S+)", (MODULE / "go.mod").read_text(), re.M)
    if m is None:
        raise KustomizeError(f"{MODULE / 'go.mod'} does not require {PACKAGE}")
    return m.group(1)


def _key() -> str:
    digest = hashlib.sha256(f"{sys.platform}-{platform.machine()}".encode())
    for name in ("go.mod", "go.sum"):
        digest.update(name.encode() + b"\0" + (MODULE / name).read_bytes() + b"\0")
    return f"kustomize-{version()}-{digest.hexdigest()[:12]}"


def ensure_built(*, cache_dir: Path | None = None) -> Path:
    """The cached kustomize binary, built first if missing (concurrent callers wait on a lock
    for the one that builds)."""
    root = Path(cache_dir or os.environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser()
    return cached_go_build(module=MODULE, name="kustomize", root=root, key=_key(), package=PACKAGE)


def build(directory: Path, *, binary: Path | None = None) -> list[dict[str, Any]]:
    """``kustomize build directory``: the rendered objects, in kustomize's order."""
    exe = binary or ensure_built()
    done = subprocess.run(
        [str(exe), "build", str(directory)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise KustomizeError(f"kustomize build {directory} failed:\n{done.stderr}")
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    exe = ensure_built()
    return subprocess.run([str(exe), *args], check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
