"""Sampling the host: one sampler builds a :class:`~nodeguard.snapshot.NodeSnapshot` every
interval, from the collectors (:mod:`nodeguard.collectors`), and samples what is near its limit
more often in between (focus sampling).

- :mod:`~nodeguard.sampling.sampler`: the sampler, its schedule and focus;
- :mod:`~nodeguard.sampling.builder`: one sample, full or focused, from the collectors;
- :mod:`~nodeguard.sampling.focus`: the kernel's notifications wired to the sampler;
- :mod:`~nodeguard.sampling.notify`: the kernel's notifications themselves (memory thresholds,
  ``memory.events``, PSI triggers).
"""
