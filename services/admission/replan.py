"""Pure: a pending job's placement fields changed in place.

`muster update -p/-q/-A/-N/--gpus-per-node/-w/-x/-C/--begin/-d` and scontrol's
`Partition=`, `QOS=`, `Account=`, `NumNodes=`, `Gres=gpu:N`, `ReqNodeList=`,
`ExcNodeList=`, `Features=`, `StartTime=` and `Dependency=` change what the placer plans
a job by (the last two: when it may start).
The job keeps its id and its place in the queue (its submit time); its spec with the
new fields is checked as a submission is (`validate`: the partition exists and the
account and QOS may use it, the owner is in the account, the limit fits its maximum,
the nodes and GPUs exist there, the nodes it requires are in the partition and not
excluded; the jobs a dependency names exist; a move into a QOS or an account counts
against the QOS's submit limits), and its policy columns and I/O settings are those of
its new partition, QOS and account.

Only a pending job changes so (`update.py` skips a started one: its nodes are placed).
The race with a placer that planned the job by the old fields is settled by the rows
(migration 0031): admission counts the change in `jobs.spec_version`, and the placer
withdraws a start whose job's count moved.
"""

from __future__ import annotations

import msgspec

from shared.jobspec import JobSpec

from .cluster_shape import ClusterShape
from .config_io import job_io
from .config_model import ClusterConfig
from .fit import unconfigured_fit
from .hostlist import expand
from .validate import NO_JOBS, SubmitCounts, validate
from .values import dependencies


class PlacementChange(msgspec.Struct, frozen=True, kw_only=True):
    """The placement fields to change; None: leave as it is."""

    partition: str | None = None
    qos: str | None = None
    nodes: tuple[int, int] | None = None  # (min, max)
    gpus_per_node: int | None = None
    exclude: str | None = None  # a hostlist; "" clears it
    constraint: str | None = None  # "" clears it
    begin_at: float | None = None  # epoch seconds (`StartTime=now` for none)
    dependency: str | None = None  # as --dependency takes it; "" clears it
    nodelist: str | None = None  # a hostlist of nodes the job must run on; "" clears it
    account: str | None = None  # one of its owner's accounts

    def fields(self) -> dict[str, object]:
        return {k: v for k, v in msgspec.structs.asdict(self).items() if v is not None}


def replanned(
    spec: JobSpec,
    change: PlacementChange,
    config: ClusterConfig | None,
    cluster: ClusterShape,
    counts: SubmitCounts = NO_JOBS,
) -> JobSpec | tuple[str, ...]:
    """The job's spec with `change`, or why it cannot be (each reason says what to
    change). `spec` carries the request's other changes already (its limit, name...).
    `counts`: the owner's and the account's other unfinished jobs under the QOS the job
    moves to, for its submit limits (none when its QOS and account stay: counted there).
    Without partitions configured (`config` None), as a submission there: its nodes
    and GPUs against the registered nodes alone, and no partition or QOS to move to."""
    if config is None and (change.partition is not None or change.qos is not None):
        return (
            "this cluster configures no partitions or QOS to move a job to: change its"
            " nodes, GPUs, excluded nodes or features, or cancel it and submit again",
        )
    if change.account is not None and (config is None or not config.accounts):
        return ("this cluster keeps no accounts to move a job to (accounting is off)",)
    if change.gpus_per_node is not None and change.gpus_per_node < 0:
        return (f"--gpus-per-node={change.gpus_per_node}: a node's GPU count is 0 or more",)
    if change.gpus_per_node is not None and (spec.gpus_per_task or spec.gpus_total):
        asked = "--gpus-per-task" if spec.gpus_per_task else "--gpus (a total)"
        return (
            f"its GPUs were asked as {asked}; a GPU count per node would contradict it:"
            " cancel the job and submit it again",
        )
    fields: dict[str, object] = {}
    if change.partition is not None:
        fields |= {"partition": change.partition, "partitions": ()}
    if change.qos is not None:
        fields["qos"] = change.qos
    if change.nodes is not None:
        low, high = change.nodes
        fields |= {"nodes_min": low, "nodes_max": high, "elastic": low < high}
    if change.gpus_per_node is not None:
        fields["gpus_per_node"] = change.gpus_per_node
    for key, hosts, option in (
        ("excluded_nodes", change.exclude, "--exclude"),
        ("required_nodes", change.nodelist, "--nodelist"),
    ):
        if hosts is not None:
            try:
                fields[key] = expand(hosts) if hosts else ()
            except ValueError as err:
                return (f"{option}: {err}",)
    if change.account is not None:
        fields["account"] = change.account
    if change.constraint is not None:
        fields["constraint"] = change.constraint or None
    if change.begin_at is not None:
        fields["begin_at"] = change.begin_at
    if change.dependency is not None:
        try:
            terms, any_of = dependencies(change.dependency) if change.dependency else ((), False)
        except ValueError as err:
            return (str(err),)
        fields |= {"dependencies": terms, "dependency_any": any_of}
    new = msgspec.structs.replace(spec, **fields)
    if config is None:
        why = unconfigured_fit(new, cluster.nodes)
        return new if why is None else (why,)
    errors = validate(new, config, cluster, counts)
    if errors:
        return tuple(e.message for e in errors)
    io = job_io(config, new.account, new.partition)
    return msgspec.structs.replace(
        new, io_weight=io.weight, io_read_bps=io.read_bps, io_write_bps=io.write_bps
    )
