"""The only module that calls the Kubernetes API (the official ``kubernetes`` client).

Every call runs in a worker thread (the client is blocking), so the event loop that samples and
serves ``/metrics`` never waits on the API server. The threads are the client's own
(:data:`API_THREADS` of them), not asyncio's default executor: with the API server frozen, every
call blocks for its whole read timeout, and calls that shared the default executor with the
sampler and the ``/metrics`` render starved both (``/metrics`` timed out 4 scrapes in 5). Calls
beyond the threads wait in the client's own queue. Results come back as plain JSON dicts, exactly
as the API returns them (camelCase keys), without the client's model classes; failures come back
as :mod:`nodeguard.kube.errors` types chained from the client's exception. Reads are retried with
capped exponential backoff on server errors (tenacity); writes are not retried here: whether a
write may be repeated is the caller's decision.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import os
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

from nodeguard.kube.core import CoreV1
from nodeguard.kube.errors import (
    BudgetExhausted,
    Conflict,
    Forbidden,
    Invalid,
    KubeError,
    MultipleBudgets,
    NotFound,
    ServerError,
    TooManyRequests,
)

__all__ = ["REQUEST_TIMEOUT_SECONDS", "KubeClient", "translate_error"]

JSON = dict[str, Any]
_MERGE = "application/merge-patch+json"
_TIMEOUT = (5.0, 15.0)  # connect, read (seconds)
#: The name prefix of the client's threads (a command's exit looks for those still in a call).
KUBE_THREAD_PREFIX = "kube-api"
#: The longest one API call (a LIST, a GET) waits for its answer: connect plus read, seconds.
REQUEST_TIMEOUT_SECONDS = _TIMEOUT[0] + _TIMEOUT[1]
#: Threads for API calls: the pod watch holds one for as long as each watch lasts, and actions,
#: Events and webhook claims are rarely more than a few at once.
API_THREADS = 4
T = TypeVar("T")
#: What the eviction handler's 500 for a pod under two budgets says (eviction.go).
_MULTIPLE_BUDGETS = "more than one PodDisruptionBudget"


def translate_error(exc: Exception) -> KubeError:
    """Map a client or transport exception (kubernetes ``ApiException``, urllib3's
    ``HTTPError``, ``OSError``) to our error type (the caller raises it ``from exc``). Any
    other exception is a programming error, not an API outcome: ``TypeError``."""
    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        body: JSON = {}
        try:
            body = json.loads(exc.body or "{}")
        except (TypeError, ValueError):
            body = {}
        message = str(body.get("message") or exc.reason or exc)
        reason = str(body.get("reason") or "")
        if status == 404:
            return NotFound(message, status=status, reason=reason)
        if status == 409:
            return Conflict(message, status=status, reason=reason)
        if status == 429:
            causes = (body.get("details") or {}).get("causes") or []
            pdb = any(c.get("reason") == "DisruptionBudget" for c in causes) or (
                "disruption budget" in message.lower()
            )
            retry = (exc.headers or {}).get("Retry-After") if exc.headers else None
            seconds = float(retry) if retry and str(retry).isdigit() else None
            if pdb:
                return BudgetExhausted(message, reason=reason, retry_after=seconds)
            return TooManyRequests(message, reason=reason, retry_after=seconds)
        if status in (401, 403):
            return Forbidden(message, status=status, reason=reason)
        if status in (400, 422):
            return Invalid(message, status=status, reason=reason)
        if status == 0:
            return ServerError(message, unreachable=True)
        if status == 500 and _MULTIPLE_BUDGETS in message:
            # eviction.go's Status for a pod under two budgets: no reason or cause to go by.
            return MultipleBudgets(message, status=status, reason=reason)
        return ServerError(message, status=status, reason=reason)
    if isinstance(exc, urllib3.exceptions.HTTPError | OSError):
        return ServerError(f"API server unreachable: {exc}", unreachable=True)
    raise TypeError(f"not a client or transport error: {type(exc).__name__}") from exc


def _api_client(configuration: k8s.Configuration) -> k8s.ApiClient:
    # urllib3 would retry each request 3 times on its own, under our tenacity retries: one
    # layer of retries, with backoff, is enough (and keeps a hung API server from costing
    # minutes per call).
    configuration.retries = False
    return k8s.ApiClient(configuration)


def _sources(kubeconfig: Path | None) -> list[str]:
    """Where :meth:`KubeClient.load` looked for a config, for the error that says none
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


