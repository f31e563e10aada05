"""Pure core + plumbing: the launcher's signature on what a node agent may run or stop.

The launcher holds a service key (an ed25519 NKey seed, like a user's); every
`muster.agent.<node>.start` and `.stop` request it sends carries an `AgentToken`: an
`AgentGrant` (verb, job, allocation attempt, generation, node, run-as user, expiry and
the sha256 `digest` of the request's every other field) and the signature of that
grant. An agent trusts the public keys listed in one file (several during a rotation)
and refuses, as a value with a code and a message, a request with no token, a key it
does not trust, a bad signature, an expired grant, a grant for another node, verb or
worker, or a body changed after signing. Nothing runs before `check` says None.

Files: `<state_dir>/launcher/launcher.nk` (the seed, 0600, read only by the launcher)
and `<state_dir>/launcher/launcher.pub` (trusted public keys, one a line), made by
`ensure_launcher_key` for a local cluster; MUSTER_STATE_DIR places them (docs/security.md).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import os
from enum import StrEnum
from pathlib import Path
from typing import TypeVar

import msgspec
import nacl.exceptions
import nacl.signing

from shared.api import AgentGrant, AgentToken, StepLaunch, StepStop, StopWorkers, WorkerSpec
from shared.identity import Signer, encode_seed, public_key_bytes
from shared.identity_files import load_signer, write_seed

GRANT_TTL_S = 300.0  # a grant is good this long after the launcher signed it
MAX_AHEAD_S = GRANT_TTL_S + 60.0  # an expiry further ahead: a clock far off, refused
_DOMAIN = b"MUSTER-AGENT-1\n"

Body = TypeVar("Body", bound=WorkerSpec | StopWorkers | StepLaunch | StepStop)


class GrantCode(StrEnum):
    UNSIGNED = "unsigned"
    NO_TRUSTED_KEYS = "no_trusted_keys"
    UNTRUSTED_KEY = "untrusted_key"
    BAD_SIGNATURE = "bad_signature"
    EXPIRED = "expired"
    WRONG_VERB = "wrong_verb"
    WRONG_NODE = "wrong_node"
    WRONG_WORKER = "wrong_worker"
    ALTERED = "altered"


class GrantRefusal(msgspec.Struct, frozen=True, kw_only=True):
    code: GrantCode
    message: str


def digest(body: WorkerSpec | StopWorkers | StepLaunch | StepStop) -> str:
    """sha256 of the request without its token, fields and keys in sorted order."""
    bare = msgspec.structs.replace(body, token=None)
    # As the agent will see it: decoded from the wire, so a value the launcher holds as
    # an int in a float field (a grace of 2) is the float the agent decodes (2.0), and
    # both sides hash the same bytes.
    seen = msgspec.json.decode(msgspec.json.encode(bare), type=type(bare))
    raw = msgspec.json.encode(seen, order="sorted")
    return hashlib.sha256(raw).hexdigest()


def signed_bytes(grant: AgentGrant) -> bytes:
    return _DOMAIN + msgspec.json.encode(grant, order="sorted")


def _user_of(body: WorkerSpec | StopWorkers | StepLaunch | StepStop) -> str:
    return (body.run_as or "") if isinstance(body, WorkerSpec | StepLaunch) else ""


def _verb_of(body: WorkerSpec | StopWorkers | StepLaunch | StepStop) -> str:
    if isinstance(body, StepLaunch):  # a job step (srun) inside the running worker's job
        return "step"
    if isinstance(body, StepStop):
        return "step_stop"
    return "start" if isinstance(body, WorkerSpec) else "stop"


class GrantSigner:
    """The launcher's side: signs each start and stop for the node it is sent to."""

    def __init__(self, signer: Signer, ttl_s: float = GRANT_TTL_S) -> None:
        self._signer = signer
        self.public_key = signer.public_key
        self.ttl_s = ttl_s

    def sign(self, body: Body, node: str, *, now: float) -> Body:
        """`body` with its token: a grant for `node` until `ttl_s` from `now`."""
        grant = AgentGrant(
            verb=_verb_of(body),
            job_id=body.job_id,
            attempt=body.attempt,
            generation=body.generation,
            node=node,
            user=_user_of(body),
            expires_ms=int((now + self.ttl_s) * 1000),
            digest=digest(body),
        )
        sig = base64.b64encode(self._signer.sign_bytes(signed_bytes(grant))).decode()
        token = AgentToken(key=self.public_key, sig=sig, grant=grant)
        return msgspec.structs.replace(body, token=token)


def _refuse(code: GrantCode, message: str) -> GrantRefusal:
    return GrantRefusal(code=code, message=f"refused ({code}): {message}")


