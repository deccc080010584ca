"""The reading side of the collectors: parsers and readers of the host's files (procfs,
cgroupfs, ``/dev/kmsg``) and of NVML, one module per part of the host. They know nothing of
metrics; each collector (:mod:`nodeguard.collectors`) calls its reader and renders what it read.

A reader raises :class:`NoDataError` when the data does not exist on this host (PSI off in the
kernel, no kubepods); any other exception is a failure of that collector alone.
"""

from __future__ import annotations

__all__ = ["NoDataError"]


class NoDataError(Exception):
    """The data a collector reads does not exist on this host; logged once, not every
    sample."""
