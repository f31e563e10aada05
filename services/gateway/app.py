"""Shell: the gateway's HTTP routes (Starlette) — the REST/JSON API over the same
request contracts the CLI sends, the OpenAPI document, and the dashboard's files.

Every API route turns its HTTP input into one `shared.api` request, sends it signed as
the gateway's user (`Upstream`), and answers the result as JSON, or the refusal as a 4xx
(5xx: the cluster is away) with the API's own `{"error", "code", "details"}`: the same
message the CLI prints. The gateway itself writes nothing anywhere."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from services.gateway import core, repo
from services.gateway.openapi import document
from services.gateway.upstream import Refusal, Upstream
from shared.api import (
    ApiError,
    JobSelector,
    NodesReply,
    QueueReply,
    QueueRequest,
    ShowJobReply,
    ShowJobRequest,
    SubmitReply,
    SubmitRequest,
)
from shared.db import Pool

STATIC = Path(__file__).resolve().parent / "static"
Handler = Callable[[Request], Awaitable[Response]]
R = TypeVar("R", SubmitRequest, JobSelector)


class BadInput(Exception):
    """HTTP input the gateway refuses before asking anyone (a 4xx with `error`)."""

    def __init__(self, message: str, code: str = "invalid", status: int = 400) -> None:
        super().__init__(message)
        self.error = ApiError(error=message, code=code)
        self.status = status


def json(value: Any, status: int = 200) -> Response:
    return Response(msgspec.json.encode(value), status, media_type="application/json")


def refused(error: ApiError, status: int | None = None) -> Response:
    return json(error, status or core.http_status(error.code))


def api(fn: Handler) -> Handler:
    """A route whose refusals (the API's, or bad HTTP input) become 4xx JSON."""

    async def route(request: Request) -> Response:
        try:
            return await fn(request)
        except Refusal as err:
            return refused(err.error)
        except BadInput as err:
            return refused(err.error, err.status)

    return route


def names(request: Request, key: str) -> tuple[str, ...]:
    """`?key=a,b&key=c` -> ("a", "b", "c"), as the CLI splits `-u a,b -u c`."""
    return tuple(n for v in request.query_params.getlist(key) for n in v.split(",") if n)


def integer(request: Request, key: str, default: int) -> int:
    raw = request.query_params.get(key)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError as err:
        raise BadInput(f"{key}={raw!r}: expected an integer") from err


def number(request: Request, key: str) -> float | None:
    raw = request.query_params.get(key)
    if raw is None or raw == "":
        return None
    try:
        return float(raw)
    except ValueError as err:
        raise BadInput(f"{key}={raw!r}: expected a number (epoch seconds)") from err


def flag(request: Request, key: str) -> bool:
    return request.query_params.get(key, "").lower() in ("1", "true", "yes", "on")


class Gateway:
    """The routes' dependencies: the upstream API, the read-only pool, the settings."""

    def __init__(
        self,
        upstream: Upstream,
        pool: Pool | None,
        *,
        cache_s: float = 1.0,
        tail_bytes: int = 16384,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.upstream = upstream
        self.pool = pool
        self.cache_s = cache_s
        self.tail_bytes = tail_bytes
        self.clock = clock
        # Many viewers polling one big queue share one answer for `cache_s`.
        self._cache: dict[tuple[Any, ...], tuple[float, Any]] = {}

    async def cached(self, key: tuple[Any, ...], fetch: Callable[[], Awaitable[Any]]) -> Any:
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and now - hit[0] < self.cache_s:
            return hit[1]
        value = await fetch()
        if len(self._cache) > 256:
            self._cache.clear()
        self._cache[key] = (now, value)
        return value

    # --- reads -----------------------------------------------------------------------

    async def whoami(self, request: Request) -> Response:
        return json({"user": self.upstream.user})

    async def queue(self, request: Request) -> Response:
        page, per_page = integer(request, "page", 1), integer(request, "per_page", 100)
        offset, limit = core.window(page, per_page)
        req = QueueRequest(
            offset=offset,
            limit=limit,
            user=self.upstream.user,
            users=names(request, "user"),
            partitions=names(request, "partition"),
            states=tuple(s.upper() for s in names(request, "state")),
            all_states=flag(request, "all"),
            job_refs=names(request, "job"),
            accounts=names(request, "account"),
            names=names(request, "name"),
        )
        reply: QueueReply = await self.cached(
            ("queue", req), lambda: self.upstream.call("queue", req, QueueReply)
        )
        got = core.page_from(reply, page, per_page)
        if not got.jobs and got.total and got.page > got.pages:  # past the end: the last
            return json(core.page_from(await self._last(req, got), got.pages, per_page))
        return json(got)

    async def _last(self, req: QueueRequest, got: core.Page) -> QueueReply:
        offset = (got.pages - 1) * got.per_page
        last = msgspec.structs.replace(req, offset=offset)
        return await self.upstream.call("queue", last, QueueReply)

    async def _nodes(self) -> NodesReply:
        req = QueueRequest(user=self.upstream.user)
        reply: NodesReply = await self.cached(
            ("nodes",), lambda: self.upstream.call("nodes", req, NodesReply)
        )
        return reply

    async def nodes(self, request: Request) -> Response:
        return json(await self._nodes())

    async def gpumap(self, request: Request) -> Response:
        page, per_page = integer(request, "page", 1), integer(request, "per_page", 2000)
        return json(core.gpu_map((await self._nodes()).nodes, page, per_page))

    async def job(self, request: Request) -> Response:
        job_id = self._job_id(request)
        reply = await self.upstream.call(
            "show", ShowJobRequest(user=self.upstream.user, job_id=job_id), ShowJobReply
        )
        out = await self._output(reply)
        return json({**msgspec.to_builtins(reply), "output": out})

    @staticmethod
    def _job_id(request: Request) -> int:
        raw = request.path_params["job_id"]
        try:
            return int(raw)
        except ValueError as err:
            raise BadInput(f"{raw!r} is not a job id; write a number such as 12") from err

    async def _output(self, reply: ShowJobReply) -> dict[str, Any]:
        """The tail of the job's stdout, for the gateway's own user's jobs only."""
        job = reply.job
        if job.user != self.upstream.user:
            return {"path": None, "tail": "", "note": "only your own jobs' output is shown"}
        node = reply.attempts[-1].nodes[0] if reply.attempts and reply.attempts[-1].nodes else ""
        node = node or (job.nodelist[0] if job.nodelist else "")
        path = core.output_file(reply.spec, job, node)
        if path is None:
            return {"path": None, "tail": "", "note": "the job's spec does not name its output"}
        tail, note = await asyncio.to_thread(read_tail, path, self.tail_bytes)
        return {"path": path, "tail": tail, "note": note}

    async def share(self, request: Request) -> Response:
        req = {
            "user": self.upstream.user,
            "accounts": names(request, "account"),
            "users": names(request, "user"),
        }
        return json(await self.upstream.raw("share", req))

    async def acct(self, request: Request) -> Response:
        try:
            job_ids = tuple(int(j) for j in names(request, "job"))
        except ValueError as err:
            raise BadInput(f"job={request.query_params.get('job')!r}: expected job ids") from err
        req: dict[str, Any] = {
            "user": self.upstream.user,
            "job_ids": job_ids,
            "users": names(request, "user"),
            "accounts": names(request, "account"),
            "states": tuple(s.upper() for s in names(request, "state")),
            "since": number(request, "since"),
            "until": number(request, "until"),
            "attempts": not flag(request, "allocations"),
            "limit": integer(request, "limit", 1000),
        }
        return json(await self.upstream.raw("acct", req))

    def _window(self, request: Request) -> dict[str, Any]:
        """A report's request as the gateway's user, over `since` / `until`."""
        return {
            "user": self.upstream.user,
            "since": number(request, "since"),
            "until": number(request, "until"),
        }

    async def report(self, request: Request) -> Response:
        req: dict[str, Any] = {
            **self._window(request),
            "accounts": names(request, "account"),
            "users": names(request, "user"),
            "by_user": not flag(request, "accounts_only"),
        }
        return json(await self.upstream.raw("report", req))

    async def cluster_report(self, request: Request) -> Response:
        return json(await self.upstream.raw("cluster_report", self._window(request)))

    async def sizes_report(self, request: Request) -> Response:
        req = {**self._window(request), "accounts": names(request, "account")}
        grouping = request.query_params.get("grouping")
        if grouping:
            try:
                req["grouping"] = [int(w) for w in grouping.split(",") if w]
            except ValueError as err:
                raise BadInput(f"grouping={grouping!r}: give GPU counts, e.g. 8,64,256") from err
        return json(await self.upstream.raw("sizes_report", req))

    async def utilisation(self, request: Request) -> Response:
        hours = number(request, "hours") or 6.0
        bucket_s = number(request, "bucket_s") or max(60.0, hours * 3600 / 72)
        if not 0 < hours <= 24 * 14 or bucket_s < 10:
            raise BadInput("hours must be in (0, 336] and bucket_s at least 10")
        if self.pool is None:
            raise BadInput("this gateway has no database to read", "unavailable", 503)
        now = self.clock()
        start = now - hours * 3600
        async with self.pool.acquire() as conn:
            intervals, total = await repo.held_since(conn, start)
        return json(core.utilisation(intervals, total, start, now, bucket_s))

    # --- writes (carried out by admission; the gateway only relays) ----------------

    async def submit(self, request: Request) -> Response:
        req = await self._body(request, SubmitRequest)
        reply = await self.upstream.call("submit", req, SubmitReply)
        return json(reply, 200 if req.dry_run else 201)

    async def cancel(self, request: Request) -> Response:
        req = await self._body(request, JobSelector)
        return json(await self.upstream.raw("cancel", req))

    async def _body(self, request: Request, kind: type[R]) -> R:
        """The JSON body as `kind`, acting as the gateway's user (naming another user is
        refused: the gateway cannot sign for anyone else)."""
        try:
            req = msgspec.json.decode(await request.body(), type=kind)
        except (msgspec.DecodeError, msgspec.ValidationError) as err:
            raise BadInput(f"malformed request: {err}", "malformed") from err
        named = str(getattr(req, "user", ""))
        if named and named != self.upstream.user:
            raise BadInput(
                f"this gateway acts as {self.upstream.user} only, not {named}; "
                "leave `user` out, or run a gateway with that user's key",
                "user_mismatch",
                403,
            )
        return msgspec.structs.replace(req, user=self.upstream.user)

    async def openapi(self, request: Request) -> Response:
        return json(document())

    async def index(self, request: Request) -> Response:
        return FileResponse(STATIC / "index.html")


def read_tail(path: str, size: int) -> tuple[str, str]:
    """The last `size` bytes of `path` as text, and a note when it cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            length = f.tell()
            f.seek(max(0, length - size))
            data = f.read()
    except OSError as err:
        return "", f"cannot read {path}: {err.strerror}"
    note = f"last {len(data)} of {length} bytes" if length > size else ""
    return data.decode("utf-8", "replace"), note


def make_app(gw: Gateway) -> Starlette:
    routes = [
        Route("/", gw.index),
        Route("/openapi.json", gw.openapi),
        Route("/api/whoami", api(gw.whoami)),
        Route("/api/queue", api(gw.queue)),
        Route("/api/jobs/{job_id}", api(gw.job)),
        Route("/api/nodes", api(gw.nodes)),
        Route("/api/gpumap", api(gw.gpumap)),
        Route("/api/share", api(gw.share)),
        Route("/api/acct", api(gw.acct)),
        Route("/api/report", api(gw.report)),
        Route("/api/cluster_report", api(gw.cluster_report)),
        Route("/api/sizes_report", api(gw.sizes_report)),
        Route("/api/utilisation", api(gw.utilisation)),
        Route("/api/submit", api(gw.submit), methods=["POST"]),
        Route("/api/cancel", api(gw.cancel), methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    return Starlette(routes=routes)
