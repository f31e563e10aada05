"""Shell: the CLI's side of the API — one signed NATS request per command.

Every request is signed with the user's key (shared.identity): `MUSTER_KEY_FILE`, else
`NAME.nk` in `MUSTER_KEY_DIR` or in the local cluster's state folder (`.muster/keys`,
which `muster up` fills), NAME being the request's user, `MUSTER_USER` or the login
name; else `~/.muster/user.nk` (`muster keygen` writes it).

On a secured bus the connection is the user's too: it authenticates with the same key
(`MUSTER_NATS_CREDS` names another) and takes its replies on the user's own inboxes,
`_INBOX.<user>` (the only ones that key may read), and `MUSTER_NATS_TLS_CA`, else the
cluster's `tls/ca.pem`; agent calls (`muster inject-fault`) use the operator's
`secrets/nats-admin.nk` when this user may read it."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import msgspec

from muster.client_env import (  # re-exported: the commands take them from here
    bus_credentials,
    current_user,
    default_key_path,
    key_path,
    nats_url,
    register_cluster,
)
from muster.refusal import ApiRefused, print_refusal
from shared.api import API_PREFIX, Envelope
from shared.identity_key import KEYGEN_HINT, KeyFileError, load_signer
from shared.urls import nats_servers

if TYPE_CHECKING:  # nats-py (and asyncio) load only for the async calls, not a CLI command's
    from pathlib import Path  # neither does pathlib: a shim runs without site's imports

    from nats.aio.client import Client
    from nats.aio.msg import Msg

T = TypeVar("T")


class Signs(Protocol):
    """What signs a request: shared.identity.Signer (a test may pass its own)."""

    def sign(self, subject: str, body: bytes, *, now: float, nonce: bytes) -> bytes: ...


def refused(verb: str, err: ApiRefused) -> int:
    """Tell the user what the API refused and what to change; the command's exit status."""
    print_refusal(f"muster {verb}", str(err), err.code, err.details)
    return 1


def default_key_file() -> Path:
    from pathlib import Path

    return Path(default_key_path())


def key_file(user: str = "") -> Path:
    """The key file that signs for `user` (see the module docstring for the order)."""
    from pathlib import Path

    return Path(key_path(user))


_signers: dict[str, Signs] = {}


def connect_options(url: str, *, operator: bool = False, user: str = "") -> dict[str, Any]:
    """How nats-py connects to the cluster at `url` as `user`: its bus credential, CA
    and inbox prefix (see the module docstring)."""
    from shared.security import nats_options

    return nats_options(*bus_credentials(url, operator=operator, user=user))


def signer_for(user: str = "") -> Signs:
    """The signer for `user`, read once per key file; ApiRefused says how to get one."""
    path = key_path(user)
    if path not in _signers:
        try:
            _signers[path] = load_signer(path)
        except KeyFileError as err:
            raise ApiRefused(f"no usable key: {err}; {KEYGEN_HINT}", "no_key", ()) from err
    return _signers[path]


def signed(verb: str, request: msgspec.Struct, signer: Signs | None = None) -> bytes:
    """The wire bytes of `request` to `muster.api.<verb>`, signed now with a fresh nonce."""
    signer = signer or signer_for(str(getattr(request, "user", "")))
    body = msgspec.json.encode(request)
    return signer.sign(API_PREFIX + verb, body, now=time.time(), nonce=os.urandom(16))


async def call(
    url: str,
    verb: str,
    request: msgspec.Struct,
    reply: type[T],
    timeout: float = 15.0,
    signer: Signs | None = None,
) -> T:
    import nats

    payload = signed(verb, request, signer)
    user = str(getattr(request, "user", ""))
    options = connect_options(url, user=user)
    nc = await nats.connect(nats_servers(url), connect_timeout=5, **options)
    try:
        msg = await _request(nc, API_PREFIX + verb, payload, timeout)
    finally:
        await nc.close()
    return _unwrap(msg.data, reply)


def _unwrap(data: bytes, reply: type[T]) -> T:
    env = msgspec.json.decode(data, type=Envelope)
    if env.error is not None:
        raise ApiRefused(env.error.error, env.error.code, env.error.details)
    return msgspec.json.decode(env.ok, type=reply)


def request(
    url: str,
    verb: str,
    req: msgspec.Struct,
    reply: type[T],
    timeout: float = 15.0,
    signer: Signs | None = None,
) -> T:
    """`call` for a one-shot command: the same signed request over a blocking socket
    (muster.wire), without loading asyncio or nats-py. An unreachable cluster, a
    refused credential or a missing service is an ApiRefused saying so."""
    from muster.exchange import exchange

    user = str(getattr(req, "user", ""))
    data = exchange(url, verb, lambda: signed(verb, req, signer), timeout, user)
    return _unwrap(data, reply)


__all__ = [
    "ApiRefused",
    "bus_credentials",
    "current_user",
    "nats_url",
    "register_cluster",
    "request",
]


async def _request(nc: Client, subject: str, payload: bytes, timeout: float) -> Msg:
    """A request that waits out a cluster still starting: with no service subscribed
    yet, retry for up to NO_RESPONDERS_WAIT_S before saying so."""
    import asyncio

    from nats.errors import NoRespondersError

    from muster.exchange import NO_RESPONDERS_WAIT_S, no_service

    deadline = time.monotonic() + NO_RESPONDERS_WAIT_S
    while True:
        try:
            return await nc.request(subject, payload, timeout=timeout)
        except NoRespondersError as err:
            if time.monotonic() > deadline:
                raise ApiRefused(no_service(subject), "unavailable", ()) from err
            await asyncio.sleep(0.2)


async def agent(
    url: str, node: str, verb: str, body: msgspec.Struct, timeout: float = 10.0
) -> bytes:
    import nats

    options = connect_options(url, operator=True)
    nc = await nats.connect(nats_servers(url), connect_timeout=5, **options)
    try:
        msg = await nc.request(
            f"muster.agent.{node}.{verb}", msgspec.json.encode(body), timeout=timeout
        )
    finally:
        await nc.close()
    return msg.data
