"""The remediator: firings (from rules or Alertmanager) in, actions and incidents out.

- :mod:`nodeguard.remediation.runbook`: action names bound to their implementations.
- :mod:`nodeguard.remediation.incidents`: the evidence of every firing that acted.
- :mod:`nodeguard.remediation.worker`: the bounded queue and its workers.
"""
