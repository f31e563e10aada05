"""Shell: the job commands (cancel, signal, hold, release, approve, requeue) and the reads
(queue, show). Each command is one transaction: select and lock the jobs, `decide`
(pure, actions.py), write and queue the events it owes (outbox)."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import msgspec

from shared.api import (
    AttemptView,
    JobSelector,
    JobView,
    Ok,
    QueueReply,
    QueueRequest,
    ShowJobReply,
    ShowJobRequest,
    UpdateRequest,
)
from shared.db import Conn, outbox_add
from shared.events import JobCancelRequested, JobLimitChanged, JobRequeueRequested, JobSubmitted
from shared.identity import Directory
from shared.jobspec import JobSpec
from shared.logs import kv
from shared.privacy import PrivateData, may_see, redact_spec
from shared.runtime import ServiceContext
from shared.settings import Settings
from shared.signal_scope import signal_name
from shared.states import ACTIVE, TERMINAL, JobState

from . import repo
from .actions import Decision, Target, Verb, decide, in_array
from .cluster_shape import NodeShape, shape
from .config_model import ClusterConfig
from .errors_api import Refused
from .policy import dependency_text, job_policy, parse_job_ref
from .purge import missing_dependencies, missing_job
from .replan import PlacementChange, replanned
from .timefmt import parse_begin
from .update import STARTED_STATES, JobChange, UpdateDecision, UpdateTarget, decide_update
from .validate import NO_JOBS, SubmitCounts
from .values import node_range
from .views import DEPENDENCY_WAITS, job_state, job_view, step_view, why_pending

log = logging.getLogger(__name__)


class JobCommands:
    def __init__(
        self,
        ctx: ServiceContext[Settings],
        config: Callable[[], ClusterConfig],
        directory: Callable[[], Directory],
        *,
        kept_s: float | None = None,
        shapes: Callable[[], Awaitable[list[NodeShape]]] | None = None,
    ) -> None:
        self.ctx = ctx
        self.config = config
        self.directory = directory
        self.shapes = shapes  # the registered nodes, to check a job's new placement on
        self.kept_s = kept_s  # how long a finished job is kept before its purge (None: ever)

    # --- selection ---------------------------------------------------------------------

    def _where(self, sel: JobSelector) -> repo.Where:
        where = _by_refs(sel.job_ids, sel.job_refs)
        if sel.name is not None:
            where.add(f"j.name = {where.arg(sel.name)}")
        if sel.owner is not None:
            where.add(f"j.user_name = {where.arg(sel.owner)}")
        if sel.mine:
            where.add(f"j.user_name = {where.arg(sel.user)}")
        if sel.partition is not None:
            where.add(f"j.partition = {where.arg(sel.partition)}")
        if not where.parts:
            raise Refused("say which jobs: give job ids, --name or --user", "invalid")
        if not (
            sel.job_ids or sel.job_refs
        ):  # a name or user alone means their live jobs, as scancel -n/-u
            where.add("j.cancel_requested_at IS NULL")
            where.add(
                "NOT EXISTS (SELECT 1 FROM job_runs t WHERE t.job_id = j.job_id"
                f" AND t.state = ANY({where.arg(TERMINAL)}::text[]))"
            )
        return where

    async def _targets(self, conn: Conn, sel: JobSelector) -> tuple[list[Target], dict[int, Any]]:
        rows = await repo.select_rows(conn, self._where(sel), lock=True)
        targets, by_id = [], {}
        states = {s.upper() for s in sel.states}
        refs = _refs(sel.job_ids, sel.job_refs)
        for row in rows:
            state, _ = job_state(row)
            if states and state not in states:
                continue
            by_id[row["job_id"]] = row
            targets.append(
                Target(
                    job_id=row["job_id"],
                    owner=row["user_name"],
                    account=row["account"],
                    state=state,
                    held=row["held"],
                    held_by_operator=row["held_by_operator"],
                    needs_approval=row["needs_approval"],
                    approved=row["approved"],
                    in_array=in_array(
                        refs, row["job_id"], row["array_job_id"], row["array_task_id"]
                    ),
                )
            )
        return targets, by_id

    async def _decided(
        self, conn: Conn, verb: Verb, sel: JobSelector
    ) -> tuple[Decision, dict[int, Any]]:
        targets, rows = await self._targets(conn, sel)
        decision = decide(verb, sel.user, targets, self.config())
        if decision.refusal is not None:
            details = decision.skipped or (decision.refusal,)
            raise Refused(decision.refusal, decision.code, details)
        return decision, rows

    # --- commands ----------------------------------------------------------------------

    async def cancel(self, sel: JobSelector) -> Ok:
        if sel.signal:
            return await self.signal(sel)
        reason = sel.reason or f"cancelled by {sel.user}"
        if sel.exit_code is not None and not 0 <= sel.exit_code <= 255:
            msg = f"exit_code {sel.exit_code}: a release's status is 0 to 255, as a process's"
            raise Refused(msg, "invalid")
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            decision, _ = await self._decided(conn, Verb.CANCEL, sel)
            for job_id in decision.act_on:
                await repo.request_cancel(conn, job_id, reason)
            await outbox_add(
                conn,
                *(
                    JobCancelRequested(
                        job_id=j, by=sel.user, reason=reason, exit_code=sel.exit_code
                    )
                    for j in decision.act_on
                ),
            )
        self.ctx.relay.kick()
        log.info("cancel", extra=kv(by=sel.user, jobs=len(decision.act_on)))
        return _ok(f"cancel requested for {len(decision.act_on)} job(s)", decision)

    async def signal(self, sel: JobSelector) -> Ok:
        """`scancel -s SIG`: the running jobs signalled (an sbatch job's steps, or its
        script with `-b`: `sel.signal_scope`), nothing cancelled. The job's coordinator
        sends it (`job.cancel_requested` with a signal): an agent takes a stop only
        signed by the launcher, so admission asking one itself was refused, and the
        signal never came (it said it was sent)."""
        try:
            name = signal_name(sel.signal or "")
        except ValueError as err:
            raise Refused(str(err), "invalid") from err
        reason = f"{name} from {sel.user}"
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            decision, _ = await self._decided(conn, Verb.SIGNAL, sel)
            await outbox_add(
                conn,
                *(
                    JobCancelRequested(
                        job_id=j,
                        by=sel.user,
                        reason=reason,
                        signal=name,
                        signal_scope=sel.signal_scope,
                    )
                    for j in decision.act_on
                ),
            )
        self.ctx.relay.kick()
        log.info("signal", extra=kv(by=sel.user, jobs=len(decision.act_on), signal=name))
        return _ok(f"sent {name} to {len(decision.act_on)} job(s)", decision)

    async def hold(self, sel: JobSelector) -> Ok:
        reason = sel.reason or f"held by {sel.user}"
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            decision, _ = await self._decided(conn, Verb.HOLD, sel)
            await self._hold_all(conn, decision, reason)
        return _ok(f"held {len(decision.act_on)} job(s)", decision)

    async def _hold_all(self, conn: Conn, decision: Decision, reason: str) -> None:
        """Hold the decided jobs: an operator's hold of another's job as an operator's."""
        ops = set(decision.operator_hold)
        mine = [j for j in decision.act_on if j not in ops]
        if mine:
            await repo.set_held(conn, mine, True, reason)
        if ops:
            await repo.set_held(conn, sorted(ops), True, reason, by_operator=True)

    async def release(self, sel: JobSelector) -> Ok:
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            decision, rows = await self._decided(conn, Verb.RELEASE, sel)
            await repo.set_held(conn, list(decision.act_on), False, "")
            await _wake(conn, decision.act_on, rows)
        self.ctx.relay.kick()
        waiting = [
            j for j in decision.act_on if rows[j]["needs_approval"] and not rows[j]["approved"]
        ]
        note = (
            f"; still awaiting operator approval: {', '.join(map(str, waiting))}" if waiting else ""
        )
        return _ok(f"released {len(decision.act_on)} job(s){note}", decision)

    async def requeue(self, sel: JobSelector) -> Ok:
        """Running jobs back to the queue: the launcher stops them and requeues them
        (same id, restart_count + 1), as it does a preempted job. With `hold` they are
        held from now (the hold `hold` sets), so once back they stay PENDING until
        released (scontrol requeuehold): the placer never sees them requeued unheld."""
        reason = sel.reason or f"requeued by {sel.user}"
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            decision, _ = await self._decided(conn, Verb.REQUEUE, sel)
            if sel.hold:
                await self._hold_all(
                    conn, decision, sel.reason or f"requeued and held by {sel.user}"
                )
            await outbox_add(
                conn,
                *(
                    JobRequeueRequested(job_id=j, by=sel.user, reason=reason)
                    for j in decision.act_on
                ),
            )
        self.ctx.relay.kick()
        log.info("requeue", extra=kv(by=sel.user, jobs=len(decision.act_on), hold=sel.hold))
        held = " (held once requeued)" if sel.hold else ""
        return _ok(f"requeue requested for {len(decision.act_on)} job(s){held}", decision)

    async def approve(self, sel: JobSelector) -> Ok:
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            decision, rows = await self._decided(conn, Verb.APPROVE, sel)
            await repo.approve(conn, list(decision.act_on), sel.user)
            await _wake(conn, decision.act_on, rows)
        self.ctx.relay.kick()
        held = [j for j in decision.act_on if rows[j]["held"]]
        note = f"; still held by a user hold: {', '.join(map(str, held))}" if held else ""
        return _ok(f"approved {len(decision.act_on)} job(s){note}", decision)

    async def update(self, req: UpdateRequest) -> Ok:
        """Jobs' time limit, nice, name or comment, changed in place (update.py); the
        placer is woken to plan pending ones by the new values, and a started job's
        coordinator is told of its new limit (`job.limit_changed`)."""
        change = JobChange(
            time_limit_s=req.time_limit_s, time_limit_change_s=req.time_limit_change_s,
            nice=req.nice, name=req.name, comment=req.comment,
            array_throttle=req.array_throttle, placement=_placement_of(req),
        )  # fmt: skip
        sel = JobSelector(user=req.user, job_refs=req.job_refs)
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            if change.replans():  # the read below sees a start that held a row first
                await repo.lock_rows(conn, self._where(sel))
            targets, rows = await self._targets(conn, sel)
            chosen = [
                UpdateTarget(
                    target=t,
                    time_limit_s=rows[t.job_id]["time_limit_s"],
                    partition=rows[t.job_id]["partition"],
                    array_task=rows[t.job_id]["array_job_id"] is not None,
                )
                for t in targets
            ]
            decision = decide_update(req.user, chosen, change, self.config())
            if decision.refusal is not None:
                raise Refused(decision.refusal, decision.code, decision.skipped or ())
            moved: dict[int, JobSpec] = {}  # a replanned job's new spec
            if change.replans():
                moved = await self._replan(conn, decision, change)
            else:
                await repo.update_jobs(conn, list(decision.act_on), change.spec_fields())
                await repo.update_limits(conn, decision.limits)
            started = {u.target.job_id for u in chosen if u.target.state in STARTED_STATES}
            pending = tuple(j for j in decision.act_on if j not in started)
            await _wake(conn, pending, rows, moved)
            limits = dict(decision.limits)
            await outbox_add(
                conn,
                *(
                    JobLimitChanged(job_id=j, time_limit_s=limits[j], by=req.user)
                    for j in decision.rearm
                ),
            )
        self.ctx.relay.kick()
        said = ", ".join(f"{k}={v}" for k, v in change.fields().items())
        log.info("update", extra=kv(by=req.user, jobs=len(decision.act_on), change=said))
        return Ok(
            message=f"updated {len(decision.act_on)} job(s): {said}",
            job_ids=decision.act_on,
            skipped=decision.skipped,
        )

    async def _replan(
        self, conn: Conn, decision: UpdateDecision, change: JobChange
    ) -> dict[int, JobSpec]:
        """Pending jobs' new placement (replan.py), each checked as a submission is and
        written whole, or the request refused with every job's reasons; each job's
        spec now."""
        config = self.config()
        nodes = await self.shapes() if self.shapes is not None else []
        cluster = shape(config, nodes)
        placing = config if config.partitions else None  # an identity-only file: none
        limits = dict(decision.limits)
        specs = await repo.job_specs(conn, decision.act_on)
        new: dict[int, JobSpec] = {}
        refusals: list[str] = []
        moved = Moved()  # what the jobs accepted so far change in the submit counts
        for job_id in decision.act_on:
            fields = change.spec_fields() | (
                {"time_limit_s": limits[job_id]} if job_id in limits else {}
            )
            spec = msgspec.structs.replace(specs[job_id], **fields)
            assert change.placement is not None  # change.replans()
            counts = await self._counts_into(conn, job_id, spec, change.placement, moved)
            out = replanned(spec, change.placement, placing, cluster, counts)
            if isinstance(out, JobSpec):
                new[job_id] = out
                moved.count(spec, out)
            else:
                refusals += [f"job {job_id}: {why}" for why in out]
        refusals += await self._dependencies_refused(conn, new)
        if refusals:
            raise Refused("; ".join(refusals), "invalid", tuple(refusals))
        for job_id, spec in new.items():
            await repo.replace_spec(conn, job_id, spec, job_policy(spec, placing))
        return new

    async def _counts_into(
        self, conn: Conn, job_id: int, spec: JobSpec, change: PlacementChange, moved: Moved
    ) -> SubmitCounts:
        """The other unfinished jobs, under the QOS a job moves to, of its owner and of
        the account it moves to, for that QOS's submit limits: counted under the lock a
        submission takes, with what the same request moved before it. None when the job
        keeps its QOS and account (it is counted there already) or the QOS caps nothing."""
        qos_name, account = change.qos or spec.qos, change.account or spec.account
        qos = self.config().qos.get(qos_name)
        if (qos_name, account) == (spec.qos, spec.account) or qos is None:
            return NO_JOBS
        if not qos.limits_submissions:
            return NO_JOBS
        user_jobs, account_jobs = await repo.submit_counts(
            conn, spec.user, account, qos_name, besides=job_id
        )
        return SubmitCounts(
            user_jobs=user_jobs + moved.delta["user", spec.user, qos_name],
            account_jobs=account_jobs + moved.delta["account", account, qos_name],
        )

    async def _dependencies_refused(self, conn: Conn, specs: dict[int, JobSpec]) -> list[str]:
        """Why the jobs' new dependencies cannot be kept: a job (or an array task) that
        does not exist (as at submission), or the job itself (it would wait for ever).
        The array tasks named are replaced by their job ids in `specs`."""
        unknown: dict[int, list[str]] = {}
        for job_id, spec in specs.items():
            specs[job_id], unknown[job_id] = await repo.with_task_jobs(conn, spec)
        absent = await repo.absent_jobs(conn, (j for s in specs.values() for j in s.depends_on))
        refusals = []
        for job_id, spec in specs.items():
            if job_id in spec.depends_on:
                refusals.append(f"job {job_id}: --dependency names the job itself")
            missing = [*map(str, sorted(spec.depends_on & absent)), *unknown[job_id]]
            if missing:
                refusals.append(f"job {job_id}: {missing_dependencies(missing, self.kept_s)}")
        return refusals

    # --- reads -------------------------------------------------------------------------

    async def queue(self, req: QueueRequest) -> QueueReply:
        where = _by_refs(req.job_ids, req.job_refs)
        for column, values in (
            ("user_name", req.users + ((req.user,) if req.mine else ())),
            ("partition", req.partitions),
            ("account", req.accounts),
            ("name", req.names),
        ):
            if values:
                where.add(f"j.{column} = ANY({where.arg(list(values))}::text[])")
        now = time.time()  # one clock reading for every row's elapsed time
        async with self.ctx.pool.acquire() as conn:
            rows = await repo.select_rows(conn, where)
        who = self.directory()
        views = [
            job_view(r, now)
            for r in rows
            if may_see(req.user, r["user_name"], r["account"], PrivateData.JOBS, who)
        ]
        if req.states:
            wanted = {s.upper() for s in req.states}
            views = [v for v in views if v.state in wanted]
        elif not req.all_states and not (req.job_ids or req.job_refs):
            views = [v for v in views if v.state in ACTIVE]
        if req.dependencies:
            views = await self._with_dependencies(views)
        if req.priorities:
            views = await self._with_priorities(views)
        if req.steps:  # squeue -s: the running steps of the jobs shown
            async with self.ctx.pool.acquire() as conn:
                found = await repo.running_steps(conn, [v.job_id for v in views])
            return QueueReply(jobs=tuple(views), steps=tuple(step_view(r) for r in found))
        if not req.limit:
            return QueueReply(jobs=tuple(views))
        return QueueReply(
            jobs=tuple(views[req.offset : req.offset + req.limit]),
            total=len(views),
            by_state=dict(Counter(v.state for v in views)),
            by_reason=dict(
                Counter(v.reason for v in views if v.state == JobState.PENDING and v.reason)
            ),
        )

    async def _with_dependencies(self, views: list[JobView]) -> list[JobView]:
        """The views, each job held back by its dependency with it (`squeue %E`): a
        job whose dependency is met shows none, as Slurm's drops the met ones."""

        def waits(v: JobView) -> bool:
            return v.reason.split(" ", 1)[0] in DEPENDENCY_WAITS

        return await self._added(views, waits, _dependency_texts, "dependency")

    async def _with_priorities(self, views: list[JobView]) -> list[JobView]:
        """The views, each pending job with its priority and factors (`sprio`)."""

        def pending(v: JobView) -> bool:
            return v.state == JobState.PENDING

        return await self._added(views, pending, repo.job_priorities, "priority")

    async def _added(
        self,
        views: list[JobView],
        wanted: Callable[[JobView], bool],
        read: Callable[[Conn, list[int]], Awaitable[Mapping[int, object]]],
        field: str,
    ) -> list[JobView]:
        """The views, those `wanted` with `field` set from `read` (one read, for them
        alone; a job it finds nothing for keeps the view's default)."""
        ids = [v.job_id for v in views if wanted(v)]
        if not ids:
            return views
        async with self.ctx.pool.acquire() as conn:
            found = await read(conn, ids)
        return [
            msgspec.structs.replace(v, **{field: found[v.job_id]}) if v.job_id in found else v
            for v in views
        ]

    async def show(self, req: ShowJobRequest) -> ShowJobReply:
        now = time.time()
        async with self.ctx.pool.acquire() as conn:
            rows = await repo.job_rows(conn, [req.job_id], None)
            if not rows:
                raise Refused(missing_job(req.job_id, self.kept_s), "not_found")
            spec = await repo.job_spec(conn, req.job_id) or {}
            history = await repo.attempts(conn, req.job_id)
            steps = await repo.steps(conn, req.job_id)
            priority = await repo.job_priority(conn, req.job_id)
            predicted, why = await repo.predicted_end(conn, req.job_id)
            used = await repo.used(conn, req.job_id)
        row = rows[0]
        spec = _visible(req.user, row, spec, self.directory())
        view = job_view(row, now)
        approval = ""
        if row["needs_approval"]:
            approval = (
                f"approved by {row['approved_by']}"
                if row["approved"]
                else "awaiting operator approval"
            )
        return ShowJobReply(
            job=view,
            spec=spec,
            why_pending=why_pending(view),
            dependency=_dependency_of(spec),
            approval=approval,
            attempts=tuple(_attempt(a) for a in history),
            steps=tuple(step_view(s) for s in steps),
            priority=priority,
            predicted_end=predicted if view.state in ("RUNNING", "CONFIGURING") else None,
            predicted_why=why if view.state in ("RUNNING", "CONFIGURING") else "",
            max_rss_bytes=None if used is None else used["max_rss"],
            max_rss_node="" if used is None else used["max_rss_node"] or "",
            cpu_usec=None if used is None else used["cpu_usec"],
        )


