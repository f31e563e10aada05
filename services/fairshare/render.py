"""Pure core: text tables for `muster share` (like sshare) and `muster acct` (like sacct).

Formatting only: rows in, one string out (no trailing newline). `--json` output is the
rows themselves encoded with msgspec, so the Struct field names are the contract.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime

import msgspec

from services.fairshare.core import ShareRow

SHARE_COLUMNS = (
    "Account",
    "User",
    "RawShares",
    "NormShares",
    "RawUsage",
    "NormUsage",
    "EffectvUsage",
    "FairShare",
    "LevelFS",
)

ACCT_COLUMNS = (
    "JobID",
    "Attempt",
    "JobName",
    "User",
    "Account",
    "Partition",
    "State",
    "GPUs",
    "Submit",
    "Start",
    "End",
    "Elapsed",
    "GPUSeconds",
    "Billed",
    "ExitCode",
    "NodeList",
)


class AcctRow(msgspec.Struct, frozen=True, kw_only=True):
    """One job, attempt or step as `muster acct` shows it; times are epoch seconds."""

    job_id: int
    attempt: int | None = None
    step: int | None = None  # an srun step of the job (JOB.STEP), not the job's record
    name: str = ""
    user: str
    account: str
    partition: str = ""
    state: str
    gpus: int = 0
    gpu_model: str | None = None
    submit: float | None = None
    start: float | None = None
    end: float | None = None
    gpu_seconds: float = 0.0  # raw GPU-seconds charged (before billing weights)
    billed: float = 0.0
    exit_code: int | None = None
    reason: str | None = None
    nodes: tuple[str, ...] = ()
    mem_mib: int = 0  # the --mem asked of each node (sacct's ReqMem); 0: none asked
    cpus: int = 0  # the CPUs asked, all nodes together (AllocCPUS, NCPUS, ReqCPUS)
    max_rss_bytes: int | None = None  # the highest memory peak of one node (MaxRSS)
    max_rss_node: str = ""  # and that node (MaxRSSNode); None above: not counted
    cpu_usec: int | None = None  # the CPU time its processes used, every node (TotalCPU)


def fmt_float(value: float | None, digits: int = 6) -> str:
    if value is None:
        return ""
    if math.isinf(value):
        return "inf"
    return f"{value:.{digits}f}"


def fmt_time(epoch: float | None) -> str:
    if epoch is None:
        return "Unknown"
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")


def fmt_elapsed(seconds: float | None) -> str:
    """sacct's [D-]HH:MM:SS."""
    if seconds is None:
        return ""
    s = max(0, int(seconds))
    days, rest = divmod(s, 86400)
    hh, rest = divmod(rest, 3600)
    mm, ss = divmod(rest, 60)
    clock = f"{hh:02d}:{mm:02d}:{ss:02d}"
    return f"{days}-{clock}" if days else clock


def table(header: Sequence[str], body: Sequence[Sequence[str]], left: int = 2) -> str:
    """Columns padded to their widest cell; the first `left` columns left-aligned."""
    widths = [max([len(h), *(len(r[i]) for r in body)]) for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.ljust(w) if i < left else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return " ".join(parts).rstrip()

    rule = " ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *(line(r) for r in body)])


def render_share_table(rows: Sequence[ShareRow]) -> str:
    """sshare -l: account names indented one space per level below root."""
    body = [
        [
            " " * max(r.depth - 1, 0) + r.account,
            r.user or "",
            str(r.raw_shares) if r.depth else "",
            fmt_float(r.norm_shares),
            f"{r.raw_usage:.0f}",
            fmt_float(r.norm_usage),
            fmt_float(r.effective_usage),
            fmt_float(r.fairshare),
            fmt_float(r.level_fs),
        ]
        for r in rows
    ]
    return table(SHARE_COLUMNS, body)


def render_acct(rows: Sequence[AcctRow]) -> str:
    """sacct-like: one line per job, attempt or step. A step is `12.3` (step 3 of job
    12), as sacct and srun name it; an attempt is its job's id with its number in
    `Attempt` (`12.1` would read as a step)."""
    body = []
    for r in rows:
        elapsed = None
        if r.start is not None:
            elapsed = (r.end if r.end is not None else r.start) - r.start
        gpus = f"{r.gpus}" + (f"({r.gpu_model})" if r.gpu_model else "")
        body.append(
            [
                str(r.job_id) if r.step is None else f"{r.job_id}.{r.step}",
                "" if r.attempt is None else str(r.attempt),
                r.name,
                r.user,
                r.account,
                r.partition,
                r.state,
                gpus,
                fmt_time(r.submit),
                fmt_time(r.start),
                fmt_time(r.end),
                fmt_elapsed(elapsed),
                f"{r.gpu_seconds:.0f}",
                f"{r.billed:.0f}",
                "" if r.exit_code is None else str(r.exit_code),
                ",".join(r.nodes),
            ]
        )
    return table(ACCT_COLUMNS, body, left=7)
