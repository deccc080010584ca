"""A real Kubernetes control plane (etcd + kube-apiserver) for integration tests.

The two binaries are built from Go modules kept next to this file
(``go/kube-apiserver`` and ``go/etcd``) and cached outside the repository, under
``${NODEGUARD_CONTROLPLANE_CACHE:-~/.cache/nodeguard/controlplane}/<version-key>/``.
The key changes whenever a ``go.mod``, ``go.sum`` or ``main.go`` there changes, so
``go build`` runs only on the first use and after a version bump.

No scheduler or kubelet runs, and kube-controller-manager runs only the ResourceQuota and
disruption (PodDisruptionBudget status) controllers: other objects are stored and served, but
nothing reconciles them. In particular no ``default`` ServiceAccount is created
in namespaces, so the ``ServiceAccount`` admission plugin is disabled (otherwise no
Pod could be created).

Typical use::

    with TestCluster() as cluster:
        client = kubernetes.config.new_client_from_config(str(cluster.kubeconfig_path))

Run ``python -m tests.support.controlplane.cluster`` (or ``scripts/test-cluster``) to start
one by hand.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import datetime
import hashlib
import ipaddress
import json
import logging
import os
import platform
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from tests.support import progress

log = logging.getLogger(__name__)

GO_DIR = Path(__file__).resolve().parent / "go"
APISERVER_MODULE = GO_DIR / "kube-apiserver"
CONTROLLER_MANAGER_MODULE = GO_DIR / "kube-controller-manager"
ETCD_MODULE = GO_DIR / "etcd"
KATIB_MODULE = GO_DIR / "katib-experiment-controller"
MODULES = (APISERVER_MODULE, CONTROLLER_MANAGER_MODULE, ETCD_MODULE, KATIB_MODULE)
CACHE_ENV = "NODEGUARD_CONTROLPLANE_CACHE"
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "nodeguard" / "controlplane"

SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"

_LOG_TAIL_LINES = 40


class ControlPlaneError(RuntimeError):
    """The test control plane could not be built, started or stopped."""


class GoNotFoundError(ControlPlaneError):
    """The binaries are not cached and no Go toolchain is available to build them."""


@dataclass(frozen=True)
class ControlPlaneBinaries:
    """Paths of the built binaries and the versions they were built from."""

    kube_apiserver: Path
    etcd: Path
    kubernetes_version: str
    etcd_version: str
    version_key: str
    kube_controller_manager: Path
    katib_controller: Path
    katib_version: str


# --------------------------------------------------------------------------- build


def _module_version(go_mod: Path, module: str) -> str:
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", go_mod.read_text(), re.M)
    if match is None:
        raise ControlPlaneError(f"{go_mod} does not require {module}")
    return match.group(1)


def version_key() -> str:
    """Return the cache key for the current Go sources (versions plus a content hash)."""
    digest = hashlib.sha256(f"{sys.platform}-{platform.machine()}".encode())
    for module in MODULES:
        for name in ("go.mod", "go.sum", "main.go"):
            digest.update(name.encode() + b"\0" + (module / name).read_bytes() + b"\0")
    k8s = _module_version(APISERVER_MODULE / "go.mod", "k8s.io/kubernetes")
    etcd = _module_version(ETCD_MODULE / "go.mod", "go.etcd.io/etcd/server/v3")
    return f"k8s-{k8s}-etcd-{etcd}-{digest.hexdigest()[:12]}"


def find_go(*, building: str = f"kube-apiserver and etcd from {GO_DIR}") -> str:
    """The Go toolchain: ``go`` on PATH, else /usr/local/go/bin/go. Raises
    :class:`GoNotFoundError` saying what needed ``building``."""
    found = shutil.which("go")
    if found:
        return found
    fallback = Path("/usr/local/go/bin/go")
    if fallback.is_file() and os.access(fallback, os.X_OK):
        return str(fallback)
    raise GoNotFoundError(
        "no Go toolchain was found (looked for `go` on PATH and /usr/local/go/bin/go); "
        f"install Go >= 1.25 to build {building}"
    )


def go_build(go: str, module: Path, output: Path, ldflags: str, package: str = ".") -> None:
    """``go build`` of ``package`` (the main package of ``module`` by default) into
    ``output``, static, reproducible; raises :class:`ControlPlaneError` with the tail of its
    output when it fails."""
    cmd = [
        go,
        "build",
        "-trimpath",
        "-buildvcs=false",
        "-mod=readonly",
        "-ldflags",
        ldflags,
        "-o",
        str(output),
        package,
    ]
    env = {**os.environ, "CGO_ENABLED": "0"}
    result = subprocess.run(cmd, cwd=module, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-_LOG_TAIL_LINES:])
        raise ControlPlaneError(f"`{' '.join(cmd)}` failed in {module}:\n{tail}")


def cached_go_build(
    *, module: Path, name: str, root: Path, key: str, package: str = ".", ldflags: str = "-s -w"
) -> Path:
    """``root/<key>/<name>``: the binary of ``package`` in the Go module ``module``, built
    there first when it is missing (concurrent callers wait on a file lock for the one that
    builds; a build goes to a staging directory renamed into place, so a half-built binary is
    never found). Raises :class:`GoNotFoundError` without Go, :class:`ControlPlaneError` when
    the build fails."""
    binary = root / key / name
    if os.access(binary, os.X_OK):
        return binary
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{key}.lock", "w") as lock:
        progress.take_lock(lock, what=f"{name} ({key})")
        if os.access(binary, os.X_OK):
            return binary
        go = find_go(building=f"{name} from {module}")
        staging = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
        try:
            with progress.step(f"building {name} (first use: a minute or more)"):
                go_build(go, module, staging / name, ldflags, package)
            staging.chmod(0o755)
            shutil.rmtree(binary.parent, ignore_errors=True)
            staging.rename(binary.parent)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return binary


def ensure_built(*, cache_dir: Path | None = None) -> ControlPlaneBinaries:
    """Return the cached kube-apiserver and etcd binaries, building them if missing.

    Args:
        cache_dir: where the ``<version-key>/`` directories live; defaults to
            ``$NODEGUARD_CONTROLPLANE_CACHE`` or ``~/.cache/nodeguard/controlplane``.

    Raises:
        GoNotFoundError: the binaries must be built and Go is not installed.
        ControlPlaneError: ``go build`` failed.

    A cold build downloads the modules through the Go module proxy and compiles
    Kubernetes, which takes several minutes; concurrent callers (e.g. pytest-xdist
    workers) wait on a file lock for the one that builds.
    """
    root = Path(cache_dir or os.environ.get(CACHE_ENV) or DEFAULT_CACHE_DIR).expanduser()
    key = version_key()
    target = root / key
    binaries = ControlPlaneBinaries(
        kube_apiserver=target / "kube-apiserver",
        etcd=target / "etcd",
        kubernetes_version=_module_version(APISERVER_MODULE / "go.mod", "k8s.io/kubernetes"),
        etcd_version=_module_version(ETCD_MODULE / "go.mod", "go.etcd.io/etcd/server/v3"),
        version_key=key,
        kube_controller_manager=target / "kube-controller-manager",
        katib_controller=target / "katib-experiment-controller",
        katib_version=_module_version(KATIB_MODULE / "go.mod", "github.com/kubeflow/katib"),
    )
    paths = (
        binaries.kube_apiserver,
        binaries.etcd,
        binaries.kube_controller_manager,
        binaries.katib_controller,
    )

    def complete() -> bool:
        return all(os.access(p, os.X_OK) for p in paths)

    if complete():
        return binaries
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{key}.lock", "w") as lock:
        progress.take_lock(lock, what=f"the test control plane {key}")
        if complete():
            return binaries
        go = find_go()
        log.warning(
            "building kube-apiserver and kube-controller-manager %s, etcd %s and Katib's "
            "experiment controller %s into %s (first run: about 7 minutes on 2 cores)",
            binaries.kubernetes_version,
            binaries.etcd_version,
            binaries.katib_version,
            target,
        )
        staging = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
        try:
            k8s = binaries.kubernetes_version
            major, minor = k8s.lstrip("v").split(".")[:2]
            k8s_flags = (
                "-s -w"
                f" -X k8s.io/component-base/version.gitVersion={k8s}"
                f" -X k8s.io/component-base/version.gitMajor={major}"
                f" -X k8s.io/component-base/version.gitMinor={minor}"
                " -X k8s.io/component-base/version.gitTreeState=clean"
                f" -X k8s.io/client-go/pkg/version.gitVersion={k8s}"
            )
            builds = (
                (ETCD_MODULE, "etcd", "-s -w"),
                (APISERVER_MODULE, "kube-apiserver", k8s_flags),
                (CONTROLLER_MANAGER_MODULE, "kube-controller-manager", k8s_flags),
                (KATIB_MODULE, "katib-experiment-controller", "-s -w"),
            )
            for i, (module, name, flags) in enumerate(builds, 1):
                with progress.step(f"building {name} ({i}/{len(builds)})"):
                    go_build(go, module, staging / name, flags)
            shutil.rmtree(target, ignore_errors=True)
            staging.chmod(0o755)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return binaries


# --------------------------------------------------------------------------- PKI


@dataclass(frozen=True)
class _Pki:
    ca_cert: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    sa_public_key: Path
    sa_private_key: Path


def _generate_pki(directory: Path) -> _Pki:
    """Write a CA, a serving cert, an admin client cert and a service-account key pair."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    def write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        path.chmod(0o600)

    def name(cn: str, org: str | None = None) -> x509.Name:
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
        if org:
            attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
        return x509.Name(attrs)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = name("nodeguard-test-ca")

    def issue(
        subject: x509.Name,
        key: ec.EllipticCurvePrivateKey,
        *,
        is_ca: bool = False,
        usage: x509.ObjectIdentifier | None = None,
        sans: Sequence[x509.GeneralName] = (),
    ) -> x509.Certificate:
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=not is_ca,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=is_ca,
                    crl_sign=is_ca,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
        )
        if usage is not None:
            builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return builder.sign(ca_key, hashes.SHA256())

    def write_cert(path: Path, cert: x509.Certificate) -> None:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    pki = _Pki(
        ca_cert=directory / "ca.crt",
        serving_cert=directory / "apiserver.crt",
        serving_key=directory / "apiserver.key",
        admin_cert=directory / "admin.crt",
        admin_key=directory / "admin.key",
        sa_public_key=directory / "sa.pub",
        sa_private_key=directory / "sa.key",
    )
    write_cert(pki.ca_cert, issue(ca_name, ca_key, is_ca=True))

    serving_key = ec.generate_private_key(ec.SECP256R1())
    service_ip = next(ipaddress.IPv4Network(SERVICE_CLUSTER_IP_RANGE).hosts())
    sans: list[x509.GeneralName] = [
        x509.DNSName(dns)
        for dns in (
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        )
    ]
    sans += [x509.IPAddress(ipaddress.IPv4Address("127.0.0.1")), x509.IPAddress(service_ip)]
    write_cert(
        pki.serving_cert,
        issue(
            name("kube-apiserver"), serving_key, usage=ExtendedKeyUsageOID.SERVER_AUTH, sans=sans
        ),
    )
    write_key(pki.serving_key, serving_key)

    admin_key = ec.generate_private_key(ec.SECP256R1())
    write_cert(
        pki.admin_cert,
        issue(name("admin", "system:masters"), admin_key, usage=ExtendedKeyUsageOID.CLIENT_AUTH),
    )
    write_key(pki.admin_key, admin_key)

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    write_key(pki.sa_private_key, sa_key)
    pki.sa_public_key.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pki


