"""Pure core + plumbing: who sent an API request, proved by a signature.

Every request to `muster.api.*` travels as a `SignedRequest`: the request's JSON body as
sent, the signer's public NKey (an ed25519 key, `U...`), a timestamp in milliseconds, a
random nonce and an ed25519 signature over `canonical(...)` of all of them and the
subject, so a signature made for one verb, body or moment is worth nothing for another
(in the spirit of Slurm's MUNGE credentials).

The server takes the user from the key (the `Directory` maps public keys to users, as
the cluster configuration says); the payload's old `user` field must be empty or name
that same user. A timestamp more than `skew_s` from the server's clock is refused, and
so is a nonce already seen within that window (a replay). Outcomes are values
(`Verified` or `AuthRefusal`); only `authenticated`, the route adapter, raises.
"""

from __future__ import annotations

import base64
import binascii
import collections
from collections.abc import Awaitable, Callable, Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import msgspec

from shared.identity_sodium import (
    KEYGEN_HINT,
    WIRE_VERSION,
    SeedPair,
    b32decode,
    canonical,
    checked_seed,
    crc16,
    encode_public,
    sign_request,
)

if TYPE_CHECKING:  # the CLI signs with this module; the server side's imports stay off its path
    import asyncio

    import nacl.signing

    from shared.apiserve import Route


DEFAULT_SKEW_S = 60.0
NONCE_BYTES = 16
MAX_NONCES = 2_000_000  # a window's worth at ~15,000 requests/s; beyond, refuse
DEFAULT_MAX_REQUEST_BYTES = 1024 * 1024
MAX_BATCH = 256  # signatures checked per worker-thread hop
_PREFIX_USER = 20 << 3  # NKeys: the first byte of a user public key ('U...')
_PREFIX_SEED = 18 << 3  # and of a seed ('S...')


class AuthCode(StrEnum):
    UNSIGNED = "unsigned"
    MALFORMED = "malformed_credential"
    TOO_LARGE = "request_too_large"
    UNKNOWN_KEY = "unknown_key"
    BAD_SIGNATURE = "bad_signature"
    STALE = "stale_request"
    REPLAYED = "replayed"
    USER_MISMATCH = "user_mismatch"
    OVERLOADED = "overloaded"


class SignedRequest(msgspec.Struct, frozen=True, kw_only=True):
    """The wire form of every API request; `body` is the request's JSON, byte for byte."""

    v: int = WIRE_VERSION
    key: str = ""  # the signer's public NKey
    ts: int = 0  # milliseconds since the epoch, the signer's clock
    nonce: str = ""  # NONCE_BYTES random bytes, base64
    sig: str = ""  # ed25519 signature of canonical(...), base64
    body: msgspec.Raw = msgspec.Raw(b"null")


class Verified(msgspec.Struct, frozen=True, kw_only=True):
    user: str
    key: str
    replay_id: str = ""  # "<key>:<nonce>": what a shared replay ledger records
    forget_at: float = 0.0  # when the timestamp check alone refuses a replay


class AuthRefusal(msgspec.Struct, frozen=True, kw_only=True):
    code: AuthCode
    message: str


class Directory(msgspec.Struct, frozen=True, kw_only=True):
    """Who is who, from the cluster configuration: keys, operators, coordinators and
    which data is private (shared by every service that answers users)."""

    users_by_key: dict[str, str] = {}
    operators: frozenset[str] = frozenset()
    coordinators: dict[str, tuple[str, ...]] = {}  # account -> its coordinators
    parents: dict[str, str | None] = {}  # account -> parent account
    private: frozenset[str] = frozenset()  # privacy.PrivateData values in force

    def ancestors(self, account: str) -> tuple[str, ...]:
        chain: list[str] = []
        current: str | None = account
        while current is not None and current in self.parents and current not in chain:
            chain.append(current)
            current = self.parents[current]
        return tuple(chain)

    def coordinates(self, actor: str, account: str) -> bool:
        """Coordinators of an account also coordinate its sub-accounts."""
        return any(actor in self.coordinators.get(a, ()) for a in self.ancestors(account))


