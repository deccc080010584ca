"""``python -m nodeguard`` is the ``nodeguard`` command."""

from nodeguard.cli import main

raise SystemExit(main())
