"""End to end, on real NATS, PostgreSQL and processes: the gateway's REST API. Every
endpoint answers from a running local cluster, acting as the gateway's one user (root,
whose jobs can run on this machine); every refusal is a 4xx whose message is the one
the CLI prints (the gateway acting as alice, an ordinary user), and leaves nothing in
the database."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from muster.cluster import Cluster, NodeDef
from tests.support.cluster import eventually, nodes, run_cli, running_cluster, submit

pytestmark = pytest.mark.slow

ALICE = "alice"  # exists only in the cluster's directory: her jobs are refused, not run
PRINTS = "#!/bin/bash\necho hello-from-the-gateway\nsleep 60\n"


@asynccontextmanager
async def gateway_cluster(
    tmp_path: Path,
    nats_url: str,
    database_url: str,
    db: asyncpg.Connection,
    defs: list[NodeDef],
    user: str,
) -> AsyncIterator[tuple[Cluster, httpx.AsyncClient]]:
    """Every service and `defs`, plus the gateway acting as `user`; a client on it once
    it answers."""
    async with running_cluster(tmp_path / "state", nats_url, database_url, db, defs) as c:
        key = c.plan_gateway()
        c.specs[key].env["MUSTER_USER"] = user
        c.respawn(key)
        async with httpx.AsyncClient(base_url=c.http, timeout=30) as client:
            await eventually(lambda: whoami(client), lambda u: u == user, 60, "gateway")
            yield c, client


async def whoami(client: httpx.AsyncClient) -> str | None:
    try:
        return str((await client.get("/api/whoami")).json()["user"])
    except httpx.TransportError:
        return None


async def json_of(client: httpx.AsyncClient, path: str, **params: Any) -> Any:
    r = await client.get(path, params=params)
    assert r.status_code == 200, r.text
    return r.json()


async def test_every_endpoint_answers_as_the_gateway_user(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    async with gateway_cluster(tmp_path, nats_url, database_url, db, nodes(2), "root") as (
        _c,
        http,
    ):
        doc = await json_of(http, "/openapi.json")
        assert {
            "/api/submit",
            "/api/cancel",
            "/api/queue",
            "/api/jobs/{job_id}",
            "/api/nodes",
            "/api/gpumap",
            "/api/share",
            "/api/acct",
            "/api/report",
            "/api/cluster_report",
            "/api/sizes_report",
            "/api/utilisation",
        } <= set(doc["paths"])
        assert "SubmitRequest" in doc["components"]["schemas"]
        assert "<title>Muster</title>" in (await http.get("/")).text

        body = {
            "argv": ["--gpus-per-node=2", "-J", "gw"],
            "script": PRINTS,
            "workdir": str(tmp_path),
            "script_path": "job.sh",
        }
        r = await http.post("/api/submit", json=body)
        assert r.status_code == 201, r.text
        (job_id,) = r.json()["job_ids"]
        assert await db.fetchval("SELECT user_name FROM jobs WHERE job_id = $1", job_id) == "root"

        async def row() -> dict[str, Any]:
            page = await json_of(http, "/api/queue", user="root")
            return next(j for j in page["jobs"] if j["job_id"] == job_id)

        running = await eventually(row, lambda j: j["state"] == "RUNNING", 60, "job running")
        assert running["gpus"] == 2 and running["name"] == "gw"

        async def shown() -> dict[str, Any]:
            return dict(await json_of(http, f"/api/jobs/{job_id}"))

        job = await eventually(
            shown, lambda j: "hello-from-the-gateway" in j["output"]["tail"], 60, "output"
        )
        assert job["job"]["state"] == "RUNNING" and len(job["attempts"]) >= 1
        assert job["output"]["path"] == str(tmp_path / f"slurm-{job_id}.out")

        listed = await json_of(http, "/api/nodes")
        assert sorted(n["name"] for n in listed["nodes"]) == ["node01", "node02"]
        gmap = await json_of(http, "/api/gpumap")
        held = [
            (n["name"], cell[0]) for n in gmap["nodes"] for cell in n["gpus"] if cell[2] == job_id
        ]
        assert len(held) == 2 and all(
            cell[1] == "allocated" for n in gmap["nodes"] for cell in n["gpus"] if cell[2] == job_id
        )
        assert gmap["by_state"]["allocated"] == 2 and gmap["total"] == 2

        share = await json_of(http, "/api/share")
        assert "rows" in share and "algorithm" in share
        acct = await json_of(http, "/api/acct", job=str(job_id))
        assert {r["job_id"] for r in acct["rows"]} == {job_id}
        report = await json_of(http, "/api/report", since=0, accounts_only=1)
        assert report["since"] == 0 and all(r["user"] is None for r in report["rows"])
        cluster = await json_of(http, "/api/cluster_report", since=0)
        assert cluster["since"] == 0 and cluster["usage"]["allocated_s"] > 0  # the job's
        sizes = await json_of(http, "/api/sizes_report", since=0, grouping="2,8")
        assert sizes["grouping"] == [2, 8] and sizes["rows"][0]["jobs"] == [0, 1, 0]
        util = await json_of(http, "/api/utilisation", hours=1)
        assert util["total_gpus"] == 8 and util["busy"][-1] > 0

        r = await http.post("/api/cancel", json={"job_ids": [job_id]})
        assert r.status_code == 200, r.text
        assert r.json()["job_ids"] == [job_id]
        await eventually(row_state(http, job_id), lambda s: s == "CANCELLED", 60, "cancelled")


def row_state(http: httpx.AsyncClient, job_id: int) -> Any:
    async def probe() -> str:
        return str((await json_of(http, f"/api/jobs/{job_id}"))["job"]["state"])

    return probe


async def counts(db: asyncpg.Connection) -> tuple[int, int, int]:
    return (
        await db.fetchval("SELECT count(*) FROM jobs"),
        await db.fetchval("SELECT count(*) FROM outbox"),
        await db.fetchval("SELECT count(*) FROM jobs WHERE cancel_requested_at IS NOT NULL"),
    )


def cli_says(c: Cluster, verb: str, *args: str) -> str:
    """The first line the CLI prints on stderr for the same request, as alice."""
    env = {
        "MUSTER_USER": ALICE,
        "MUSTER_NATS_URL": c.nats_url,
        "CWD": str(c.state_dir.parent),
    }
    done = run_cli(verb, *args, env=env)
    assert done.returncode != 0, done
    return done.stderr.splitlines()[0]


async def test_every_refusal_is_a_4xx_with_the_clis_message_and_nothing_is_kept(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    async with gateway_cluster(tmp_path, nats_url, database_url, db, [], ALICE) as (c, http):
        (bobs,) = (await submit(c.nats_url, PRINTS, ("--hold",), user="bob")).job_ids
        before = await counts(db)
        (tmp_path / "job.sh").write_text(PRINTS)

        async def refused(r: httpx.Response, status: int, code: str) -> str:
            assert r.status_code == status, r.text
            assert r.json()["code"] == code, r.text
            return str(r.json()["error"])

        bad_time = {"argv": ["--time=banana"], "script": PRINTS, "script_path": "job.sh"}
        said = await refused(await http.post("/api/submit", json=bad_time), 400, "invalid")
        assert cli_says(c, "submit", "--time=banana", "job.sh") == (f"muster submit: {said}")
        said = await refused(await http.get("/api/jobs/999999"), 404, "not_found")
        assert cli_says(c, "show", "job", "999999") == f"muster show: {said}"

        said = await refused(await http.post("/api/submit", content=b"{not json"), 400, "malformed")
        assert said.startswith("malformed request:")
        no_script = await http.post("/api/submit", json={"argv": []})
        assert "script" in await refused(no_script, 400, "malformed")
        as_bob = {**bad_time, "argv": [], "user": "bob"}
        assert "acts as alice only" in await refused(
            await http.post("/api/submit", json=as_bob), 403, "user_mismatch"
        )
        bad_signal = {"job_ids": [bobs], "signal": "SIGBOGUS"}
        await refused(await http.post("/api/cancel", json=bad_signal), 400, "invalid")
        await refused(await http.get("/api/jobs/abc"), 400, "invalid")
        await refused(await http.get("/api/queue", params={"page": "x"}), 400, "invalid")
        await refused(await http.get("/api/queue", params={"job": "12_[x"}), 400, "invalid")
        await refused(await http.get("/api/acct", params={"limit": "0"}), 400, "malformed")
        await refused(await http.get("/api/acct", params={"since": "soon"}), 400, "invalid")
        later = {"since": "7200", "until": "3600"}
        said = await refused(await http.get("/api/report", params=later), 400, "invalid")
        assert "give an end (-E) after the start (-S)" in said
        await refused(await http.get("/api/utilisation", params={"hours": "-1"}), 400, "invalid")
        await refused(await http.get("/api/gpumap", params={"page": "one"}), 400, "invalid")

        said = await refused(
            await http.post("/api/cancel", json={"job_ids": [bobs]}), 403, "forbidden"
        )
        assert cli_says(c, "cancel", str(bobs)) == f"muster cancel: {said}"
        assert await counts(db) == before
