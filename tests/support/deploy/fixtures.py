"""Pytest fixtures of the manifest tests, shared through ``tests/conftest.py``: kustomize, the
rendered base, and server-side apply against the test control plane."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from tests.support.controlplane.cluster import TestCluster
from tests.support.deploy import kustomize
from tests.support.deploy.manifests import DAEMONSET, Applier, Obj, install_crds, render

__all__ = ["admin_config", "applier", "kustomize_bin", "manifests"]


@pytest.fixture(scope="session")
def kustomize_bin() -> Path:
    """kustomize, built from tests/support/deploy/go/kustomize on first use (about a minute),
    cached."""
    return kustomize.ensure_built()


@pytest.fixture(scope="session")
def manifests(kustomize_bin: Path) -> list[Obj]:
    """``kustomize build daemonset/``: what ``kubectl apply -k daemonset/`` applies."""
    return render(DAEMONSET, binary=kustomize_bin)


@pytest.fixture(scope="session")
def applier(control_plane: TestCluster) -> Iterator[Applier]:
    """Server-side apply on the test control plane, the Prometheus Operator's CRDs installed."""
    api = client.ApiClient(admin_config(control_plane))
    install_crds(api)
    yield Applier(api, discovery_cache=control_plane.work_dir / "discovery.json")
    api.close()  # type: ignore[no-untyped-call]  # ApiClient.close carries no annotations


def admin_config(cp: TestCluster) -> client.Configuration:
    """The client configuration of the test control plane's admin kubeconfig."""
    cfg = client.Configuration()
    # kubernetes.config carries no annotations (the generated client does).
    config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=str(cp.kubeconfig_path), client_configuration=cfg
    )
    return cfg
