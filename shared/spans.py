"""Pure: sorted whole numbers folded into runs, `2-4,7`, each number zero-padded to a
width (`01-03`): the inside of a hostlist's brackets (`node[01-03]`), an array's task
ids (`--array=2-4,7`), squeue's pending tasks (`12_[2-4,7]`). No imports: the lean
squeue loads it."""

from __future__ import annotations


def spans(numbers: list[int], width: int = 0) -> str:
    """[2, 3, 4, 7] -> `2-4,7`; `numbers` sorted, without repeats, not empty."""
    runs: list[str] = []
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        lo, hi = str(start).zfill(width), str(prev).zfill(width)
        runs.append(lo if start == prev else f"{lo}-{hi}")
        if n is not None:
            start = prev = n
    return ",".join(runs)
