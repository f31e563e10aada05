"""Admission shell: the user-facing API over NATS request-reply (queue group
`admission`, so replicas share the load).

A submission is parsed and validated before anything is written; an accepted job is
stored PENDING and its `job.submitted` event is written in the same transaction
(outbox). A refused one leaves no trace and gets a message that says what to change.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec

from services.admission import repo
from services.admission.arrays import parse_array
from services.admission.sbatch import parse_submission
from services.admission.views import job_view, node_views, why_pending
from shared.api import (
    API_PREFIX,
    ApiError,
    AttemptView,
    Envelope,
    JobSelector,
    NodeAction,
    NodesReply,
    Ok,
    QueueReply,
    QueueRequest,
    ShowJobReply,
    ShowJobRequest,
    SubmitReply,
    SubmitRequest,
)
from shared.db import Conn, outbox_add
from shared.events import JobCancelRequested, JobSubmitted, NodeDrainRequested
from shared.jobspec import JobSpec
from shared.logs import kv
from shared.runtime import ServiceContext, until_stopped

log = logging.getLogger(__name__)
R = TypeVar("R", bound=msgspec.Struct)


class Refused(Exception):
    """A request admission will not carry out; the message says what to change."""

    def __init__(self, message: str, code: str = "invalid", details: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.error = ApiError(error=message, code=code, details=details)


class Admission:
    def __init__(
        self, ctx: ServiceContext, operators: frozenset[str] = frozenset({"root"})
    ) -> None:
        self.ctx = ctx
        self.operators = operators

    async def run(self, stop: asyncio.Event) -> None:
        routes: dict[str, Callable[[bytes], Awaitable[msgspec.Struct]]] = {
            "submit": self._typed(SubmitRequest, self.submit),
            "cancel": self._typed(JobSelector, self.cancel),
            "hold": self._typed(JobSelector, self.hold),
            "release": self._typed(JobSelector, self.release),
            "queue": self._typed(QueueRequest, self.queue),
            "show": self._typed(ShowJobRequest, self.show),
            "nodes": self._typed(QueueRequest, self.nodes),
            "drain": self._typed(NodeAction, self.drain),
            "resume": self._typed(NodeAction, self.resume),
        }
        for verb, route in routes.items():
            await self.ctx.bus.serve(API_PREFIX + verb, "admission", self._wrap(route))
        await until_stopped(stop, self.ctx.relay.run)

    def _typed(
        self, kind: type[R], fn: Callable[[R], Awaitable[msgspec.Struct]]
    ) -> Callable[[bytes], Awaitable[msgspec.Struct]]:
        async def call(payload: bytes) -> msgspec.Struct:
            try:
                req = msgspec.json.decode(payload, type=kind)
            except (msgspec.DecodeError, msgspec.ValidationError) as err:
                raise Refused(f"malformed request: {err}", "malformed") from err
            return await fn(req)

        return call

    def _wrap(
        self, route: Callable[[bytes], Awaitable[msgspec.Struct]]
    ) -> Callable[[bytes, str], Awaitable[bytes]]:
        async def handler(payload: bytes, subject: str) -> bytes:
            try:
                result = await route(payload)
            except Refused as err:
                return msgspec.json.encode(Envelope(error=err.error))
            except Exception as err:
                log.exception("request failed", extra=kv(subject=subject))
                error = ApiError(
                    error=f"internal error: {type(err).__name__}: {err}", code="internal"
                )
                return msgspec.json.encode(Envelope(error=error))
            return msgspec.json.encode(Envelope(ok=msgspec.Raw(msgspec.json.encode(result))))

        return handler

    # --- submit ---------------------------------------------------------------------

    async def submit(self, req: SubmitRequest) -> SubmitReply:
        parsed = parse_submission(
            req.argv,
            req.script,
            user=req.user,
            workdir=req.workdir,
            script_path=req.script_path,
            args=req.args,
            now=time.time(),
        )
        if parsed.errors or parsed.spec is None:
            details = tuple(str(e) for e in parsed.errors)
            raise Refused("; ".join(details) or "the submission is invalid", "invalid", details)
        spec = parsed.spec
        async with self.ctx.pool.acquire() as conn:
            self._check_cluster(spec, await repo.node_shapes(conn))
        if req.dry_run or parsed.dry_run:
            return SubmitReply(warnings=parsed.warnings, spec=msgspec.to_builtins(spec))
        ids = await self._persist(spec)
        self.ctx.relay.kick()
        log.info("submitted", extra=kv(jobs=len(ids), first=ids[0], user=spec.user))
        return SubmitReply(job_ids=tuple(ids), warnings=parsed.warnings)

    def _check_cluster(self, spec: JobSpec, shapes: list[Any]) -> None:
        if not shapes:
            return  # no node registered yet: nothing to compare against
        largest = max(int(s["gpus"]) for s in shapes)
        if spec.gpus_per_node > largest:
            raise Refused(
                f"{spec.gpus_per_node} GPUs per node requested, but the largest node has "
                f"{largest} GPUs; ask for --gpus-per-node={largest} or fewer and more nodes",
                "too_large",
            )
        fitting = sum(1 for s in shapes if int(s["gpus"]) >= spec.gpus_per_node)
        if spec.nodes_min > fitting:
            raise Refused(
                f"{spec.nodes_min} nodes requested, but only {fitting} nodes have "
                f"{spec.gpus_per_node} GPUs; ask for --nodes={fitting} or fewer",
                "too_large",
            )

    async def _persist(self, spec: JobSpec) -> list[int]:
        tasks: tuple[int | None, ...] = (None,)
        if spec.array_spec:
            try:
                tasks = parse_array(spec.array_spec).task_ids
            except ValueError as err:
                raise Refused(str(err)) from err
        ids: list[int] = []
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            for task in tasks:
                task_spec = msgspec.structs.replace(spec, array_task_id=task)
                if ids and task is not None:
                    task_spec = msgspec.structs.replace(task_spec, array_job_id=ids[0])
                job_id = await repo.insert_job(conn, task_spec)
                if task is not None and not ids:
                    task_spec = msgspec.structs.replace(task_spec, array_job_id=job_id)
                    await repo.set_array_job(conn, job_id, task_spec)
                ids.append(job_id)
            await outbox_add(
                conn,
                *(
                    JobSubmitted(
                        job_id=j, user=spec.user, account=spec.account, partition=spec.partition
                    )
                    for j in ids
                ),
            )
        return ids

    # --- job actions ----------------------------------------------------------------

    async def _authorized(self, conn: Conn, sel: JobSelector) -> list[int]:
        job_ids = list(sel.job_ids)
        if sel.name is not None or sel.owner is not None:
            job_ids += await repo.select_jobs(conn, sel.name, sel.owner)
        if not job_ids:
            raise Refused("no job matches; give job ids, --name or --user", "not_found")
        rows = await repo.owners(conn, job_ids)
        found = {r["job_id"]: r for r in rows}
        missing = [j for j in job_ids if j not in found]
        if missing:
            raise Refused(f"no such job: {', '.join(map(str, missing))}", "not_found")
        for row in rows:
            if row["user_name"] != sel.user and sel.user not in self.operators:
                raise Refused(
                    f"job {row['job_id']} belongs to {row['user_name']}; only its owner or an "
                    "operator may act on it",
                    "forbidden",
                )
        return sorted(found)

    async def cancel(self, sel: JobSelector) -> Ok:
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            ids = await self._authorized(conn, sel)
            reason = sel.reason or f"cancelled by {sel.user}"
            for job_id in ids:
                await repo.request_cancel(conn, job_id, reason)
            await outbox_add(
                conn,
                *(
                    JobCancelRequested(job_id=j, by=sel.user, reason=reason, signal=sel.signal)
                    for j in ids
                ),
            )
        self.ctx.relay.kick()
        return Ok(message=f"cancel requested for {len(ids)} job(s)", job_ids=tuple(ids))

    async def hold(self, sel: JobSelector) -> Ok:
        return await self._set_held(sel, True)

    async def release(self, sel: JobSelector) -> Ok:
        return await self._set_held(sel, False)

    async def _set_held(self, sel: JobSelector, held: bool) -> Ok:
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            ids = await self._authorized(conn, sel)
            for job_id in ids:
                await repo.set_held(conn, job_id, held, sel.reason or f"by {sel.user}")
            if not held:  # a released job is news to the placer
                wake = [JobSubmitted(job_id=j, user=sel.user, account="") for j in ids]
                await outbox_add(conn, *wake)
        self.ctx.relay.kick()
        return Ok(message=f"{'held' if held else 'released'} {len(ids)} job(s)", job_ids=tuple(ids))

    # --- reads ----------------------------------------------------------------------

    async def queue(self, req: QueueRequest) -> QueueReply:
        async with self.ctx.pool.acquire() as conn:
            rows = await repo.job_rows(conn, list(req.job_ids) or None, list(req.users) or None)
        views = [job_view(r) for r in rows]
        if req.partitions:
            views = [v for v in views if v.partition in req.partitions]
        if req.states:
            views = [v for v in views if v.state in req.states]
        elif not req.all_states and not req.job_ids:
            views = [
                v
                for v in views
                if v.state in ("PENDING", "CONFIGURING", "STARTING", "RUNNING", "COMPLETING")
            ]
        return QueueReply(jobs=tuple(views))

    async def show(self, req: ShowJobRequest) -> ShowJobReply:
        async with self.ctx.pool.acquire() as conn:
            rows = await repo.job_rows(conn, [req.job_id], None)
            if not rows:
                raise Refused(f"no such job: {req.job_id}", "not_found")
            spec = await repo.job_spec(conn, req.job_id) or {}
            history = await repo.attempts(conn, req.job_id)
        spec.pop("script", None) if spec.get(
            "user"
        ) != req.user and req.user not in self.operators else None
        view = job_view(rows[0])
        return ShowJobReply(
            job=view,
            spec=spec,
            why_pending=why_pending(view),
            attempts=tuple(
                AttemptView(
                    attempt=a["attempt"],
                    seq=a["seq"],
                    nodes=tuple(a["nodes"]),
                    world_size=a["world_size"],
                    reason=a["reason"],
                    outcome=a["outcome"],
                    started_at=float(a["started"]),
                    ended_at=None if a["ended"] is None else float(a["ended"]),
                )
                for a in history
            ),
        )

    async def nodes(self, _req: QueueRequest) -> NodesReply:
        async with self.ctx.pool.acquire() as conn:
            nodes, gpus = await repo.nodes_view(conn)
        return NodesReply(nodes=tuple(node_views(nodes, gpus)))

    # --- operator actions -----------------------------------------------------------

    async def drain(self, req: NodeAction) -> Ok:
        return await self._node_action(req, resume=False)

    async def resume(self, req: NodeAction) -> Ok:
        return await self._node_action(req, resume=True)

    async def _node_action(self, req: NodeAction, *, resume: bool) -> Ok:
        verb = "resume" if resume else "drain"
        if req.user not in self.operators:
            raise Refused(f"only operators may {verb} nodes; {req.user} is not one", "forbidden")
        if not req.reason:
            raise Refused(f"say why: muster {verb} {req.node} --reason TEXT", "invalid")
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            shapes = await repo.node_shapes(conn)
            names = [s["name"] for s in shapes]
            if req.node not in names:
                raise Refused(f"no node {req.node}; nodes are: {', '.join(names)}", "not_found")
            await outbox_add(
                conn,
                NodeDrainRequested(node=req.node, by=req.user, reason=req.reason, resume=resume),
            )
        self.ctx.relay.kick()
        return Ok(message=f"{verb} requested for {req.node}")
