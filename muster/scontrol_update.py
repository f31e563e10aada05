"""Pure core of the `scontrol update` shim (muster/shims.py): Slurm's words for a job's
change read into an `UpdateRequest` (services/admission/update.py says who may change
what).

    scontrol update JobId=123[,124] [TimeLimit=2:00:00] [Nice=10] [JobName=x] [Comment=y]
    scontrol update JobId=8 ArrayTaskThrottle=4
    scontrol update NodeName=node[01-02] State=DRAIN|RESUME [Reason="..."]

Keys in any case, as Slurm's; `Name=` is `JobName=`. A time limit is whole or, as
Slurm's, a change of each job's own (`TimeLimit=+30`, `TimeLimit=-1:00:00`). A pending
job's placement changes too (`KEYS`); the rest of what the placer plans a job by
(`PLANNED`: tasks, CPUs, memory, a GPU type...) is refused, saying to cancel and submit
again.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import msgspec

from services.admission import hostlist
from services.admission.values import limit_update, nice
from shared.api import UpdateRequest

KEYS = (
    "JobId=, TimeLimit=, Nice=, JobName=, Comment=, and for a pending job Partition=, QOS=,"
    " Account=, NumNodes=, Gres=gpu:N, ReqNodeList=, ExcNodeList=, Features=, StartTime="
    " and Dependency=; for an array ArrayTaskThrottle="
)
# What else the placer plans a job by: not changed in place (cancel and submit again).
PLANNED = frozenset(
    {
        "numtasks", "numcpus", "minnodes", "tres", "tresperjob", "tres_per_job",
        "reservation", "minmemorynode", "minmemorycpu",
        "contiguous", "shared", "oversubscribe", "licenses",
    }
)  # fmt: skip


# Slurm's keys of a pending job's placement that are one value each: the request's field.
RENAMED = {
    "partition": "partition", "qos": "qos", "account": "account", "reqnodelist": "nodelist",
    "nodelist": "nodelist", "excnodelist": "exclude", "features": "constraint",
    "starttime": "begin", "dependency": "dependency",
}  # fmt: skip


class UpdateError(ValueError):
    """A command line the shim cannot send; the message says what to write."""


def update_request(words: Sequence[str], user: str) -> UpdateRequest:
    """`JobId=... Key=Value ...` -> the request."""
    refs: list[str] = []
    limit: int | None = None
    limit_change: int | None = None
    niceness: int | None = None
    name: str | None = None
    comment: str | None = None
    placement: dict[str, str | int] = {}
    for word, key, k, value in _pairs(words, KEYS):
        if k in ("jobid", "job"):
            refs += [r for r in value.split(",") if r]
        elif k == "timelimit":
            limit, limit_change = _limit(value)
        elif k == "nice":
            try:
                niceness = nice(value)
            except ValueError as err:
                raise UpdateError(str(err).replace("--nice", "Nice=")) from err
        elif k in ("jobname", "name"):
            name = value
        elif k == "comment":
            comment = value
        elif k in RENAMED:
            placement[RENAMED[k]] = value
        elif k == "numnodes":
            placement["nodes"] = value
        elif k == "gres":
            placement["gpus_per_node"] = _gpus(value)
        elif k == "arraytaskthrottle":
            if not value.isdigit():
                raise UpdateError(f"{word}: a number of tasks, 0 for no limit")
            placement["array_throttle"] = int(value)
        elif k in PLANNED:
            raise UpdateError(
                f"{key}= is what the job is placed by and is not changed in place here:"
                " cancel the job and submit it again with the new value"
            )
        else:
            raise UpdateError(f"{word}: unknown to this shim; it changes {KEYS}")
    if not refs:
        raise UpdateError("say which job: JobId=123 (or JobId=123,124, 123_4)")
    return msgspec.convert(
        {
            "user": user, "job_refs": tuple(refs), "time_limit_s": limit,
            "time_limit_change_s": limit_change, "nice": niceness, "name": name,
            "comment": comment, **placement,
        },
        UpdateRequest,
    )  # fmt: skip


def _gpus(value: str) -> int:
    """`Gres=gpu:4` (per node) -> 4; a GPU type or another resource is not changed here."""
    parts = value.split(":")
    if parts[0] != "gpu" or len(parts) != 2 or not parts[1].isdigit():
        raise UpdateError(
            f"Gres={value}: this shim changes the GPUs per node alone, as Gres=gpu:N"
            " (a GPU type is not changed in place: cancel and submit again)"
        )
    return int(parts[1])


def _limit(value: str) -> tuple[int | None, int | None]:
    try:
        return limit_update(value, "TimeLimit=")
    except ValueError as err:
        raise UpdateError(str(err)) from err


# `scontrol update NodeName=... State=...`: Slurm's operator words for a drain, read as
# `muster drain` / `muster resume` of each node the hostlist names.
NODE_KEYS = "NodeName=, State= (DRAIN, RESUME, UNDRAIN) and Reason="
NODE_STATES = {"drain": "drain", "resume": "resume", "undrain": "resume"}


class NodeUpdate(msgspec.Struct, frozen=True, kw_only=True):
    """What `scontrol update NodeName=...` asks: one verb for each node."""

    verb: str  # drain | resume (the API's verbs)
    nodes: tuple[str, ...]
    reason: str


def is_node_update(words: Sequence[str]) -> bool:
    """Whether `scontrol update WORDS` is about nodes (Slurm's first key says which)."""
    return bool(words) and words[0].partition("=")[0].lower() in ("nodename", "node")


def node_update(words: Sequence[str]) -> NodeUpdate:
    """`NodeName=node[01-02] State=DRAIN Reason="bad riser"` -> the request. A drain says
    why, as Slurm asks; a resume needs no reason. DOWN is refused: it would kill the
    node's jobs at once, which this shim leaves to `scancel`."""
    names: tuple[str, ...] = ()
    state = reason = ""
    for word, _, k, value in _pairs(words, NODE_KEYS):
        if k in ("nodename", "node"):
            try:
                names = hostlist.expand(value)
            except ValueError as err:
                raise UpdateError(f"NodeName={value}: {err}") from err
        elif k == "state":
            state = value.lower()
        elif k == "reason":
            reason = value
        else:
            raise UpdateError(f"{word}: unknown to this shim; for a node it changes {NODE_KEYS}")
    if not names:
        raise UpdateError("say which node: NodeName=node01 (or node[01-04])")
    verb = NODE_STATES.get(state)
    if state == "down":
        raise UpdateError(
            "State=DOWN is not taken by hand here: State=DRAIN lets the node's jobs end"
            " and takes no new ones (scancel its jobs to free it at once)"
        )
    if verb is None:
        raise UpdateError(f"State={state.upper() or '(none)'}: give State=DRAIN or State=RESUME")
    if verb == "drain" and not reason.strip():
        raise UpdateError('a drain says why: add Reason="..." (e.g. Reason="bad riser")')
    return NodeUpdate(verb=verb, nodes=names, reason=reason.strip() or "resumed by scontrol")


def _pairs(words: Sequence[str], keys: str) -> Iterator[tuple[str, str, str, str]]:
    """Each `Key=Value` word as (word, key, key in lower case, value); a word without
    `=` is refused, naming the `keys` this command takes."""
    for word in words:
        key, eq, value = word.partition("=")
        if not eq:
            raise UpdateError(f"{word}: write Key=Value ({keys})")
        yield word, key, key.lower(), value
