"""Pure: `--constraint` feature expressions, `a100&ib|h100` (OR of ANDs, no brackets).

Muster supports the common subset of Slurm's syntax: feature names joined by `&` (all)
and `|` (any), `&` binding tighter. Bracketed sets and `*count` are refused.
"""

from __future__ import annotations

import re

_FEATURE = re.compile(r"[A-Za-z0-9_.:\-]+")
CONSTRAINT_FORMS = "FEATURE, A&B (all of) or A|B (any of), e.g. a100&ib|h100"


def parse_constraint(text: str) -> tuple[tuple[str, ...], ...]:
    """`a&b|c` -> (("a", "b"), ("c",)); raises ValueError on anything else."""
    options: list[tuple[str, ...]] = []
    for alternative in text.split("|"):
        names = tuple(f.strip() for f in alternative.split("&"))
        if not all(_FEATURE.fullmatch(n) for n in names):
            raise ValueError(f"invalid --constraint {text!r}: expected {CONSTRAINT_FORMS}")
        options.append(names)
    return tuple(options)


def matches(features: tuple[str, ...], parsed: tuple[tuple[str, ...], ...]) -> bool:
    have = set(features)
    return any(set(alternative) <= have for alternative in parsed)
