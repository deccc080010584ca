"""One watch of a node's pods, streamed in a worker thread until the server ends it.

``GET /api/v1/pods?watch=true&fieldSelector=spec.nodeName=<node>&resourceVersion=<rv>``, with
bookmarks (``allowWatchBookmarks``) so that the resourceVersion moves on in a quiet watch, and
the server's ``timeoutSeconds`` to end it; the body is one JSON watch event a line (API
concepts, "Efficient detection of changes"). 410 Gone (the resourceVersion expired) means the
watch cannot resume: :class:`Relist`.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable
from typing import Any

from nodeguard.kube.client import JSON, KubeClient
from nodeguard.kube.translate import translate_error

__all__ = ["PodWatchStream", "Relist"]


class Relist(Exception):
    """The watch cannot resume; list again."""


class PodWatchStream:
    """Streams the watch events of node ``node_name``'s pods to ``apply`` (which returns the
    event's resourceVersion, or raises :class:`Relist`). ``watch_timeout``: the server ends each
    watch after this many seconds."""

    def __init__(
        self,
        *,
        kube: KubeClient,
        node_name: str,
        watch_timeout: int,
        apply: Callable[[JSON], str | None],
    ) -> None:
        self._kube = kube
        self._node_name = node_name
        self._watch_timeout = watch_timeout
        self._apply = apply
        self._resp: Any = None  # the open watch response, shut down to stop the thread

    def watch(self, rv: str, stop: threading.Event) -> str:
        """Stream watch events from ``rv`` until the server ends the watch (or ``stop`` is
        set); the last resourceVersion seen. Blocks: run it in a thread. Raises
        :class:`Relist` or a :class:`~nodeguard.kube.errors.KubeError`."""
        try:
            resp: Any = self._kube.core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={self._node_name}",
                resource_version=rv,
                watch=True,
                allow_watch_bookmarks=True,
                timeout_seconds=self._watch_timeout,
                _preload_content=False,
                _request_timeout=(5.0, self._watch_timeout + 30.0),
            )
        except Exception as exc:
            err = translate_error(exc)
            if err.status == 410:
                raise Relist("410 Gone") from exc
            raise err from exc
        self._resp = resp
        if stop.is_set():
            resp.release_conn()
            return rv
        try:
            buffer = b""
            for chunk in resp.stream(65536):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        rv = self._apply(json.loads(line)) or rv
                if stop.is_set():
                    break
        except Relist:
            raise
        except Exception as exc:
            if stop.is_set():
                return rv  # shut down by unblock() on stop
            raise translate_error(exc) from exc
        finally:
            self._resp = None
            if stop.is_set():
                resp.close()  # a shut-down socket must not go back to the pool
            else:
                resp.release_conn()
        return rv

    def unblock(self, stop: threading.Event) -> None:
        """Stop the watch thread now rather than at the watch's server-side timeout."""
        stop.set()
        resp = self._resp
        if resp is not None:
            with contextlib.suppress(Exception):
                resp.shutdown()
