"""The per-container peer: cAdvisor as the kubelet embeds it (benchmarks/cadvisor/main.go: the
library module ``github.com/google/cadvisor/lib`` v0.60.6, raw cgroup handler, memory and OOM
metrics, 10 s housekeeping), built from Go modules once and cached like the test control plane
(``tests/support/controlplane/cluster.py``): under ``${NODEGUARD_CADVISOR_CACHE:-~/.cache/nodeguard/
cadvisor}/<key>/cadvisor-peer``, the key a hash of ``go.mod``, ``go.sum`` and ``main.go``, so
``go build`` runs on first use and after a change. A cold build downloads the modules through
the Go module proxy (about a minute here).

    python benchmarks/cadvisor_peer.py            # build (or find) it; prints its path
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import Proc, serving  # noqa: E402
from tests.support.agent import free_port  # noqa: E402
from tests.support.controlplane.cluster import cached_go_build  # noqa: E402

__all__ = ["CADVISOR_VERSION", "MODULE", "cadvisor", "ensure_built"]

MODULE = Path(__file__).resolve().parent / "cadvisor"
CADVISOR_VERSION = "v0.60.6"
CACHE_ENV = "NODEGUARD_CADVISOR_CACHE"
DEFAULT_CACHE = Path.home() / ".cache" / "nodeguard" / "cadvisor"


def _key() -> str:
    digest = hashlib.sha256(f"{sys.platform}-{platform.machine()}".encode())
    for name in ("go.mod", "go.sum", "main.go"):
        digest.update(name.encode() + b"\0" + (MODULE / name).read_bytes() + b"\0")
    return f"cadvisor-{CADVISOR_VERSION}-{digest.hexdigest()[:12]}"


def ensure_built(*, cache_dir: Path | None = None) -> Path:
    """The cached peer binary, built first when missing. Raises ``GoNotFoundError`` without
    Go, ``ControlPlaneError`` when the build fails."""
    root = Path(cache_dir or os.environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser()
    return cached_go_build(module=MODULE, name="cadvisor-peer", root=root, key=_key())


@contextlib.contextmanager
def cadvisor(*, cgroup_roots: Sequence[str], log_path: Path) -> Iterator[Proc]:
    """The peer on a free loopback port, watching the raw cgroups under ``cgroup_roots`` (paths
    from the hierarchy root, as the kubelet passes its cgroup roots: ``/kubepods``); yields
    its base URL once ``/metrics`` answers."""
    port = free_port()
    cmd = [str(ensure_built()), "-listen", f"127.0.0.1:{port}"]
    for root in cgroup_roots:
        cmd += ["-cgroup-root", root]
    with serving(cmd, port=port, log_path=log_path, what="cAdvisor", timeout=60) as base:
        yield base


def main() -> None:
    print(ensure_built())


if __name__ == "__main__":
    main()
