"""Runbook actions: cordon/uncordon, evict, pause/resume Katib experiments.

Each action is usable alone (``nodeguard act``) and takes ``dry_run``: a dry run walks the same
path — the same reads, ranking, budget and lock — and sends its writes to the API server as
server-side dry runs (``dryRun=All``: admission, validation and PodDisruptionBudget checks run,
nothing is persisted), so it reports "would have" exactly where a real run reports "did".
Every action returns an :class:`~nodeguard.actions.base.ActionResult` and is audited
(:mod:`nodeguard.actions.audit`).
"""
