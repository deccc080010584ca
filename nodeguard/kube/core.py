"""The core/v1 endpoints nodeguard calls, over the official client's ``ApiClient``.

Why not ``kubernetes.client.CoreV1Api``: importing that module (and ``BatchV1Api``) cost 21
and 9 MiB of RSS (they build the pydantic validators of some 250 and 150 model modules;
kubernetes 37, measured with ``import nodeguard.agent`` already done), a third of the agent's
memory, and nodeguard never uses the typed models: every call asks for the raw response and
parses the JSON itself (:meth:`nodeguard.kube.calls.ApiCalls.read`). The requests here are
what the generated methods send: ``ApiClient.param_serialize`` with the ``BearerToken`` auth
setting, ``ApiClient.call_api``, and ``ApiException.from_response`` on a status outside 2xx, as
the client's own ``_call_with_legacy_options`` does for ``_preload_content=False``. The method
names and keyword arguments are the generated ones, so :class:`CoreV1` stands where the
generated class stood. The paths are the Kubernetes API's (API reference: core/v1 Node, Pod,
Event, ResourceQuota, LimitRange; policy/v1 Eviction). The small coordination.k8s.io and
custom-objects classes stay as generated.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

__all__ = ["CoreV1"]

JSON = dict[str, Any]

# The generated methods' keyword arguments and the query parameters they become.
_QUERY = {
    "field_selector": "fieldSelector",
    "label_selector": "labelSelector",
    "dry_run": "dryRun",
    "resource_version": "resourceVersion",
    "watch": "watch",
    "allow_watch_bookmarks": "allowWatchBookmarks",
    "timeout_seconds": "timeoutSeconds",
}


class _Raw:
    """Requests as the generated methods make them, each returning the raw urllib3 response
    (``_preload_content`` is always off). Raises ``ApiException`` (and its status subclasses) as
    they do; an unknown keyword argument is a ``KeyError`` (a programming error)."""

    def __init__(self, api_client: k8s.ApiClient) -> None:
        self._api = api_client

    def _call(
        self,
        method: str,
        path: str,
        path_params: dict[str, str],
        body: JSON | None,
        kwargs: dict[str, Any],
    ) -> Any:
        timeout = kwargs.pop("_request_timeout", None)
        kwargs.pop("_preload_content", None)
        content_type = kwargs.pop("_content_type", None)
        query = [(_QUERY[k], v) for k, v in kwargs.items() if v is not None]
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        request = self._api.param_serialize(
            method=method,
            resource_path=path,
            path_params=path_params,
            query_params=query,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self._api.call_api(*request, _request_timeout=timeout)
        if not 200 <= response.status <= 299:
            response.read()
            raise ApiException.from_response(http_resp=response, body=None, data=None)
        return response.response


class CoreV1(_Raw):
    """``CoreV1Api``'s methods that nodeguard calls."""

    # -- nodes ---------------------------------------------------------------------------------
    def read_node(self, name: str, **kw: Any) -> Any:
        return self._call("GET", "/api/v1/nodes/{name}", {"name": name}, None, kw)

    def list_node(self, **kw: Any) -> Any:
        return self._call("GET", "/api/v1/nodes", {}, None, kw)

    def patch_node(self, name: str, body: JSON, **kw: Any) -> Any:
        return self._call("PATCH", "/api/v1/nodes/{name}", {"name": name}, body, kw)

    # -- pods ----------------------------------------------------------------------------------
    def list_pod_for_all_namespaces(self, **kw: Any) -> Any:
        return self._call("GET", "/api/v1/pods", {}, None, kw)

    def list_namespaced_pod(self, namespace: str, **kw: Any) -> Any:
        path = "/api/v1/namespaces/{namespace}/pods"
        return self._call("GET", path, {"namespace": namespace}, None, kw)

    def create_namespaced_pod_eviction(
        self, name: str, namespace: str, body: JSON, **kw: Any
    ) -> Any:
        path = "/api/v1/namespaces/{namespace}/pods/{name}/eviction"
        return self._call("POST", path, {"name": name, "namespace": namespace}, body, kw)

    # -- events --------------------------------------------------------------------------------
    def create_namespaced_event(self, namespace: str, body: JSON, **kw: Any) -> Any:
        path = "/api/v1/namespaces/{namespace}/events"
        return self._call("POST", path, {"namespace": namespace}, body, kw)

    # -- resource quotas (the Katib pause) --------------------------------------------------
    def list_resource_quota_for_all_namespaces(self, **kw: Any) -> Any:
        return self._call("GET", "/api/v1/resourcequotas", {}, None, kw)

    def list_namespaced_resource_quota(self, namespace: str, **kw: Any) -> Any:
        path = "/api/v1/namespaces/{namespace}/resourcequotas"
        return self._call("GET", path, {"namespace": namespace}, None, kw)

    def create_namespaced_resource_quota(self, namespace: str, body: JSON, **kw: Any) -> Any:
        path = "/api/v1/namespaces/{namespace}/resourcequotas"
        return self._call("POST", path, {"namespace": namespace}, body, kw)

    def delete_namespaced_resource_quota(
        self, name: str, namespace: str, body: JSON, **kw: Any
    ) -> Any:
        path = "/api/v1/namespaces/{namespace}/resourcequotas/{name}"
        return self._call("DELETE", path, {"name": name, "namespace": namespace}, body, kw)

    # -- limit ranges (nodeguard doctor) -------------------------------------------------------
    def list_limit_range_for_all_namespaces(self, **kw: Any) -> Any:
        return self._call("GET", "/api/v1/limitranges", {}, None, kw)

    def list_namespaced_limit_range(self, namespace: str, **kw: Any) -> Any:
        path = "/api/v1/namespaces/{namespace}/limitranges"
        return self._call("GET", path, {"namespace": namespace}, None, kw)

    # -- nodeguard doctor: a --namespace, the agent's rules ConfigMap, the kubelet's configz ----
    def read_namespace(self, name: str, **kw: Any) -> Any:
        return self._call("GET", "/api/v1/namespaces/{name}", {"name": name}, None, kw)

    def read_namespaced_config_map(self, name: str, namespace: str, **kw: Any) -> Any:
        path = "/api/v1/namespaces/{namespace}/configmaps/{name}"
        return self._call("GET", path, {"name": name, "namespace": namespace}, None, kw)

    # -- Katib trials' memory records (nodeguard.kube.trial_records) -------------------------
    def list_namespaced_config_map(self, namespace: str, **kw: Any) -> Any:
        path = "/api/v1/namespaces/{namespace}/configmaps"
        return self._call("GET", path, {"namespace": namespace}, None, kw)

    def create_namespaced_config_map(self, namespace: str, body: JSON, **kw: Any) -> Any:
        path = "/api/v1/namespaces/{namespace}/configmaps"
        return self._call("POST", path, {"namespace": namespace}, body, kw)

    def patch_namespaced_config_map(self, name: str, namespace: str, body: JSON, **kw: Any) -> Any:
        path = "/api/v1/namespaces/{namespace}/configmaps/{name}"
        return self._call("PATCH", path, {"name": name, "namespace": namespace}, body, kw)

    def connect_get_node_proxy_configz(self, name: str, **kw: Any) -> Any:
        # The node proxy subresource (verb get on nodes/proxy): the API server forwards the
        # request to the kubelet's /configz on the node's address and kubelet port.
        return self._call("GET", "/api/v1/nodes/{name}/proxy/configz", {"name": name}, None, kw)