def _visible(actor: str, row: Any, spec: dict[str, Any], who: Directory) -> dict[str, Any]:
    """What `show` may tell `actor` of a job: refused when jobs are private and it is not
    theirs to see; the script and environment redacted when those are."""
    owner, account = row["user_name"], row["account"]
    if not may_see(actor, owner, account, PrivateData.JOBS, who):
        raise Refused(
            f"job {row['job_id']} belongs to {owner!r}: other users' jobs are private here "
            "(only its owner, a coordinator of its account or an operator may see it)",
            "private",
        )
    if may_see(actor, owner, account, PrivateData.SCRIPTS, who):
        return spec
    return redact_spec(spec)


def _refs(
    job_ids: tuple[int, ...], job_refs: tuple[str, ...]
) -> list[tuple[int, tuple[int, ...] | None]]:
    """(job id, array tasks or None) of each id and `123`, `123_4`, `123_[1-3]`
    reference (refused if bad)."""
    refs: list[tuple[int, tuple[int, ...] | None]] = [(j, None) for j in job_ids]
    for text in job_refs:
        try:
            ref = parse_job_ref(text)
        except ValueError as err:
            raise Refused(str(err), "invalid") from err
        refs.append((ref.job_id, ref.tasks))
    return refs


def _by_refs(job_ids: tuple[int, ...], job_refs: tuple[str, ...]) -> repo.Where:
    """A WHERE on job ids and `123`, `123_4`, `123_[1-3]` references."""
    where = repo.Where()
    if refs := _refs(job_ids, job_refs):
        repo.refs_clause(where, refs)
    return where


