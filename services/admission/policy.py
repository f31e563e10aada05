"""Pure: what admission stamps on an accepted job besides its spec, and the small
grammars of the job commands.

- `job_policy`: the partition's tier and preemption settings and the QOS's minimum
  runtime, stored with the job so the placer needs no copy of the configuration.
- `parse_job_ref`: `123`, `123_4`, `123_[1-3,7]` as scancel, scontrol and squeue take them.
- `dependency_text`: a spec's dependencies written back the way they were given.
"""

from __future__ import annotations

import re

import msgspec

from shared.arrays import parse_array
from shared.jobspec import JobSpec

from .config_model import ClusterConfig, PreemptMode


class JobPolicy(msgspec.Struct, frozen=True, kw_only=True):
    tier: int = 0
    preemptible: bool = True
    can_preempt: bool = False
    grace_s: int = 0
    min_runtime_s: int = 0
    needs_approval: bool = False


NO_POLICY = JobPolicy()


def job_policy(spec: JobSpec, config: ClusterConfig | None) -> JobPolicy:
    """The policy the job's partition and QOS give it; defaults without a config."""
    if config is None:
        return NO_POLICY
    part = config.partitions.get(spec.partition)
    qos = config.qos.get(spec.qos)
    if part is None:
        return NO_POLICY
    return JobPolicy(
        tier=part.priority_tier,
        preemptible=part.preempt_mode is not PreemptMode.OFF,
        can_preempt=bool(part.can_preempt or part.can_preempt_tiers or (qos and qos.preempt)),
        grace_s=part.grace_time_s,
        min_runtime_s=qos.min_runtime_s if qos else 0,
        needs_approval=part.requires_approval,
    )


class JobRef(msgspec.Struct, frozen=True, kw_only=True):
    """`job_id` alone: that job, or every task of the array it heads; with `tasks`: those
    tasks of array `job_id`."""

    job_id: int
    tasks: tuple[int, ...] | None = None


_REF = re.compile(r"(\d{1,18})(?:_(\d{1,9}|\[[0-9,\-:]+\]))?")


def parse_job_ref(text: str, *, max_index: int = 1_000_000) -> JobRef:
    """Raises ValueError with a message that shows the accepted forms."""
    m = _REF.fullmatch(text.strip())
    if not m:
        raise ValueError(
            f"{text!r} is not a job id; use 123, 123_4 (array task) or 123_[1-3,7] (tasks)"
        )
    job_id = int(m.group(1))
    task = m.group(2)
    if task is None:
        return JobRef(job_id=job_id)
    if task.startswith("["):
        try:
            ids = parse_array(task[1:-1], max_index=max_index).task_ids
        except ValueError as err:
            raise ValueError(f"{text!r}: {err}") from err
        return JobRef(job_id=job_id, tasks=ids)
    return JobRef(job_id=job_id, tasks=(int(task),))


def dependency_text(spec: JobSpec) -> str:
    terms = []
    for dep in spec.dependencies:
        if dep.kind == "singleton":
            terms.append("singleton")
            continue
        delay = f"+{dep.delay_s // 60}" if dep.delay_s else ""
        terms.append(dep.kind + "".join(f":{j}{delay}" for j in dep.job_ids))
    return ("?" if spec.dependency_any else ",").join(terms)