def check(
    body: WorkerSpec | StopWorkers | StepLaunch | StepStop,
    *,
    node: str,
    trusted: frozenset[str],
    now: float,
) -> GrantRefusal | None:
    """None when the launcher signed exactly this request for this node, now; else why not."""
    token, verb = body.token, _verb_of(body)
    if not trusted:
        return _refuse(
            GrantCode.NO_TRUSTED_KEYS,
            f"node {node} trusts no launcher key: list the launcher's public key in "
            "<state_dir>/launcher/launcher.pub (muster up writes it)",
        )
    if token is None:
        return _refuse(
            GrantCode.UNSIGNED, f"a {verb} without the launcher's token; only the launcher may"
        )
    if token.key not in trusted:
        return _refuse(
            GrantCode.UNTRUSTED_KEY,
            f"signed by {token.key[:12]}..., not a launcher key node {node} trusts",
        )
    if not _valid(token):
        return _refuse(GrantCode.BAD_SIGNATURE, "the token's signature does not match its grant")
    grant, now_ms = token.grant, int(now * 1000)
    if grant.verb != verb:
        return _refuse(GrantCode.WRONG_VERB, f"a grant to {grant.verb}, not to {verb}")
    if grant.node != node:
        return _refuse(GrantCode.WRONG_NODE, f"a grant for node {grant.node}, not {node}")
    if now_ms > grant.expires_ms or grant.expires_ms - now_ms > MAX_AHEAD_S * 1000:
        return _refuse(
            GrantCode.EXPIRED,
            f"the grant expires at {grant.expires_ms} ms, this node's clock says {now_ms}: "
            "a stale request, or the clocks disagree (NTP)",
        )
    target = (body.job_id, body.attempt, body.generation, _user_of(body))
    if (grant.job_id, grant.attempt, grant.generation, grant.user) != target:
        return _refuse(GrantCode.WRONG_WORKER, "the grant names another job, attempt or user")
    if grant.digest != digest(body):
        return _refuse(GrantCode.ALTERED, "the request was changed after the launcher signed it")
    return None


# Verify keys decoded once: only trusted keys reach `_valid`, so this stays a handful.
_VERIFY_KEYS: dict[str, nacl.signing.VerifyKey] = {}


def _valid(token: AgentToken) -> bool:
    try:
        key = _VERIFY_KEYS.get(token.key)
        if key is None:
            key = _VERIFY_KEYS[token.key] = nacl.signing.VerifyKey(public_key_bytes(token.key))
        key.verify(signed_bytes(token.grant), base64.b64decode(token.sig, validate=True))
    except (ValueError, binascii.Error, nacl.exceptions.BadSignatureError):
        return False
    return True


# --- key files -------------------------------------------------------------------------


def launcher_key_paths(state_dir: str) -> tuple[Path, Path]:
    """The local cluster's launcher seed and trusted-keys file under `state_dir`."""
    folder = Path(state_dir).resolve() / "launcher"
    return folder / "launcher.nk", folder / "launcher.pub"


def ensure_launcher_key(state_dir: str) -> None:
    """A launcher key for a local cluster, kept if there; its public key listed as
    trusted (added, so keys listed for a rotation stay)."""
    seed_file, pub_file = launcher_key_paths(state_dir)
    if not seed_file.exists():
        with contextlib.suppress(FileExistsError):  # another process made it meanwhile
            write_seed(str(seed_file), encode_seed(os.urandom(32)))
    public = load_signer(str(seed_file)).public_key
    if public not in read_trusted(str(pub_file)):
        with pub_file.open("a") as f:
            f.write(public + "\n")


def read_trusted(path: str) -> frozenset[str]:
    """The public keys listed in `path`, one a line (`#` comments); none if no file."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return frozenset()
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return frozenset(line for line in lines if line)


class TrustedKeys:
    """The trusted-keys file, read again when it changes (a rotation needs no restart)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._keys: frozenset[str] = frozenset()

    def current(self) -> frozenset[str]:
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            stamp = (0, 0, 0)
        if stamp != self._stamp:
            self._keys, self._stamp = read_trusted(self.path), stamp
        return self._keys


def load_grant_signer(seed_path: str) -> GrantSigner:
    """The launcher's signer from its seed file (refused if others may read it)."""
    return GrantSigner(load_signer(seed_path))


def agent_trusted_keys(state_dir: str, path: str = "") -> TrustedKeys:
    """What a node agent trusts: the keys in `path`, by default
    `<state_dir>/launcher/launcher.pub`."""
    return TrustedKeys(path or str(launcher_key_paths(state_dir)[1]))
