"""The node agent's rules, without a cluster: the launcher's start/stop tokens
(shared/agent_auth.py), the accounts a job may run as (accounts.py), the job's
environment (shared/exports.py, env.job_env) and the spool (spool.py)."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from services.launcher.accounts import AccountPolicy, SystemAccountRefused, refusal
from services.launcher.env import SYSTEM_PATH, job_env, place_worker
from services.launcher.executor import RootNotAllowed
from services.launcher.spool import Spool, UnsafeSpool
from shared.agent_auth import (
    GRANT_TTL_S,
    GrantCode,
    GrantSigner,
    TrustedKeys,
    check,
    ensure_launcher_key,
    launcher_key_paths,
)
from shared.api import StopWorkers, WorkerSpec
from shared.exports import with_environment
from shared.identity import Signer, encode_seed
from shared.jobspec import JobSpec
from tests.support.accounts import AccountUnavailable, run_as_account

NOW = 1_800_000_000.0
LAUNCHER = GrantSigner(Signer(encode_seed(b"\x01" * 32)))
INTRUDER = GrantSigner(Signer(encode_seed(b"\x02" * 32)))
TRUSTED = frozenset({LAUNCHER.public_key})
SPEC = WorkerSpec(
    job_id=7, attempt=1, generation=0, argv=("{spool}/script.sh",), env={"A": "1"},
    workdir="/tmp", stdout="out", stderr="out", run_as="alice", script="#!/bin/sh\ntrue\n",
)  # fmt: skip
STOP = StopWorkers(job_id=7, attempt=1, generation=0)


def good(body: WorkerSpec | StopWorkers) -> WorkerSpec | StopWorkers:
    return LAUNCHER.sign(body, "node01", now=NOW)


def tampered(**changes: object) -> Callable[[], WorkerSpec | StopWorkers]:
    return lambda: msgspec.structs.replace(good(SPEC), **changes)


def sig_of(body: WorkerSpec | StopWorkers) -> str:
    assert body.token is not None
    return body.token.sig


def token_changed(*, sig: str | None = None, node: str | None = None) -> WorkerSpec:
    """The launcher's start with its signature swapped, or its grant edited after signing."""
    signed = LAUNCHER.sign(SPEC, "node01", now=NOW)
    assert signed.token is not None
    token = signed.token
    if sig is not None:
        token = msgspec.structs.replace(token, sig=sig)
    if node is not None:
        token = msgspec.structs.replace(
            token, grant=msgspec.structs.replace(token.grant, node=node)
        )
    return msgspec.structs.replace(signed, token=token)


CASES: dict[str, tuple[Callable[[], WorkerSpec | StopWorkers], float, GrantCode | None]] = {
    "the launcher's own start, in time, for this node, runs": (lambda: good(SPEC), NOW, None),
    "the launcher's own stop is obeyed": (lambda: good(STOP), NOW, None),
    "a start without a token is refused": (lambda: SPEC, NOW, GrantCode.UNSIGNED),
    "a start signed by a key nobody trusts is refused": (
        lambda: INTRUDER.sign(SPEC, "node01", now=NOW), NOW, GrantCode.UNTRUSTED_KEY),
    "a stop signed by a key nobody trusts is refused": (
        lambda: INTRUDER.sign(STOP, "node01", now=NOW), NOW, GrantCode.UNTRUSTED_KEY),
    "the launcher's key with another signature is refused": (
        lambda: token_changed(sig=sig_of(good(STOP))), NOW, GrantCode.BAD_SIGNATURE),
    "a grant edited to another node is refused (the signature no longer matches)": (
        lambda: token_changed(node="node02"), NOW, GrantCode.BAD_SIGNATURE),
    "a start signed for another node is refused here": (
        lambda: LAUNCHER.sign(SPEC, "node02", now=NOW), NOW, GrantCode.WRONG_NODE),
    "an expired start is refused": (lambda: good(SPEC), NOW + GRANT_TTL_S + 1, GrantCode.EXPIRED),
    "a grant expiring far in this node's future (clocks apart) is refused": (
        lambda: good(SPEC), NOW - 3600, GrantCode.EXPIRED),
    "a stop's token on a start is refused": (
        lambda: msgspec.structs.replace(SPEC, token=good(STOP).token), NOW, GrantCode.WRONG_VERB),
    "a start's token on another generation is refused": (
        tampered(generation=1), NOW, GrantCode.WRONG_WORKER),
    "a start's token with another run-as user is refused": (
        tampered(run_as="postgres"), NOW, GrantCode.WRONG_WORKER),
    "a start's token with another command is refused": (
        tampered(argv=("/bin/sh", "-c", "id")), NOW, GrantCode.ALTERED),
    "a start's token with another script is refused": (
        tampered(script="#!/bin/sh\ncurl evil\n"), NOW, GrantCode.ALTERED),
    "a start's token with another environment is refused": (
        tampered(env={"LD_PRELOAD": "/tmp/x.so"}), NOW, GrantCode.ALTERED),
}  # fmt: skip


