"""The image: built from the repository's Dockerfile (tests/support/image.py: buildah on a Debian
base
made from Debian packages, no registry), then ``nodeguard --version``, ``nodeguard snapshot``
on a fixture host, and the DaemonSet's own arguments run inside it."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeguard import __version__
from tests.support.agent import free_port, wait_until
from tests.support.deploy.container import http, lay_out, metric
from tests.support.deploy.manifests import Obj, container
from tests.support.hosts import HOSTS
from tests.support.image import Buildah, build, missing_tools

TAG = "localhost/nodeguard:test"


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Buildah, str]]:
    missing = missing_tools()
    if missing:
        pytest.skip(f"needs Debian's {' and '.join(missing)} (scripts/test installs them)")
    work = tmp_path_factory.mktemp("image")
    buildah = Buildah(root=work / "buildah")
    try:
        yield buildah, build(buildah, work=work, tag=TAG)
    finally:
        buildah.remove_all()


def _run(buildah: Buildah, image: str, *argv: str, mounts: dict[str, Path] | None = None) -> str:
    ctr = buildah("from", image)
    try:
        volumes = [f"--volume={src}:{dst}:ro" for dst, src in (mounts or {}).items()]
        return buildah("run", "--isolation=chroot", *volumes, ctr, "--", *argv, what=argv[0])
    finally:
        buildah("rm", ctr)


def test_the_image_is_the_dockerfiles(image: tuple[Buildah, str]) -> None:
    buildah, name = image
    config = buildah.config(name)
    assert config["Entrypoint"] == ["nodeguard"] and config["Cmd"] == ["run"]
    assert config["User"] == "65534:65534"
    assert "9847/tcp" in config["ExposedPorts"]
    assert _run(buildah, name, "nodeguard", "--version") == f"nodeguard {__version__}"
    assert _run(buildah, name, "id", "-u") == "65534"
    # Neither a compiler nor pip in the final image.
    tools = _run(buildah, name, "sh", "-c", "command -v gcc cc pip pip3 || true")
    assert tools == ""


def test_snapshot_in_the_image(image: tuple[Buildah, str]) -> None:
    buildah, name = image
    host = HOSTS / "v2-systemd-containerd"
    flags = ["--path.procfs=/host/proc", "--path.sysfs=/host/sys", "--path.kmsg=/host/kmsg"]
    data = json.loads(
        _run(buildah, name, "nodeguard", "snapshot", "--json", *flags, mounts={"/host": host})
    )
    assert data["meminfo"]["available_bytes"] == 6 << 30
    assert len(data["pods"]) >= 4 and data["oom"]["total"] == 2
    report = _run(buildah, name, "nodeguard", "snapshot", *flags, mounts={"/host": host})
    assert "slab unreclaimable" in report and "10.0 GiB" in report


def test_the_daemonset_arguments_run_in_the_image(
    image: tuple[Buildah, str], manifests: list[Obj], tmp_path: Path
) -> None:
    """The DaemonSet gives only arguments: the image's entrypoint runs them, as root (its
    securityContext), with its volumes at their mount paths and its environment."""
    buildah, name = image
    box = lay_out(manifests, tmp_path / "ctr", host=HOSTS / "v2-systemd-containerd", node="gpu-1")
    assert "command" not in container(manifests)
    port = free_port()
    args = [
        f"--listen-address=127.0.0.1:{port}" if a.startswith("--listen-address=") else a
        for a in box.written
    ]
    entrypoint = buildah.config(name)["Entrypoint"]
    ctr = buildah("from", name)
    volumes = [
        f"--volume={src}:{dst}{':ro' if ro else ''}" for dst, (src, ro) in box.mounts.items()
    ]
    env = [f"--env={k}={v}" for k, v in box.env.items()]
    # The kubelet stops the container with SIGTERM: `timeout` sends it, and passes on the status.
    argv = ["timeout", "--preserve-status", "-s", "TERM", "20", *entrypoint, *args]
    proc = subprocess.Popen(
        buildah.command(
            "run", "--isolation=chroot", "--network=host", "--user=0:0", *volumes, *env, ctr, "--"
        )
        + argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            assert proc.poll() is None, proc.communicate()[0]
            return http(f"{url}/readyz")[0] == 200

        wait_until("the image's agent ready", ready, timeout=60, step=0.2)
        status, text = http(f"{url}/metrics")
        assert status == 200
        assert metric(text, "nodeguard_node_memory_available_bytes") == [float(6 << 30)]
        assert metric(text, "nodeguard_rules_loaded") and metric(text, "nodeguard_rules_loaded")[0]
        assert metric(text, "nodeguard_build_info", version=__version__) == [1.0]
        out = proc.communicate(timeout=40)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        buildah("rm", ctr)
    assert proc.returncode == 0, out
    assert "nodeguard stopped" in out
    assert (box.root / "var/lib/nodeguard/kmsg-oom.json").is_file()
