"""Writes the golden scenarios (golden/*.json) from the plans the core gives today.

    .venv/bin/python -m tests.unit.placer.make_golden

Review the diff of the JSON before committing: a changed plan is a changed policy.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from services.placer.core import (
    JobRequest,
    Limit,
    Limits,
    Node,
    NodeState,
    Plan,
    PolicyConfig,
    Recurrence,
    Reservation,
    Running,
    Snapshot,
    place,
)
from tests.unit.placer.helpers import T0, gang, grant, node, running, whole

GOLDEN = Path(__file__).parent / "golden"


class Scenario(msgspec.Struct, frozen=True, kw_only=True):
    story: str
    now: float
    snapshot: Snapshot
    pending: tuple[JobRequest, ...]
    config: PolicyConfig = PolicyConfig()
    want: Plan = Plan()


def fat_tree() -> tuple[Node, ...]:
    """2 pods x 2 spines x 2 leaves x 4 nodes of 8 GPUs in two NVLink groups."""
    out = []
    for i in range(32):
        leaf, spine, pod = i // 4, i // 8, i // 16
        path = (f"pod{pod}", f"spine{spine}", f"leaf{leaf}")
        out.append(node(f"n{i:02d}", 8, topology=path, groups=2))
    return tuple(out)


def busy_fat_tree() -> Scenario:
    nodes = list(fat_tree())
    nodes[31] = node("n31", 8, topology=("pod1", "spine3", "leaf7"), state=NodeState.DOWN)
    nodes[30] = node("n30", 8, topology=("pod1", "spine3", "leaf7"), unhealthy=(0, 1))
    run: list[Running] = [
        running(100, *(whole(f"n{i:02d}") for i in range(0, 6)), time_limit_s=5400),
        running(101, *(whole(f"n{i:02d}") for i in range(8, 14)), time_limit_s=9000),
        running(102, grant("n16", 0, 1, 2), grant("n17", 0), priority=1.0, time_limit_s=4000),
        running(103, *(whole(f"n{i:02d}") for i in range(18, 24)), tier=0, priority=0.5),
        running(104, grant("n24", 4, 5, 6, 7), preemptible=False, time_limit_s=86_400),
    ]
    pending = (
        gang(1, nodes=16, gpus_per_node=8, priority=9.0, time_limit_s=7200),
        gang(2, nodes=2, gpus_per_node=8, time_limit_s=600),
        gang(3, nodes=4, gpus_per_node=8, time_limit_s=86_400),
        gang(4, gpus_per_node=4, time_limit_s=1800),
        gang(5, nodes=(2, 4), gpus_per_node=8, max_switches=1, switches_wait_s=3600),
        gang(6, gpus_total=12, time_limit_s=1200),
        gang(7, nodes=6, gpus_per_node=8, tier=2, can_preempt=True),
        gang(8, gpus_per_node=2, held=True),
        gang(9, gpus_per_node=8, exclusive=True, excluded_nodes=("n07",)),
    )
    return Scenario(
        story="a busy 3-level fat tree: a 16-node job books its start, short jobs "
        "backfill, a tier-2 job preempts, the rest wait with reasons",
        now=T0,
        snapshot=Snapshot(nodes=tuple(nodes), running=tuple(run)),
        pending=pending,
    )


def windows_and_limits() -> Scenario:
    nodes = tuple(
        node(f"b{i}", 8, topology=("spine0", f"leaf{i // 2}"), block=f"nvl{i // 4}")
        for i in range(8)
    )
    return Scenario(
        story="a weekly maintenance of two nodes, a daily VIP window, per-user caps "
        "and NVLink blocks",
        now=T0,
        snapshot=Snapshot(
            nodes=nodes,
            running=(running(50, whole("b0"), user="ann"),),
            reservations=(
                Reservation(
                    name="patch",
                    start=T0 - 7 * 86_400 + 1800,
                    duration_s=3600,
                    nodes=("b6", "b7"),
                    maintenance=True,
                    recurrence=Recurrence.WEEKLY,
                ),
                Reservation(
                    name="vip",
                    start=T0 + 600,
                    duration_s=7200,
                    gpus=16,
                    accounts=("vip",),
                    recurrence=Recurrence.DAILY,
                ),
            ),
            limits=Limits(user_default=Limit(max_jobs=3), users={"ann": Limit(max_gpus=16)}),
        ),
        pending=(
            gang(1, nodes=4, gpus_per_node=8, user="bob", time_limit_s=3600),
            gang(2, nodes=2, gpus_per_node=8, user="ann", time_limit_s=300),
            gang(3, nodes=2, gpus_per_node=8, account="vip", user="vic"),
            gang(4, gpus_per_node=1, user="ann"),
            gang(5, gpus_per_node=8, user="carl", time_limit_s=1200),
            gang(6, gpus_per_node=8, user="dora", time_limit_s=7200),
        ),
    )


def main() -> None:
    GOLDEN.mkdir(exist_ok=True)
    for name, make in {
        "busy_fat_tree": busy_fat_tree,
        "windows_and_limits": windows_and_limits,
    }.items():
        sc = make()
        plan = place(sc.snapshot, sc.pending, now=sc.now, config=sc.config)
        sc = msgspec.structs.replace(sc, want=plan)
        text = msgspec.json.format(msgspec.json.encode(sc), indent=1)
        (GOLDEN / f"{name}.json").write_bytes(text + b"\n")
        print(f"wrote {name}.json: {len(plan.starts)} starts, {len(plan.waits)} waits")


if __name__ == "__main__":
    main()