def public_key_bytes(text: str) -> bytes:
    """The raw ed25519 key of a user public NKey; ValueError says what is wrong."""
    try:
        raw = b32decode(text.encode())
    except (binascii.Error, ValueError) as err:
        raise ValueError(f"{text!r} is not an NKey (base32 text like 'UAB...')") from err
    if len(raw) != 35 or raw[0] != _PREFIX_USER:
        raise ValueError(f"{text!r} is not a user public key: those start with 'U' (56 chars)")
    if int.from_bytes(raw[33:], "little") != crc16(raw[:33]):
        raise ValueError(f"{text!r} has a bad checksum: copy the whole key again")
    return raw[1:33]


def encode_public_key(raw: bytes) -> str:
    return encode_public(_PREFIX_USER, raw).decode()


def encode_seed(raw: bytes) -> str:
    """A user seed (`SU...`) from 32 random bytes, as `muster keygen` writes it."""
    import nkeys  # type: ignore[import-untyped]  # only keygen writes seeds

    return str(nkeys.encode_seed(raw, nkeys.PREFIX_BYTE_USER).decode())


def decode_seed(text: str) -> bytes:
    """The 32-byte seed of an NKey seed text, its checksum checked."""
    return checked_seed(text)


class Signer:
    """The client's side: one user's private key (an NKeys seed), signing request bodies."""

    def __init__(self, seed: str) -> None:
        decode_seed(seed)  # nkeys does not check the seed's checksum; a damaged file is refused
        self._pair = SeedPair(seed)  # nkeys' signatures, without loading all of PyNaCl
        self.public_key: str = self._pair.public_key.decode()

    def sign(self, subject: str, body: bytes, *, now: float, nonce: bytes) -> bytes:
        """The wire bytes of `body` sent to `subject` at `now` with a fresh `nonce`
        (a SignedRequest's JSON, written by the lean client's code: one encoding)."""
        return sign_request(self._pair, subject, body, now=now, nonce=nonce)

    def sign_bytes(self, data: bytes) -> bytes:
        """The raw ed25519 signature of `data` (the launcher's agent grants use it)."""
        sig: bytes = self._pair.sign(data)
        return sig


class NonceCache:
    """Nonces seen within the window, bounded: each is forgotten once its request's
    timestamp has left the window (no replay of it could pass the timestamp check)."""

    def __init__(self, max_entries: int = MAX_NONCES) -> None:
        self.max_entries = max_entries
        self._seen: set[str] = set()
        self._order: collections.deque[tuple[float, str]] = collections.deque()

    def __len__(self) -> int:
        return len(self._seen)

    def prune(self, now: float) -> None:
        while self._order and self._order[0][0] <= now:
            self._seen.discard(self._order.popleft()[1])

    def add(self, nonce: str, forget_at: float, now: float) -> AuthCode | None:
        """None when `nonce` is new (and now remembered); otherwise why it is refused."""
        self.prune(now)
        if nonce in self._seen:
            return AuthCode.REPLAYED
        if len(self._seen) >= self.max_entries:
            return AuthCode.OVERLOADED
        self._seen.add(nonce)
        self._order.append((forget_at, nonce))
        return None


