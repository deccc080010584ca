"""Where the client's configuration comes from: the pod's ServiceAccount, a kubeconfig, or a
bearer token, and the ``ApiClient`` made from it.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from nodeguard.kube.errors import KubeError

__all__ = ["api_client", "cluster_named", "loaded_configuration", "token_configuration"]


def _in_a_pod() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def _home_config() -> Path:
    # Not the library's KUBE_CONFIG_DEFAULT_LOCATION: that is $KUBECONFIG when it was set at
    # import. The home file is kubectl's last resort, read when $KUBECONFIG is unset.
    return Path("~/.kube/config").expanduser()


def cluster_named(*, kubeconfig: Path | None, home: bool) -> bool:
    """Whether a Kubernetes config is at hand, in the one order every command follows:
    ``--kubeconfig``; else ``$KUBECONFIG``; else, in a pod, its ServiceAccount; else, where
    ``home`` (the interactive commands: ``snapshot``, ``act``), ``~/.kube/config`` if it exists.
    The agent (``run``) passes ``home=False``: an agent that writes to a cluster is pointed at
    one by a name someone gave it, never by a file found in a home directory."""
    if kubeconfig is not None or os.environ.get("KUBECONFIG") or _in_a_pod():
        return True
    return home and _home_config().exists()


def loaded_configuration(*, kubeconfig: Path | None, context: str | None) -> k8s.Configuration:
    """The config :func:`cluster_named` finds (``--kubeconfig``, ``$KUBECONFIG``, the pod's
    ServiceAccount, ``~/.kube/config``), its ``context`` (``None``: the current one). Raises
    :class:`KubeError`, naming every place tried and without the library's words, when none
    works."""
    configuration = k8s.Configuration()
    try:
        if kubeconfig is None and not os.environ.get("KUBECONFIG") and _in_a_pod():
            k8s_config.load_incluster_config(client_configuration=configuration)
        else:
            # config_file None: the library reads $KUBECONFIG, else ~/.kube/config. An empty
            # $KUBECONFIG is unset, as kubectl reads it (the library would read "" as a path).
            home = None if os.environ.get("KUBECONFIG") else str(_home_config())
            k8s_config.load_kube_config(
                config_file=str(kubeconfig) if kubeconfig else home,
                context=context,
                client_configuration=configuration,
            )
    except k8s_config.ConfigException as exc:
        # "Invalid kube-config file. No configuration found." is the library's: what matters
        # is the reason after it, and where it looked.
        reason = str(exc).removeprefix("Invalid kube-config file. ").rstrip(".")
        raise KubeError(
            f"no usable Kubernetes config ({reason}); tried {', '.join(_sources(kubeconfig))}"
        ) from exc
    except OSError as exc:
        reason = f"{exc.filename}: {exc.strerror}" if exc.filename else str(exc)
        raise KubeError(
            f"no usable Kubernetes config ({reason}); tried {', '.join(_sources(kubeconfig))}"
        ) from exc
    except (yaml.YAMLError, TypeError, ValueError, AttributeError, KeyError) as exc:
        # The library parses the file and walks it as a mapping: a file that is not YAML, or
        # YAML of another shape ([1, 2]), fails inside it with these. Bad input, not a crash.
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise KubeError(
            f"no usable Kubernetes config (not a kubeconfig: {first}); tried "
            f"{', '.join(_sources(kubeconfig))}"
        ) from exc
    return configuration


def token_configuration(*, server: str, token: str, ca_file: Path) -> k8s.Configuration:
    """``server`` (its URL) authenticated by a bearer token (a ServiceAccount's TokenRequest),
    its certificate checked against ``ca_file``."""
    configuration = k8s.Configuration()
    configuration.host = server
    configuration.ssl_ca_cert = str(ca_file)
    configuration.api_key = {"authorization": token}
    configuration.api_key_prefix = {"authorization": "Bearer"}
    return configuration


def api_client(configuration: k8s.Configuration) -> k8s.ApiClient:
    """The client's ``ApiClient`` over ``configuration``, with urllib3's own retries off."""
    # urllib3 would retry each request 3 times on its own, under our tenacity retries: one
    # layer of retries, with backoff, is enough (and keeps a hung API server from costing
    # minutes per call).
    configuration.retries = False
    return k8s.ApiClient(configuration)


def _sources(kubeconfig: Path | None) -> list[str]:
    """Where :func:`loaded_configuration` looked, in its order, for the error that says none
    worked."""
    if kubeconfig is not None:
        return [f"--kubeconfig {kubeconfig}{_absent(kubeconfig)}"]
    tried = ["--kubeconfig (not given)"]
    env = os.environ.get("KUBECONFIG")
    if env:
        missing = all(_absent(Path(p)) for p in env.split(os.pathsep) if p)
        return [*tried, f"$KUBECONFIG={env}{' (absent)' if missing else ''}"]
    tried.append("$KUBECONFIG (unset)")
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    if host:
        return [*tried, f"the in-cluster config (KUBERNETES_SERVICE_HOST={host}: the pod's token)"]
    home = _home_config()
    return [*tried, "the in-cluster config (not in a pod)", f"{home}{_absent(home)}"]


def _absent(path: Path) -> str:
    return "" if path.exists() else " (absent)"
