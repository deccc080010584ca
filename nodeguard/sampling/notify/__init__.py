"""Kernel notifications that wake the sampler at once, instead of at the next interval.

Polling loses to the kernel: at a 5 s interval a container growing 8 MiB/s toward a 512 MiB limit
crosses 95 % only 3.2 s before the OOM killer fires (docs/benchmarks.md). The kernel can say when
something is happening, where it offers to:

- :mod:`~nodeguard.sampling.notify.thresholds`: cgroup v1 memory thresholds (an eventfd
  registered in ``cgroup.event_control`` on ``memory.usage_in_bytes``; kernel
  Documentation/admin-guide/cgroup-v1/memory.rst, "Memory thresholds");
- :mod:`~nodeguard.sampling.notify.psi`: PSI triggers (``/proc/pressure/memory`` and cgroup v2
  ``memory.pressure``; Documentation/accounting/psi.rst, "Monitoring for pressure thresholds");
- :mod:`~nodeguard.sampling.notify.events`: cgroup v2 ``memory.events`` "modified" file events
  (max, oom, oom_kill; Documentation/admin-guide/cgroup-v2.rst).

Each is optional: what the kernel or the agent's privileges do not allow is reported (in
``nodeguard_collector_*{collector="notify_..."}``) and logged once, and the agent falls back to
focus sampling. :class:`~nodeguard.sampling.notify.hub.NotificationHub` gathers them on one
epoll set that the event loop watches, and calls back with what fired.
"""