def _ok(message: str, decision: Decision) -> Ok:
    return Ok(message=message, job_ids=decision.act_on, skipped=decision.skipped)


class Moved:
    """Jobs one update request moves between QOS and accounts, as the submit counts see
    them: the database still counts each where it was until the request commits."""

    def __init__(self) -> None:
        self.delta: Counter[tuple[str, str, str]] = Counter()  # (kind, name, QOS): jobs

    def count(self, old: JobSpec, new: JobSpec) -> None:
        for kind, before, after in (
            ("user", old.user, new.user),
            ("account", old.account, new.account),
        ):
            self.delta[kind, before, old.qos] -= 1
            self.delta[kind, after, new.qos] += 1


async def _wake(
    conn: Conn,
    job_ids: tuple[int, ...],
    rows: dict[int, Any],
    moved: dict[int, JobSpec] | None = None,
) -> None:
    """A released, approved or changed job is news to the placer (`moved`: the new spec
    of a job an update moved, whose partition and account its row read before)."""
    moved = moved or {}

    def news(j: int) -> JobSubmitted:
        if (spec := moved.get(j)) is not None:
            return JobSubmitted(
                job_id=j, user=spec.user, account=spec.account, partition=spec.partition
            )
        row = rows[j]
        return JobSubmitted(
            job_id=j, user=row["user_name"], account=row["account"], partition=row["partition"]
        )

    await outbox_add(conn, *(news(j) for j in job_ids))


