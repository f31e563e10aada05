"""Pure: the signing and verification core (shared.identity) — canonical bytes, what a
verifier accepts and refuses, the replay window and the bounded nonce cache. The clock
and the nonces are passed in, so every case is a fixed input and a whole-value want."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import msgspec
import nkeys  # type: ignore[import-untyped]  # nkeys ships no stubs or py.typed
import pytest

from shared.identity import (
    AuthCode,
    AuthRefusal,
    NonceCache,
    SignedRequest,
    Signer,
    Verified,
    Verifier,
    decode_seed,
    directory_of,
    encode_seed,
    public_key_bytes,
    user_matches,
)
from shared.identity_sodium import canonical

T0 = 1_800_000_000.0
SUBMIT = "muster.api.submit"
ALICE = Signer(encode_seed(bytes(range(32))))
BOB = Signer(encode_seed(bytes(range(1, 33))))
STRANGER = Signer(encode_seed(bytes(range(2, 34))))
DIRECTORY = directory_of({"alice": (ALICE.public_key,), "bob": (BOB.public_key,)})
BODY = b'{"user":"","script":"#!/bin/bash\\ntrue\\n"}'


def nonce(i: int) -> bytes:
    return i.to_bytes(16, "big")


def verifier(**kw: object) -> Verifier:
    return Verifier(lambda: DIRECTORY, **kw)  # type: ignore[arg-type]


def tampered(wire: bytes, **fields: object) -> bytes:
    signed = msgspec.json.decode(wire, type=SignedRequest)
    return msgspec.json.encode(msgspec.structs.replace(signed, **fields))


def test_the_canonical_bytes_cover_subject_key_time_nonce_and_the_body_verbatim() -> None:
    assert canonical(SUBMIT, "UKEY", 1234, "bm9uY2U=", b'{"a":1}') == (
        b'MUSTER-API-1\nmuster.api.submit\nUKEY\n1234\nbm9uY2U=\n{"a":1}'
    )


def test_keys_and_seeds_are_the_nkeys_library_s_own_encoding() -> None:
    seed = encode_seed(bytes(range(32)))
    pair = nkeys.from_seed(seed.encode())
    assert pair.public_key.decode() == ALICE.public_key
    assert ALICE.public_key.startswith("U") and seed.startswith("SU")
    assert decode_seed(seed) == bytes(range(32))
    assert len(public_key_bytes(ALICE.public_key)) == 32


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("not base32!", "is not an NKey"),
        (ALICE.public_key[:-2] + "AA", "bad checksum"),
        (encode_seed(bytes(32)), "is not a user public key"),
    ],
    ids=["garbage", "a mistyped key", "a seed where a public key belongs"],
)
def test_a_bad_public_key_says_what_is_wrong(text: str, want: str) -> None:
    with pytest.raises(ValueError, match=want):
        public_key_bytes(text)


def _sent(signer: Signer, subject: str = SUBMIT, at: float = T0, n: int = 1) -> bytes:
    return signer.sign(subject, BODY, now=at, nonce=nonce(n))


CASES: dict[str, tuple[bytes, str, float, Verified | AuthCode]] = {
    "a request signed by a registered key is its user's": (
        _sent(ALICE), SUBMIT, T0, Verified(user="alice", key=ALICE.public_key),
    ),
    "the clock may be behind within the window": (
        _sent(BOB, at=T0 - 59), SUBMIT, T0, Verified(user="bob", key=BOB.public_key),
    ),
    "an old request is stale": (_sent(ALICE, at=T0 - 61), SUBMIT, T0, AuthCode.STALE),
    "a request from the future is stale too": (
        _sent(ALICE, at=T0 + 120), SUBMIT, T0, AuthCode.STALE,
    ),
    "a key nobody registered is unknown": (_sent(STRANGER), SUBMIT, T0, AuthCode.UNKNOWN_KEY),
    "a signature for another verb does not carry over": (
        _sent(ALICE, subject="muster.api.queue"), SUBMIT, T0, AuthCode.BAD_SIGNATURE,
    ),
    "a plain request without a credential is unsigned": (
        BODY, SUBMIT, T0, AuthCode.UNSIGNED,
    ),
    "bytes that are no JSON at all are unsigned": (b"\x00\x01", SUBMIT, T0, AuthCode.UNSIGNED),
    "a body swapped under the signature fails it": (
        tampered(_sent(ALICE), body=msgspec.Raw(b'{"user":"","script":"rm -rf /"}')),
        SUBMIT, T0, AuthCode.BAD_SIGNATURE,
    ),
    "alice's signature presented under bob's key fails": (
        tampered(_sent(ALICE), key=BOB.public_key), SUBMIT, T0, AuthCode.BAD_SIGNATURE,
    ),
    "a moved timestamp fails the signature": (
        tampered(_sent(ALICE), ts=int(T0 * 1000) + 1), SUBMIT, T0, AuthCode.BAD_SIGNATURE,
    ),
    "a signature that is not base64 fails": (
        tampered(_sent(ALICE), sig="%%%"), SUBMIT, T0, AuthCode.BAD_SIGNATURE,
    ),
}  # fmt: skip


@pytest.mark.parametrize(("wire", "subject", "now", "want"), CASES.values(), ids=CASES.keys())
def test_verify(wire: bytes, subject: str, now: float, want: Verified | AuthCode) -> None:
    outcome, _ = verifier().verify(wire, subject, now)
    got = outcome.code if isinstance(outcome, AuthRefusal) else _who(outcome)
    assert got == want


def _who(verified: Verified) -> Verified:
    """The user and key (the replay id and its expiry are the nonce's, tested apart)."""
    return Verified(user=verified.user, key=verified.key)


def test_the_body_handed_on_is_the_signed_body_byte_for_byte() -> None:
    _, body = verifier().verify(_sent(ALICE), SUBMIT, T0)
    assert body == BODY


def test_the_same_request_twice_is_a_replay_and_a_fresh_nonce_is_not() -> None:
    v = verifier()
    first, _ = v.verify(_sent(ALICE, n=7), SUBMIT, T0)
    again, _ = v.verify(_sent(ALICE, n=7), SUBMIT, T0 + 1)
    fresh, _ = v.verify(_sent(ALICE, n=8), SUBMIT, T0 + 1)
    assert isinstance(first, Verified) and isinstance(fresh, Verified)
    assert isinstance(again, AuthRefusal) and again.code is AuthCode.REPLAYED
    assert "already received" in again.message


def test_a_replay_after_the_window_is_stale_so_its_nonce_can_be_forgotten() -> None:
    v = verifier(skew_s=10.0)
    wire = _sent(ALICE, n=3)
    assert isinstance(v.verify(wire, SUBMIT, T0)[0], Verified)
    late, _ = v.verify(wire, SUBMIT, T0 + 11)
    assert isinstance(late, AuthRefusal) and late.code is AuthCode.STALE
    assert len(v.nonces) == 0  # pruned: the timestamp check alone refuses it now


def test_an_unverified_request_leaves_no_nonce_behind() -> None:
    v = verifier()
    v.verify(_sent(STRANGER), SUBMIT, T0)
    v.verify(tampered(_sent(ALICE), key=BOB.public_key), SUBMIT, T0)
    assert len(v.nonces) == 0


def test_the_nonce_cache_is_bounded_and_refuses_rather_than_forgets() -> None:
    cache = NonceCache(max_entries=2)
    assert cache.add("a", forget_at=T0 + 60, now=T0) is None
    assert cache.add("b", forget_at=T0 + 60, now=T0) is None
    assert cache.add("c", forget_at=T0 + 60, now=T0) is AuthCode.OVERLOADED
    assert cache.add("a", forget_at=T0 + 60, now=T0) is AuthCode.REPLAYED
    assert cache.add("c", forget_at=T0 + 120, now=T0 + 61) is None  # a and b expired


def test_an_oversized_request_is_refused_with_the_limit_before_it_is_decoded() -> None:
    outcome, body = verifier(max_request_bytes=100).verify(b"x" * 101, SUBMIT, T0)
    assert outcome == AuthRefusal(
        code=AuthCode.TOO_LARGE,
        message="the request is 101 bytes; the limit (max_request_bytes) is 100",
    )
    assert body == b""


USER_FIELD = {
    "an empty user field takes the key's user": ("", None),
    "the key's own name matches": ("alice", None),
    "another name is a forgery": ("root", AuthCode.USER_MISMATCH),
}


@pytest.mark.parametrize(("named", "want"), USER_FIELD.values(), ids=USER_FIELD.keys())
def test_the_payload_user_must_be_empty_or_the_key_s(named: str, want: AuthCode | None) -> None:
    refusal = user_matches(named, Verified(user="alice", key=ALICE.public_key))
    assert (refusal.code if refusal else None) == want


def test_refusals_say_what_to_do() -> None:
    v = verifier()
    unsigned, _ = v.verify(BODY, SUBMIT, T0)
    unknown, _ = v.verify(_sent(STRANGER), SUBMIT, T0)
    assert isinstance(unsigned, AuthRefusal) and "muster keygen" in unsigned.message
    assert isinstance(unknown, AuthRefusal)
    assert f"muster user add NAME --key {STRANGER.public_key}" in unknown.message


def test_the_wire_form_is_stable() -> None:
    wire = _sent(ALICE, n=1)
    doc = msgspec.json.decode(wire)
    assert set(doc) == {"v", "key", "ts", "nonce", "sig", "body"}
    assert doc["v"] == 1 and doc["ts"] == int(T0 * 1000)
    assert base64.b64decode(doc["nonce"]) == nonce(1)
    assert msgspec.json.encode(doc["body"]) == BODY


async def test_checked_in_batches_off_the_loop_the_outcomes_are_the_same() -> None:
    v = verifier()
    wires = [_sent(ALICE, n=100 + i) for i in range(50)] + [_sent(STRANGER), BODY]
    wires.append(tampered(_sent(ALICE, n=500), key=BOB.public_key))
    outcomes = await asyncio.gather(*(v.averify(w, SUBMIT, T0) for w in wires))
    codes = [o.code if isinstance(o, AuthRefusal) else o.user for o, _ in outcomes]
    assert codes == ["alice"] * 50 + [
        AuthCode.UNKNOWN_KEY,
        AuthCode.UNSIGNED,
        AuthCode.BAD_SIGNATURE,
    ]
    again, _ = await v.averify(wires[0], SUBMIT, T0)
    assert isinstance(again, AuthRefusal) and again.code is AuthCode.REPLAYED
    await v.aclose()


GOLDEN = Path(__file__).with_name("golden_signed_submit.json")


def test_a_recorded_signed_request_is_signed_the_same_and_verifies_forever() -> None:
    """ed25519 signatures are deterministic: the same key, body, time and nonce give
    these bytes. A change to the canonical form or the wire fails here first."""
    recorded = GOLDEN.read_bytes().strip()
    body = msgspec.json.encode(msgspec.json.decode(recorded)["body"])
    assert ALICE.sign(SUBMIT, body, now=1796119591.363, nonce=bytes(range(16))) == recorded
    outcome, got = verifier().verify(recorded, SUBMIT, 1796119591.363 + 30)
    assert outcome == Verified(
        user="alice",
        key=ALICE.public_key,
        replay_id=f"{ALICE.public_key}:AAECAwQFBgcICQoLDA0ODw==",
        forget_at=1796119591.363 + 60,
    )
    assert got == body
