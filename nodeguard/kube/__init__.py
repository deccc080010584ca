"""The Kubernetes layer: the only package that imports the official ``kubernetes`` client.

- :mod:`nodeguard.kube.errors`: our error types (no client import; safe to import anywhere).
- :mod:`nodeguard.kube.client`: :class:`~nodeguard.kube.client.KubeClient`, calls off the loop,
  made of its configuration (:mod:`~nodeguard.kube.config`), one call
  (:mod:`~nodeguard.kube.calls`, failures by :mod:`~nodeguard.kube.translate`) and the endpoints
  by API group (:mod:`~nodeguard.kube.nodes`, :mod:`~nodeguard.kube.pods`,
  :mod:`~nodeguard.kube.leases`, :mod:`~nodeguard.kube.quotas`,
  :mod:`~nodeguard.kube.custom_objects`).
- :mod:`nodeguard.kube.objects`: Pod/Node JSON -> snapshot types.
- :mod:`nodeguard.kube.watch`: the list-then-watch of this node's pods.
"""