# --------------------------------------------------------------------------- processes


def _free_ports(count: int) -> list[int]:
    """Return ``count`` distinct currently-free loopback TCP ports."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def spawn(args: Sequence[str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start ``args`` in a session of its own, its output appended to ``log_path``."""
    with open(log_path, "ab") as log_file:
        log_file.write(f"\n==== {time.strftime('%H:%M:%S')} starting {args[0]}\n".encode())
        log_file.flush()
        # A new session keeps a terminal's Ctrl-C away from the children, so that the
        # Python side stops them in order.
        return subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def terminate(proc: subprocess.Popen[Any] | None, *, timeout: float, kill: bool = False) -> None:
    """SIGTERM (or SIGKILL at once if ``kill``), then SIGKILL after ``timeout`` seconds."""
    if proc is None or proc.poll() is not None:
        return
    if kill:
        proc.kill()
    else:
        proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


_running: weakref.WeakSet[TestCluster] = weakref.WeakSet()


@atexit.register
def _stop_leftovers() -> None:
    for cluster in list(_running):
        with contextlib.suppress(Exception):
            cluster.stop()


class TestCluster:
    """etcd + kube-apiserver on loopback, with an admin kubeconfig.

    Use as a context manager or call :meth:`start` / :meth:`stop`. Everything lives in
    a temporary directory (etcd data, certificates, ``etcd.log``, ``kube-apiserver.log``,
    ``kubeconfig``) that :meth:`stop` removes. :meth:`stop_apiserver` and
    :meth:`start_apiserver` restart only the API server, on the same port with the
    same certificates, keeping etcd and its data.
    """

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        *,
        binaries: ControlPlaneBinaries | None = None,
        cache_dir: Path | None = None,
        base_dir: Path | None = None,
        startup_timeout: float = 120.0,
        stop_timeout: float = 10.0,
        extra_apiserver_args: Sequence[str] = (),
        keep_dir: bool = False,
    ) -> None:
        """Configure (but do not start) a cluster.

        Args:
            binaries: prebuilt binaries; by default :func:`ensure_built` is called on start.
            cache_dir: passed to :func:`ensure_built`.
            base_dir: parent of the temporary directory (default: the system temp dir).
            startup_timeout: seconds to wait for etcd, then for the API server, to be ready.
            stop_timeout: seconds between SIGTERM and SIGKILL when stopping a process.
            extra_apiserver_args: appended to the kube-apiserver command line.
            keep_dir: leave the temporary directory in place on stop (for debugging).
        """
        self._binaries = binaries
        self._cache_dir = cache_dir
        self._base_dir = base_dir
        self._startup_timeout = startup_timeout
        self._stop_timeout = stop_timeout
        self._extra_apiserver_args = tuple(extra_apiserver_args)
        self._keep_dir = keep_dir
        self._dir: Path | None = None
        self._pki: _Pki | None = None
        self._etcd: subprocess.Popen[bytes] | None = None
        self._apiserver: subprocess.Popen[bytes] | None = None
        self._controller_manager: subprocess.Popen[bytes] | None = None
        self._etcd_port = 0
        self._apiserver_port = 0
        self.startup_seconds: float | None = None
        """Wall time of the last :meth:`start`, build excluded."""

    # ----------------------------------------------------------------- properties

    def _require_dir(self) -> Path:
        if self._dir is None:
            raise ControlPlaneError("the test cluster is not started")
        return self._dir

    @property
    def work_dir(self) -> Path:
        """The cluster's temporary directory."""
        return self._require_dir()

    @property
    def kubeconfig_path(self) -> Path:
        """Admin kubeconfig (user ``admin`` in group ``system:masters``)."""
        return self._require_dir() / "kubeconfig"

    @property
    def server_url(self) -> str:
        """``https://127.0.0.1:<port>``; the port stays the same across API server restarts."""
        self._require_dir()
        return f"https://127.0.0.1:{self._apiserver_port}"

    @property
    def etcd_url(self) -> str:
        """The etcd client URL (plain HTTP on loopback)."""
        self._require_dir()
        return f"http://127.0.0.1:{self._etcd_port}"

    @property
    def ca_cert_path(self) -> Path:
        """CA that signed the serving certificate and the admin client certificate."""
        return self._require_dir() / "pki" / "ca.crt"

    @property
    def apiserver_log_path(self) -> Path:
        """kube-apiserver's stdout and stderr (appended to across restarts)."""
        return self._require_dir() / "kube-apiserver.log"

    @property
    def controller_manager_log_path(self) -> Path:
        """Log of kube-controller-manager (the ResourceQuota and disruption controllers only)."""
        return self._require_dir() / "kube-controller-manager.log"

    @property
    def etcd_log_path(self) -> Path:
        """etcd's stdout and stderr."""
        return self._require_dir() / "etcd.log"

    @property
    def apiserver_pid(self) -> int:
        """The kube-apiserver's process ID (benchmarks read its CPU and RSS)."""
        if self._apiserver is None:
            raise RuntimeError("the API server is not running")
        return self._apiserver.pid

    @property
    def etcd_pid(self) -> int:
        """etcd's process ID."""
        if self._etcd is None:
            raise RuntimeError("etcd is not running")
        return self._etcd.pid

    @property
    def apiserver_running(self) -> bool:
        """Whether the kube-apiserver process is alive."""
        return self._apiserver is not None and self._apiserver.poll() is None

    # ----------------------------------------------------------------- lifecycle

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Build if needed, then start etcd and kube-apiserver and wait until ready.

        Returns once ``/readyz`` is ok and namespace ``default`` exists.

        Raises:
            ControlPlaneError: a process failed or timed out; the message holds the tail
                of its log. Everything started so far is stopped again.
        """
        if self._dir is not None:
            raise ControlPlaneError("the test cluster is already started")
        binaries = self._binaries or ensure_built(cache_dir=self._cache_dir)
        self._binaries = binaries
        for attempt in range(3):
            started = time.monotonic()
            try:
                self._start_once(binaries)
            except ControlPlaneError as error:
                self.stop()
                # A free port picked by _free_ports may be taken before etcd or the
                # API server binds it; try fresh ports then.
                if "address already in use" in str(error) and attempt < 2:
                    continue
                raise
            except BaseException:
                self.stop()
                raise
            self.startup_seconds = time.monotonic() - started
            _running.add(self)
            return

    def _start_once(self, binaries: ControlPlaneBinaries) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="nodeguard-cp-", dir=self._base_dir))
        self._etcd_port, peer_port, self._apiserver_port = _free_ports(3)
        self._pki = _generate_pki(self._dir / "pki")
        self._write_kubeconfig()

        peer_url = f"http://127.0.0.1:{peer_port}"
        self._etcd = spawn(
            [
                str(binaries.etcd),
                "--name=nodeguard-test",
                f"--data-dir={self._dir / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=nodeguard-test={peer_url}",
                "--unsafe-no-fsync",  # test data; fsync only slows the tests down
                "--log-level=warn",
            ],
            self.etcd_log_path,
        )
        self._wait(self._etcd_healthy, self._etcd, self.etcd_log_path, "etcd to become healthy")
        self._start_apiserver()
        self._wait(
            self._default_namespace_exists,
            self._apiserver,
            self.apiserver_log_path,
            "namespace default to be created",
        )
        # The ResourceQuota controller computes status.used, which quota admission checks; the
        # disruption controller computes a PodDisruptionBudget's status (disruptionsAllowed,
        # currentHealthy, observedGeneration), which the eviction API checks. Not the garbage
        # collector: test pods name owners that do not exist (a test that needs it runs it for
        # its own span: garbage_collector()).
        self.start_controller_manager()

    def _spawn_controller_manager(
        self, controllers: str, log_path: Path
    ) -> subprocess.Popen[bytes]:
        assert self._binaries is not None
        return spawn(
            [
                str(self._binaries.kube_controller_manager),
                f"--kubeconfig={self.kubeconfig_path}",
                f"--controllers={controllers}",
                "--leader-elect=false",
                "--secure-port=0",
                "--v=1",
            ],
            log_path,
        )

    def start_controller_manager(self) -> None:
        """Start kube-controller-manager (its ResourceQuota and disruption controllers) again."""
        self._require_dir()
        if self._controller_manager is not None and self._controller_manager.poll() is None:
            raise ControlPlaneError("kube-controller-manager is already running")
        self._controller_manager = self._spawn_controller_manager(
            "resourcequota,disruption", self.controller_manager_log_path
        )

    def stop_controller_manager(self) -> None:
        """Stop kube-controller-manager: no quota's status is written until it starts again
        (what a cluster whose controller-manager is down or restarting looks like)."""
        self._require_dir()
        terminate(self._controller_manager, timeout=self._stop_timeout)
        self._controller_manager = None

    @contextlib.contextmanager
    def garbage_collector(self) -> Iterator[Path]:
        """A second kube-controller-manager running only the garbage collector for the block
        (``--controllers=garbagecollector``): objects whose owners are gone are deleted, as in
        a real cluster. Its log's path. It acts on the whole cluster while it runs: dependents
        of owners that do not exist (other tests' pods) go too."""
        log_path = self._require_dir() / "kube-controller-manager-gc.log"
        proc = self._spawn_controller_manager("garbagecollector", log_path)
        try:
            yield log_path
        finally:
            terminate(proc, timeout=self._stop_timeout)

    def stop(self) -> None:
        """Stop both processes (SIGTERM, then SIGKILL) and remove the temporary directory.

        Safe to call more than once, and on a cluster that failed to start.
        """
        terminate(self._controller_manager, timeout=self._stop_timeout)
        terminate(self._apiserver, timeout=self._stop_timeout)
        terminate(self._etcd, timeout=self._stop_timeout)
        self._apiserver = self._etcd = self._controller_manager = None
        if self._dir is not None and not self._keep_dir:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._dir = None
        self._pki = None
        _running.discard(self)

    @contextlib.contextmanager
    def controllers_frozen(self) -> Iterator[None]:
        """kube-controller-manager stopped (SIGSTOP) for the block, resumed (SIGCONT) after:
        the API server serves on while no controller writes a status, as when the
        controller-manager is down or behind (a PodDisruptionBudget's ``observedGeneration``
        then stays below its ``generation``)."""
        proc = self._controller_manager
        if proc is None or proc.poll() is not None:
            raise ControlPlaneError("kube-controller-manager is not running")
        proc.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            proc.send_signal(signal.SIGCONT)

    def stop_apiserver(self, *, kill: bool = False) -> None:
        """Stop only kube-apiserver (SIGTERM then SIGKILL, or SIGKILL at once if ``kill``)."""
        self._require_dir()
        terminate(self._apiserver, timeout=self._stop_timeout, kill=kill)
        self._apiserver = None

    def start_apiserver(self) -> None:
        """Start kube-apiserver again on the same port and wait for ``/readyz``."""
        self._require_dir()
        if self.apiserver_running:
            raise ControlPlaneError("kube-apiserver is already running")
        self._start_apiserver()

    # ----------------------------------------------------------------- internals

    def _apiserver_args(self) -> list[str]:
        assert self._binaries is not None and self._pki is not None and self._dir is not None
        pki = self._pki
        return [
            str(self._binaries.kube_apiserver),
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self._apiserver_port}",
            f"--cert-dir={self._dir / 'apiserver-certs'}",
            f"--tls-cert-file={pki.serving_cert}",
            f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca_cert}",
            "--authorization-mode=Node,RBAC",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={pki.sa_public_key}",
            f"--service-account-signing-key-file={pki.sa_private_key}",
            f"--api-audiences={SERVICE_ACCOUNT_ISSUER}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            # Without kube-controller-manager no namespace gets a `default`
            # ServiceAccount, which this plugin requires of every Pod.
            "--disable-admission-plugins=ServiceAccount",
            # Endpoints may not hold loopback addresses; nothing here needs them.
            "--endpoint-reconciler-type=none",
            "--allow-privileged=true",
            "--profiling=false",
            *self._extra_apiserver_args,
        ]

    def _start_apiserver(self) -> None:
        self._apiserver = spawn(self._apiserver_args(), self.apiserver_log_path)
        self._wait(
            self._apiserver_ready,
            self._apiserver,
            self.apiserver_log_path,
            "kube-apiserver /readyz",
        )

    def _wait(
        self,
        ready: Callable[[], bool],
        proc: subprocess.Popen[bytes] | None,
        log_path: Path,
        what: str,
    ) -> None:
        """:func:`~tests.support.agent.wait_until` ``ready()``, its failures as
        :class:`ControlPlaneError` (a port taken is retried by :meth:`start`)."""
        from tests.support.agent import wait_until  # which imports this module's terminate

        def up() -> bool:
            if proc is not None and proc.poll() is not None:
                raise ControlPlaneError(
                    f"{log_path.stem} exited with status {proc.returncode} while waiting for "
                    f"{what}; last lines of {log_path}:\n{_tail(log_path)}"
                )
            return ready()

        try:
            wait_until(what, up, timeout=self._startup_timeout, step=0.2)
        except AssertionError:
            raise ControlPlaneError(
                f"timed out after {self._startup_timeout:.0f}s waiting for {what}; "
                f"last lines of {log_path}:\n{_tail(log_path)}"
            ) from None

    def _http_get(self, url: str, *, tls: bool) -> tuple[int, bytes]:
        handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
        if tls:
            assert self._pki is not None
            context = ssl.create_default_context(cafile=str(self._pki.ca_cert))
            context.load_cert_chain(str(self._pki.admin_cert), str(self._pki.admin_key))
            handlers.append(urllib.request.HTTPSHandler(context=context))
        opener = urllib.request.build_opener(*handlers)
        try:
            with opener.open(url, timeout=5) as response:
                return int(response.status), bytes(response.read())
        except urllib.error.HTTPError as error:
            return error.code, error.read()
        except (OSError, ssl.SSLError):
            return 0, b""

    def _etcd_healthy(self) -> bool:
        status, body = self._http_get(f"{self.etcd_url}/health", tls=False)
        return status == 200 and b'"health":"true"' in body

    def _apiserver_ready(self) -> bool:
        status, body = self._http_get(f"{self.server_url}/readyz", tls=True)
        return status == 200 and body.strip() == b"ok"

    def _default_namespace_exists(self) -> bool:
        status, _ = self._http_get(f"{self.server_url}/api/v1/namespaces/default", tls=True)
        return status == 200

    @property
    def pki(self) -> _Pki:
        """The certificates and keys (a proxy in front of the API server serves with the
        serving pair and authenticates upstream with the admin pair)."""
        if self._pki is None:
            raise ControlPlaneError("the test cluster is not started")
        return self._pki

    def write_kubeconfig(self, path: Path, *, server: str) -> Path:
        """An admin kubeconfig like :attr:`kubeconfig_path` for another server URL (a proxy
        in front of the API server, with the same certificates)."""
        text = self.kubeconfig_path.read_text().replace(self.server_url, server)
        path.write_text(text)
        path.chmod(0o600)
        return path

    def _write_kubeconfig(self) -> None:
        assert self._pki is not None

        def b64(path: Path) -> str:
            return base64.b64encode(path.read_bytes()).decode()

        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "nodeguard-test",
                    "cluster": {
                        "server": self.server_url,
                        "certificate-authority-data": b64(self._pki.ca_cert),
                    },
                }
            ],
            "users": [
                {
                    "name": "admin",
                    "user": {
                        "client-certificate-data": b64(self._pki.admin_cert),
                        "client-key-data": b64(self._pki.admin_key),
                    },
                }
            ],
            "contexts": [
                {
                    "name": "nodeguard-test",
                    "context": {"cluster": "nodeguard-test", "user": "admin"},
                }
            ],
            "current-context": "nodeguard-test",
            "preferences": {},
        }
        # JSON is YAML; kubectl and the Python client read it as a kubeconfig.
        self.kubeconfig_path.write_text(json.dumps(config, indent=2) + "\n")
        self.kubeconfig_path.chmod(0o600)


