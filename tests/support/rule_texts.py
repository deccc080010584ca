"""Rule files as text: one good rule, the lines ``nodeguard check`` writes for a bad one, and
the hostile rule files (each with the error it must give)."""

from __future__ import annotations

import re

GOOD_RULE = """\
apiVersion: nodeguard.io/v1alpha1
kind: RuleSet
spec:
  rules:
    - name: low
      scope: node
      when:
        - {signal: node_memory_available_ratio, op: "<", value: 0.05}
      actions:
        - action: cordon
"""


#: ``FILE:LINE: FIELD: message``; a field is a path (``spec.rules[0].for``) or a (word).
CHECK_LINE = re.compile(
    r"^(?P<file>/[^:]+):(?P<line>\d+): (?P<field>\(top level\)|\S+): (?P<msg>.+)$"
)


def _with(extra: str) -> str:
    """GOOD_RULE with ``extra`` lines added to its rule (after ``scope: node``, line 6)."""
    return GOOD_RULE.replace("      scope: node\n", f"      scope: node\n{extra}")


def _laughs(levels: int, key: str = "for") -> str:
    """A billion-laughs document inside a rule: 9 ** levels strings from a few hundred bytes."""
    lines = ['      x0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n']
    for i in range(1, levels):
        refs = ",".join([f"*l{i - 1}"] * 9)
        lines.append(f"      x{i}: &l{i} [{refs}]\n")
    return _with("".join(lines) + f"      {key}: *l{levels - 1}\n")


# name -> (file text or bytes, (line, field, message fragment))
HOSTILE_RULES: dict[str, tuple[str | bytes, tuple[int, str, str]]] = {
    "alias-bomb": (_laughs(9), (11, "spec.rules[0].x5", "aliases expanded")),
    "alias-bomb-top": (
        "a: &a [x,x,x,x,x,x,x,x,x,x]\n"
        + "".join(
            f"{chr(98 + i)}: &{chr(98 + i)} [{','.join([f'*{chr(97 + i)}'] * 10)}]\n"
            for i in range(8)
        ),
        (5, "f", "aliases expanded"),
    ),
    "merge-bomb": (
        "a: &a {k0: 0, k1: 1, k2: 2, k3: 3, k4: 4, k5: 5, k6: 6, k7: 7, k8: 8, k9: 9}\n"
        + "".join(
            f"m{i}: &m{i} {{<<: [{', '.join([f'*{p}'] * 10)}]}}\n"
            for i, p in enumerate(["a", "m0", "m1", "m2", "m3", "m4", "m5"])
        ),
        (4, "m3['<<']", "aliases expanded"),
    ),
    "recursive-alias": (
        _with("      for: &r [*r]\n"),
        (7, "spec.rules[0].for[0]", "recursive alias"),
    ),
    "deep-flow": ("a: " + "[" * 100_000 + "]" * 100_000 + "\n", (1, "(yaml)", "deeper than 64")),
    "deep-block": (
        "".join("  " * i + "a:\n" for i in range(500)),
        (64, "(yaml)", "deeper than 64"),
    ),
    "deep-through-aliases": (
        "a: &a " + "[" * 40 + "]" * 40 + "\nb: " + "[" * 40 + "*a" + "]" * 40 + "\n",
        (2, "b" + "[0]" * 15, "deeper than 64 levels with aliases"),
    ),
    "huge-int": (
        GOOD_RULE.replace("value: 0.05", "value: " + "9" * 5000),
        (8, "spec.rules[0].when[0].value", "a number of 5000 characters"),
    ),
    "huge-float": (
        GOOD_RULE.replace("value: 0.05", "value: 0." + "1" * 400),
        (8, "spec.rules[0].when[0].value", "a number of 402 characters"),
    ),
    "huge-int-tagged": (
        _with(f"      cooldown: !!int {'7' * 4400}\n"),
        (7, "spec.rules[0].cooldown", "a number of 4400 characters"),
    ),
    "60000-digit-duration": (
        _with(f'      for: "{"1" * 60_000}"\n'),
        (7, "spec.rules[0].for", "60000 characters (at most 32)"),
    ),
    "long-duration-with-unit": (
        _with(f"      for: {'1' * 5000}s\n"),
        (7, "spec.rules[0].for", "5001 characters"),
    ),
    "nan-for": (_with("      for: .nan\n"), (7, "spec.rules[0].for", "not a finite duration")),
    "inf-cooldown": (
        _with("      cooldown: .inf\n"),
        (7, "spec.rules[0].cooldown", "not a finite duration"),
    ),
    "overflowing-duration": (
        _with("      cooldown: 1.0e+400\n"),
        (7, "spec.rules[0].cooldown", "not a finite duration"),
    ),
    "nan-window": (
        _with("      maxFirings: {count: 1, window: .NaN}\n"),
        (7, "spec.rules[0].maxFirings.window", "not a finite duration"),
    ),
    "duration-as-list": (
        _with("      for: [1m, 2m]\n"),
        (7, "spec.rules[0].for", "not a duration: list"),
    ),
    "huge-free": (
        GOOD_RULE.replace(
            "- action: cordon", f"- action: evict\n          args: {{free: {'9' * 400}Gi}}"
        ),
        (10, "spec.rules[0].actions[0]", "at most 32 characters"),
    ),
    "latin-1": (
        GOOD_RULE.encode() + b"# caf\xe9 au lait\n",
        (11, "(file)", "not UTF-8: byte 0xe9"),
    ),
    "utf-16": (GOOD_RULE.encode("utf-16"), (1, "(file)", "not UTF-8: byte 0xff")),
    "nul-character": ("a: b\nc: \x00\n", (2, "(yaml)", "character U+0000 is not allowed")),
    "lone-surrogate": (
        _with('      description: "\\ud800"\n'),
        (7, "spec.rules[0].description", "lone surrogate"),
    ),
    "sequence-key": ("? [a, b]\n: 1\n", (1, "(top level)", "a key must be a scalar")),
    "mapping-key": ("spec:\n  ? {a: b}\n  : 1\n", (2, "spec", "a key must be a scalar")),
    "duplicate-key": (
        _with("      for: 1m\n      for: 0s\n"),
        (8, "spec.rules[0].for", "duplicate key 'for'"),
    ),
    "two-documents": (
        GOOD_RULE + "---\n" + GOOD_RULE,
        (11, "(yaml)", "but found another document"),
    ),
    "python-tag": ("a: !!python/object/apply:os.system [true]\n", (1, "(yaml)", "invalid YAML")),
    "not-a-mapping": ("- 1\n- 2\n", (1, "(top level)", "a rule file is a mapping")),
}
