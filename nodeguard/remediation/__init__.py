"""The remediator: firings (from rules or Alertmanager) in, actions and incidents out.

- :mod:`nodeguard.remediation.worker`: the bounded queue, its workers and the journal that lets
  a runbook cut short by a restart resume or be abandoned with why.
- :mod:`nodeguard.remediation.recovery`: what to check before resuming, and the undos adopted
  from the cluster.
- :mod:`nodeguard.remediation.incidents`: the evidence of every firing that acted.
- :mod:`nodeguard.remediation.metrics`: the remediator's own series.
"""
