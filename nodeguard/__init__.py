"""nodeguard: keeps GPU/ML Kubernetes nodes from being eaten by memory.

Public surface: :mod:`nodeguard.snapshot` (the data), :mod:`nodeguard.sampling.sampler`
(building it), :mod:`nodeguard.exposition.exporter` (rendering it), :mod:`nodeguard.cli` (the
``nodeguard`` command).
"""

__version__ = "0.1.0"
