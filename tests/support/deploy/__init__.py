"""Deploying nodeguard as a DaemonSet: kustomize, the generated manifests, measurements."""
