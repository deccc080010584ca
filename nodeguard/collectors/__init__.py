"""The collectors: each reads one part of the host into the snapshot and renders that part as
metric families (:mod:`nodeguard.collectors.base` says what one is).

Every collector is one module of this package that registers its class with
:func:`~nodeguard.collectors.base.register`; importing the package imports each of its modules,
so the registry is complete as soon as anything of ``nodeguard.collectors`` is imported, and
adding a collector is one module and one registration (``tests/unit/test_collectors.py`` registers
a stand-in and finds its series and its status in ``/metrics``).
"""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
