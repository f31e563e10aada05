"""The CLI's light signer (shared.identity_sodium, libsodium's cffi module alone) makes
the bytes nkeys makes — the same public keys for every key type and the same ed25519
signatures — so the services' verification (PyNaCl) and the bus's nonce check accept
what it signs; a damaged seed is refused."""

from __future__ import annotations

import base64
import os

import msgspec
import nkeys  # type: ignore[import-untyped]
import pytest

from shared.identity import SignedRequest, Signer, Verifier, directory_of
from shared.identity_sodium import BadSeed, SeedPair, canonical

KINDS = {
    "a user's seed": nkeys.PREFIX_BYTE_USER,
    "an account's seed": nkeys.PREFIX_BYTE_ACCOUNT,
    "a server's seed": nkeys.PREFIX_BYTE_SERVER,
    "an operator's seed": nkeys.PREFIX_BYTE_OPERATOR,
    "a cluster's seed": nkeys.PREFIX_BYTE_CLUSTER,
}


@pytest.mark.parametrize("prefix", KINDS.values(), ids=KINDS.keys())
def test_a_seed_signs_as_nkeys_signs(prefix: int) -> None:
    for i in range(8):
        seed = nkeys.encode_seed(bytes((i * 7 + k) % 256 for k in range(32)), prefix)
        want, got = nkeys.from_seed(seed), SeedPair(seed.decode())
        assert got.public_key == want.public_key
        for message in (b"", b"x", os.urandom(300)):
            assert got.sign(message) == want.sign(message)


def test_a_signed_request_is_nkeys_signature_and_verifies() -> None:
    seed = nkeys.encode_seed(bytes(range(32)), nkeys.PREFIX_BYTE_USER).decode()
    signer = Signer(seed)
    wire = signer.sign("muster.api.queue", b'{"user":""}', now=1000.0, nonce=b"n" * 16)
    req = msgspec.json.decode(wire, type=SignedRequest)
    body = canonical("muster.api.queue", req.key, req.ts, req.nonce, b'{"user":""}')
    assert base64.b64decode(req.sig) == nkeys.from_seed(seed.encode()).sign(body)
    verifier = Verifier(lambda: directory_of({"alice": (signer.public_key,)}))
    verified, _ = verifier.verify(wire, "muster.api.queue", now=1000.0)
    assert getattr(verified, "user", None) == "alice", verified


@pytest.mark.parametrize(
    "text",
    ["", "not base32 at all!", "UAB" + "A" * 53, "SUA" + "A" * 10],
    ids=["empty", "not base32", "a public key", "too short"],
)
def test_what_is_no_seed_is_refused(text: str) -> None:
    with pytest.raises(BadSeed):
        SeedPair(text)
