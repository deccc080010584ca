"""Runbook actions: cordon/uncordon, evict, pause/resume Katib experiments, record.

Every action is one module of this package that registers itself in
:mod:`nodeguard.actions.registry`; importing the package imports each of its modules, so the
registry is complete as soon as anything of ``nodeguard.actions`` is imported. Rule files,
the runbook and ``nodeguard act`` all dispatch through the registry
(:func:`~nodeguard.actions.registry.dispatch`), and every action takes ``dry_run``: a dry run
walks the same path — the same reads, ranking, budget, limits and lock — and sends its writes
to the API server as server-side dry runs (``dryRun=All``: admission, validation and
PodDisruptionBudget checks run, nothing is persisted), so it reports "would have" exactly where
a real run reports "did". Every result is audited once (:mod:`nodeguard.actions.audit`).
"""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
