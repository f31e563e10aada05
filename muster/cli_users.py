"""Shell (+ a pure text edit): the identity commands of `muster`.

`muster keygen` makes the user's key (`~/.muster/user.nk`, mode 0600) and prints the
public key an operator registers; `muster user add NAME --key U...` and `muster user
remove-key NAME --key U...` edit the cluster configuration's `[users.NAME] keys` in
place (checked with admission's loader before the file is replaced, so a bad edit never
lands); the services pick the change up within seconds (they watch the file). See
docs/security.md.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Any

from muster.client import default_key_file, key_file
from shared.identity import encode_seed, public_key_bytes
from shared.identity_files import KeyFileError, load_signer, write_seed


class EditError(ValueError):
    """The file cannot be edited safely by the command; the message says what to do."""


def _header(name: str) -> re.Pattern[str]:
    return re.compile(rf"^\[users\.{re.escape(name)}\]\s*(#.*)?$")


def set_user_keys(
    text: str,
    name: str,
    add: tuple[str, ...] = (),
    remove: tuple[str, ...] = (),
    accounts: tuple[str, ...] = (),
) -> str:
    """Pure: `text` with `[users.NAME] keys` holding its keys + `add` - `remove` (the
    section is appended, with `accounts`, when there is none). Comments and the rest of
    the file are kept as written."""
    lines = text.splitlines()
    head = next((i for i, line in enumerate(lines) if _header(name).match(line.strip())), None)
    if head is None:
        if remove:
            raise EditError(f"no [users.{name}] in the configuration")
        block = [f"[users.{name}]"]
        if accounts:
            block.append(f"accounts = {_toml_list(accounts)}")
        block.append(f"keys = {_toml_list(add)}")
        return "\n".join([*lines, "", *block]) + "\n"
    end = next(
        (i for i in range(head + 1, len(lines)) if lines[i].lstrip().startswith("[")), len(lines)
    )
    at = next((i for i in range(head + 1, end) if re.match(r"^\s*keys\s*=", lines[i])), None)
    import tomllib  # only this command parses TOML; every other call is spared the import

    keys: list[str] = []
    if at is not None:
        try:
            keys = list(tomllib.loads(lines[at])["keys"])
        except (tomllib.TOMLDecodeError, KeyError) as err:
            raise EditError(f"users.{name}.keys spans several lines; edit it by hand") from err
    missing = [k for k in remove if k not in keys]
    if missing:
        raise EditError(f"{', '.join(missing)} is not one of {name}'s keys")
    keys = [k for k in keys if k not in remove] + [k for k in add if k not in keys]
    line = f"keys = {_toml_list(tuple(keys))}"
    if at is None:
        lines.insert(head + 1, line)
    else:
        lines[at] = line
    return "\n".join(lines) + "\n"


def _toml_list(items: tuple[str, ...]) -> str:
    return "[" + ", ".join(f'"{item}"' for item in items) + "]"


def _config_path(args: argparse.Namespace) -> Path:
    path = args.config or os.environ.get("MUSTER_CLUSTER_CONFIG")
    if not path:
        raise SystemExit("name the cluster configuration: --config FILE or MUSTER_CLUSTER_CONFIG")
    return Path(path)


def cmd_keygen(args: argparse.Namespace) -> int:
    path = Path(args.file) if args.file else default_key_file()
    if path.exists():
        print(
            f"muster keygen: {path} exists; keep it, or write a new key elsewhere with --file "
            "(to rotate: register the new key, then remove the old)",
            file=sys.stderr,
        )
        return 1
    write_seed(str(path), encode_seed(os.urandom(32)))
    public = load_signer(str(path)).public_key
    print(f"wrote {path} (mode 0600); your public key:\n{public}")
    name = args.name or os.environ.get("USER", "NAME")
    print(f"an operator registers it: muster user add {name} --key {public}")
    return 0


def cmd_whoami(_args: argparse.Namespace) -> int:
    path = key_file()
    try:
        print(f"{load_signer(str(path)).public_key}  ({path})")
    except KeyFileError as err:
        print(f"muster whoami: {err}; run `muster keygen`", file=sys.stderr)
        return 1
    return 0


def _edit(args: argparse.Namespace, *, add: tuple[str, ...], remove: tuple[str, ...]) -> int:
    from services.admission.config import ConfigError, load_config  # only this command's

    for key in (*add, *remove):
        try:
            public_key_bytes(key)
        except ValueError as err:
            print(f"muster user: {err}", file=sys.stderr)
            return 1
    path = _config_path(args)
    try:
        text = set_user_keys(path.read_text(), args.name, add, remove, tuple(args.account or ()))
        load_config(text)
    except (EditError, OSError) as err:
        print(f"muster user: {path}: {err}", file=sys.stderr)
        return 1
    except ConfigError as err:
        print(
            f"muster user: the edit would make {path} invalid; nothing written\n{err}",
            file=sys.stderr,
        )
        return 1
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)  # the services never read half a file
    print(
        f"{path}: {args.name} keys updated; the services honour it within a few seconds"
        " (a local cluster's bus too; on a real cluster render the bus users with"
        " `python -m muster.bus_users AUTHORIZATION.conf --config CLUSTER.toml` and reload"
        " NATS: docs/security.md)"
    )
    return 0


def cmd_user(args: argparse.Namespace) -> int:
    if args.action == "add":
        return _edit(args, add=(args.key,), remove=())
    return _edit(args, add=(), remove=(args.key,))


def register(sub: Any) -> None:
    """Add `keygen`, `whoami` and `user add|remove-key` to the `muster` parser."""
    s = sub.add_parser("keygen", help="make your key (~/.muster/user.nk) and print its public key")
    s.add_argument("--file", help="write the key here instead")
    s.add_argument("--name", help="your user name, for the printed registration command")
    s.set_defaults(fn=cmd_keygen)
    sub.add_parser("whoami", help="the public key your requests are signed with").set_defaults(
        fn=cmd_whoami
    )
    s = sub.add_parser("user", help="register or remove a user's key (operators)")
    s.add_argument("action", choices=("add", "remove-key"))
    s.add_argument("name")
    s.add_argument("--key", required=True, help="the user's public key (U...)")
    s.add_argument("--account", action="append", help="accounts of a new user")
    s.add_argument("--config", help="the cluster configuration (default MUSTER_CLUSTER_CONFIG)")
    s.set_defaults(fn=cmd_user)