@pytest.mark.parametrize(("make", "now", "want"), CASES.values(), ids=CASES.keys())
def test_an_agent_runs_only_what_the_launcher_signed_for_it(
    make: Callable[[], WorkerSpec | StopWorkers], now: float, want: GrantCode | None
) -> None:
    got = check(make(), node="node01", trusted=TRUSTED, now=now)
    assert (got.code if got else None) == want
    if got is not None:
        assert got.message.startswith(f"refused ({want}): ")


def test_an_agent_that_trusts_no_key_refuses_everything() -> None:
    got = check(good(SPEC), node="node01", trusted=frozenset(), now=NOW)
    assert got is not None and got.code is GrantCode.NO_TRUSTED_KEYS
    assert "launcher/launcher.pub" in got.message


def test_a_rotation_is_read_without_a_restart(tmp_path: Path) -> None:
    """Old and new key listed together, then the old one removed: each change counts."""
    pub = tmp_path / "launcher.pub"
    keys = TrustedKeys(str(pub))
    assert keys.current() == frozenset()
    pub.write_text(f"# the launcher\n{LAUNCHER.public_key}\n")
    assert keys.current() == {LAUNCHER.public_key}
    pub.write_text(f"{LAUNCHER.public_key}\n{INTRUDER.public_key}  # new key\n")
    assert keys.current() == {LAUNCHER.public_key, INTRUDER.public_key}
    pub.write_text(f"{INTRUDER.public_key}\n")
    assert keys.current() == {INTRUDER.public_key}


def test_a_local_cluster_key_is_made_once_private_and_listed(tmp_path: Path) -> None:
    ensure_launcher_key(str(tmp_path))
    seed, pub = launcher_key_paths(str(tmp_path))
    first = seed.read_text()
    ensure_launcher_key(str(tmp_path))
    assert seed.read_text() == first
    assert stat.S_IMODE(seed.stat().st_mode) == 0o600
    assert len(pub.read_text().split()) == 1


# --- accounts ---------------------------------------------------------------------------

ACCOUNT_CASES = {
    "an ordinary user runs": ("alice", 1000, AccountPolicy(), None),
    "a system account is refused": ("postgres", 114, AccountPolicy(), SystemAccountRefused),
    "daemon (uid 1) is refused": ("daemon", 1, AccountPolicy(), SystemAccountRefused),
    "an allowed system account runs": (
        "ci", 998, AccountPolicy(allowed=frozenset({"ci"})), None),
    "the minimum is configurable": ("bob", 1500, AccountPolicy(min_uid=2000), SystemAccountRefused),
    "root is refused by default": ("root", 0, AccountPolicy(), RootNotAllowed),
    "root even when listed as allowed": (
        "root", 0, AccountPolicy(allowed=frozenset({"root"})), RootNotAllowed),
    "root only with allow_root": ("root", 0, AccountPolicy(allow_root=True), None),
}  # fmt: skip


@pytest.mark.parametrize(("user", "uid", "policy", "want"), ACCOUNT_CASES.values(),
                         ids=ACCOUNT_CASES.keys())  # fmt: skip
def test_no_job_runs_as_a_system_account(
    user: str, uid: int, policy: AccountPolicy, want: type[Exception] | None
) -> None:
    got = refusal(user, uid, policy)
    assert (type(got) if got else None) is want
    if isinstance(got, SystemAccountRefused):
        assert f"uid {uid}" in str(got) and "allowed_job_users" in str(got)


# --- environment ------------------------------------------------------------------------

LAUNCHER_OWNED = ("MUSTER_", "SLURM", "MASTER_", "CUDA_")
RANKS = {
    "NNODES",
    "NODE_RANK",
    "WORLD_SIZE",
    "RANK",
    "GROUP_RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
}
SUBMITTER = {"PATH": "/home/alice/bin:/usr/bin", "HOME": "/home/alice", "WANDB_KEY": "k"}
ENV_CASES = {
    "--export=ALL: the submitter's whole environment": ("ALL", {}, SUBMITTER),
    "--export=NONE: nothing of it, the system PATH": ("NONE", {}, {"PATH": SYSTEM_PATH}),
    "--export=NAME: only that": ("WANDB_KEY", {}, {"WANDB_KEY": "k", "PATH": SYSTEM_PATH}),
    "an assignment wins over the submitter's value": (
        "ALL", {"WANDB_KEY": "x"}, {**SUBMITTER, "WANDB_KEY": "x"}),
}  # fmt: skip


