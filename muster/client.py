"""Shell: the CLI's side of the API — one signed NATS request per command.

Every request is signed with the user's key (shared.identity): `MUSTER_KEY_FILE`, else
`NAME.nk` in `MUSTER_KEY_DIR` or in the local cluster's state folder (`.muster/keys`,
which `muster up` fills), NAME being the request's user, `MUSTER_USER` or the login
name; else `~/.muster/user.nk` (`muster keygen` writes it).

On a secured bus the connection itself needs a credential too (who may talk to the bus
at all, not who the user is): `MUSTER_NATS_CREDS`, else the users' one of the cluster
(`nats-users.nk` in its state folder), and `MUSTER_NATS_TLS_CA`, else its `tls/ca.pem`;
agent calls (`muster inject-fault`) use the operator's `secrets/nats-admin.nk` when this
user may read it."""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import msgspec

from shared.api import API_PREFIX, Envelope
from shared.identity import KEYGEN_HINT
from shared.identity_key import KeyFileError, load_signer
from shared.settings import nats_servers

if TYPE_CHECKING:  # nats-py (and asyncio) load only for the async calls, not a CLI command's
    from pathlib import Path  # neither does pathlib: a shim runs without site's imports

    from nats.aio.client import Client
    from nats.aio.msg import Msg

T = TypeVar("T")
NO_RESPONDERS_WAIT_S = 15.0
# Where a state folder keeps the bus credentials, as shared.security names them (that
# module's openssl and ssl imports stay off the CLI's path).
SECRETS = "secrets"
USERS_CREDS = "nats-users.nk"


class Signs(Protocol):
    """What signs a request: shared.identity.Signer (a test may pass its own)."""

    def sign(self, subject: str, body: bytes, *, now: float, nonce: bytes) -> bytes: ...


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
    if err.code in ("unknown_user", "unknown_key", "no_key", "user_mismatch"):
        print(
            "  (on the local cluster, act as one of deploy/local/cluster.toml's users, "
            "e.g. MUSTER_USER=alice)",
            file=sys.stderr,
        )
    return 1


def _state_dir() -> str:
    return os.environ.get("MUSTER_STATE_DIR", ".muster")


def nats_url(state_dir: str | None = None) -> str:
    if url := os.environ.get("MUSTER_NATS_URL"):
        return url
    folder = state_dir or _state_dir()
    cluster = os.path.join(folder, "cluster.json")
    if os.path.exists(cluster):
        with open(cluster, "rb") as f:
            url = str(msgspec.json.decode(f.read())["nats_url"])
        _state_of[url] = folder
        return url
    raise SystemExit("no cluster: run `muster up` here, or set MUSTER_NATS_URL")


def current_user() -> str:
    """The user a request names: `MUSTER_USER`, or "" (the server takes it from the key)."""
    return os.environ.get("MUSTER_USER", "")


def default_key_file() -> Path:
    from pathlib import Path

    return Path(_default_key_path())


def _default_key_path() -> str:
    return os.path.join(os.path.expanduser("~"), ".muster", "user.nk")


def key_file(user: str = "") -> Path:
    """The key file that signs for `user` (see the module docstring for the order)."""
    from pathlib import Path

    return Path(_key_path(user))


def _key_path(user: str) -> str:
    if path := os.environ.get("MUSTER_KEY_FILE"):
        return path
    name = user or os.environ.get("MUSTER_USER") or _login_name()
    state = os.path.join(_state_dir(), "keys")
    for folder in (os.environ.get("MUSTER_KEY_DIR"), state):
        if folder and os.path.exists(candidate := os.path.join(folder, f"{name}.nk")):
            return candidate
    return _default_key_path()


def _login_name() -> str:
    import getpass  # only when MUSTER_USER does not say

    return getpass.getuser()


_signers: dict[str, Signs] = {}
_state_of: dict[str, str] = {}  # a cluster's URL -> its state folder (from cluster.json)


def register_cluster(url: str, state_dir: str | os.PathLike[str]) -> None:
    """Connect to `url` with the credentials of the cluster in `state_dir`."""
    _state_of[url] = os.fspath(state_dir)


def bus_credentials(url: str, *, operator: bool = False) -> tuple[str, str]:
    """(NKey seed file, TLS CA file) to connect to the cluster at `url` with ("" each
    when it needs none; see the module docstring)."""
    folder = _state_of.get(url) or _state_dir()
    creds = os.environ.get("MUSTER_NATS_CREDS", "")
    admin = os.path.join(folder, SECRETS, "nats-admin.nk")
    if operator and os.access(admin, os.R_OK):
        creds = admin
    elif not creds and os.path.exists(users := os.path.join(folder, USERS_CREDS)):
        creds = users
    ca = os.environ.get("MUSTER_NATS_TLS_CA", "")
    if not ca and os.path.exists(pem := os.path.join(folder, "tls", "ca.pem")):
        ca = pem
    return creds, ca


def connect_options(url: str, *, operator: bool = False) -> dict[str, Any]:
    """How nats-py connects to the cluster at `url`: its bus credential and CA, if it
    has any (see the module docstring)."""
    from shared.security import nats_options

    return nats_options(*bus_credentials(url, operator=operator))


def signer_for(user: str = "") -> Signs:
    """The signer for `user`, read once per key file; ApiRefused says how to get one."""
    path = _key_path(user)
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
    nc = await nats.connect(nats_servers(url), connect_timeout=5, **connect_options(url))
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
    from muster import wire

    payload = signed(verb, req, signer)
    creds, ca = bus_credentials(url)
    subject = API_PREFIX + verb
    deadline = time.monotonic() + NO_RESPONDERS_WAIT_S
    while True:
        try:
            data = wire.request(
                nats_servers(url), subject, payload, timeout=timeout, creds=creds, tls_ca=ca
            )
            return _unwrap(data, reply)
        except wire.Unreachable as err:
            raise ApiRefused(f"{err}; is the cluster up?", "unreachable", ()) from err
        except wire.ServerError as err:
            raise ApiRefused(f"the bus refused this client: {err}", "bus_refused", ()) from err
        except wire.BadCredential as err:
            raise ApiRefused(f"{err}; see MUSTER_NATS_CREDS", "bus_refused", ()) from err
        except TimeoutError as err:
            raise ApiRefused(
                f"no reply on {subject} within {timeout:g} s", "unavailable", ()
            ) from err
        except ConnectionError as err:
            raise ApiRefused(f"{err} (at {url})", "unavailable", ()) from err
        except wire.NoResponders as err:
            if time.monotonic() > deadline:
                raise ApiRefused(_no_service(subject), "unavailable", ()) from err
        time.sleep(0.2)
        payload = signed(verb, req, signer)  # a fresh nonce: a resend is not a replay


def _no_service(subject: str) -> str:
    service = "fairshare" if subject.endswith((".share", ".acct")) else "admission"
    return f"no {service} service answers on {subject}; is the cluster up?"


async def _request(nc: Client, subject: str, payload: bytes, timeout: float) -> Msg:
    """A request that waits out a cluster still starting: with no service subscribed
    yet, retry for up to NO_RESPONDERS_WAIT_S before saying so."""
    import asyncio

    from nats.errors import NoRespondersError

    deadline = time.monotonic() + NO_RESPONDERS_WAIT_S
    while True:
        try:
            return await nc.request(subject, payload, timeout=timeout)
        except NoRespondersError as err:
            if time.monotonic() > deadline:
                raise ApiRefused(_no_service(subject), "unavailable", ()) from err
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
