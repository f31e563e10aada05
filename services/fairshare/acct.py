"""Pure core: `muster acct` records (sacct-like) from the rows the shell reads.

One record per job (its latest state, first start, end, and every attempt's charge
summed) and, on request, one per attempt (`12.2` is attempt 2 of job 12 in `muster
acct`): an attempt that is not the job's current one ended REQUEUED; and one per srun
step (`sacct`'s `12.0`, `12.1`: docs/steps.md), its command's name, state, exit code,
times, nodes and the GPUs it held alone (charges are the job's, not the step's).
GPU-seconds are what fairshare charged, so they agree with `muster share`. Other users'
records and share rows are left out where the configuration makes usage private
(`visible_*`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import msgspec

from services.fairshare.render import AcctRow
from shared.identity import Directory
from shared.jobspec import JobSpec
from shared.node_size import per_node
from shared.privacy import PrivateData, may_see
from shared.states import JobState

Row = Mapping[str, Any]


def job_state(job: Row) -> str:
    if job.get("state"):
        return str(job["state"])
    return JobState.CANCELLED if job.get("cancelled") else JobState.PENDING


def _requested_gpus(spec: JobSpec) -> int:
    return spec.gpus_total if spec.gpus_total is not None else spec.gpus_requested


def acct_rows(
    jobs: Sequence[Row],
    attempts: Iterable[Row],
    charges: Iterable[Row],
    *,
    per_attempt: bool = False,
    states: Sequence[str] = (),
    steps: Iterable[Row] = (),
) -> list[AcctRow]:
    """Job records in the order given, each followed by its attempts if asked, then
    by its steps (`steps`, the rows read for it)."""
    steps_of: dict[int, list[Row]] = {}
    for s in sorted(steps, key=lambda s: (s["job_id"], s["step_id"])):
        steps_of.setdefault(s["job_id"], []).append(s)
    by_job: dict[int, list[Row]] = {}
    for a in sorted(attempts, key=lambda a: (a["job_id"], a["attempt"])):
        by_job.setdefault(a["job_id"], []).append(a)
    charged: dict[tuple[int, int], Row] = {(c["job_id"], c["attempt"]): c for c in charges}
    wanted = {s.upper() for s in states}
    out: list[AcctRow] = []
    for job in jobs:
        state = job_state(job)
        if wanted and state not in wanted:
            continue
        mine = by_job.get(job["job_id"], [])
        bills = [c for (j, _), c in charged.items() if j == job["job_id"]]
        model = next((c["gpu_model"] for c in bills if c["gpu_model"]), None)
        spec = msgspec.json.decode(job["spec"], type=JobSpec)
        cpus, mib = per_node(spec)
        nodes = tuple(job["run_nodes"] or ())
        base = AcctRow(
            job_id=job["job_id"],
            name=job["name"],
            user=job["user_name"],
            account=job["account"],
            partition=job["partition"],
            state=state,
            gpus=int(mine[-1]["gpus"]) if mine else _requested_gpus(spec),
            gpu_model=model,
            submit=job["submit"],
            start=job["run_start"],
            end=job["run_end"],
            gpu_seconds=sum(float(c["charged"]) for c in bills),
            billed=sum(float(c["billed"]) for c in bills),
            exit_code=job["exit_code"],
            nodes=nodes,
            mem_mib=mib,
            cpus=cpus * (len(nodes) or spec.nodes_min),
            max_rss_bytes=job.get("max_rss"),
            max_rss_node=job.get("max_rss_node") or "",
            cpu_usec=job.get("cpu_usec"),
        )
        out.append(base)
        if per_attempt:
            out.extend(_attempt_row(base, job, a, charged, cpus) for a in mine)
        out.extend(_step_row(base, s) for s in steps_of.get(job["job_id"], ()))
    return out


def _step_row(base: AcctRow, step: Row) -> AcctRow:
    held = msgspec.json.decode(step["gpus"] or "{}", type=dict[str, list[int]])
    argv = step["argv"] or ()
    return AcctRow(
        job_id=base.job_id,
        step=step["step_id"],
        name=argv[0].rsplit("/", 1)[-1] if argv else "",  # sacct: the command's name
        user=base.user,
        account=base.account,
        partition=base.partition,
        state=str(step["state"]),
        gpus=sum(len(g) for g in held.values()),
        gpu_model=base.gpu_model,
        start=step["started"],
        end=step["ended"],
        exit_code=step["exit_code"],
        nodes=tuple(step["nodes"] or ()),
    )


def _attempt_row(
    base: AcctRow, job: Row, a: Row, charged: Mapping[tuple[int, int], Row], cpus: int
) -> AcctRow:
    """Attempt `a` of the job; `cpus`: what it asks of each node."""
    current = a["attempt"] == job["current_attempt"]
    bill = charged.get((a["job_id"], a["attempt"]))
    return msgspec.structs.replace(
        base,
        attempt=a["attempt"],
        state=base.state if current else JobState.REQUEUED,
        gpus=int(a["gpus"]),
        gpu_model=(bill["gpu_model"] if bill else None) or base.gpu_model,
        start=a["started"] if a["started"] is not None else a["allocated"],
        end=a["ended"] if a["ended"] is not None else a["released"],
        gpu_seconds=float(bill["charged"]) if bill else 0.0,
        billed=float(bill["billed"]) if bill else 0.0,
        exit_code=base.exit_code if current else None,
        nodes=tuple(a["nodes"] or ()),
        cpus=cpus * len(a["nodes"] or ()),
        max_rss_bytes=a.get("max_rss"),
        max_rss_node=a.get("max_rss_node") or "",
        cpu_usec=a.get("cpu_usec"),
    )


def visible_acct_rows(rows: Iterable[AcctRow], actor: str, directory: Directory) -> list[AcctRow]:
    """Only the records `actor` may see when usage is private (shared.privacy)."""
    return [r for r in rows if may_see(actor, r.user, r.account, PrivateData.USAGE, directory)]


class UsageRow(Protocol):
    """A row of usage: an account's (`user` None) or a user's in it (share, report)."""

    @property
    def account(self) -> str: ...

    @property
    def user(self) -> str | None: ...


RowT = TypeVar("RowT", bound=UsageRow)


def visible_usage_rows(rows: Iterable[RowT], actor: str, directory: Directory) -> tuple[RowT, ...]:
    """Account rows (aggregates) for everyone; a user's row for whoever may see that
    user's usage (`share` and `report` alike)."""
    return tuple(
        r
        for r in rows
        if r.user is None or may_see(actor, r.user, r.account, PrivateData.USAGE, directory)
    )
