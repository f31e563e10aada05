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

import base64
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


def decode_seed(text: str | bytes) -> tuple[int, bytes]:
    """(key type prefix, the 32-byte ed25519 seed) of an NKey seed, read as nkeys reads
    one (which leaves the checksum unchecked: shared.identity.decode_seed checks it)."""
    raw_text = text.encode() if isinstance(text, str) else text
    try:
        raw = base64.b32decode(raw_text + b"=" * (-len(raw_text) % 8))[:-2]
    except (binascii.Error, ValueError) as err:
        raise BadSeed("not an NKey seed (base32 text like 'SUA...')") from err
    if len(raw) != 2 + SEED_BYTES or raw[0] & 248 != PREFIX_SEED:
        raise BadSeed("not an NKey seed: seeds start with 'S' (58 chars)")
    prefix = (raw[0] & 7) << 5 | (raw[1] & 248) >> 3
    if prefix not in PUBLIC_PREFIXES:
        raise BadSeed("the seed names no NKey type (user, account, ...)")
    return prefix, raw[2:]


def encode_public(prefix: int, raw: bytes) -> bytes:
    """The NKey text (`U...` for a user) of a raw public key, as nkeys writes it."""
    body = bytes([prefix]) + raw
    return base64.b32encode(body + crc16(body).to_bytes(2, "little")).rstrip(b"=")


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
