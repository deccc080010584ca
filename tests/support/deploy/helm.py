"""helm, the tool most clusters install exporters with, built from Go modules like kustomize.

The version is pinned in ``go/helm/go.mod`` (a ``tool`` directive) with its ``go.sum``; the
binary is built once and cached outside the repository, under
``${NODEGUARD_HELM_CACHE:-~/.cache/nodeguard/helm}/<key>/helm``, the key changing with
``go.mod``/``go.sum``. Concurrent callers wait on a lock for the one that builds, which prints a
progress line every 30 s. A cold build downloads the modules through the Go module proxy and
compiles Helm and the Kubernetes client libraries it embeds (see CONTRIBUTING.md for the time).

    python -m tests.support.deploy.helm template charts/nodeguard  # helm, building it first
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

MODULE = Path(__file__).resolve().parent / "go" / "helm"
MODULE_PATH = "helm.sh/helm/v3"
PACKAGE = f"{MODULE_PATH}/cmd/helm"
CACHE_ENV = "NODEGUARD_HELM_CACHE"
DEFAULT_CACHE = Path.home() / ".cache" / "nodeguard" / "helm"


class HelmError(RuntimeError):
    """helm could not be built, or a helm command failed."""


def version() -> str:
    """The pinned Helm version (from go.mod)."""
    return _required(MODULE_PATH)


def _required(module: str) -> str:
    text = (MODULE / "go.mod").read_text()
    m = re.search(rf"^\s*{re.escape(module)}\s+(v\S+)", text, re.M)
    if m is None:
        raise HelmError(f"{MODULE / 'go.mod'} does not require {module}")
    return m.group(1)


def ldflags() -> str:
    """The link flags of Helm's own Makefile: its version, and the Kubernetes version that
    ``helm template`` and ``helm lint`` assume (that of the client-go it embeds, v0.N -> 1.N)
    instead of the 1.20 compiled in without them."""
    minor = _required("k8s.io/client-go").split(".")[1]
    flags = [f"{MODULE_PATH}/internal/version.version={version()}"]
    for pkg in ("pkg/chartutil", "pkg/lint/rules"):
        flags += [
            f"{MODULE_PATH}/{pkg}.k8sVersionMajor=1",
            f"{MODULE_PATH}/{pkg}.k8sVersionMinor={minor}",
        ]
    return " ".join(["-s", "-w", *(f"-X {f}" for f in flags)])


def _key() -> str:
    digest = hashlib.sha256(f"{sys.platform}-{platform.machine()}".encode())
    digest.update(ldflags().encode() + b"\0")
    for name in ("go.mod", "go.sum"):
        digest.update(name.encode() + b"\0" + (MODULE / name).read_bytes() + b"\0")
    return f"helm-{version()}-{digest.hexdigest()[:12]}"


def ensure_built(*, cache_dir: Path | None = None) -> Path:
    """The cached helm binary, built first if missing (concurrent callers wait on a lock for
    the one that builds)."""
    root = Path(cache_dir or os.environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser()
    return cached_go_build(
        module=MODULE, name="helm", root=root, key=_key(), package=PACKAGE, ldflags=ldflags()
    )


def run(
    *args: str, binary: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``helm *args``, not raising: the completed process, output captured."""
    exe = binary or ensure_built()
    return subprocess.run([str(exe), *args], capture_output=True, text=True, check=False, env=env)


def template(
    chart: Path,
    *,
    sets: tuple[str, ...] = (),
    values: Path | None = None,
    binary: Path | None = None,
) -> list[dict[str, Any]]:
    """``helm template nodeguard chart -n nodeguard [-f values] --set ...``: the rendered
    objects."""
    flags = [f for s in sets for f in ("--set", s)]
    if values is not None:
        flags += ["-f", str(values)]
    done = run("template", "nodeguard", str(chart), "-n", "nodeguard", *flags, binary=binary)
    if done.returncode != 0:
        raise HelmError(f"helm template {chart} {' '.join(flags)} failed:\n{done.stderr}")
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    exe = ensure_built()
    return subprocess.run([str(exe), *args], check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