def _placement_of(req: UpdateRequest) -> PlacementChange | None:
    try:
        nodes = None if req.nodes is None else node_range(req.nodes)
        begin = None if req.begin is None else parse_begin(req.begin, now=time.time())
    except ValueError as err:
        raise Refused(str(err), "invalid") from err
    change = PlacementChange(
        partition=req.partition, qos=req.qos, nodes=nodes, gpus_per_node=req.gpus_per_node,
        exclude=req.exclude, constraint=req.constraint, begin_at=begin,
        dependency=req.dependency, nodelist=req.nodelist, account=req.account,
    )  # fmt: skip
    return change if change.fields() else None


async def _dependency_texts(conn: Conn, job_ids: list[int]) -> dict[int, str]:
    """Each job's --dependency as given (`afterok:12:13`)."""
    return {j: dependency_text(spec) for j, spec in (await repo.job_specs(conn, job_ids)).items()}


def _dependency_of(spec: dict[str, Any]) -> str:
    if not spec.get("dependencies"):
        return ""
    try:
        return dependency_text(msgspec.convert(spec, JobSpec))
    except msgspec.ValidationError:
        return ""


def _attempt(a: Any) -> AttemptView:
    return AttemptView(
        attempt=a["attempt"],
        seq=a["seq"],
        nodes=tuple(a["nodes"]),
        world_size=a["world_size"],
        reason=a["reason"],
        outcome=a["outcome"],
        started_at=float(a["started"]),
        ended_at=None if a["ended"] is None else float(a["ended"]),
    )
