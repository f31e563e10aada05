"""Pure: Slurm hostlist expressions, `gpu[001-004,007],login1` <-> node names.

`expand` keeps the order written and drops repeats; `compress` sorts and groups names
by prefix and zero-padding so that `expand(compress(names))` gives the same set back.
Both raise `ValueError` with a message for the submitter on a malformed expression.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from shared.spans import spans

MAX_HOSTS = 100_000  # one expression may not name more nodes than any real cluster has
_TAIL_DIGITS = re.compile(r"^(.*?)(\d+)$")
_NAME_CHARS = re.compile(r"[A-Za-z0-9._\-]*")
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


def _split_top(expr: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(expr):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"invalid hostlist {expr!r}: nested '['")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"invalid hostlist {expr!r}: ']' without '['")
        elif ch == "," and depth == 0:
            parts.append(expr[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"invalid hostlist {expr!r}: '[' is never closed")
    parts.append(expr[start:])
    return parts


def _bracket_values(body: str, expr: str) -> list[str]:
    values: list[str] = []
    for item in body.split(","):
        m = _RANGE.fullmatch(item.strip())
        if not m:
            raise ValueError(f"invalid hostlist {expr!r}: {item!r} inside brackets is not N or N-M")
        lo_text, hi_text = m.group(1), m.group(2)
        lo, hi = int(lo_text), int(hi_text if hi_text is not None else lo_text)
        if hi < lo:
            raise ValueError(f"invalid hostlist {expr!r}: range {item!r} runs backwards")
        if hi - lo >= MAX_HOSTS:
            raise ValueError(f"hostlist {expr!r} names more than {MAX_HOSTS} nodes")
        width = len(lo_text)
        values.extend(str(n).zfill(width) for n in range(lo, hi + 1))
    return values


def _expand_one(term: str, expr: str) -> list[str]:
    names = [""]
    pos = 0
    while pos < len(term):
        open_at = term.find("[", pos)
        literal = term[pos:] if open_at < 0 else term[pos:open_at]
        if not _NAME_CHARS.fullmatch(literal):
            raise ValueError(f"invalid hostlist {expr!r}: unexpected character in {literal!r}")
        names = [n + literal for n in names]
        if open_at < 0:
            break
        close_at = term.index("]", open_at)
        values = _bracket_values(term[open_at + 1 : close_at], expr)
        names = [n + v for n in names for v in values]
        if len(names) > MAX_HOSTS:
            raise ValueError(f"hostlist {expr!r} names more than {MAX_HOSTS} nodes")
        pos = close_at + 1
    return names


def expand(expr: str) -> tuple[str, ...]:
    """`gpu[01-03,07]` -> ("gpu01", "gpu02", "gpu03", "gpu07")."""
    seen: dict[str, None] = {}
    for term in _split_top(expr.strip()):
        term = term.strip()
        if not term:
            continue
        for name in _expand_one(term, expr):
            seen.setdefault(name, None)
        if len(seen) > MAX_HOSTS:
            raise ValueError(f"hostlist {expr!r} names more than {MAX_HOSTS} nodes")
    return tuple(seen)


def compress(names: Iterable[str]) -> str:
    """("gpu01", "gpu02", "gpu04") -> "gpu[01-02,04]"; names are sorted, repeats dropped."""
    plain: set[str] = set()
    groups: dict[tuple[str, int], set[int]] = {}
    for name in names:
        m = _TAIL_DIGITS.match(name)
        if not m:
            plain.add(name)
            continue
        prefix, digits = m.group(1), m.group(2)
        # Zero-padded numbers only group with numbers of the same width.
        width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        groups.setdefault((prefix, width), set()).add(int(digits))
    parts = [(name, name) for name in plain]
    for (prefix, width), numbers in groups.items():
        ordered = sorted(numbers)
        if len(ordered) == 1:
            text = prefix + str(ordered[0]).zfill(width)
        else:
            text = f"{prefix}[{spans(ordered, width)}]"
        parts.append((prefix + str(ordered[0]).zfill(width), text))
    return ",".join(text for _, text in sorted(parts))
