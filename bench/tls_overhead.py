"""What TLS costs a client of `muster up --tls`: PostgreSQL and NATS, each measured on
the same server with TLS and without.

PostgreSQL: one data folder (the system PostgreSQL, which has OpenSSL) started with TLS,
then again without it; for each, the time to open a connection (SCRAM login, and the
TLS handshake with verification) and `SELECT 1` round trips on an open one. NATS: one
server with TLS and one without; request-reply round trips through it. Prints one line
per figure, then one JSON object.

    .venv/bin/python bench/tls_overhead.py [--connects 50] [--queries 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg
import nats
from nats.aio.msg import Msg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from muster.secure_up import LocalSecurity
from shared import embedded
from shared.security import nats_options


async def timed(step: Callable[[], Awaitable[object]], count: int) -> list[float]:
    """Each of `count` runs of `step`, in microseconds."""
    took = []
    for _ in range(count):
        start = time.perf_counter()
        await step()
        took.append((time.perf_counter() - start) * 1e6)
    return took


async def pg_figures(url: str, connects: int, queries: int) -> dict[str, float]:
    async def connect() -> None:
        conn = await asyncpg.connect(url)
        await conn.close()

    opened = await timed(connect, connects)
    conn = await asyncpg.connect(url)
    try:
        ran = await timed(lambda: conn.fetchval("SELECT 1"), queries)
    finally:
        await conn.close()
    return {"connect_ms": statistics.median(opened) / 1000, "query_us": statistics.median(ran)}


async def nats_figures(url: str, ca: str, requests: int) -> float:
    async def echo(msg: Msg) -> None:
        await msg.respond(msg.data)

    nc = await nats.connect(url, **nats_options(tls_ca=ca))
    try:
        await nc.subscribe("bench.echo", cb=echo)
        ran = await timed(lambda: nc.request("bench.echo", b"x" * 256, timeout=5), requests)
    finally:
        await nc.close()
    return statistics.median(ran)


async def main(args: argparse.Namespace) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="muster-bench-tls-"))
    try:
        sec = LocalSecurity.make(root, [], tls=True)
        assert sec.tls is not None
        pg = embedded.start_postgres(root, password=sec.pg_password, tls=sec.tls)
        embedded.create_database(pg.url, "muster", password=sec.pg_password, ca=sec.pg_ca)
        url = sec.role_url(pg.url, "muster", "postgres")
        with_tls = await pg_figures(url, args.connects, args.queries)
        pg.stop()
        port = int(pg.url.rsplit(":", 1)[1])
        pg = embedded.start_postgres(root, port, password=sec.pg_password)
        plain = await pg_figures(re.sub(r"&sslmode=.*", "", url), args.connects, args.queries)
        pg.stop()
        secure_bus = embedded.start_nats(root / "tls-bus", config=sec.tls.nats_block())
        plain_bus = embedded.start_nats(root / "plain-bus")
        try:
            nats_tls = await nats_figures(secure_bus.url, str(sec.tls.ca), args.queries)
            nats_plain = await nats_figures(plain_bus.url, "", args.queries)
        finally:
            secure_bus.stop()
            plain_bus.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "pg_connect_ms_tls": round(with_tls["connect_ms"], 2),
        "pg_connect_ms_plain": round(plain["connect_ms"], 2),
        "pg_query_us_tls": round(with_tls["query_us"], 1),
        "pg_query_us_plain": round(plain["query_us"], 1),
        "nats_request_us_tls": round(nats_tls, 1),
        "nats_request_us_plain": round(nats_plain, 1),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connects", type=int, default=50)
    parser.add_argument("--queries", type=int, default=5000)
    figures = asyncio.run(main(parser.parse_args()))
    for key, value in figures.items():
        print(f"{key}: {value}")
    print(json.dumps(figures))
