"""``nodeguard doctor``: a read-only check of a cluster's memory posture for ML training.

- :mod:`~nodeguard.doctor.inputs`: what the checks read (nodes, pods, quotas, LimitRanges),
  read once by :mod:`~nodeguard.doctor.read` through :mod:`nodeguard.kube`;
  :mod:`~nodeguard.doctor.agent_inputs` the nodeguard agents, their rules and the kubelets'
  ``configz`` (:mod:`~nodeguard.doctor.read_agents`, :mod:`~nodeguard.doctor.read_kubelet`),
  :mod:`~nodeguard.doctor.quota_scopes` which pods a scoped quota counts.
- :mod:`~nodeguard.doctor.findings`: a finding (check, severity, objects, evidence, fix).
- :mod:`~nodeguard.doctor.registry`: the checks, one module each, registered by id:
  ``unbounded-memory`` (:mod:`~nodeguard.doctor.unbounded`), ``overcommit``
  (:mod:`~nodeguard.doctor.overcommit`), ``quota-limitrange``
  (:mod:`~nodeguard.doctor.quota_limits`), ``node-reserve``
  (:mod:`~nodeguard.doctor.node_reserve`), ``nodeguard-agents``
  (:mod:`~nodeguard.doctor.agents`), ``katib-fit`` (:mod:`~nodeguard.doctor.katib_fit`),
  ``training-priority`` (:mod:`~nodeguard.doctor.training_priority`) and ``training-gang``
  (:mod:`~nodeguard.doctor.training_gang`), the last two over the training workloads of
  :mod:`~nodeguard.doctor.training_workloads` (jobs read by
  :mod:`~nodeguard.doctor.read_training`).
- :mod:`~nodeguard.doctor.table`: the findings at 80 columns, grouped by severity.
- :mod:`~nodeguard.doctor.node_scope`: the checks of scope ``node`` on one node's cluster, as
  the agent runs them for ``nodeguard_posture_findings``.

Importing the package imports every module of it, so the registry is complete.
"""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
