"""``nodeguard run``: the agent's tasks wired together.

One sampler task builds a snapshot every interval; after each, the rule engine evaluates it and
its firings go to the remediator's queue (never awaited). The pod watch (with a cluster) keeps
pod metadata current; the web server serves the latest snapshot, within the bounds of
:mod:`nodeguard.connections`. Rule files reload when they change (checked every sample, read and
parsed in a thread of their own) and on SIGHUP; SIGTERM and SIGINT stop everything.

At start the remediation state (``<path.state>/remediation-state.json``) is read: the engine's
firing state, cooldowns and caps, the eviction limits, the webhook's handled deliveries and the
journal of runbooks under way (:mod:`nodeguard.remediation.recovery` decides, on the first
sample, which of those resume); with a cluster, undos the state file lost are found on the
cluster objects.

The modules, in the order a start goes through them:

- :mod:`~nodeguard.agent.config`: :class:`AgentConfig`, everything ``nodeguard run`` was told;
- :mod:`~nodeguard.agent.build`: every part built from it, before anything runs
  (:class:`~nodeguard.agent.build.Agent`), the parts that act by
  :mod:`~nodeguard.agent.acting`;
- :mod:`~nodeguard.agent.decide`: what each snapshot decides (the sampler's listener);
- :mod:`~nodeguard.agent.serve`: listen, handle signals, run the tasks, shut down;
- :mod:`~nodeguard.agent.run`: :func:`run_agent`, the three in order.
"""

from nodeguard.agent.config import AgentConfig
from nodeguard.agent.run import run_agent

__all__ = ["AgentConfig", "run_agent"]