# --------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    """Build if needed, start a cluster, print its kubeconfig path, run until signalled."""
    parser = argparse.ArgumentParser(prog="test-cluster", description=main.__doc__)
    parser.add_argument(
        "--cache-dir",
        type=Path,
        help=f"binary cache (default: ${CACHE_ENV} or {DEFAULT_CACHE_DIR})",
    )
    parser.add_argument("--build-only", action="store_true", help="build the binaries and exit")
    parser.add_argument("--keep-dir", action="store_true", help="keep the temp dir on exit")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if not args.build_only:
        try:
            import cryptography  # noqa: F401  (the certificates; checked before a long build)
        except ImportError:
            print(
                f"test-cluster: {sys.executable} has no `cryptography` (for the cluster's "
                "certificates): scripts/test-cluster installs it into .venv, or run "
                f"`{sys.executable} -m pip install 'cryptography>=42'`",
                file=sys.stderr,
            )
            return 2

    started = time.monotonic()
    binaries = ensure_built(cache_dir=args.cache_dir)
    print(
        f"binaries: {binaries.kube_apiserver.parent} ({time.monotonic() - started:.1f}s)",
        file=sys.stderr,
    )
    if args.build_only:
        return 0

    def on_signal(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    cluster = TestCluster(binaries=binaries, keep_dir=args.keep_dir)
    try:
        cluster.start()
        print(
            f"kube-apiserver {binaries.kubernetes_version} at {cluster.server_url}, "
            f"etcd {binaries.etcd_version}; ready in {cluster.startup_seconds:.1f}s",
            file=sys.stderr,
        )
        print(f"logs: {cluster.work_dir}; Ctrl-C or SIGTERM stops the cluster", file=sys.stderr)
        print(f"export KUBECONFIG={cluster.kubeconfig_path}", file=sys.stderr)
        print(cluster.kubeconfig_path, flush=True)
        while cluster.apiserver_running:
            time.sleep(1)
        print(f"kube-apiserver exited:\n{_tail(cluster.apiserver_log_path)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        cluster.stop()
        print("stopped", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
