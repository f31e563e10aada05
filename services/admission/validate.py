"""Pure: check a parsed `JobSpec` against the cluster configuration and its nodes.

`admit` is what the admission service calls: it fills the defaults the submitter left
out (partition, account, QOS, time limit, node count for `--gpus`) from the
configuration, tries each partition named with `-p a,b` in order, and returns either an
accepted spec or every reason it was refused. `validate` is the check alone.
"""

from __future__ import annotations

import msgspec

from shared.arrays import parse_array
from shared.constraint import CONTAINER
from shared.jobspec import JobSpec

from .apply import UNLIMITED_TIME_S
from .cluster_shape import ClusterShape, NodeShape
from .config_io import job_io
from .config_model import ClusterConfig, Partition
from .errors import ErrorCode, SubmitError
from .fit import check_size
from .timefmt import format_duration


class SubmitCounts(msgspec.Struct, frozen=True, kw_only=True):
    """Unfinished (pending or running) jobs already in the queue under the job's QOS."""

    user_jobs: int = 0
    account_jobs: int = 0


NO_JOBS = SubmitCounts()


class Admission(msgspec.Struct, frozen=True, kw_only=True):
    spec: JobSpec | None
    errors: tuple[SubmitError, ...] = ()
    needs_approval: bool = False  # the partition holds jobs until an operator approves


def _err(code: ErrorCode, message: str, field: str) -> SubmitError:
    return SubmitError(code=code, message=message, field=field)


def apply_defaults(
    spec: JobSpec, explicit: frozenset[str], config: ClusterConfig, cluster: ClusterShape
) -> JobSpec:
    """Fill what the submitter left out from the configuration; never refuses."""
    changes: dict[str, object] = {}
    partition_name = spec.partition if "partition" in explicit else config.default_partition
    changes["partition"] = partition_name
    part = config.partitions.get(partition_name)
    user = config.users.get(spec.user)
    if "account" not in explicit and user is not None:
        changes["account"] = user.default_account
    if "qos" not in explicit:
        changes["qos"] = (part.default_qos if part else None) or config.default_qos
    if part is not None:
        if "time_limit_s" not in explicit:
            changes["time_limit_s"] = part.default_time_s
        elif spec.time_limit_s == UNLIMITED_TIME_S and part.max_time_s is not None:
            changes["time_limit_s"] = part.max_time_s
    if spec.gpus_total and not spec.gpus_per_node and "nodes_min" not in explicit:
        changes.update(_split_total_gpus(spec, cluster.in_partition(partition_name)))
    filled = msgspec.structs.replace(spec, **changes)
    if part is not None and "mem_mib" not in explicit:
        mib = default_memory(filled, part)
        if mib:
            filled = msgspec.structs.replace(filled, mem_mib=mib)
    return filled


def default_memory(spec: JobSpec, part: Partition) -> int:
    """The --mem per node a job that gave no memory option gets from its partition
    (`def_mem_per_gpu` times its GPUs per node, or `def_mem_per_cpu` times its CPUs per
    node); 0: none (a `--gpus=N` job whose GPUs per node are not settled yet, or no
    default)."""
    if part.def_mem_per_gpu_mib:
        return part.def_mem_per_gpu_mib * spec.gpus_per_node
    if part.def_mem_per_cpu_mib:
        return part.def_mem_per_cpu_mib * spec.cpus_per_task * spec.ntasks_per_node
    return 0


