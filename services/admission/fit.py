"""Pure: does a job's shape fit a partition's nodes? Part of validation (validate.py).

Each refusal says what the partition does have: its node count, its largest node, its
GPU types or features, so the submitter knows what to ask for instead.
"""

from __future__ import annotations

from shared.gpu_types import gpu_matches, type_of
from shared.jobspec import JobSpec
from shared.node_size import big_enough, per_node

from .cluster_shape import NodeShape
from .config_model import Partition
from .constraint import feasible, node_fits, parse_constraint
from .errors import ErrorCode, SubmitError
from .hostlist import compress


def _err(code: ErrorCode, message: str, field: str) -> SubmitError:
    return SubmitError(code=code, message=message, field=field)


def check_size(
    spec: JobSpec, part: Partition, nodes: tuple[NodeShape, ...], all_nodes: tuple[str, ...]
) -> list[SubmitError]:
    errors = _check_named_nodes(spec, part, nodes, all_nodes)
    if part.max_nodes is not None and spec.nodes_max > part.max_nodes:
        msg = (
            f"{spec.nodes_max} nodes asked; partition {part.name!r} allows at most "
            f"{part.max_nodes} node(s) per job"
        )
        return [*errors, _err(ErrorCode.TOO_MANY_NODES, msg, "nodes")]
    total = spec.gpus_total if spec.gpus_total is not None else spec.gpus_requested
    if part.max_gpus_per_job is not None and total > part.max_gpus_per_job:
        msg = f"{total} GPUs asked; partition {part.name!r} allows at most "
        msg += f"{part.max_gpus_per_job} GPUs per job"
        return [*errors, _err(ErrorCode.TOO_MANY_GPUS, msg, "gpus")]
    eligible, why = _eligible(spec, part, nodes)
    if why is not None:
        return [*errors, why]
    errors += _check_gpus(spec, part, eligible)
    return errors


def _check_named_nodes(
    spec: JobSpec, part: Partition, nodes: tuple[NodeShape, ...], all_nodes: tuple[str, ...]
) -> list[SubmitError]:
    errors = []
    members = {n.name for n in nodes}
    unknown = [n for n in spec.required_nodes if n not in all_nodes]
    if unknown:
        msg = f"no node(s) {compress(unknown)}; the cluster has {compress(all_nodes) or 'none'}"
        errors.append(_err(ErrorCode.UNKNOWN_NODE, msg, "nodelist"))
    outside = [n for n in spec.required_nodes if n in all_nodes and n not in members]
    if outside:
        msg = (
            f"node(s) {compress(outside)} are not in partition {part.name!r}, "
            f"whose nodes are {compress(members) or 'none'}"
        )
        errors.append(_err(ErrorCode.UNKNOWN_NODE, msg, "nodelist"))
    both = set(spec.required_nodes) & set(spec.excluded_nodes)
    if both:
        msg = f"node(s) {compress(both)} are both required (--nodelist) and excluded (--exclude)"
        errors.append(_err(ErrorCode.CONFLICTING_OPTIONS, msg, "nodelist"))
    if len(spec.required_nodes) > spec.nodes_max:
        msg = (
            f"--nodelist names {len(spec.required_nodes)} nodes but the job asks for at most "
            f"{spec.nodes_max}; raise --nodes or name fewer nodes"
        )
        errors.append(_err(ErrorCode.CONFLICTING_OPTIONS, msg, "nodelist"))
    return errors


def _eligible(
    spec: JobSpec, part: Partition, nodes: tuple[NodeShape, ...]
) -> tuple[tuple[NodeShape, ...], SubmitError | None]:
    pool = tuple(n for n in nodes if n.name not in spec.excluded_nodes)
    where = f"partition {part.name!r}"
    if spec.gpu_model:
        types = sorted({_type_named(n) for n in pool if n.gpu_model or n.gpu_type})
        pool = tuple(n for n in pool if gpu_matches(spec.gpu_model, n.gpu_model, n.gpu_type))
        if not pool:
            msg = f"no node in {where} has GPU type {spec.gpu_model!r}; GPU types there: "
            return pool, _err(
                ErrorCode.NO_MATCHING_NODES, msg + (", ".join(types) or "none"), "gres"
            )
    if spec.constraint:
        try:
            parsed = parse_constraint(spec.constraint)
        except ValueError as err:
            return pool, _err(ErrorCode.BAD_VALUE, str(err), "constraint")
        features = sorted({f for n in pool for f in n.features})
        fitting = tuple(n for n in pool if node_fits(n.features, parsed))
        if not fitting:
            msg = f"no node in {where} matches --constraint {spec.constraint!r}; features: "
            return pool, _err(
                ErrorCode.NO_MATCHING_NODES, msg + (", ".join(features) or "none"), "constraint"
            )
        together = parsed.matching or any(t.count for alt in parsed.alternatives for t in alt)
        if together and not feasible(parsed, [n.features for n in fitting], spec.nodes_max):
            msg = (
                f"no {spec.nodes_max} node(s) in {where} satisfy --constraint "
                f"{spec.constraint!r} together (counts, or one [..] alternative for all); "
                "features: "
            )
            return pool, _err(
                ErrorCode.NO_MATCHING_NODES, msg + (", ".join(features) or "none"), "constraint"
            )
        pool = fitting
    pool, why = _big_enough(spec, pool, where)
    if why is not None:
        return pool, why
    if len(pool) < spec.nodes_max:
        filtered = " that match the request" if len(pool) < len(nodes) else ""
        asked = f"{spec.nodes_max} nodes asked"
        if spec.gpus_total and spec.gpus_per_node:
            asked = f"--gpus={spec.gpus_total} needs {spec.nodes_max} nodes"
        msg = f"{asked}; {where} has {len(pool)} node(s){filtered}"
        return pool, _err(ErrorCode.TOO_MANY_NODES, msg, "nodes")
    return pool, None