class Verifier:
    """The server's side: checks a signed request against the directory in force."""

    def __init__(
        self,
        directory: Callable[[], Directory],
        *,
        skew_s: float = DEFAULT_SKEW_S,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        nonces: NonceCache | None = None,
    ) -> None:
        self.directory = directory
        self.skew_s = skew_s
        self.max_request_bytes = max_request_bytes
        self.nonces = nonces if nonces is not None else NonceCache()
        self._keys: dict[str, nacl.signing.VerifyKey] = {}  # decoded once per key
        self._batches = _Batches(lambda item: self._signed(*item))

    def verify(
        self, payload: bytes, subject: str, now: float
    ) -> tuple[Verified | AuthRefusal, bytes]:
        """The signer (or why not) and the request body it signed."""
        req, body, user = self._before_signature(payload, now)
        if isinstance(user, AuthRefusal):
            return user, body
        return self._after_signature(req, user, self._signed(req, body, subject), now), body

    async def averify(
        self, payload: bytes, subject: str, now: float
    ) -> tuple[Verified | AuthRefusal, bytes]:
        """As `verify`, the signature checked off the event loop with others in a batch
        (libsodium runs without the GIL): the loop keeps decoding and committing."""
        req, body, user = self._before_signature(payload, now)
        if isinstance(user, AuthRefusal):
            return user, body
        ok = await self._batches.check((req, body, subject))
        return self._after_signature(req, user, ok, now), body

    async def aclose(self) -> None:
        await self._batches.aclose()

    def _before_signature(
        self, payload: bytes, now: float
    ) -> tuple[SignedRequest, bytes, str | AuthRefusal]:
        """Decode, and the checks that need no cryptography: size, credential, window, key."""
        if len(payload) > self.max_request_bytes:
            return (
                SignedRequest(),
                b"",
                _refusal(
                    AuthCode.TOO_LARGE,
                    f"the request is {len(payload)} bytes; the limit (max_request_bytes) is "
                    f"{self.max_request_bytes}",
                ),
            )
        try:
            req = msgspec.json.decode(payload, type=SignedRequest)
        except (msgspec.DecodeError, msgspec.ValidationError):
            req = SignedRequest()
        body = bytes(req.body)
        self.nonces.prune(now)  # forgotten as time passes, not only when one is added
        if not (req.sig and req.key and req.nonce):
            return (
                req,
                body,
                _refusal(AuthCode.UNSIGNED, f"the request is not signed; {KEYGEN_HINT}"),
            )
        off = req.ts / 1000 - now
        if abs(off) > self.skew_s:
            side = "behind" if off < 0 else "ahead of"
            return (
                req,
                body,
                _refusal(
                    AuthCode.STALE,
                    f"the request's timestamp is {abs(off):.0f} s {side} the server's clock (at "
                    f"most {self.skew_s:.0f} s allowed): set this machine's clock (NTP) and send "
                    "it again",
                ),
            )
        user = self.directory().users_by_key.get(req.key)
        if user is None:
            return (
                req,
                body,
                _refusal(
                    AuthCode.UNKNOWN_KEY,
                    f"key {req.key} is not registered to any user: ask an operator to run "
                    f"`muster user add NAME --key {req.key}`",
                ),
            )
        return req, body, user

    def _after_signature(
        self, req: SignedRequest, user: str, signed: bool, now: float
    ) -> Verified | AuthRefusal:
        """Only a verified request's nonce is remembered, so junk cannot fill the cache."""
        if not signed:
            return _refusal(
                AuthCode.BAD_SIGNATURE,
                f"the signature does not match the request (key {req.key}): it was altered, "
                "or signed for another request",
            )
        replay_id, forget_at = f"{req.key}:{req.nonce}", req.ts / 1000 + self.skew_s
        seen = self.nonces.add(replay_id, forget_at, now)
        if seen is AuthCode.REPLAYED:
            return _refusal(
                seen,
                f"this request was already received (its nonce was seen within {self.skew_s:.0f}"
                " s): a replayed request is refused; send a new one",
            )
        if seen is AuthCode.OVERLOADED:
            return _refusal(seen, "too many requests in the replay window; try again shortly")
        return Verified(user=user, key=req.key, replay_id=replay_id, forget_at=forget_at)

    def _signed(self, req: SignedRequest, body: bytes, subject: str) -> bool:
        import nacl.exceptions
        import nacl.signing

        key = self._keys.get(req.key)
        try:
            if key is None:
                key = self._keys[req.key] = nacl.signing.VerifyKey(public_key_bytes(req.key))
            sig = base64.b64decode(req.sig, validate=True)
            key.verify(canonical(subject, req.key, req.ts, req.nonce, body), sig)
        except (ValueError, binascii.Error, nacl.exceptions.BadSignatureError):
            return False
        return True


_Item = tuple[SignedRequest, bytes, str]


