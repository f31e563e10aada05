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

import msgspec
from nats.aio.msg import Msg
from opentelemetry import trace

from services.admission import repo
from services.admission.authz import Action, authorize
from services.admission.batch import JobBatcher
from services.admission.bus_users import BusUsers
from services.admission.cluster_shape import NodeShape, shape
from services.admission.commands import JobCommands
from services.admission.config import ConfigError
from services.admission.config_model import ClusterConfig, Limits
from services.admission.config_source import ConfigSource
from services.admission.errors_api import Refused
from services.admission.fit import unconfigured_fit
from services.admission.node_partitions import nodes_reply
from services.admission.nonces import NonceLedger
from services.admission.policy import NO_POLICY, JobPolicy, job_policy
from services.admission.purge import PURGE_JOBS, missing_dependencies
from services.admission.ratelimit import Bucket, take
from services.admission.sbatch import parse_submission
from services.admission.validate import SubmitCounts, admit, validate
from services.admission.views import node_views
from shared.api import (
    API_PREFIX,
    JobSelector,
    NodeAction,
    NodesReply,
    Ok,
    QueueRequest,
    ReloadReply,
    Request,
    ShowJobRequest,
    SubmitReply,
    SubmitRequest,
    UpdateRequest,
)
from shared.apiserve import Route, enveloped
from shared.arrays import parse_array
from shared.db import outbox_add
from shared.events import JobSubmitted, NodeDrainRequested
from shared.exports import with_environment
from shared.identity import R, Verifier, authenticated
from shared.identity_files import IdentitySource
from shared.jobspec import JobSpec
from shared.logs import kv
from shared.retention import INBOX_FLOOR_S
from shared.runtime import ServiceContext, every, until_ready, until_stopped
from shared.settings import AdmissionSettings
from shared.telemetry import extract_context

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

__all__ = ["Admission", "Refused"]

# Requests one replica works on at once; more wait in NATS's pending buffer.
CONCURRENCY = 256
SHAPES_TTL_S = 2.0
CONFIG_CHECK_S = 2.0
NONCE_SWEEP_S = 30.0
READ_ONLY = frozenset({"queue", "show", "nodes"})  # a replay of these changes nothing


def _no_config(operators: frozenset[str]) -> ClusterConfig:
    """Without a configuration file: no accounts, and these operators (none unless a
    test passes some: operators come from the configuration)."""
    return ClusterConfig(
        default_partition="", default_qos="normal", partitions={}, qos={},
        operators=tuple(sorted(operators)),
    )  # fmt: skip


