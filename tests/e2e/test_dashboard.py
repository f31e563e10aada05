"""End to end in a browser: the dashboard of a running local cluster, in headless
Chromium (Debian's `chromium`, driven by Playwright through `executable_path`; no
browser is downloaded). It shows every node and GPU, a running job on its GPUs, a node
taken out by an injected XID, and a job's page; screenshots go to the test's tmp dir
(MUSTER_DASHBOARD_SCREENSHOT=PATH also copies the GPU map there)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import asyncpg
import pytest

from muster.cluster import Cluster
from tests.support.cluster import eventually, inject, nodes, running_cluster, submit

pytestmark = pytest.mark.slow

CHROMIUM = os.environ.get("MUSTER_CHROMIUM", "/usr/bin/chromium")
playwright_api = pytest.importorskip(
    "playwright.async_api", reason="pip install playwright (its browsers are not needed)"
)
if not Path(CHROMIUM).exists():
    pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install -y chromium", allow_module_level=True)

JOB = "#!/bin/bash\necho training step 1\necho training step 2\nsleep 120\n"
NODES = nodes(3)
WAIT_MS = 60_000


async def gateway_url(c: Cluster, user: str = "root") -> str:
    key = c.plan_gateway()
    c.specs[key].env["MUSTER_USER"] = user
    c.respawn(key)
    return str(c.http)


async def test_the_dashboard_shows_nodes_a_running_job_a_drained_node_and_a_job_page(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    async with running_cluster(tmp_path / "state", nats_url, database_url, db, NODES) as c:
        url = await gateway_url(c)
        reply = await submit(c.nats_url, JOB, ("--gpus-per-node=2", "-J", "train"), str(tmp_path))
        (job_id,) = reply.job_ids
        await eventually(
            lambda: db.fetchval("SELECT state FROM job_runs WHERE job_id = $1", job_id),
            lambda s: s == "RUNNING",
            60,
            "job running",
        )
        busy = await db.fetchval(
            "SELECT g.node FROM allocation_gpus g JOIN allocations a USING (alloc_id)"
            " WHERE a.job_id = $1 AND g.live LIMIT 1",
            job_id,
        )
        faulty = next(n.name for n in NODES if n.name != busy)
        await inject(c.nats_url, faulty, 79, gpu=1)

        async with playwright_api.async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                page = await browser.new_page(viewport={"width": 1280, "height": 720})
                await page.goto(f"{url}/#gpus", wait_until="domcontentloaded")
                await page.wait_for_function(
                    "document.querySelectorAll('[data-node]').length === 3", timeout=WAIT_MS
                )
                assert await page.locator("[data-gpu]").count() == 12
                # The job's two GPUs carry its id, on the node the database placed it on.
                job_cells = page.locator(f'[data-job="{job_id}"]')
                await job_cells.first.wait_for(timeout=WAIT_MS)
                assert await job_cells.count() == 2
                assert (
                    await page.locator(f'[data-node="{busy}"] [data-job="{job_id}"]').count() == 2
                )
                # The XID takes its node out: not UP, its GPU unhealthy, the XID marked.
                node = page.locator(f'[data-node="{faulty}"]')
                await page.wait_for_function(
                    f"document.querySelector('[data-node=\"{faulty}\"]').dataset.state !== 'UP'",
                    timeout=WAIT_MS,
                )
                await page.locator(f'[data-gpu="{faulty}/1"][data-state="unhealthy"]').wait_for(
                    timeout=WAIT_MS
                )
                assert await node.locator("[data-xid='79']").count() == 1
                await page.screenshot(path=str(tmp_path / "gpus.png"), full_page=True)
                if target := os.environ.get("MUSTER_DASHBOARD_SCREENSHOT"):
                    shutil.copy(tmp_path / "gpus.png", target)

                await page.goto(f"{url}/#queue")
                await page.locator(f'tr[data-job="{job_id}"]').wait_for(timeout=WAIT_MS)
                assert "RUNNING" in await page.locator(f'tr[data-job="{job_id}"]').inner_text()
                await page.screenshot(path=str(tmp_path / "queue.png"), full_page=True)

                # The job page: its facts, its attempt, and its output's tail, live.
                await page.locator(f'a[href="#job/{job_id}"]').click()
                await page.wait_for_function(
                    "document.querySelector('#job-output').textContent.includes('step 2')",
                    timeout=WAIT_MS,
                )
                assert f"Job {job_id}: train" in await page.locator("#job-title").inner_text()
                assert await page.locator("[data-fact='state']").inner_text() == "RUNNING"
                assert await page.locator("#job-attempts tbody tr").count() >= 1
                await page.screenshot(path=str(tmp_path / "job.png"), full_page=True)
            finally:
                await browser.close()
