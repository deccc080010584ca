"""The Kubernetes layer: the only package that imports the official ``kubernetes`` client.

- :mod:`nodeguard.kube.errors`: our error types (no client import; safe to import anywhere).
- :mod:`nodeguard.kube.client`: :class:`~nodeguard.kube.client.KubeClient`, calls off the loop.
- :mod:`nodeguard.kube.objects`: Pod/Node JSON -> snapshot types.
- :mod:`nodeguard.kube.watch`: the list-then-watch of this node's pods.
"""
