"""Pure core: a job step's task layout and each task's environment (docs/steps.md).

`layout` decides which of the allocation's nodes a step (`srun`) uses and how many
tasks each runs, as Slurm does inside an allocation: one task per node on every node by
default; `-N` takes the first N nodes; `-n` spreads that many tasks in blocks (the first
nodes get one more when they do not divide evenly); `--ntasks-per-node` caps each node.
`-w` names the nodes (of the allocation) the step runs on, all of them.
`--gpus-per-task` binds each task its own GPUs of the node's share of the job;
`--gpus-per-node` (and `--gres=gpu:N`) gives each of the step's nodes N GPUs, seen by
every task there; `--gpus` is the step's total, split evenly over its nodes. Those
GPUs are the step's alone while it runs, as Slurm's steps are exclusive: steps
started side by side (`srun -n1 --gpus-per-task=1 ... &`, a sweep inside one
allocation) get different GPUs; a step on fewer nodes than the job has goes where its
GPUs are free; a step whose GPUs are all held by running steps is `Busy` (srun waits
and asks again). `--overlap`, and a step that asks for no GPUs (it
sees all of the node's share), hold none and share what they see. A request the
allocation cannot hold is refused with a message, never shrunk silently.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Collection, Mapping, Sequence
from enum import StrEnum

import msgspec

from services.launcher.env import compress_hostlist, tasks_per_node


class StepState(StrEnum):
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"  # the job ended (or its node went) under the step


class StepShape(msgspec.Struct, frozen=True, kw_only=True):
    """What srun asked for; 0 is "not given"."""

    nodes: int = 0
    ntasks: int = 0
    ntasks_per_node: int = 0
    gpus_per_task: int = 0
    gpus_per_node: int = 0  # --gpus-per-node, --gres=gpu:N: each node's, its tasks share them
    gpus: int = 0  # --gpus: the step's total, split evenly over its nodes
    overlap: bool = False  # srun --overlap: binds GPUs other steps hold, holds none
    nodelist: tuple[str, ...] = ()  # srun -w: exactly these nodes of the allocation


class Task(msgspec.Struct, frozen=True, kw_only=True):
    procid: int  # SLURM_PROCID: rank in the step
    localid: int  # SLURM_LOCALID: rank on its node
    nodeid: int  # SLURM_NODEID: the node's index in the step
    node: str
    gpus: tuple[int, ...]  # the GPUs it sees (CUDA_VISIBLE_DEVICES)


class Layout(msgspec.Struct, frozen=True, kw_only=True):
    nodes: tuple[str, ...]
    tasks: tuple[Task, ...]
    holds: bool = False  # the tasks' GPUs are the step's alone while it runs

    def held(self) -> dict[str, list[int]]:
        """The GPUs the step holds, by node (none when it does not hold its GPUs)."""
        out: dict[str, list[int]] = {}
        for t in self.tasks if self.holds else ():
            out.setdefault(t.node, []).extend(t.gpus)
        return {node: sorted(set(g)) for node, g in out.items()}  # shared by its tasks

    def on(self, node: str) -> tuple[Task, ...]:
        return tuple(t for t in self.tasks if t.node == node)

    def per_node(self) -> tuple[int, ...]:
        return tuple(len(self.on(n)) for n in self.nodes)


class Refusal(msgspec.Struct, frozen=True, kw_only=True):
    message: str


class Busy(msgspec.Struct, frozen=True, kw_only=True):
    """The GPUs the step needs are held by the job's running steps: ask again later."""

    message: str


def with_job_tasks(shape: StepShape, job_ntasks_per_node: int) -> StepShape:
    """srun given neither `-n` nor `--ntasks-per-node` runs the job's tasks per node
    (sbatch's `--ntasks-per-node`, or its `-n` split over the nodes), as Slurm's srun
    takes them from the batch script's SLURM_NTASKS_PER_NODE."""
    if shape.ntasks or shape.ntasks_per_node or job_ntasks_per_node <= 1:
        return shape
    return msgspec.structs.replace(shape, ntasks_per_node=job_ntasks_per_node)


