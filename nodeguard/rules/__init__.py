"""Rules: what to watch and when to act.

- :mod:`nodeguard.rules.signals`: every signal a rule can compare, registered under its name.
- :mod:`nodeguard.rules.schema`: the rule file format (pydantic models, ``nodeguard/v1``).
- :mod:`nodeguard.rules.safe_yaml`: YAML read within bounds (size, depth, aliases).
- :mod:`nodeguard.rules.load`: rule files to a rule set, reloaded on change.
- :mod:`nodeguard.rules.engine`: snapshots in, firings out (durations, cooldowns, limits), on
  :mod:`~nodeguard.rules.memory` (what it remembers, in the state file),
  :mod:`~nodeguard.rules.decide` (one rule on one target at one sample) and
  :mod:`~nodeguard.rules.feedback` (what the remediator reports back).
"""
