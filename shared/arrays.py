"""Pure: job array specs (`-a 0-15:4%2`, `1,3,5-7`) -> task ids and a throttle. Shared
by admission (which splits an array into its tasks) and the launcher (which tells each
task its array's size, `SLURM_ARRAY_TASK_COUNT`...).

Grammar, as sbatch documents it: comma-separated items, each `N`, `N-M` or `N-M:STEP`,
optionally followed by `%K` (at most K tasks running at once). Task ids are sorted and
unique. Raises `ValueError` with a message for the submitter.
"""

from __future__ import annotations

import re

import msgspec

from shared.spans import spans

MAX_ARRAY_INDEX = 1000  # Slurm's default MaxArraySize=1001 allows indices 0..1000
ARRAY_FORMS = "N, N-M, N-M:STEP or a comma list of those, optionally ending in %MAX_RUNNING"
_ITEM = re.compile(r"(\d{1,9})(?:-(\d{1,9})(?::(\d{1,9}))?)?")


class ArraySpec(msgspec.Struct, frozen=True, kw_only=True):
    task_ids: tuple[int, ...]
    max_running: int | None = None  # the `%K` throttle

    def __str__(self) -> str:
        return format_array(self)

    @property
    def step(self) -> int | None:
        """The ids' one spacing (`0-15:4`: 4, a single id: 1), None when they have no
        one spacing (`1,2,5`)."""
        gaps = {b - a for a, b in zip(self.task_ids, self.task_ids[1:], strict=False)}
        return 1 if not gaps else gaps.pop() if len(gaps) == 1 else None


def parse_array(text: str, *, max_index: int = MAX_ARRAY_INDEX) -> ArraySpec:
    spec = text.strip()
    throttle: int | None = None
    if "%" in spec:
        spec, _, limit = spec.partition("%")
        if not limit.isdigit() or int(limit) < 1:
            raise ValueError(
                f"invalid --array {text!r}: the part after % must be a count of 1 or more"
            )
        throttle = int(limit)
    ids: set[int] = set()
    for item in spec.split(","):
        m = _ITEM.fullmatch(item.strip())
        if not m:
            raise ValueError(f"invalid --array {text!r}: {item!r} is not one of {ARRAY_FORMS}")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        step = int(m.group(3)) if m.group(3) is not None else 1
        if hi < lo:
            raise ValueError(f"invalid --array {text!r}: range {item!r} runs backwards")
        if step < 1:
            raise ValueError(f"invalid --array {text!r}: the step in {item!r} must be 1 or more")
        if hi > max_index:
            raise ValueError(
                f"invalid --array {text!r}: task id {hi} is over the maximum {max_index}"
            )
        ids.update(range(lo, hi + 1, step))
    return ArraySpec(task_ids=tuple(sorted(ids)), max_running=throttle)


def format_array(spec: ArraySpec) -> str:
    """Canonical form: consecutive ids folded into ranges, then `%K` if throttled."""
    text = spans(list(spec.task_ids)) if spec.task_ids else ""
    return f"{text}%{spec.max_running}" if spec.max_running is not None else text
