"""Pure: apply parsed sbatch options, in order, onto the fields of a `JobSpec`.

`Builder` collects the keyword arguments for `JobSpec` while options are applied (later
ones win, as in sbatch), remembers which fields the submitter set explicitly (so
admission knows which defaults to fill from the partition), and `finish` resolves the
options that only make sense together (`--gpus` with `--nodes`, `--mem-per-cpu`, ...).
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from dataclasses import dataclass, field

from shared.arrays import format_array, parse_array
from shared.constraint import CONTAINER, with_feature

from .errors import ErrorCode, SubmitError
from .hostlist import expand
from .timefmt import parse_begin
from .values import (
    count,
    dependencies,
    duration_or_error,
    export,
    gres_gpus,
    memory_mib,
    nice,
    node_range,
    signal_spec,
    switches,
    typed_gpus,
)

# `--time=UNLIMITED` (or 0) means "the partition's max_time"; admission replaces it.
UNLIMITED_TIME_S = 2**31 - 1


@dataclass
class Builder:
    fields: dict[str, object]
    now: float | None = None
    explicit: set[str] = field(default_factory=set)
    warnings: list[str] = field(default_factory=list)
    nodes_given: bool = False
    gpus_total: int | None = None
    gpus_per_task: int | None = None
    ntasks: int | None = None
    mem_per_cpu: int | None = None
    mem_per_gpu: int | None = None
    chdir: str | None = None
    wrap: str | None = None
    dry_run: bool = False

    def set(self, name: str, value: object) -> None:
        self.fields[name] = value
        self.explicit.add(name)

    def num(self, name: str) -> int:
        value = self.fields[name]
        assert isinstance(value, int), name  # every count field starts as an int
        return value


def _text(value: str | None, what: str) -> str:
    text = (value or "").strip()
    if not text:
        raise ValueError(f"{what} cannot be empty")
    return text


def _job_name(b: Builder, v: str | None) -> None:
    b.set("name", _text(v, "--job-name"))


def _nodes(b: Builder, v: str | None) -> None:
    low, high = node_range(v or "")
    b.set("nodes_min", low)
    b.set("nodes_max", high)
    b.nodes_given = True


def _set_gpus(b: Builder, model: str | None, n: int) -> None:
    b.set("gpus_per_node", n)
    if model:
        b.set("gpu_model", model)


def _gpus_per_node(b: Builder, v: str | None) -> None:
    _set_gpus(b, *typed_gpus(v or "", "--gpus-per-node"))


def _gres(b: Builder, v: str | None) -> None:
    gpus, others = gres_gpus(v or "")
    if gpus is not None:
        _set_gpus(b, *gpus)
    if others:
        b.warnings.append(
            f"--gres {', '.join(others)} ignored: Muster schedules GPUs only (gpu[:type]:N)"
        )


def _gpus(b: Builder, v: str | None) -> None:
    model, n = typed_gpus(v or "", "--gpus")
    b.gpus_total = n
    if model:
        b.set("gpu_model", model)


def _gpus_per_task(b: Builder, v: str | None) -> None:
    model, n = typed_gpus(v or "", "--gpus-per-task")
    b.gpus_per_task = n
    if model:
        b.set("gpu_model", model)


def _int_field(name: str, what: str, minimum: int = 1) -> Callable[[Builder, str | None], None]:
    def handler(b: Builder, v: str | None) -> None:
        b.set(name, count(v or "", what, minimum=minimum))

    return handler


def _ntasks(b: Builder, v: str | None) -> None:
    b.ntasks = count(v or "", "--ntasks")


def _mem(b: Builder, v: str | None) -> None:
    b.set("mem_mib", memory_mib(v or ""))


def _mem_per_cpu(b: Builder, v: str | None) -> None:
    b.mem_per_cpu = memory_mib(v or "")


def _mem_per_gpu(b: Builder, v: str | None) -> None:
    b.mem_per_gpu = memory_mib(v or "")


def _time(b: Builder, v: str | None) -> None:
    seconds = duration_or_error(v or "", "--time")
    b.set("time_limit_s", seconds if seconds else UNLIMITED_TIME_S)


def _partition(b: Builder, v: str | None) -> None:
    names = tuple(p.strip() for p in (v or "").split(","))
    if not all(names):
        raise ValueError(f"invalid --partition {v!r}: expected NAME or a comma list NAME,NAME")
    b.set("partition", names[0])
    b.set("partitions", names)


def _container_mounts(b: Builder, v: str | None) -> None:
    """`SRC:DST[:ro|rw],...` (pyxis's form; `SRC` alone mounts it at the same path)."""
    mounts = []
    for item in (m.strip() for m in (v or "").split(",")):
        if not item:
            continue
        parts = item.split(":")
        if (
            not parts[0].startswith("/")
            or len(parts) > 3
            or (len(parts) == 3 and parts[2] not in ("ro", "rw"))
        ):
            raise ValueError(
                f"--container-mounts={v}: each mount is /SRC[:/DST[:ro|rw]], comma-separated"
            )
        mounts.append(item)
    b.set("container_mounts", tuple(mounts))


def _str_field(name: str, what: str) -> Callable[[Builder, str | None], None]:
    def handler(b: Builder, v: str | None) -> None:
        b.set(name, _text(v, what))

    return handler


def _flag(name: str, value: object) -> Callable[[Builder, str | None], None]:
    def handler(b: Builder, v: str | None) -> None:
        b.set(name, value)

    return handler


def _signal(b: Builder, v: str | None) -> None:
    name, before, batch_only, reservation = signal_spec(v or "")
    b.set("signal", name)
    b.set("signal_before_s", before)
    b.set("signal_batch_only", batch_only)
    if reservation:
        b.warnings.append("--signal R: (reservation overlap) has no effect in Muster")


def _dependency(b: Builder, v: str | None) -> None:
    terms, any_of = dependencies(v or "")
    b.set("dependencies", terms)
    b.set("dependency_any", any_of)


def _array(b: Builder, v: str | None) -> None:
    spec = parse_array(v or "")
    b.set("array_spec", format_array(spec))
    b.set("array_max_running", spec.max_running)


def _exclusive(b: Builder, v: str | None) -> None:
    if v is not None and v not in ("user", "mcs", "topo"):
        raise ValueError(f"invalid --exclusive={v!r}: expected --exclusive, or =user, =mcs, =topo")
    if v is not None:
        b.warnings.append(f"--exclusive={v} is treated as --exclusive (whole nodes)")
    b.set("exclusive", True)


def _switches(b: Builder, v: str | None) -> None:
    limit, wait = switches(v or "")
    b.set("max_switches", limit)
    b.set("switches_wait_s", wait)


def _hosts(name: str, what: str) -> Callable[[Builder, str | None], None]:
    def handler(b: Builder, v: str | None) -> None:
        text = _text(v, what)
        if "/" in text:
            raise ValueError(
                f"{what} {text!r} looks like a file; Muster takes a hostlist such as gpu[01-04]"
            )
        b.set(name, expand(text))

    return handler


def _begin(b: Builder, v: str | None) -> None:
    if b.now is None:
        raise ValueError("--begin needs the submission time, which this caller did not pass")
    b.set("begin_at", parse_begin(v or "", now=b.now))


def _nice(b: Builder, v: str | None) -> None:
    b.set("nice", nice(v))


def _export(b: Builder, v: str | None) -> None:
    mode, env = export(v or "")
    b.set("export", mode)
    b.set("env", env)


def _chdir(b: Builder, v: str | None) -> None:
    b.chdir = _text(v, "--chdir")


def _wrap(b: Builder, v: str | None) -> None:
    b.wrap = _text(v, "--wrap")


def _batch_nodes(b: Builder, v: str | None) -> None:
    """`--batch-nodes=first|all`: where the batch script runs (docs/steps.md)."""
    where = (v or "").strip().lower()
    if where not in ("first", "all"):
        msg = f"--batch-nodes={v}: give first (Slurm's: the script on the first node only) or all"
        raise ValueError(msg)
    b.set("batch_first_node", where == "first")


def _dry_run(b: Builder, v: str | None) -> None:
    b.dry_run = True


HANDLERS: dict[str, Callable[[Builder, str | None], None]] = {
    "job-name": _job_name,
    "nodes": _nodes,
    "gpus-per-node": _gpus_per_node,
    "gres": _gres,
    "gpus": _gpus,
    "gpus-per-task": _gpus_per_task,
    "ntasks": _ntasks,
    "ntasks-per-node": _int_field("ntasks_per_node", "--ntasks-per-node"),
    "cpus-per-task": _int_field("cpus_per_task", "--cpus-per-task"),
    "mem": _mem,
    "mem-per-cpu": _mem_per_cpu,
    "mem-per-gpu": _mem_per_gpu,
    "time": _time,
    "partition": _partition,
    "account": _str_field("account", "--account"),
    "qos": _str_field("qos", "--qos"),
    "output": _str_field("output", "--output"),
    "error": _str_field("error", "--error"),
    "comment": _str_field("comment", "--comment"),
    "constraint": _str_field("constraint", "--constraint"),
    "requeue": _flag("requeue", True),
    "no-requeue": _flag("requeue", False),
    "hold": _flag("hold", True),
    "torchrun": _flag("torchrun", True),
    "ray": _flag("ray", True),
    "batch-nodes": _batch_nodes,
    "container-image": _str_field("container_image", "--container-image"),
    "container-mounts": _container_mounts,
    "container-workdir": _str_field("container_workdir", "--container-workdir"),
    "signal": _signal,
    "dependency": _dependency,
    "array": _array,
    "exclusive": _exclusive,
    "switches": _switches,
    "nodelist": _hosts("required_nodes", "--nodelist"),
    "exclude": _hosts("excluded_nodes", "--exclude"),
    "begin": _begin,
    "nice": _nice,
    "export": _export,
    "chdir": _chdir,
    "wrap": _wrap,
    "dry-run": _dry_run,
    "test-only": _dry_run,
}


def _conflict(message: str, name: str) -> SubmitError:
    return SubmitError(code=ErrorCode.CONFLICTING_OPTIONS, message=message, field=name)


def _finish_gpus(b: Builder) -> list[SubmitError]:
    total = b.gpus_total
    if total is None:
        return []
    b.set("gpus_total", total)
    low, high = b.num("nodes_min"), b.num("nodes_max")
    if "gpus_per_node" in b.explicit:
        per_node = b.num("gpus_per_node")
        if low != high or per_node * low != total:
            return [
                _conflict(
                    f"--gpus={total} (total) disagrees with --gpus-per-node={per_node} on "
                    f"{b.fields['nodes_max']} node(s); give only one of them",
                    "gpus",
                )
            ]
        return []
    if not b.nodes_given:
        return []  # admission picks the node count from the partition's node sizes
    if low != high:
        msg = f"--gpus={total} (total) cannot be split over a node range {low}-{high}; "
        return [_conflict(msg + "give --gpus-per-node instead", "gpus")]
    if total % low:
        msg = f"--gpus={total} does not divide evenly over {low} nodes; "
        return [_conflict(msg + "give --gpus-per-node instead", "gpus")]
    b.set("gpus_per_node", total // low)
    return []


def _finish_tasks(b: Builder) -> list[SubmitError]:
    if b.ntasks is None:
        return []
    if "ntasks_per_node" in b.explicit:
        b.warnings.append("--ntasks ignored: --ntasks-per-node is given and wins")
        return []
    nodes = b.num("nodes_min")
    if b.ntasks % nodes or nodes != b.num("nodes_max"):
        msg = f"--ntasks={b.ntasks} does not divide evenly over {nodes} node(s); "
        return [_conflict(msg + "give --ntasks-per-node instead", "ntasks")]
    b.set("ntasks_per_node", b.ntasks // nodes)
    return []


def _finish_gpus_per_task(b: Builder) -> list[SubmitError]:
    """`--gpus-per-task=N`: N GPUs for each task a node runs (after --ntasks is split)."""
    if b.gpus_per_task is None:
        return []
    if "gpus_per_node" in b.explicit or b.gpus_total is not None:
        msg = "--gpus-per-task and --gpus/--gpus-per-node/--gres both count GPUs; give one"
        return [_conflict(msg, "gpus-per-task")]
    b.set("gpus_per_node", b.gpus_per_task * b.num("ntasks_per_node"))
    if b.gpus_per_task:  # each task's own GPUs, for the job's steps (srun)
        b.set("gpus_per_task", b.gpus_per_task)
    return []


def _finish_memory(b: Builder) -> list[SubmitError]:
    given = [n for n, v in (("mem-per-cpu", b.mem_per_cpu), ("mem-per-gpu", b.mem_per_gpu)) if v]
    if "mem_mib" in b.explicit:
        given.insert(0, "mem")
    if len(given) > 1:
        names = ", ".join(f"--{n}" for n in given)
        return [_conflict(f"{names} are mutually exclusive; give one of them", given[1])]
    if b.mem_per_cpu:
        tasks = b.num("ntasks_per_node") * b.num("cpus_per_task")
        b.set("mem_mib", b.mem_per_cpu * tasks)
    if b.mem_per_gpu:
        gpus = b.num("gpus_per_node")
        if not gpus:
            msg = "--mem-per-gpu needs GPUs per node (--gpus-per-node or --gres=gpu:N)"
            return [_conflict(msg, "mem-per-gpu")]
        b.set("mem_mib", b.mem_per_gpu * gpus)
    return []


def finish(b: Builder) -> list[SubmitError]:
    """Resolve options that depend on each other; returns the conflicts found."""
    errors = _finish_gpus(b) + _finish_tasks(b) + _finish_gpus_per_task(b) + _finish_memory(b)
    if b.fields.get("ray") and b.fields.get("torchrun"):
        msg = "--ray and --torchrun are two launch modes; give one of them"
        errors.append(_conflict(msg, "ray"))
    if b.fields.get("ray") or b.fields.get("torchrun"):
        if b.fields.get("batch_first_node") and "batch_first_node" in b.explicit:
            msg = "--batch-nodes=first: --ray and --torchrun run on every node; drop one of them"
            errors.append(_conflict(msg, "batch-nodes"))
        b.fields["batch_first_node"] = False  # the sbatch shim's default is a plain script's
    if b.fields.get("container_image"):
        if b.fields.get("ray") or b.fields.get("torchrun"):
            msg = "--container-image runs the script once per node; not with --ray or --torchrun"
            errors.append(_conflict(msg, "container-image"))
        b.set("constraint", with_feature(str(b.fields.get("constraint") or ""), CONTAINER))
    if b.chdir is not None:
        b.set("workdir", posixpath.normpath(posixpath.join(str(b.fields["workdir"]), b.chdir)))
    b.fields["elastic"] = b.fields["nodes_min"] != b.fields["nodes_max"]
    return errors