class KubeClient:
    """Async facade over the official client for what nodeguard does to a cluster.

    Construct with :meth:`load` (in-cluster config, else a kubeconfig) or :meth:`with_token`.
    ``read_attempts`` bounds retries of reads on :class:`ServerError`.
    """

    def __init__(self, *, api_client: k8s.ApiClient, read_attempts: int = 4) -> None:
        self.api = api_client
        self.core = CoreV1(api_client)  # not the generated classes: nodeguard/kube/core.py
        self.coordination = k8s.CoordinationV1Api(api_client)
        self.policy = k8s.PolicyV1Api(api_client)
        self.custom = k8s.CustomObjectsApi(api_client)
        self._read_attempts = read_attempts
        #: Awaited right before every destructive write (a real eviction, a Node patch); raises
        #: :class:`~nodeguard.kube.errors.Fenced` to stop it (the node actor's check).
        self.fence: Callable[[], Awaitable[None]] | None = None
        self._threads = ThreadPoolExecutor(
            max_workers=API_THREADS, thread_name_prefix=KUBE_THREAD_PREFIX
        )

    @classmethod
    def load(cls, *, kubeconfig: Path | None = None, context: str | None = None) -> KubeClient:
        """In-cluster config (the pod's ServiceAccount) when ``kubeconfig`` is ``None`` and
        ``KUBERNETES_SERVICE_HOST`` is set; otherwise the kubeconfig (``$KUBECONFIG`` or
        ``~/.kube/config`` when ``None``). Raises :class:`KubeError` when neither works."""
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
        return cls(api_client=_api_client(configuration))

    @classmethod
    def with_token(cls, *, server: str, token: str, ca_file: Path) -> KubeClient:
        """A client authenticated by a bearer token (a ServiceAccount's TokenRequest)."""
        configuration = k8s.Configuration()
        configuration.host = server
        configuration.ssl_ca_cert = str(ca_file)
        configuration.api_key = {"authorization": token}
        configuration.api_key_prefix = {"authorization": "Bearer"}
        return cls(api_client=_api_client(configuration))

    def close(self) -> None:
        """Close the connection pool; calls still queued for a thread are dropped."""
        self._threads.shutdown(wait=False, cancel_futures=True)
        self.api.close()

    async def in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in one of the client's own threads (never asyncio's default executor,
        which the sampler and ``/metrics`` use), with the caller's context variables, as
        ``asyncio.to_thread`` runs it."""
        call = functools.partial(contextvars.copy_context().run, fn, *args)
        return await asyncio.get_running_loop().run_in_executor(self._threads, call)

    # -- plumbing ----------------------------------------------------------------------------
    @staticmethod
    def _blocking(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> JSON:
        try:
            resp = fn(*args, _preload_content=False, _request_timeout=_TIMEOUT, **kwargs)
            data = resp.data
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            # Only the client's and the transport's failures are API outcomes; a bug raises.
            raise translate_error(exc) from exc
        if not data:
            return {}
        try:
            parsed: JSON = json.loads(data)
        except ValueError as exc:
            raise ServerError(f"the API answered something that is not JSON: {exc}") from exc
        return parsed

    async def write(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> JSON:
        """Run one API call once, off the event loop; the response body as a dict."""
        return await self.in_thread(functools.partial(self._blocking, fn, **kwargs), *args)

    async def read(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> JSON:
        """Like :meth:`write`, retried with capped exponential backoff on
        :class:`ServerError` (reads are safe to repeat)."""
        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(ServerError),
            stop=stop_after_attempt(self._read_attempts),
            wait=wait_exponential_jitter(multiplier=0.2, max=5.0, jitter=0.2),
            reraise=True,
        ):
            with attempt:
                return await self.write(fn, *args, **kwargs)
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    def _dry(dry_run: bool) -> dict[str, str]:
        # Server-side dry run: admission, validation and PDB checks run; nothing is persisted.
        return {"dry_run": "All"} if dry_run else {}

    # -- nodes -------------------------------------------------------------------------------
    async def get_node(self, *, name: str) -> JSON:
        """GET /api/v1/nodes/{name}."""
        return await self.read(self.core.read_node, name)

    async def list_nodes(self, *, label_selector: str | None = None) -> list[JSON]:
        """GET /api/v1/nodes, optionally by label selector."""
        kw = {"label_selector": label_selector} if label_selector else {}
        items: list[JSON] = (await self.read(self.core.list_node, **kw)).get("items", [])
        return items

    async def patch_node(self, *, name: str, patch: JSON, dry_run: bool) -> JSON:
        """JSON merge patch of a Node (RFC 7386); include ``metadata.resourceVersion`` in the
        patch for optimistic concurrency (then a concurrent change gives :class:`Conflict`).
        A real patch passes :attr:`fence` first."""
        if not dry_run and self.fence is not None:
            await self.fence()
        return await self.write(
            self.core.patch_node, name, patch, _content_type=_MERGE, **self._dry(dry_run)
        )

    # -- pods --------------------------------------------------------------------------------
    async def list_pods(
        self,
        *,
        node_name: str | None = None,
        namespace: str | None = None,
        label_selector: str | None = None,
    ) -> tuple[list[JSON], str]:
        """Pods (of one node via the ``spec.nodeName`` field selector, of one namespace, by
        label selector); returns ``(items, list resourceVersion)``."""
        kw: dict[str, Any] = {}
        if node_name:
            kw["field_selector"] = f"spec.nodeName={node_name}"
        if label_selector:
            kw["label_selector"] = label_selector
        if namespace:
            body = await self.read(self.core.list_namespaced_pod, namespace, **kw)
        else:
            body = await self.read(self.core.list_pod_for_all_namespaces, **kw)
        return body.get("items", []), str(body.get("metadata", {}).get("resourceVersion", ""))

    async def evict_pod(
        self, *, name: str, namespace: str, dry_run: bool, uid: str | None = None
    ) -> None:
        """POST the policy/v1 Eviction subresource (never DELETE). The API server refuses with
        429 (:class:`BudgetExhausted`) when a PodDisruptionBudget does not allow the disruption,
        500 (:class:`MultipleBudgets`) when more than one selects the pod; in dry run it checks
        the same and deletes nothing. With ``uid``, ``deleteOptions.preconditions.uid``: a pod
        replaced under the same name is a :class:`Conflict`, never evicted in the decided pod's
        place. A real eviction passes :attr:`fence` first."""
        if not dry_run and self.fence is not None:
            await self.fence()
        options: JSON = {}
        if dry_run:
            options["dryRun"] = ["All"]
        if uid:
            options["preconditions"] = {"uid": uid}
        body: JSON = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        if options:
            body["deleteOptions"] = options
        await self.write(
            self.core.create_namespaced_pod_eviction, name, namespace, body, **self._dry(dry_run)
        )

    async def list_pod_disruption_budgets(self, *, namespace: str) -> list[JSON]:
        """GET /apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets: every budget of
        the namespace, as the eviction handler lists them (it matches selectors itself)."""
        body = await self.read(self.policy.list_namespaced_pod_disruption_budget, namespace)
        items: list[JSON] = body.get("items", [])
        return items

    # -- events ------------------------------------------------------------------------------
    async def create_event(self, *, namespace: str, body: JSON) -> JSON:
        """POST a core/v1 Event."""
        return await self.write(self.core.create_namespaced_event, namespace, body)

    # -- leases ------------------------------------------------------------------------------
    async def get_lease(self, *, name: str, namespace: str) -> JSON:
        """GET a coordination.k8s.io/v1 Lease."""
        return await self.read(self.coordination.read_namespaced_lease, name, namespace)

    async def create_lease(self, *, namespace: str, body: JSON) -> JSON:
        """POST a Lease; :class:`Conflict` when it exists."""
        return await self.write(self.coordination.create_namespaced_lease, namespace, body)

    async def replace_lease(self, *, name: str, namespace: str, body: JSON) -> JSON:
        """PUT a Lease; the body's resourceVersion makes a concurrent update a Conflict."""
        return await self.write(self.coordination.replace_namespaced_lease, name, namespace, body)

    # -- resource quotas (the Katib pause) --------------------------------------------------
    async def list_resource_quotas(
        self, *, label_selector: str | None = None, namespace: str | None = None
    ) -> list[JSON]:
        """ResourceQuotas of one namespace (or every namespace), by label selector (default:
        all)."""
        kw = {"label_selector": label_selector} if label_selector else {}
        if namespace is None:
            body = await self.read(self.core.list_resource_quota_for_all_namespaces, **kw)
        else:
            body = await self.read(self.core.list_namespaced_resource_quota, namespace, **kw)
        items: list[JSON] = body.get("items", [])
        return items

    async def create_resource_quota(self, *, namespace: str, body: JSON, dry_run: bool) -> JSON:
        """POST a ResourceQuota; :class:`Conflict` when one of that name exists."""
        return await self.write(
            self.core.create_namespaced_resource_quota, namespace, body, **self._dry(dry_run)
        )

    async def delete_resource_quota(
        self, *, name: str, namespace: str, uid: str, dry_run: bool
    ) -> None:
        """DELETE a ResourceQuota, only the one with ``uid`` (a precondition: one made again
        under the name by someone else is a :class:`Conflict`)."""
        body: JSON = {"preconditions": {"uid": uid}}
        if dry_run:
            body["dryRun"] = ["All"]
        await self.write(
            self.core.delete_namespaced_resource_quota,
            name,
            namespace,
            body,
            **self._dry(dry_run),
        )

    # -- custom resources (Katib) ----------------------------------------------------------
    async def get_custom(
        self, *, group: str, version: str, plural: str, namespace: str, name: str
    ) -> JSON:
        """GET a namespaced custom object."""
        return await self.read(
            self.custom.get_namespaced_custom_object, group, version, namespace, plural, name
        )

    async def list_custom(
        self,
        *,
        group: str,
        version: str,
        plural: str,
        namespace: str | None = None,
        label_selector: str | None = None,
    ) -> list[JSON]:
        """Custom objects of one namespace (or every namespace), by label selector."""
        kw = {"label_selector": label_selector} if label_selector else {}
        if namespace is None:
            body = await self.read(
                self.custom.list_cluster_custom_object, group, version, plural, **kw
            )
        else:
            body = await self.read(
                self.custom.list_namespaced_custom_object, group, version, namespace, plural, **kw
            )
        items: list[JSON] = body.get("items", [])
        return items

    async def patch_custom(
        self,
        *,
        group: str,
        version: str,
        plural: str,
        namespace: str,
        name: str,
        patch: JSON,
        dry_run: bool,
    ) -> JSON:
        """JSON merge patch of a namespaced custom object."""
        return await self.write(
            self.custom.patch_namespaced_custom_object,
            group,
            version,
            namespace,
            plural,
            name,
            patch,
            _content_type=_MERGE,
            **self._dry(dry_run),
        )
