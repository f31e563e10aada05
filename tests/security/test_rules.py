"""Pure: the visibility rules (shared.privacy), the submit rate limit (admission's token
bucket), the identity part of the cluster configuration and its validation."""

from __future__ import annotations

import pytest

from services.admission.config import ConfigError, load_config
from services.admission.ratelimit import Bucket, take
from shared.identity import Directory, Signer, encode_seed
from shared.identity_files import directory_from_toml
from shared.privacy import REDACTED, PrivateData, may_see, redact_spec

KEY_A = Signer(encode_seed(bytes(range(32)))).public_key
KEY_B = Signer(encode_seed(bytes(range(1, 33)))).public_key

TOML = f"""
[cluster]
private_data = ["jobs", "scripts", "usage"]

[accounts.root]
[accounts.research]
parent = "root"
coordinators = ["carol"]
[accounts.vision]
parent = "research"

[users.alice]
accounts = ["vision"]
keys = ["{KEY_A}"]

[roles]
operators = ["root"]
"""
WHO = directory_from_toml(TOML, {"bob": (KEY_B,)})

VISIBLE = {
    "an owner sees their own job": ("alice", "alice", "vision", PrivateData.JOBS, True),
    "another user does not": ("bob", "alice", "vision", PrivateData.JOBS, False),
    "a coordinator sees a job of an account below theirs": (
        "carol", "alice", "vision", PrivateData.SCRIPTS, True,
    ),
    "a coordinator of another account does not": (
        "carol", "dave", "prod", PrivateData.USAGE, False,
    ),
    "an operator sees everything": ("root", "alice", "vision", PrivateData.USAGE, True),
    "without an account only the owner and operators see": (
        "carol", "alice", None, PrivateData.JOBS, False,
    ),
}  # fmt: skip


@pytest.mark.parametrize(
    ("actor", "owner", "account", "what", "want"), VISIBLE.values(), ids=VISIBLE.keys()
)
def test_may_see(
    actor: str, owner: str, account: str | None, what: PrivateData, want: bool
) -> None:
    assert may_see(actor, owner, account, what, WHO) is want


def test_what_the_configuration_makes_public_anyone_sees() -> None:
    public_jobs = Directory(private=frozenset({PrivateData.SCRIPTS}))
    assert may_see("bob", "alice", "vision", PrivateData.JOBS, public_jobs)
    assert not may_see("bob", "alice", "vision", PrivateData.SCRIPTS, public_jobs)


def test_the_directory_reads_keys_operators_coordinators_and_the_key_folder() -> None:
    assert WHO.users_by_key == {KEY_A: "alice", KEY_B: "bob"}
    assert WHO.operators == frozenset({"root"})
    assert WHO.ancestors("vision") == ("vision", "research", "root")
    assert WHO.private == frozenset(PrivateData)


def test_private_data_defaults_to_everything_and_an_empty_list_to_nothing() -> None:
    assert directory_from_toml("").private == frozenset(PrivateData)
    assert directory_from_toml("[cluster]\nprivate_data = []\n").private == frozenset()


def test_a_redacted_spec_keeps_its_shape_and_loses_script_arguments_and_environment() -> None:
    secret = "s3cr3t"
    spec: dict[str, object] = {
        "name": "train", "script": "#!/bin/bash\necho $TOKEN", "args": ["--token", secret],
        "env": {"TOKEN": secret}, "export": f"ALL,TOKEN={secret}", "workdir": "/home/a",
    }  # fmt: skip
    assert redact_spec(spec) == {
        "name": "train", "script": REDACTED, "args": [], "env": {}, "export": "NONE",
        "workdir": "/home/a",
    }  # fmt: skip


BUCKET = {
    "a new user starts with a full burst": (None, 0.0, True, Bucket(tokens=2.0, at=0.0)),
    "an empty bucket refuses": (Bucket(tokens=0.0, at=0.0), 0.0, False, Bucket(tokens=0.0, at=0.0)),
    "it refills at the rate": (Bucket(tokens=0.0, at=0.0), 1.0, True, Bucket(tokens=1.0, at=1.0)),
    "never beyond the burst": (
        Bucket(tokens=0.0, at=0.0),
        100.0,
        True,
        Bucket(tokens=2.0, at=100.0),
    ),
}


@pytest.mark.parametrize(("bucket", "now", "ok", "want"), BUCKET.values(), ids=BUCKET.keys())
def test_take(bucket: Bucket | None, now: float, ok: bool, want: Bucket) -> None:
    got, refusal = take(bucket, now, rate=2.0, burst=3, user="alice")
    assert (got, refusal is None) == (want, ok)


def test_a_rate_refusal_names_both_limits_their_values_and_the_wait() -> None:
    _, refusal = take(Bucket(tokens=0.5, at=0.0), 0.0, rate=2.0, burst=3, user="alice")
    assert refusal is not None and refusal.retry_after_s == pytest.approx(0.25)
    assert "limits.submit_burst = 3" in refusal.message
    assert "limits.submit_rate = 2" in refusal.message and "wait 0.2 s" in refusal.message


def test_an_identity_only_configuration_is_valid_and_places_nothing() -> None:
    config = load_config(f'[users.alice]\nkeys = ["{KEY_A}"]\n[roles]\noperators = ["alice"]\n')
    assert config.partitions == {} and config.users["alice"].keys == (KEY_A,)


BAD = {
    "a key that is not one": (
        '[users.a]\nkeys = ["nope"]\n[roles]\noperators=[]\n',
        "users.a.keys",
        "not an NKey",
    ),
    "one key for two users": (
        f'[users.a]\nkeys = ["{KEY_A}"]\n[users.b]\nkeys = ["{KEY_A}"]\n',
        "users.b.keys",
        "already 'a'",
    ),
    "an unknown kind of private data": (
        '[cluster]\nprivate_data = ["secrets"]\n[roles]\n',
        "cluster.private_data",
        "accepted: jobs",
    ),
    "a rate of zero": ("[limits]\nsubmit_rate = 0\n[roles]\n", "limits.submit_rate", "above 0"),
    "a policy without partitions is still refused": (
        "[accounts.root]\n[roles]\n",
        "partitions",
        "at least one",
    ),
}


@pytest.mark.parametrize(("text", "key", "want"), BAD.values(), ids=BAD.keys())
def test_identity_mistakes_name_the_key(text: str, key: str, want: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(text)
    assert any(p.key == key and want in p.message for p in caught.value.problems), caught.value
