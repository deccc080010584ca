"""The remediator: firings (from rules or Alertmanager) in, actions and incidents out.

- :mod:`nodeguard.remediation.worker`: the :class:`Remediator` front (submit, restore, resume,
  run), on a bounded queue, and the journal that lets a runbook cut short by a restart resume
  or be abandoned with why. Its parts, one module each: :mod:`~nodeguard.remediation.journal`
  (the entries), :mod:`~nodeguard.remediation.steps` (one runbook's steps: claim, wait,
  dispatch, retry), :mod:`~nodeguard.remediation.pods` (steps that wait for the pod list),
  :mod:`~nodeguard.remediation.endings` (incidents and feedback),
  :mod:`~nodeguard.remediation.resuming` (the decisions after a restart),
  :mod:`~nodeguard.remediation.waits` and :mod:`~nodeguard.remediation.workers` (the queue,
  its delayed re-queues and its workers).
- :mod:`nodeguard.remediation.recovery`: what to check before resuming, and the undos adopted
  from the cluster.
- :mod:`nodeguard.remediation.incidents`: the evidence of every firing that acted.
- :mod:`nodeguard.remediation.metrics`: the remediator's own series.
- :mod:`nodeguard.remediation.actor`: the per-node Lease that decides which agent acts; who
  may take it (:mod:`~nodeguard.remediation.lease_takeover`), what its holder writes on it for
  the next one (:mod:`~nodeguard.remediation.lease_mirror`), its reads and writes
  (:mod:`~nodeguard.remediation.lease_api`).
"""