class Admission:
    def __init__(
        self,
        ctx: ServiceContext[AdmissionSettings],
        operators: frozenset[str] = frozenset(),
        config: ConfigSource | None = None,
    ) -> None:
        self.ctx = ctx
        # finished jobs, with every row about them
        self.job_keep_s = ctx.pruner.keep_as_set(
            PURGE_JOBS, ctx.settings.job_keep_s, INBOX_FLOOR_S, counts=True
        )
        self.operators = operators
        self.source = config if config is not None else ConfigSource(ctx.settings.cluster_config)
        self._published: ClusterConfig | None = None
        self._fallback = _no_config(operators)
        self.identity = IdentitySource(
            self.source.path, ctx.settings.user_keys_dir, config_text=lambda: self.source.text
        )
        self.verifier = Verifier(self.identity.directory)
        self.bus_users = BusUsers(ctx.settings.nats_auth_dir)
        self.ledger = NonceLedger(ctx.pool)
        self._buckets: dict[str, Bucket] = {}
        self.jobs = JobCommands(
            ctx, self.authz_config, self.identity.directory, kept_s=self.job_keep_s,
            shapes=self._node_shapes,
        )  # fmt: skip
        self.batcher = JobBatcher(ctx.pool, ctx.relay.kick)
        self._shapes: tuple[float, list[NodeShape]] = (0.0, [])
        self._inflight: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(CONCURRENCY)

    def authz_config(self) -> ClusterConfig:
        return self.source.config or self._fallback

    async def run(self, stop: asyncio.Event) -> None:
        routes: dict[str, Route] = {
            "submit": self._signed("submit", SubmitRequest, self.submit),
            "cancel": self._signed("cancel", JobSelector, self.jobs.cancel),
            "hold": self._signed("hold", JobSelector, self.jobs.hold),
            "release": self._signed("release", JobSelector, self.jobs.release),
            "requeue": self._signed("requeue", JobSelector, self.jobs.requeue),
            "approve": self._signed("approve", JobSelector, self.jobs.approve),
            "update": self._signed("update", UpdateRequest, self.jobs.update),
            "queue": self._signed("queue", QueueRequest, self.jobs.queue),
            "show": self._signed("show", ShowJobRequest, self.jobs.show),
            "nodes": self._signed("nodes", QueueRequest, self.nodes),
            "drain": self._signed("drain", NodeAction, self.drain),
            "resume": self._signed("resume", NodeAction, self.resume),
        }
        # PostgreSQL may be away right after the connect: wait for it, do not exit.
        await until_ready("publish the policy", self._publish_policy, stop)
        for verb, route in routes.items():
            await self._serve(API_PREFIX + verb, "admission", route)
        # Every replica reloads: no queue group, the first reply answers the caller.
        reload = self._signed("reload", Request, self.reload)
        await self._serve(API_PREFIX + "reload", "", reload)

        async def watch(stop: asyncio.Event) -> None:
            await every(CONFIG_CHECK_S, stop, self._check_config_file)

        async def sweep(stop: asyncio.Event) -> None:
            await every(NONCE_SWEEP_S, stop, self.ledger.sweep)

        try:
            await until_stopped(stop, self.ctx.relay.run, self.ctx.pruner.run, watch, sweep)
        finally:
            if self._inflight:
                await asyncio.wait(self._inflight, timeout=self.ctx.settings.drain_timeout_s)
            await self.verifier.aclose()
            await self.ledger.aclose(self.ctx.settings.drain_timeout_s)

    def _signed(
        self, verb: str, kind: type[R], fn: Callable[[R], Awaitable[msgspec.Struct]]
    ) -> Route:
        """Every request is verified (shared.identity) before `fn` sees it, as its user;
        one that changes something is also checked against the replicas' shared ledger."""
        ledger = None if verb in READ_ONLY else self.ledger.first_time
        return authenticated(self.verifier, API_PREFIX + verb, kind, fn, time.time, ledger)

    async def _check_config_file(self) -> None:
        self.source.reload_if_changed()
        if self.source.config is not self._published:
            await self._publish_policy()
        await self.bus_users.sync(self.identity.directory())

    async def _publish_policy(self) -> None:
        """The placer schedules by the policy in force: partitions' nodes, QOS limits."""
        config = self.source.config
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            await repo.publish_policy(conn, _placement(config))
        self.verifier.max_request_bytes = (config.limits if config else Limits()).max_request_bytes
        self._published = config

    async def _serve(self, subject: str, queue: str, route: Route) -> None:
        """Each request in its own task (bounded), so one replica overlaps many round
        trips to PostgreSQL instead of answering one request at a time."""
        handler = enveloped(route)

        async def on_request(msg: Msg) -> None:
            await self._slots.acquire()
            task = asyncio.get_running_loop().create_task(self._answer(msg, handler))
            self._inflight.add(task)
            task.add_done_callback(self._done)

        await self.ctx.bus.nc.subscribe(subject, queue=queue, cb=on_request)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._inflight.discard(task)
        self._slots.release()

    async def _answer(self, msg: Msg, handler: Callable[[bytes, str], Awaitable[bytes]]) -> None:
        with tracer.start_as_current_span(
            f"serve {msg.subject}",
            context=extract_context(msg.headers),
            kind=trace.SpanKind.SERVER,
        ):
            reply = await handler(msg.data, msg.subject)
        if msg.reply:
            try:
                await msg.respond(reply)
            except Exception as err:  # the caller's connection is gone; nothing to tell
                log.warning("reply not sent", extra=kv(subject=msg.subject, error=repr(err)))

    # --- submit ---------------------------------------------------------------------

    async def submit(self, req: SubmitRequest) -> SubmitReply:
        self._within_limits(req, time.time())
        parsed = parse_submission(
            req.argv,
            req.script,
            user=req.user,
            workdir=req.workdir,
            script_path=req.script_path,
            args=req.args,
            now=time.time(),
            batch_first_node=req.batch_first_node,
        )
        if parsed.errors or parsed.spec is None:
            _refuse_all(tuple(str(e) for e in parsed.errors), "invalid")
        assert parsed.spec is not None
        # The job's environment: what --export passes of the submitter's, never ours.
        submitted = with_environment(parsed.spec, req.environment)
        config = _placement(self.source.config)
        shapes = await self._node_shapes()
        if config is None:
            spec, policy = submitted, NO_POLICY
            self._check_cluster(spec, shapes)
        else:
            spec = self._admit(submitted, parsed.explicit, config, shapes, SubmitCounts())
            policy = job_policy(spec, config)
        if spec.dependencies:
            spec = await self._check_dependencies(spec)
        if req.dry_run or parsed.dry_run:
            return SubmitReply(warnings=parsed.warnings, spec=msgspec.to_builtins(spec))
        ids = await self._persist(spec, policy, config, shapes)  # kicks the relay
        log.debug("submitted", extra=kv(jobs=len(ids), first=ids[0], user=spec.user))
        warnings = parsed.warnings
        if policy.needs_approval:
            warnings += (f"partition {spec.partition!r} needs an operator's approval; "
                         "the job waits held until then",)  # fmt: skip
        return SubmitReply(job_ids=tuple(ids), warnings=warnings)

    def _within_limits(self, req: SubmitRequest, now: float) -> None:
        """The abuse limits, checked before anything is parsed or stored."""
        limits = self.source.config.limits if self.source.config else Limits()
        size = len(req.script.encode())
        if size > limits.max_script_bytes:
            raise Refused(
                f"the script is {size} bytes; the limit (limits.max_script_bytes) is "
                f"{limits.max_script_bytes} bytes: keep data out of the script and read it "
                "from a file",
                "too_large",
            )
        bucket, refusal = take(
            self._buckets.get(req.user),
            now,
            rate=limits.submit_rate,
            burst=limits.submit_burst,
            user=req.user,
        )
        self._buckets[req.user] = bucket
        if refusal is not None:
            raise Refused(refusal.message, "rate_limited")

    def _admit(
        self,
        spec: JobSpec,
        explicit: frozenset[str],
        config: ClusterConfig,
        shapes: list[NodeShape],
        counts: SubmitCounts,
    ) -> JobSpec:
        admitted = admit(spec, explicit, config, shape(config, shapes), counts)
        if admitted.spec is None:
            _refuse_all(tuple(e.message for e in admitted.errors), admitted.errors[0].code)
        assert admitted.spec is not None
        return admitted.spec

    async def _node_shapes(self) -> list[NodeShape]:
        """Registered nodes, cached briefly: every submission checks against them."""
        at, cached = self._shapes
        if time.monotonic() - at < SHAPES_TTL_S and cached:
            return cached
        async with self.ctx.pool.acquire() as conn:
            rows = await repo.node_shapes(conn)
        shapes = [
            NodeShape(
                name=r["name"],
                gpus=int(r["gpus"]),
                gpu_model=r["model"],
                features=tuple(r["features"]),
                cpus=r["cpus"],
                memory_mib=r["memory_mib"],
            )
            for r in rows
        ]
        self._shapes = (time.monotonic(), shapes)
        return shapes

    def _check_cluster(self, spec: JobSpec, shapes: list[NodeShape]) -> None:
        why = unconfigured_fit(spec, tuple(shapes))
        if why is not None:
            raise Refused(why, "too_large")

    async def _check_dependencies(self, spec: JobSpec) -> JobSpec:
        """The spec with the array tasks its dependencies name as their job ids, every
        job named existing; else refused, naming those that do not."""
        async with self.ctx.pool.acquire() as conn:
            spec, tasks = await repo.with_task_jobs(conn, spec)
            missing = await repo.absent_jobs(conn, spec.depends_on)
        if tasks or missing:
            named = [*map(str, sorted(missing)), *tasks]
            raise Refused(missing_dependencies(named, self.job_keep_s), "bad_dependency")
        return spec

    async def _persist(
        self,
        spec: JobSpec,
        policy: JobPolicy,
        config: ClusterConfig | None,
        shapes: list[NodeShape],
    ) -> list[int]:
        qos = config.qos.get(spec.qos) if config else None
        if not spec.array_spec and not (qos and qos.limits_submissions):
            return [await self.batcher.insert(spec, policy)]  # group commit
        tasks: tuple[int | None, ...] = (None,)
        if spec.array_spec:
            try:
                tasks = parse_array(spec.array_spec).task_ids
            except ValueError as err:
                raise Refused(str(err)) from err
        ids: list[int] = []
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            if config and qos and qos.limits_submissions:
                user, account = await repo.submit_counts(conn, spec.user, spec.account, spec.qos)
                counts = SubmitCounts(user_jobs=user, account_jobs=account)
                errors = validate(spec, config, shape(config, shapes), counts)
                if errors:
                    _refuse_all(tuple(e.message for e in errors), errors[0].code)
            for task in tasks:
                task_spec = msgspec.structs.replace(spec, array_task_id=task)
                if ids and task is not None:
                    task_spec = msgspec.structs.replace(task_spec, array_job_id=ids[0])
                job_id = await repo.insert_job(conn, task_spec, policy)
                if task is not None and not ids:
                    task_spec = msgspec.structs.replace(task_spec, array_job_id=job_id)
                    await repo.set_array_job(conn, job_id, task_spec)
                ids.append(job_id)
            rows = await outbox_add(
                conn,
                *(
                    JobSubmitted(
                        job_id=j, user=spec.user, account=spec.account, partition=spec.partition
                    )
                    for j in ids
                ),
            )
        self.ctx.relay.kick(rows)
        return ids

    # --- configuration --------------------------------------------------------------

    async def reload(self, req: Request) -> ReloadReply:
        refused = authorize(Action.RELOAD_CONFIG, req.user, None, None, self.authz_config())
        if refused is not None:
            raise Refused(refused.message, "forbidden")
        try:
            changed, message = self.source.reload()
        except ConfigError as err:
            details = tuple(f"{p.key}: {p.message}" for p in err.problems)
            raise Refused(
                f"{self.source.path}: {len(details)} problem(s); the configuration in force "
                "is unchanged", "invalid_config", details,
            ) from err  # fmt: skip
        except OSError as err:
            raise Refused(
                f"cannot read {self.source.path}: {err.strerror}", "invalid_config"
            ) from err
        if changed:
            await self._publish_policy()
        parts = tuple(self.source.config.partitions) if self.source.config else ()
        return ReloadReply(
            message=message, path=self.source.path, partitions=parts, changed=changed
        )

    # --- reads ----------------------------------------------------------------------

    async def nodes(self, _req: QueueRequest) -> NodesReply:
        async with self.ctx.pool.acquire() as conn:
            nodes, gpus = await repo.nodes_view(conn)
        return nodes_reply(node_views(nodes, gpus), _placement(self.source.config), time.time())

    # --- operator actions -----------------------------------------------------------

    async def drain(self, req: NodeAction) -> Ok:
        return await self._node_action(req, resume=False)

    async def resume(self, req: NodeAction) -> Ok:
        return await self._node_action(req, resume=True)

    async def _node_action(self, req: NodeAction, *, resume: bool) -> Ok:
        verb = "resume" if resume else "drain"
        action = Action.RESUME if resume else Action.DRAIN
        refused = authorize(action, req.user, None, None, self.authz_config())
        if refused is not None:
            raise Refused(refused.message, "forbidden")
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


def _placement(config: ClusterConfig | None) -> ClusterConfig | None:
    """The configuration that places jobs: none for an identity-only file (no partitions),
    which then checks submissions against the registered nodes alone."""
    return config if config is not None and config.partitions else None


def _refuse_all(messages: tuple[str, ...], code: str) -> None:
    raise Refused("; ".join(messages) or "the submission is invalid", str(code), messages)
