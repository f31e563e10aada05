"""Pure: `--constraint` feature expressions as Slurm writes them.

`a&b` (all of), `a|b` (any of; `&` binds tighter), `a*2&b` (at least 2 of the job's
nodes have `a`, every node has `b`), and `[a|b]` (matching OR: every node of the job
has the same one of the alternatives, e.g. one rack). Parentheses are not supported.
`node_fits` is what a single node must satisfy (every feature without a count in one
alternative); `feasible` checks a whole set of nodes, counts included; `residual` is
what spares must satisfy to complete the nodes a job keeps.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import msgspec

_TERM = re.compile(r"([A-Za-z0-9_.:\-]+)(?:\*([0-9]+))?")
# The feature a node agent gives its node where a container runtime works there: what
# a `--container-image` job needs of every node (muster/node.py, admission's apply).
CONTAINER = "container"
FORMS = "FEATURE, A&B (all of), A|B (any of), A*N&B (counts) or [A|B] (matching), e.g. a100&ib"


class Term(msgspec.Struct, frozen=True):
    feature: str
    count: int | None = None  # at least this many of the job's nodes; None: every node


class Constraint(msgspec.Struct, frozen=True, kw_only=True):
    alternatives: tuple[tuple[Term, ...], ...]  # OR of ANDs
    matching: bool = False  # [..]: the job's nodes all satisfy the same alternative


def parse(text: str) -> Constraint:
    """Raises ValueError naming the accepted forms when `text` is none of them."""
    body = text.strip()
    matching = body.startswith("[") and body.endswith("]")
    if matching:
        body = body[1:-1]
    alternatives = []
    for alternative in body.split("|"):
        terms = []
        for word in alternative.split("&"):
            found = _TERM.fullmatch(word.strip())
            if found is None or (found.group(2) is not None and int(found.group(2)) < 1):
                raise ValueError(f"invalid --constraint {text!r}: expected {FORMS}")
            count = found.group(2)
            terms.append(Term(found.group(1), int(count) if count else None))
        alternatives.append(tuple(terms))
    return Constraint(alternatives=tuple(alternatives), matching=matching)


def with_feature(text: str, feature: str) -> str:
    """`text` with `feature` required of every node as well, in every alternative."""
    body = text.strip()
    if not body:
        return feature
    matching = body.startswith("[") and body.endswith("]")
    inner = body[1:-1] if matching else body
    joined = "|".join(f"{alt}&{feature}" for alt in inner.split("|"))
    return f"[{joined}]" if matching else joined


def features_of(c: Constraint) -> tuple[str, ...]:
    return tuple(dict.fromkeys(t.feature for alt in c.alternatives for t in alt))


def fits_alternative(features: Sequence[str], alternative: tuple[Term, ...]) -> bool:
    have = set(features)
    return all(t.feature in have for t in alternative if t.count is None)


def node_fits(features: Sequence[str], c: Constraint) -> bool:
    """Whether one node may be among the job's nodes."""
    return any(fits_alternative(features, alt) for alt in c.alternatives)


def feasible(c: Constraint, nodes: Sequence[Sequence[str]], needed: int) -> bool:
    """Whether `needed` of these nodes (each its features) can satisfy `c` together."""
    for alt in c.alternatives:
        pool = [set(n) for n in nodes if fits_alternative(n, alt)]
        counted = [t for t in alt if t.count is not None]
        if len(pool) >= max(needed, sum(t.count or 0 for t in counted)) and countable(
            counted, pool
        ):
            return True
    # Plain OR: the nodes may mix alternatives (counts are then met per alternative above).
    if c.matching or any(t.count is not None for alt in c.alternatives for t in alt):
        return False
    return sum(1 for n in nodes if node_fits(n, c)) >= needed


def countable(counted: Sequence[Term], pool: Sequence[set[str]]) -> bool:
    """Whether distinct nodes of `pool` meet every count (each counted node meets one
    count, as Slurm's `[a*2&b*4]` is six nodes): a bipartite matching of count slots to
    nodes by augmenting paths."""
    slots = [t.feature for t in counted for _ in range(t.count or 0)]
    owner: dict[int, int] = {}  # node -> the slot it meets

    def augment(slot: int, seen: set[int]) -> bool:
        for i, n in enumerate(pool):
            if slots[slot] in n and i not in seen:
                seen.add(i)
                if i not in owner or augment(owner[i], seen):
                    owner[i] = slot
                    return True
        return False

    return all(augment(slot, set()) for slot in range(len(slots)))


def text_of(alternative: Sequence[Term]) -> str:
    return "&".join(t.feature + (f"*{t.count}" if t.count else "") for t in alternative)


def residual(c: Constraint, kept: Sequence[Sequence[str]]) -> str | None:
    """The constraint spares must meet so that they and the `kept` nodes (each its
    features) meet `c` together: the first alternative every kept node fits, its counts
    less what kept nodes already meet (each kept node meets one count). None when the
    kept nodes fit no alternative together; `c` unchanged when it needs no togetherness."""
    together = c.matching or any(t.count is not None for alt in c.alternatives for t in alt)
    if not together:
        return "|".join(text_of(alt) for alt in c.alternatives)
    for alt in c.alternatives:
        if not all(fits_alternative(n, alt) for n in kept):
            continue
        left = [set(n) for n in kept]
        terms: list[Term] = []
        for t in alt:
            if t.count is None:
                terms.append(t)
                continue
            met = [n for n in left if t.feature in n][: t.count]
            for n in met:
                left.remove(n)
            if t.count > len(met):
                terms.append(Term(t.feature, t.count - len(met)))
        return text_of(terms)
    return None