def _big_enough(
    spec: JobSpec, pool: tuple[NodeShape, ...], where: str
) -> tuple[tuple[NodeShape, ...], SubmitError | None]:
    """The nodes with the CPUs and memory the job asks of each (shared.node_size); a
    refusal naming the largest there when none has them."""
    cpus, mib = per_node(spec)
    fitting = tuple(n for n in pool if big_enough(n.cpus, n.memory_mib, cpus, mib))
    if fitting or not pool:
        return fitting, None
    if not any(big_enough(0, n.memory_mib, cpus, mib) for n in pool):
        most = max(n.memory_mib for n in pool)
        msg = (
            f"--mem of {mib} MiB per node: no node in {where} has that much memory; its"
            f" largest has {most} MiB"
        )
        return fitting, _err(ErrorCode.NO_MATCHING_NODES, msg, "mem")
    asked = f"{cpus} CPUs per node (--cpus-per-task x --ntasks-per-node)"
    if not any(big_enough(n.cpus, 0, cpus, mib) for n in pool):
        most = max(n.cpus for n in pool)
        msg = f"{asked}: no node in {where} has that many; its largest has {most}"
    else:
        msg = f"{asked} and {mib} MiB of --mem: no node in {where} has both"
    return fitting, _err(ErrorCode.NO_MATCHING_NODES, msg, "cpus-per-task")


def _type_named(n: NodeShape) -> str:
    """A GPU type as a refusal lists it: the short name, and the model it stands for."""
    kind = type_of(n.gpu_model, n.gpu_type)
    return f"{kind} ({n.gpu_model})" if n.gpu_model and n.gpu_model.lower() != kind else kind


def _check_gpus(spec: JobSpec, part: Partition, pool: tuple[NodeShape, ...]) -> list[SubmitError]:
    where = f"partition {part.name!r}"
    largest = max((n.gpus for n in pool), default=0)
    if spec.gpus_per_node > largest:
        msg = (
            f"{spec.gpus_per_node} GPUs per node asked; the largest node in {where} has "
            f"{largest} GPU(s)"
        )
        return [_err(ErrorCode.TOO_MANY_GPUS_PER_NODE, msg, "gpus-per-node")]
    big_enough = sum(1 for n in pool if n.gpus >= spec.gpus_per_node)
    if big_enough < spec.nodes_max:
        msg = (
            f"{spec.nodes_max} nodes with {spec.gpus_per_node} GPUs each asked; only "
            f"{big_enough} node(s) in {where} have that many"
        )
        return [_err(ErrorCode.TOO_MANY_NODES, msg, "nodes")]
    if spec.gpus_total and spec.gpus_per_node * spec.nodes_max < spec.gpus_total:
        msg = (
            f"--gpus={spec.gpus_total} cannot be split evenly over nodes of {where} "
            f"(largest has {largest} GPUs); give --nodes and --gpus-per-node"
        )
        return [_err(ErrorCode.TOO_MANY_GPUS, msg, "gpus")]
    return []


def unconfigured_fit(spec: JobSpec, nodes: tuple[NodeShape, ...]) -> str | None:
    """Without partitions configured, the job against the registered nodes alone: why
    it cannot fit, or None (also when no node has registered yet)."""
    if not nodes:
        return None
    largest = max(s.gpus for s in nodes)
    if spec.gpus_per_node > largest:
        return (
            f"{spec.gpus_per_node} GPUs per node requested, but the largest node has "
            f"{largest} GPUs; ask for --gpus-per-node={largest} or fewer and more nodes"
        )
    fitting = sum(1 for s in nodes if s.gpus >= spec.gpus_per_node)
    if spec.nodes_min > fitting:
        return (
            f"{spec.nodes_min} nodes requested, but only {fitting} nodes have "
            f"{spec.gpus_per_node} GPUs; ask for --nodes={fitting} or fewer"
        )
    _, small = _big_enough(spec, nodes, "the cluster")
    return None if small is None else small.message