@pytest.mark.parametrize(("export", "explicit", "want"), ENV_CASES.values(), ids=ENV_CASES.keys())
def test_a_job_gets_the_submitters_environment_never_the_daemons(
    export: str, explicit: dict[str, str], want: dict[str, str]
) -> None:
    spec = with_environment(
        JobSpec(user="alice", script="x", export=export, env=explicit), SUBMITTER
    )
    placement = place_worker(
        spec, job_id=1, attempt=1, generation=0, node="n1", nodelist=["n1"], gpus=[],
        master_port=1,
    )  # fmt: skip
    env = job_env(spec, placement)  # no environment of this process goes in
    user = {k: v for k, v in env.items() if not k.startswith(LAUNCHER_OWNED) and k not in RANKS}
    assert user == want


# --- spool ------------------------------------------------------------------------------


def test_the_script_is_the_users_alone_in_a_fresh_folder(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path / "spool"))
    uid = os.geteuid()
    folder = Path(spool.write(3, 1, 0, "script.sh", "#!/bin/sh\necho hi\n", uid))
    assert folder == spool.folder(3, 1, 0)
    script = folder / "script.sh"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o711
    assert stat.S_IMODE(script.stat().st_mode) == 0o500
    assert script.read_text() == "#!/bin/sh\necho hi\n"
    spool.remove(3, 1, 0)
    assert not folder.exists()


def test_a_symlink_planted_where_the_spool_writes_is_never_followed(tmp_path: Path) -> None:
    """The attack on the old spool: the user owned the folder, replaced script.sh (or the
    folder) by a symlink to a file of root's, and the root agent wrote, chmodded and
    chowned through it. Here a planted link is removed, never followed."""
    victim = tmp_path / "shadow"
    victim.write_text("root's secret\n")
    victim.chmod(0o600)
    spool = Spool(str(tmp_path / "spool"))
    spool.write(1, 1, 0, "script.sh", "x", None)  # the root exists
    spool.remove(1, 1, 0)
    planted = spool.folder(9, 1, 0)
    planted.symlink_to(victim)  # the generation folder itself
    (tmp_path / "spool" / "job-9").mkdir()
    (tmp_path / "spool" / "job-9" / "script.sh").symlink_to(victim)  # the old layout
    folder = Path(spool.write(9, 1, 0, "../../shadow", "#!/bin/sh\nid\n", os.geteuid()))
    assert not folder.is_symlink() and folder.is_dir()
    assert os.listdir(folder) == ["shadow"]  # the name's folder part is dropped
    assert victim.read_text() == "root's secret\n"
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600


def test_a_spool_root_that_is_a_symlink_or_writable_by_others_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "elsewhere"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(UnsafeSpool, match="cannot open it as a folder"):
        Spool(str(tmp_path / "link")).write(1, 1, 0, "script.sh", "x", None)
    open_root = tmp_path / "open"
    open_root.mkdir()
    open_root.chmod(0o777)
    with pytest.raises(UnsafeSpool, match="writable by no other"):
        Spool(str(open_root)).write(1, 1, 0, "script.sh", "x", None)
    assert os.listdir(real) == [] and os.listdir(open_root) == []


def test_the_job_user_owns_only_its_script_not_the_folder(tmp_path: Path) -> None:
    try:
        account = run_as_account()
    except AccountUnavailable as err:
        pytest.skip(str(err))
    spool = Spool(str(tmp_path / "spool"))
    folder = Path(spool.write(4, 1, 0, "script.sh", "x", account.uid))
    assert folder.stat().st_uid == os.geteuid()
    assert (folder / "script.sh").stat().st_uid == account.uid


def test_a_stop_whose_float_field_was_set_from_an_int_still_verifies() -> None:
    """Chaos seed 1: a preemption's stop carried grace_s=2 (an int from the partition's
    grace_time); the agent decodes 2.0, and the digest must not differ (it did: the stop
    was refused as altered and the preempted worker kept its GPU)."""
    import msgspec

    from shared.agent_auth import digest
    from shared.api import StopWorkers

    sent = StopWorkers(job_id=47, grace_s=2, attempt=1, generation=0)
    seen = msgspec.json.decode(msgspec.json.encode(sent), type=StopWorkers)
    assert digest(sent) == digest(seen)
