"""Where the client's configuration comes from: the pod's ServiceAccount, a kubeconfig, or a
bearer token, and the ``ApiClient`` made from it.
"""

from __future__ import annotations

import os
from pathlib import Path

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from nodeguard.kube.errors import KubeError

__all__ = ["api_client", "loaded_configuration", "token_configuration"]


def loaded_configuration(*, kubeconfig: Path | None, context: str | None) -> k8s.Configuration:
    """In-cluster config (the pod's ServiceAccount) when ``kubeconfig`` is ``None`` and
    ``KUBERNETES_SERVICE_HOST`` is set; otherwise the kubeconfig (``$KUBECONFIG`` or
    ``~/.kube/config`` when ``None``), its ``context`` (``None``: the current one). Raises
    :class:`KubeError`, naming every place tried, when neither works."""
    configuration = k8s.Configuration()
    try:
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            k8s_config.load_incluster_config(client_configuration=configuration)
        else:
            k8s_config.load_kube_config(
                config_file=str(kubeconfig) if kubeconfig else None,
                context=context,
                client_configuration=configuration,
            )
    except (k8s_config.ConfigException, OSError) as exc:
        raise KubeError(
            f"no usable Kubernetes config ({exc}); tried {', '.join(_sources(kubeconfig))}"
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
    """Where :func:`loaded_configuration` looked for a config, for the error that says none
    worked: the file given; else in a pod its ServiceAccount; else ``$KUBECONFIG``, else
    ``~/.kube/config``."""
    if kubeconfig is not None:
        return [f"--kubeconfig {kubeconfig}"]
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    if host:
        return [f"the in-cluster config (KUBERNETES_SERVICE_HOST={host}: the pod's token)"]
    tried = ["--kubeconfig (not given)", "the in-cluster config (not in a pod)"]
    env = os.environ.get("KUBECONFIG")
    if env:
        return [*tried, f"$KUBECONFIG={env}"]
    home = Path(k8s_config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION).expanduser()
    return [*tried, "$KUBECONFIG (unset)", f"{home}{'' if home.exists() else ' (absent)'}"]