def with_job_gpus(shape: StepShape, job_gpus_per_task: int | None) -> StepShape:
    """srun given no GPU option binds each task to the job's `--gpus-per-task` GPUs of its
    node, as Slurm's srun takes SLURM_GPUS_PER_TASK from the batch script's environment
    (without it, every task would see all its node's GPUs, and a script written for one
    GPU a task would run them all on device 0)."""
    if not job_gpus_per_task or shape.gpus_per_task or shape.gpus_per_node or shape.gpus:
        return shape
    return msgspec.structs.replace(shape, gpus_per_task=job_gpus_per_task)


def _counts(shape: StepShape, available: int) -> tuple[int, ...] | Refusal:
    """How many tasks each used node runs, in node order."""
    nodes, ntasks, per = shape.nodes, shape.ntasks, shape.ntasks_per_node
    if min(nodes, ntasks, per, shape.gpus_per_task, shape.gpus_per_node, shape.gpus) < 0:
        return Refusal(message="counts must be positive")
    if nodes > available:
        return Refusal(
            message=f"-N {nodes}: the allocation has {available} node{'s' * (available != 1)}"
        )
    if not nodes:
        if per and ntasks:
            nodes = min(available, -(-ntasks // per))
        elif ntasks:
            nodes = min(available, ntasks)
        else:
            nodes = available
    if not ntasks:
        ntasks = nodes * (per or 1)
    if ntasks < nodes:
        return Refusal(message=f"-n {ntasks} is fewer tasks than -N {nodes} nodes")
    if per and ntasks > nodes * per:
        return Refusal(
            message=f"-n {ntasks} does not fit {nodes} node(s) at --ntasks-per-node={per}"
        )
    base, extra = divmod(ntasks, nodes)
    return tuple(base + (1 if i < extra else 0) for i in range(nodes))


def layout(
    shape: StepShape,
    nodes: tuple[str, ...],
    gpus: dict[str, list[int]],
    busy: Mapping[str, Collection[int]] | None = None,
) -> Layout | Refusal | Busy:
    """The step's tasks over the allocation's `nodes` (rank order) holding `gpus`, of
    which the job's running steps hold `busy` (by node)."""
    if not nodes:
        return Refusal(message="the job holds no nodes")
    if shape.nodelist:
        named = _named(shape, nodes)
        if isinstance(named, Refusal):
            return named
        nodes = named
    counts = _counts(shape, len(nodes))
    if isinstance(counts, Refusal):
        return counts
    need = _gpu_need(shape, len(counts))
    if isinstance(need, Refusal):
        return need
    g = shape.gpus_per_task
    holds = need.asked and not shape.overlap
    placed = list(zip(nodes, counts, strict=False))  # the first nodes
    if holds and len(counts) < len(nodes):  # a step on some nodes: where its GPUs are free

        def free_there(node: str) -> int:
            taken = set((busy or {}).get(node, ()))
            return sum(1 for x in gpus.get(node, []) if x not in taken)

        placed = _where_free(counts, nodes, need.on, free_there) or placed
    used = tuple(node for node, _ in placed)
    tasks: list[Task] = []
    for nodeid, (node, count) in enumerate(placed):
        held = sorted(gpus.get(node, []))
        wanted = need.on(count)
        if wanted > len(held):
            return Refusal(
                message=f"{need.said(count)} needs {wanted} GPUs on {node}; "
                f"the job holds {len(held)} there"
            )
        taken = set((busy or {}).get(node, ())) if holds else set()
        free = [x for x in held if x not in taken]
        if wanted > len(free):
            return Busy(
                message=f"{need.said(count)} needs {wanted} GPUs on {node}; the job's "
                f"running steps hold {len(held) - len(free)} of its {len(held)} there"
            )
        for localid in range(count):
            if g:
                bound = tuple(free[localid * g : (localid + 1) * g])
            else:  # per node, shared by its tasks; or none asked: the node's whole share
                bound = tuple(free[:wanted]) if need.asked else tuple(held)
            tasks.append(
                Task(procid=len(tasks), localid=localid, nodeid=nodeid, node=node, gpus=bound)
            )
    return Layout(nodes=used, tasks=tuple(tasks), holds=holds)


class _Need(msgspec.Struct, frozen=True):
    """The GPUs a node of the step needs for its `count` tasks, and how srun said it."""

    per_task: int = 0
    per_node: int = 0
    option: str = ""  # as the message names it: "--gpus-per-node=2", "--gpus=4 over 2 nodes"

    @property
    def asked(self) -> bool:
        return bool(self.per_task or self.per_node)

    def on(self, count: int) -> int:
        return count * self.per_task if self.per_task else self.per_node

    def said(self, count: int) -> str:
        if self.per_task:
            return f"--gpus-per-task={self.per_task} x {count} task(s)"
        return self.option


def _gpu_need(shape: StepShape, nodes: int) -> _Need | Refusal:
    """One of --gpus-per-task, --gpus-per-node (--gres) and --gpus, as a node's need."""
    given = [shape.gpus_per_task, shape.gpus_per_node, shape.gpus]
    if sum(1 for n in given if n) > 1:
        return Refusal(
            message="give one of --gpus-per-task, --gpus-per-node (--gres=gpu:N) and --gpus"
        )
    if shape.gpus_per_task:
        return _Need(per_task=shape.gpus_per_task)
    if shape.gpus_per_node:
        return _Need(per_node=shape.gpus_per_node, option=f"--gpus-per-node={shape.gpus_per_node}")
    if shape.gpus:
        per, left = divmod(shape.gpus, nodes)
        if left or not per:
            return Refusal(
                message=f"--gpus={shape.gpus} does not split evenly over the step's {nodes} "
                f"node(s): give a multiple of {nodes}, -N to use fewer nodes, or --gpus-per-node"
            )
        return _Need(per_node=per, option=f"--gpus={shape.gpus} over {nodes} node(s)")
    return _Need()


def _named(shape: StepShape, nodes: tuple[str, ...]) -> tuple[str, ...] | Refusal:
    """`-w`: the allocation's nodes it names, in rank order, every one of them used."""
    wanted = set(shape.nodelist)
    unknown = [n for n in shape.nodelist if n not in nodes]
    if unknown:
        return Refusal(
            message=f"-w {','.join(unknown)}: not in the job's allocation "
            f"({compress_hostlist(nodes)})"
        )
    if shape.nodes and shape.nodes != len(wanted):
        return Refusal(
            message=f"-N {shape.nodes} with -w naming {len(wanted)} node(s): "
            "give one or the other, or as many nodes in -w as -N says"
        )
    return tuple(n for n in nodes if n in wanted)


def _where_free(
    counts: tuple[int, ...],
    nodes: tuple[str, ...],
    need: Callable[[int], int],
    free: Callable[[str], int],
) -> list[tuple[str, int]] | None:
    """Nodes for a step that uses fewer than the allocation has, as Slurm places such
    a step where its resources are free: each count (the larger first) on the first
    node in rank order with `need(count)` GPUs free; in rank order. None when they do
    not all fit now (the first nodes then say why: held, or more than the job has)."""
    left = list(nodes)
    chosen: list[tuple[str, int]] = []
    for count in counts:
        node = next((n for n in left if need(count) <= free(n)), None)
        if node is None:
            return None
        left.remove(node)
        chosen.append((node, count))
    return sorted(chosen, key=lambda pair: nodes.index(pair[0]))


def task_env(
    base: dict[str, str], lay: Layout, task: Task, *, job_id: int, step_id: int
) -> dict[str, str]:
    """One task's environment: the caller's (the job's), with the step's and the task's
    own variables over it, and the node's variables for the node it runs on."""
    per_node = tasks_per_node(lay.per_node())
    return base | {
        "SLURM_JOB_ID": str(job_id),
        "SLURM_JOBID": str(job_id),
        "MUSTER_JOB_ID": str(job_id),
        "SLURM_STEP_ID": str(step_id),
        "SLURM_STEPID": str(step_id),
        "MUSTER_STEP_ID": str(step_id),
        "SLURM_PROCID": str(task.procid),
        "SLURM_LOCALID": str(task.localid),
        "SLURM_NODEID": str(task.nodeid),
        "SLURM_NTASKS": str(len(lay.tasks)),
        "SLURM_NPROCS": str(len(lay.tasks)),
        "SLURM_STEP_NUM_TASKS": str(len(lay.tasks)),
        "SLURM_STEP_NUM_NODES": str(len(lay.nodes)),
        "SLURM_STEP_NODELIST": compress_hostlist(lay.nodes),
        "SLURM_STEP_TASKS_PER_NODE": per_node,
        "SLURM_TASKS_PER_NODE": per_node,
        "SLURMD_NODENAME": task.node,
        "MUSTER_NODE": task.node,
        "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in task.gpus),
        "GPU_DEVICE_ORDINAL": ",".join(str(g) for g in task.gpus),
        # the step's GPUs on this node, every task's there (Slurm's SLURM_STEP_GPUS)
        "SLURM_STEP_GPUS": ",".join(
            str(g) for g in sorted({g for t in lay.on(task.node) for g in t.gpus})
        ),
    }


# signals a task dies of by its own fault, not because someone ended it
CRASHES = frozenset(
    {
        signal.SIGSEGV,
        signal.SIGBUS,
        signal.SIGILL,
        signal.SIGFPE,
        signal.SIGABRT,
        signal.SIGSYS,
        signal.SIGTRAP,
    }
)


class StepEnd(msgspec.Struct, frozen=True, kw_only=True):
    state: StepState
    exit_code: int | None
    signal: int | None = None  # the one the row records: a failing task's first


def step_end(
    exit_codes: Sequence[int | None],
    signals: Sequence[int | None],
    stopped: Sequence[bool | None],
    lost: bool,
) -> StepEnd:
    """A step's end from its tasks'. A task that failed by itself, a non-zero exit or a
    crash (SIGSEGV, SIGABRT, ...: `CRASHES`), FAILS the step with the highest such
    status (128+N for signal N), whatever happened to the others: with srun -K they
    were stopped *for* it, so the cause is what srun and sacct report, not the stop's
    SIGTERM. Otherwise a task stopped (srun's Ctrl-C, scancel JOB.STEP, -K, the node
    fenced: `stopped`, whatever its status then), one killed from outside (SIGTERM,
    SIGKILL: its job ended, a kill), or a lost node CANCELS it, with the highest
    status; else it COMPLETED. `stopped[i]` None: an older agent did not say."""
    bad: list[tuple[int, int | None]] = []  # (status, signal) of the tasks that failed
    any_stopped = False
    for code, sig, stop in zip(exit_codes, signals, stopped, strict=True):
        if stop or (sig is not None and sig not in CRASHES):
            any_stopped = True
        elif sig is not None:
            bad.append((128 + sig, sig))
        elif code not in (0, None):
            bad.append((code, None))
    if bad:
        first = next((sig for _, sig in bad if sig is not None), None)
        return StepEnd(state=StepState.FAILED, exit_code=max(s for s, _ in bad), signal=first)
    state = StepState.CANCELLED if lost or any_stopped else StepState.COMPLETED
    sig = next((s for s in signals if s is not None), None)
    return StepEnd(state=state, exit_code=step_exit(exit_codes, signals), signal=sig)


def bad_end(exit_codes: Collection[int | None], signals: Collection[int | None]) -> bool:
    """srun -K's test: a task exited non-zero or by a signal."""
    return any(c not in (0, None) for c in exit_codes) or any(s is not None for s in signals)


def step_exit(exit_codes: Sequence[int | None], signals: Sequence[int | None]) -> int | None:
    """The step's exit code, srun's: the highest of its tasks' (128+N for a signal)."""
    codes = [c for c in exit_codes if c is not None] + [128 + s for s in signals if s is not None]
    return max(codes) if codes else None