class _Batches:
    """Signature checks gathered while one batch runs in a worker thread, then run
    together: one thread hop per batch, not per request. The one drain task is owned
    and awaited at `aclose`."""

    def __init__(self, check: Callable[[_Item], bool]) -> None:
        self._check = check
        self._queue: list[tuple[_Item, asyncio.Future[bool]]] = []
        self._drain: asyncio.Task[None] | None = None

    async def check(self, item: _Item) -> bool:
        import asyncio

        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._queue.append((item, future))
        if self._drain is None or self._drain.done():
            self._drain = asyncio.get_running_loop().create_task(self._run())
        return await future

    async def _run(self) -> None:
        import asyncio

        while self._queue:
            batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
            try:
                items = [item for item, _ in batch]
                results: list[bool | Exception] = await asyncio.to_thread(self._check_all, items)
            except Exception as err:  # a waiter must never hang on a lost batch
                results = [err] * len(batch)
            for (_, future), ok in zip(batch, results, strict=True):
                if future.done():
                    continue
                if isinstance(ok, Exception):
                    future.set_exception(ok)
                else:
                    future.set_result(ok)

    def _check_all(self, items: list[_Item]) -> list[bool | Exception]:
        return [self._check(item) for item in items]

    async def aclose(self) -> None:
        import asyncio

        if self._drain is not None:
            await asyncio.wait({self._drain}, timeout=5)


def _refusal(code: AuthCode, message: str) -> AuthRefusal:
    return AuthRefusal(code=code, message=message)


class _HasUser(Protocol):
    @property
    def user(self) -> str: ...


R = TypeVar("R", bound=msgspec.Struct)


def user_matches(payload_user: str, verified: Verified) -> AuthRefusal | None:
    """The payload's `user` (kept on the wire for old clients) must be empty or the
    key's user: a request naming someone else is refused, never silently re-labelled."""
    if not payload_user or payload_user == verified.user:
        return None
    return _refusal(
        AuthCode.USER_MISMATCH,
        f"the request names user {payload_user!r} but is signed by {verified.user!r}'s key "
        f"({verified.key}): the user is taken from the key; unset MUSTER_USER or use "
        f"{payload_user!r}'s key",
    )


Ledger = Callable[[str, float], Awaitable[bool]]


def authenticated(
    verifier: Verifier,
    subject: str,
    kind: type[R],
    fn: Callable[[R], Awaitable[msgspec.Struct]],
    clock: Callable[[], float],
    ledger: Ledger | None = None,
) -> Route:
    """A route that verifies the signature, decodes the signed body as `kind` and hands
    `fn` the request with `user` set to the verified user (refusing anything else).
    With a `ledger` (shared by every replica: `first_time(replay_id, forget_at)`), a
    request another replica already received is refused as a replay too."""
    from shared.apiserve import Refused

    async def call(payload: bytes) -> msgspec.Struct:
        outcome, body = await verifier.averify(payload, subject, clock())
        if isinstance(outcome, AuthRefusal):
            raise Refused(outcome.message, str(outcome.code))
        if ledger is not None and not await ledger(outcome.replay_id, outcome.forget_at):
            raise Refused(
                "this request was already received by another replica: a replayed request "
                "is refused; send a new one",
                str(AuthCode.REPLAYED),
            )
        try:
            req: Any = msgspec.json.decode(body, type=kind)
        except (msgspec.DecodeError, msgspec.ValidationError) as err:
            raise Refused(f"malformed request: {err}", "malformed") from err
        mismatch = user_matches(req.user, outcome)
        if mismatch is not None:
            raise Refused(mismatch.message, str(mismatch.code))
        return await fn(msgspec.structs.replace(req, user=outcome.user))

    return call


def directory_of(users_keys: Mapping[str, tuple[str, ...]], **rest: Any) -> Directory:
    """A directory from user -> keys (as the configuration lists them)."""
    by_key = {key: user for user, keys in users_keys.items() for key in keys}
    return Directory(users_by_key=by_key, **rest)
