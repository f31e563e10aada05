"""`muster keygen` and `muster user add|remove-key`: the pure edit of `[users.NAME] keys`
(table), and the commands on real files (a key file's mode, a refused bad edit)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from muster.cli_users import EditError, set_user_keys
from services.admission.config import load_config
from shared.identity import Signer, encode_seed

REPO = Path(__file__).resolve().parents[2]
K1 = Signer(encode_seed(bytes(range(32)))).public_key
K2 = Signer(encode_seed(bytes(range(1, 33)))).public_key
BASE = '[users.alice]\naccounts = ["research"]  # the lab\n\n[roles]\noperators = ["root"]\n'

EDITS = {
    "a first key goes right under the user's header": (
        BASE, "alice", (K1,), (),
        f'[users.alice]\nkeys = ["{K1}"]\naccounts = ["research"]  # the lab\n\n'
        '[roles]\noperators = ["root"]\n',
    ),
    "a second key joins the first (rotation starts)": (
        f'[users.alice]\nkeys = ["{K1}"]\n', "alice", (K2,), (),
        f'[users.alice]\nkeys = ["{K1}", "{K2}"]\n',
    ),
    "removing the old key ends the rotation": (
        f'[users.alice]\nkeys = ["{K1}", "{K2}"]\n', "alice", (), (K1,),
        f'[users.alice]\nkeys = ["{K2}"]\n',
    ),
    "a key already there is not doubled": (
        f'[users.alice]\nkeys = ["{K1}"]\n', "alice", (K1,), (),
        f'[users.alice]\nkeys = ["{K1}"]\n',
    ),
    "a new user is appended with its key": (
        BASE, "bob", (K1,), (), BASE + f'\n[users.bob]\nkeys = ["{K1}"]\n',
    ),
    "only the named user's section is touched": (
        f'[users.bob]\nkeys = ["{K2}"]\n[users.alice]\n', "alice", (K1,), (),
        f'[users.bob]\nkeys = ["{K2}"]\n[users.alice]\nkeys = ["{K1}"]\n',
    ),
}  # fmt: skip


@pytest.mark.parametrize(
    ("text", "name", "add", "remove", "want"), EDITS.values(), ids=EDITS.keys()
)
def test_set_user_keys(
    text: str, name: str, add: tuple[str, ...], remove: tuple[str, ...], want: str
) -> None:
    assert set_user_keys(text, name, add, remove) == want


@pytest.mark.parametrize(
    ("text", "remove", "want"),
    [
        (BASE, (K1,), "is not one of alice's keys"),
        ("[roles]\n", (K1,), r"no \[users.alice\]"),
        (f'[users.alice]\nkeys = [\n  "{K1}",\n]\n', (K1,), "edit it by hand"),
    ],
    ids=["a key the user does not have", "a user not there", "a keys list over several lines"],
)
def test_an_edit_that_cannot_be_made_says_why(
    text: str, remove: tuple[str, ...], want: str
) -> None:
    with pytest.raises(EditError, match=want):
        set_user_keys(text, "alice", (), remove)


def muster(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MUSTER_")}
    env.update(HOME=str(home), PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "muster.lean", *args],  # the installed `muster`
        capture_output=True, text=True, env=env, timeout=60, check=False,
        cwd=home,  # not the checkout: a `.muster/` left there by `muster up` holds keys
    )  # fmt: skip


def test_keygen_writes_a_private_key_and_user_add_registers_its_public_key(tmp_path: Path) -> None:
    made = muster("keygen", "--name", "alice", home=tmp_path)
    assert made.returncode == 0, made.stderr
    key_file = tmp_path / ".muster" / "user.nk"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    public = made.stdout.split("\n")[1]
    assert f"muster user add alice --key {public}" in made.stdout
    again = muster("keygen", home=tmp_path)
    assert again.returncode == 1 and "exists" in again.stderr  # never overwritten

    config = tmp_path / "cluster.toml"
    config.write_text((REPO / "deploy" / "local" / "cluster.toml").read_text())
    added = muster("user", "add", "alice", "--key", public, "--config", str(config), home=tmp_path)
    assert added.returncode == 0, added.stderr
    assert load_config(config.read_text()).users["alice"].keys == (public,)
    whoami = muster("whoami", home=tmp_path)
    assert whoami.stdout.startswith(public)


def test_a_user_add_that_would_break_the_configuration_writes_nothing(tmp_path: Path) -> None:
    config = tmp_path / "cluster.toml"
    text = (REPO / "deploy" / "local" / "cluster.toml").read_text()
    config.write_text(text)
    # a new user without an account is refused by the loader: the file stays as it was
    out = muster("user", "add", "zed", "--key", K1, "--config", str(config), home=tmp_path)
    assert out.returncode == 1 and "nothing written" in out.stderr
    assert "users.zed.accounts" in out.stderr
    assert config.read_text() == text
    bad = muster("user", "add", "alice", "--key", "UNOPE", "--config", str(config), home=tmp_path)
    assert bad.returncode == 1 and "not" in bad.stderr and config.read_text() == text