def _split_total_gpus(spec: JobSpec, nodes: tuple[NodeShape, ...]) -> dict[str, object]:
    """`--gpus=N` without `--nodes`: the fewest nodes that take an equal share each."""
    total = spec.gpus_total or 0
    largest = max((n.gpus for n in nodes), default=0)
    for count in range(1, total + 1):
        if total % count == 0 and total // count <= largest:
            return {"nodes_min": count, "nodes_max": count, "gpus_per_node": total // count}
    return {"gpus_per_node": total}  # no split fits: validate says why


def validate(
    spec: JobSpec,
    config: ClusterConfig,
    cluster: ClusterShape,
    counts: SubmitCounts = NO_JOBS,
) -> tuple[SubmitError, ...]:
    """Every reason this spec cannot be accepted as it stands; empty when it can."""
    part = config.partitions.get(spec.partition)
    if part is None:
        known = ", ".join(config.partitions)
        msg = f"no partition {spec.partition!r}; partitions: {known}"
        return (_err(ErrorCode.UNKNOWN_PARTITION, msg, "partition"),)
    errors = [*_check_qos(spec, config, part), *_check_account(spec, config, part)]
    errors += _check_time(spec, part)
    all_names = tuple(n.name for n in cluster.nodes)
    # Without a runtime anywhere, that is the reason (not the feature it implies).
    no_runtime = _check_container(spec, cluster.in_partition(part.name), part.name)
    sized = no_runtime or check_size(spec, part, cluster.in_partition(part.name), all_names)
    errors += sized or _check_kept(spec, config, cluster, part)
    errors += _check_array(spec, config)
    errors += _check_limits(spec, config, counts)
    if spec.nice < 0 and spec.user not in config.operators:
        msg = f"--nice={spec.nice}: only an operator may raise a job's priority; use 0 or more"
        errors.append(_err(ErrorCode.NOT_PERMITTED, msg, "nice"))
    return tuple(errors)


def _check_kept(
    spec: JobSpec, config: ClusterConfig, cluster: ClusterShape, part: Partition
) -> list[SubmitError]:
    """A job asking more GPUs than its partition's nodes leave once other partitions
    keep theirs (`reserved_gpus` of a partition whose nodes all lie in this one: the
    placer holds those GPUs for it alone, so the job could never start)."""
    mine = {n.name: n.gpus for n in cluster.in_partition(part.name)}
    kept = {
        other.name: other.reserved_gpus
        for other in config.partitions.values()
        if other.name != part.name
        and other.reserved_gpus
        and (theirs := {n.name for n in cluster.in_partition(other.name)})
        and theirs <= mine.keys()
    }
    total = spec.gpus_total if spec.gpus_total is not None else spec.gpus_requested
    usable = sum(mine.values()) - sum(kept.values())
    if not kept or total <= usable:
        return []
    keeping = ", ".join(f"{name} keeps {count}" for name, count in sorted(kept.items()))
    msg = (
        f"{total} GPUs asked; partition {part.name!r} has {sum(mine.values())}, of which"
        f" {keeping} for its own jobs (reserved_gpus): ask for at most {usable}"
    )
    return [_err(ErrorCode.TOO_MANY_GPUS, msg, "gpus")]


def _check_container(
    spec: JobSpec, nodes: tuple[NodeShape, ...], partition: str
) -> list[SubmitError]:
    """A `--container-image` job needs a node whose agent found a container runtime."""
    if not spec.container_image or any(CONTAINER in n.features for n in nodes):
        return []
    msg = (
        f"--container-image={spec.container_image}: no node of partition {partition!r} has a"
        f" container runtime (its agent gives it the feature {CONTAINER!r} where podman"
        " works); install podman on the nodes, or run the job without a container"
    )
    return [_err(ErrorCode.NO_MATCHING_NODES, msg, "container-image")]


def _check_qos(spec: JobSpec, config: ClusterConfig, part: Partition) -> list[SubmitError]:
    if spec.qos not in config.qos:
        msg = f"no QOS {spec.qos!r}; QOS defined: {', '.join(config.qos)}"
        return [_err(ErrorCode.UNKNOWN_QOS, msg, "qos")]
    if part.allowed_qos and spec.qos not in part.allowed_qos:
        msg = (
            f"partition {part.name!r} does not accept QOS {spec.qos!r}; "
            f"allowed: {', '.join(part.allowed_qos)}"
        )
        return [_err(ErrorCode.QOS_NOT_ALLOWED, msg, "qos")]
    return []


def _check_account(spec: JobSpec, config: ClusterConfig, part: Partition) -> list[SubmitError]:
    if not config.accounts:
        return []  # accounting is off
    user = config.users.get(spec.user)
    if user is None:
        msg = (
            f"user {spec.user!r} has no account on this cluster; ask an operator or an "
            "account coordinator to add you"
        )
        return [_err(ErrorCode.UNKNOWN_USER, msg, "account")]
    if spec.account not in config.accounts:
        msg = f"no account {spec.account!r}; your accounts: {', '.join(user.accounts)}"
        return [_err(ErrorCode.UNKNOWN_ACCOUNT, msg, "account")]
    if spec.account not in user.accounts:
        msg = (
            f"user {spec.user!r} is not in account {spec.account!r}; "
            f"your accounts: {', '.join(user.accounts)}"
        )
        return [_err(ErrorCode.USER_NOT_IN_ACCOUNT, msg, "account")]
    allowed = part.allowed_accounts
    if allowed and not set(config.ancestors(spec.account)) & set(allowed):
        msg = (
            f"account {spec.account!r} may not use partition {part.name!r}; "
            f"allowed accounts: {', '.join(allowed)}"
        )
        return [_err(ErrorCode.ACCOUNT_NOT_ALLOWED, msg, "account")]
    return []


def _check_time(spec: JobSpec, part: Partition) -> list[SubmitError]:
    limit = part.max_time_s
    if limit is None or spec.time_limit_s <= limit:
        return []
    asked = "UNLIMITED" if spec.time_limit_s == UNLIMITED_TIME_S else spec.time_limit_s
    msg = (
        f"time limit {format_duration(asked if isinstance(asked, int) else None)} is over "
        f"the maximum of partition {part.name!r}: {format_duration(limit)}; "
        f"ask for --time={format_duration(limit)} or less"
    )
    return [_err(ErrorCode.TIME_OVER_MAX, msg, "time")]


def _check_array(spec: JobSpec, config: ClusterConfig) -> list[SubmitError]:
    if spec.array_spec is None:
        return []
    try:
        parse_array(spec.array_spec, max_index=config.max_array_index)
    except ValueError as err:
        return [_err(ErrorCode.BAD_VALUE, str(err), "array")]
    return []


def _task_count(spec: JobSpec) -> int:
    """The jobs a spec adds to the queue: an array's tasks, but one for a task already
    split from its array (a queued task's placement changed in place)."""
    if spec.array_spec is None or spec.array_task_id is not None:
        return 1
    try:
        return len(parse_array(spec.array_spec, max_index=2**31).task_ids)
    except ValueError:
        return 1


def _check_limits(spec: JobSpec, config: ClusterConfig, counts: SubmitCounts) -> list[SubmitError]:
    qos = config.qos.get(spec.qos)
    if qos is None:
        return []
    adding = _task_count(spec)
    errors = []
    for who, have, limit in (
        (f"user {spec.user!r}", counts.user_jobs, qos.max_submitted_jobs_per_user),
        (f"account {spec.account!r}", counts.account_jobs, qos.max_submitted_jobs_per_account),
    ):
        if limit is not None and have + adding > limit:
            msg = (
                f"{who} already has {have} job(s) queued or running under QOS {qos.name!r}; "
                f"adding {adding} would pass its limit of {limit} submitted jobs. Wait for some "
                "to finish"
            )
            errors.append(_err(ErrorCode.SUBMIT_LIMIT, msg, "qos"))
    return errors


def admit(
    spec: JobSpec,
    explicit: frozenset[str],
    config: ClusterConfig,
    cluster: ClusterShape,
    counts: SubmitCounts = NO_JOBS,
) -> Admission:
    """Defaults, then validation, for each candidate partition in order; first fit wins.

    `spec` and `explicit` come from `parse_submission`. When every candidate refuses,
    the errors of each are returned (prefixed with the partition when there are several).
    """
    candidates = spec.partitions if "partitions" in explicit and spec.partitions else ()
    if not candidates:
        candidates = (spec.partition if "partition" in explicit else config.default_partition,)
    if len(candidates) > 1:
        bad = _check_partition_list(spec, explicit, config, cluster, candidates)
        if bad:
            return Admission(spec=None, errors=tuple(bad))
    refusals: list[SubmitError] = []
    for name in candidates:
        filled = apply_defaults(
            msgspec.structs.replace(spec, partition=name), explicit | {"partition"}, config, cluster
        )
        errors = validate(filled, config, cluster, counts)
        if not errors:
            part = config.partitions[name]
            io = job_io(config, filled.account, name)
            filled = msgspec.structs.replace(
                filled, io_weight=io.weight, io_read_bps=io.read_bps, io_write_bps=io.write_bps
            )
            return Admission(spec=filled, needs_approval=part.requires_approval)
        if len(candidates) == 1:
            refusals.extend(errors)
        else:
            refusals.extend(
                msgspec.structs.replace(e, message=f"partition {name!r}: {e.message}")
                for e in errors
            )
    return Admission(spec=None, errors=tuple(refusals))


def _check_partition_list(
    spec: JobSpec,
    explicit: frozenset[str],
    config: ClusterConfig,
    cluster: ClusterShape,
    names: tuple[str, ...],
) -> list[SubmitError]:
    """`-p a,b`: every name must be a partition the submitter may use, as Slurm refuses
    the whole list for one bad name; a typo must not pass because another name fits."""
    errors = []
    for name in names:
        part = config.partitions.get(name)
        if part is None:
            known = ", ".join(config.partitions)
            msg = f"partition list {','.join(names)!r}: no partition {name!r}; partitions: {known}"
            errors.append(_err(ErrorCode.UNKNOWN_PARTITION, msg, "partition"))
            continue
        filled = apply_defaults(
            msgspec.structs.replace(spec, partition=name), explicit | {"partition"}, config, cluster
        )
        for e in (*_check_account(filled, config, part), *_check_qos(filled, config, part)):
            if e.code in _NOT_USABLE:
                msg = f"partition list {','.join(names)!r}: {name!r} is not usable: {e.message}"
                errors.append(msgspec.structs.replace(e, message=msg))
    return errors


_NOT_USABLE = frozenset({ErrorCode.ACCOUNT_NOT_ALLOWED, ErrorCode.QOS_NOT_ALLOWED})
