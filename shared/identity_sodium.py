"""Plumbing: ed25519 signing with an NKey seed, straight from libsodium's cffi module.

`nkeys.from_seed(...).sign(...)` — what signs the API's requests and answers the bus's
nonce — loads `nacl.signing`, which loads all twenty of PyNaCl's binding modules (boxes,
hashes, password hashing, ...): more than a one-shot `muster queue` spends on its
request. `SeedPair` is the part of `nkeys.KeyPair` the clients use (`public_key`, `sign`)
over the same libsodium calls PyNaCl makes (`crypto_sign_seed_keypair`, `crypto_sign`),
loading only `nacl._sodium`. Ed25519 signatures are deterministic: the bytes are the
ones nkeys makes, which tests/unit/test_identity_sodium.py checks against nkeys itself.
Verifying stays with PyNaCl (shared.identity's Verifier).
"""

from __future__ import annotations

import binascii

from nacl._sodium import ffi, lib  # type: ignore[import-not-found]  # compiled, untyped

PREFIX_SEED = 18 << 3  # NKeys: the first 5 bits of a seed ('S...')
SEED_BYTES = 32
PUBLIC_BYTES = 32
SECRET_BYTES = 64
SIGNATURE_BYTES = 64
# the key types an NKey seed may carry: operator, server, cluster, account, user
PUBLIC_PREFIXES = frozenset({14 << 3, 13 << 3, 2 << 3, 0, 20 << 3})

if lib.sodium_init() < 0:  # 1: already initialised (by PyNaCl, say); -1: unusable
    raise RuntimeError("libsodium failed to initialise")


KEYGEN_HINT = (
    "run `muster keygen` (it writes ~/.muster/user.nk and prints your public key) and ask "
    "an operator to register it: `muster user add NAME --key U...`"
)


class BadSeed(ValueError):
    """The text is not an NKey seed (what nkeys raises its ErrInvalidSeed for)."""


def crc16(data: bytes) -> int:
    """CRC-16/XMODEM, the checksum NKeys end with."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


B32 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"  # RFC 4648's alphabet, which NKeys use
_B32_VALUE = {c: i for i, c in enumerate(B32)}


def b32encode(data: bytes) -> bytes:
    """RFC 4648 base32 without its `=` padding (as NKeys write it); `base64` would load
    `re` and `struct` for it."""
    bits = int.from_bytes(data, "big") << (-len(data) * 8 % 5)
    count = -(-len(data) * 8 // 5)
    return bytes(B32[(bits >> (5 * (count - 1 - i))) & 31] for i in range(count))


def b32decode(text: bytes) -> bytes:
    """The bytes of unpadded base32 text; binascii.Error for a letter not in the alphabet
    or a length no bytes encode to."""
    text = text.rstrip(b"=")
    if len(text) * 5 % 8 >= 5:
        raise binascii.Error("base32 text of a length no bytes encode to")
    try:
        bits = 0
        for c in text:
            bits = bits << 5 | _B32_VALUE[c]
    except KeyError:
        raise binascii.Error("not base32 text") from None
    size = len(text) * 5 // 8
    return (bits >> (len(text) * 5 - size * 8)).to_bytes(size, "big")


def decode_seed(text: str | bytes) -> tuple[int, bytes]:
    """(key type prefix, the 32-byte ed25519 seed) of an NKey seed, read as nkeys reads
    one (which leaves the checksum unchecked: shared.identity.decode_seed checks it)."""
    raw_text = text.encode() if isinstance(text, str) else text
    try:
        raw = b32decode(raw_text)[:-2]
    except (binascii.Error, ValueError) as err:
        raise BadSeed("not an NKey seed (base32 text like 'SUA...')") from err
    if len(raw) != 2 + SEED_BYTES or raw[0] & 248 != PREFIX_SEED:
        raise BadSeed("not an NKey seed: seeds start with 'S' (58 chars)")
    prefix = (raw[0] & 7) << 5 | (raw[1] & 248) >> 3
    if prefix not in PUBLIC_PREFIXES:
        raise BadSeed("the seed names no NKey type (user, account, ...)")
    return prefix, raw[2:]


def checked_seed(text: str) -> bytes:
    """The 32-byte ed25519 seed of an NKey seed, its checksum checked too (nkeys leaves
    it unchecked; a damaged key file is refused); ValueError saying what is wrong."""
    try:
        raw = b32decode(text.strip().encode())
    except (binascii.Error, ValueError) as err:
        raise ValueError("not an NKey seed (base32 text like 'SUA...')") from err
    if len(raw) != 2 + SEED_BYTES + 2 or raw[0] & 248 != PREFIX_SEED:
        raise ValueError("not an NKey seed: seeds start with 'S' (58 chars)")
    if int.from_bytes(raw[34:], "little") != crc16(raw[:34]):
        raise ValueError("the seed has a bad checksum: the key file is damaged")
    return raw[2:34]


def encode_public(prefix: int, raw: bytes) -> bytes:
    """The NKey text (`U...` for a user) of a raw public key, as nkeys writes it."""
    body = bytes([prefix]) + raw
    return b32encode(body + crc16(body).to_bytes(2, "little"))


class SeedPair:
    """A signing key from an NKey seed: `public_key` (the NKey text, bytes) and
    `sign(data)` (the raw 64-byte ed25519 signature), as `nkeys.KeyPair` has them."""

    def __init__(self, seed: str | bytes) -> None:
        prefix, raw = decode_seed(seed.strip())
        public = ffi.new("unsigned char[]", PUBLIC_BYTES)
        self._secret = ffi.new("unsigned char[]", SECRET_BYTES)
        if lib.crypto_sign_seed_keypair(public, self._secret, raw) != 0:
            raise RuntimeError("libsodium could not derive the key pair")
        self.public_key: bytes = encode_public(prefix, ffi.buffer(public, PUBLIC_BYTES)[:])

    def sign(self, data: bytes) -> bytes:
        signed = ffi.new("unsigned char[]", len(data) + SIGNATURE_BYTES)
        length = ffi.new("unsigned long long *")
        if lib.crypto_sign(signed, length, data, len(data), self._secret) != 0:
            raise RuntimeError("libsodium could not sign")
        return bytes(ffi.buffer(signed, SIGNATURE_BYTES))


# --- a signed API request, as the client writes it -------------------------------------

WIRE_VERSION = 1


def canonical(subject: str, key: str, ts: int, nonce: str, body: bytes) -> bytes:
    """The bytes a request's signature covers: every field but the signature itself."""
    head = f"MUSTER-API-{WIRE_VERSION}\n{subject}\n{key}\n{ts}\n{nonce}\n"
    return head.encode() + body


def _b64(data: bytes) -> str:
    return binascii.b2a_base64(data, newline=False).decode()


def sign_request(pair: SeedPair, subject: str, body: bytes, *, now: float, nonce: bytes) -> bytes:
    """The wire bytes of `body` (JSON) sent to `subject` at `now` with a fresh `nonce`:
    shared.identity.SignedRequest's fields in its order, `body` embedded byte for byte."""
    ts = int(now * 1000)
    key = pair.public_key.decode()
    text = _b64(nonce)
    sig = _b64(pair.sign(canonical(subject, key, ts, text, body)))
    head = f'{{"v":{WIRE_VERSION},"key":"{key}","ts":{ts},"nonce":"{text}","sig":"{sig}","body":'
    return head.encode() + body + b"}"
