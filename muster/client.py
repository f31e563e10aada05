"""Shell: the CLI's side of the API — one NATS request per command."""

from __future__ import annotations

import asyncio
import getpass
import json
import os
import sys
import time
from pathlib import Path
from typing import TypeVar

import msgspec
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError

from shared.api import API_PREFIX, Envelope

T = TypeVar("T")
NO_RESPONDERS_WAIT_S = 15.0


class ApiRefused(Exception):
    def __init__(self, message: str, code: str, details: tuple[str, ...]) -> None:
        super().__init__(message)
        self.code = code
        self.details = details


def refused(verb: str, err: ApiRefused) -> int:
    """Tell the user what the API refused and what to change; the command's exit status."""
    print(f"muster {verb}: {err}", file=sys.stderr)
    for detail in err.details:
        if detail != str(err):
            print(f"  {detail}", file=sys.stderr)
    if err.code == "unknown_user":
        print(
            "  (on the local cluster, act as one of deploy/local/cluster.toml's users, "
            "e.g. MUSTER_USER=alice)",
            file=sys.stderr,
        )
    return 1


def nats_url(state_dir: str | None = None) -> str:
    if url := os.environ.get("MUSTER_NATS_URL"):
        return url
    state = Path(state_dir or os.environ.get("MUSTER_STATE_DIR", ".muster")) / "cluster.json"
    if state.exists():
        return str(json.loads(state.read_text())["nats_url"])
    raise SystemExit("no cluster: run `muster up` here, or set MUSTER_NATS_URL")


def current_user() -> str:
    return os.environ.get("MUSTER_USER") or getpass.getuser()


async def call(
    url: str, verb: str, request: msgspec.Struct, reply: type[T], timeout: float = 15.0
) -> T:
    nc = await nats.connect(url, connect_timeout=5)
    try:
        msg = await _request(nc, API_PREFIX + verb, msgspec.json.encode(request), timeout)
    finally:
        await nc.close()
    env = msgspec.json.decode(msg.data, type=Envelope)
    if env.error is not None:
        raise ApiRefused(env.error.error, env.error.code, env.error.details)
    return msgspec.json.decode(env.ok, type=reply)


async def _request(nc: Client, subject: str, payload: bytes, timeout: float) -> Msg:
    """A request that waits out a cluster still starting: with no service subscribed
    yet, retry for up to NO_RESPONDERS_WAIT_S before saying so."""
    deadline = time.monotonic() + NO_RESPONDERS_WAIT_S
    while True:
        try:
            return await nc.request(subject, payload, timeout=timeout)
        except NoRespondersError as err:
            if time.monotonic() > deadline:
                service = "fairshare" if subject.endswith((".share", ".acct")) else "admission"
                raise ApiRefused(
                    f"no {service} service answers on {subject}; is the cluster up?",
                    "unavailable",
                    (),
                ) from err
            await asyncio.sleep(0.2)


async def agent(
    url: str, node: str, verb: str, body: msgspec.Struct, timeout: float = 10.0
) -> bytes:
    nc = await nats.connect(url, connect_timeout=5)
    try:
        msg = await nc.request(
            f"muster.agent.{node}.{verb}", msgspec.json.encode(body), timeout=timeout
        )
    finally:
        await nc.close()
    return msg.data
