"""Admission throughput: sustained accepted submissions per second, end to end.

Starts embedded NATS and PostgreSQL, four registered 4-GPU nodes (rows, no agents: only
admission is measured) and `--replicas` admission processes validating against the
local cluster's configuration. `--clients` concurrent clients (spread over
`--connections` NATS connections in `--client-procs` processes) submit a one-line job
for `--seconds`. A submission counts once its reply said accepted; the run ends when
every accepted job's `job.submitted` event is in JetStream. The figure is

    accepted / (last event published - first request sent)

so it includes parse, validation against the configuration and the nodes, the commit
(job row + outbox, one transaction) and the relay's publish.

    .venv/bin/python bench/admission_throughput.py [--replicas 1] [--seconds 10]

Every request is signed (shared.identity) with its user's key, each with a fresh nonce,
and admission verifies each signature, as in production: authentication cannot be
switched off. The local configuration's per-user submit limits (500 queued jobs, and
the submit rate of `[limits]`) would refuse most of a benchmark's jobs, so they are
lifted here; with a queued-jobs limit set, admission counts the user's queued jobs in
the same transaction (one more query per submission).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import asyncpg
import msgspec
import nats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._local import start_nats
from muster.cluster import Cluster
from shared import embedded
from shared.api import API_PREFIX, Envelope, QueueRequest, SubmitRequest
from shared.bus import STREAM
from shared.identity import Signer
from shared.identity_files import load_signer, provision_keys
from shared.urls import nats_servers

REPO = Path(__file__).resolve().parent.parent
SCRIPT = "#!/bin/bash\n#SBATCH --gpus-per-node=1\ntrue\n"
USERS = ("alice", "bob", "carol", "dave")


def bench_config(folder: Path) -> Path:
    text = (REPO / "deploy" / "local" / "cluster.toml").read_text()
    text = re.sub(r"(?m)^max_submitted_jobs_per_\w+ = \d+\n", "", text)
    text += "\n[limits]\nsubmit_rate = 1e9\nsubmit_burst = 1000000000\n"
    path = folder / "cluster.toml"
    path.write_text(text)
    return path


async def register_nodes(db_url: str) -> None:
    db = await asyncpg.connect(db_url)
    try:
        for _ in range(100):  # admission creates the tables as it starts
            try:
                await db.fetchval("SELECT count(*) FROM gpus")
                break
            except asyncpg.UndefinedTableError:
                await asyncio.sleep(0.1)
        for i in range(1, 5):
            await db.execute("INSERT INTO nodes(name) VALUES ($1)", f"node{i:02d}")
            await db.executemany(
                "INSERT INTO gpus(node, idx, model) VALUES ($1, $2, 'SIM-H100')",
                [(f"node{i:02d}", g) for g in range(4)],
            )
    finally:
        await db.close()


def signers(keys: str) -> list[Signer]:
    return [load_signer(f"{keys}/{user}.nk") for user in USERS]


def sign(signer: Signer, body: bytes) -> bytes:
    return signer.sign(API_PREFIX + "submit", body, now=time.time(), nonce=os.urandom(16))


async def wait_ready(url: str, replicas: int, signer: Signer) -> None:
    nc = await nats.connect(nats_servers(url))
    body = msgspec.json.encode(QueueRequest(job_ids=(0,)))
    try:
        for _ in range(300):
            try:
                payload = signer.sign(
                    API_PREFIX + "queue", body, now=time.time(), nonce=os.urandom(16)
                )
                raw = await nc.request(API_PREFIX + "queue", payload, timeout=1)
                if msgspec.json.decode(raw.data, type=Envelope).error is None:
                    break
            except Exception:
                await asyncio.sleep(0.2)
        await asyncio.sleep(1.0 + 0.3 * replicas)  # every replica subscribed
    finally:
        await nc.close()


async def client_proc(
    url: str, clients: int, connections: int, seconds: float, keys: str
) -> dict[str, int]:
    conns = [await nats.connect(nats_servers(url)) for _ in range(connections)]
    bodies = list(
        zip(
            signers(keys),
            (
                msgspec.json.encode(SubmitRequest(script=SCRIPT, script_path="job.sh"))
                for _ in USERS
            ),
            strict=True,
        )
    )
    accepted = refused = errors = 0
    deadline = time.monotonic() + seconds

    async def one(i: int) -> None:
        nonlocal accepted, refused, errors
        nc = conns[i % len(conns)]
        signer, body = bodies[i % len(bodies)]
        while time.monotonic() < deadline:
            try:  # each request signed afresh: a nonce is accepted once
                msg = await nc.request(API_PREFIX + "submit", sign(signer, body), timeout=10)
            except Exception:
                errors += 1
                continue
            env = msgspec.json.decode(msg.data, type=Envelope)
            if env.error is None:
                accepted += 1
            else:
                refused += 1

    await asyncio.gather(*(one(i) for i in range(clients)))
    for nc in conns:
        await nc.close()
    return {"accepted": accepted, "refused": refused, "errors": errors}


def _client_main(
    url: str,
    clients: int,
    connections: int,
    seconds: float,
    keys: str,
    out: mp.Queue[dict[str, int]],
) -> None:
    import uvloop

    out.put(uvloop.run(client_proc(url, clients, connections, seconds, keys)))


async def drained(url: str, db_url: str, accepted: int) -> tuple[float, int, int]:
    """Wait until the outbox is empty; (last publish epoch, events in JetStream, jobs)."""
    db = await asyncpg.connect(db_url)
    nc = await nats.connect(nats_servers(url))
    try:
        for _ in range(2400):  # two minutes at most
            if not await db.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL"):
                break
            await asyncio.sleep(0.05)
        last = await db.fetchval("SELECT extract(epoch FROM max(published_at))::float8 FROM outbox")
        jobs = await db.fetchval("SELECT count(*) FROM jobs")
        info = await nc.jetstream().stream_info(STREAM, subjects_filter="muster.job.submitted")
        return float(last), int(info.state.messages), int(jobs)
    finally:
        await db.close()
        await nc.close()


def run(args: argparse.Namespace) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="muster-bench-") as tmp:
        state = Path(tmp)
        state.chmod(0o755)
        config = bench_config(state)
        nats_server = start_nats(state, args.nats_servers)
        pg = embedded.start_postgres(state, fast=True)
        keys = str(state / "keys")
        provision_keys(keys, USERS)
        os.environ.update(
            MUSTER_LOG_LEVEL="WARNING",
            MUSTER_CLUSTER_CONFIG=str(config),
            MUSTER_USER_KEYS_DIR=keys,
        )
        cluster = Cluster(
            state,
            nats_server.url,
            embedded.create_database(pg.url, "muster"),
            stream_replicas=min(args.nats_servers, 3),
        )
        try:
            for i in range(args.replicas):
                key = "admission" if i == 0 else f"admission-{i}"
                cluster.spawn(key, "services.admission", MUSTER_INSTANCE=str(i))
            asyncio.run(register_nodes(cluster.database_url))
            asyncio.run(wait_ready(cluster.nats_url, args.replicas, signers(keys)[0]))
            out: mp.Queue[dict[str, int]] = mp.Queue()
            per = max(1, args.clients // args.client_procs)
            procs = [
                mp.Process(
                    target=_client_main,
                    args=(cluster.nats_url, per, args.connections, args.seconds, keys, out),
                )
                for _ in range(args.client_procs)
            ]
            t0 = time.time()
            for p in procs:
                p.start()
            results = [out.get(timeout=args.seconds + 120) for _ in procs]
            for p in procs:
                p.join()
            accepted = sum(r["accepted"] for r in results)
            last, events, jobs = asyncio.run(
                drained(cluster.nats_url, cluster.database_url, accepted)
            )
        finally:
            cluster.stop_all()
            nats_server.stop()
            pg.stop()
    elapsed = last - t0
    return {
        "bench": "admission_throughput",
        "replicas": args.replicas,
        "nats_servers": args.nats_servers,
        "clients": per * args.client_procs,
        "seconds": args.seconds,
        "accepted": accepted,
        "refused": sum(r["refused"] for r in results),
        "errors": sum(r["errors"] for r in results),
        "jobs_committed": jobs,
        "events_in_jetstream": events,
        "elapsed_to_last_publish_s": round(elapsed, 3),
        "accepted_per_s": round(accepted / elapsed, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--nats-servers", type=int, default=1, choices=(1, 3))
    parser.add_argument("--clients", type=int, default=256)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--client-procs", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    result = run(args)
    print(
        f"admission: {result['accepted_per_s']} accepted submissions/s end to end "
        f"({result['accepted']} jobs in {result['elapsed_to_last_publish_s']} s, "
        f"{args.replicas} replica(s), {result['clients']} clients; "
        f"{result['events_in_jetstream']} events in JetStream)"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
