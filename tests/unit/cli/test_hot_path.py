"""A `muster queue`, `muster submit`, `squeue` or `sbatch` call loads only what it
needs: run as its own process without site (as a shim runs), through signing and a
connection attempt, it has loaded no service code, no asyncio or nats-py, none of
PyNaCl's binding modules or nkeys, and none of pathlib, inspect, logging,
typing_extensions or urllib (each costs every call its import). The parser built for
one command is the whole parser's for that command, and msgspec's fallback from
typing_extensions reads every API struct's types as typing_extensions would."""

from __future__ import annotations

import subprocess
import sys
import typing
from pathlib import Path

import msgspec
import pytest
import typing_extensions

import shared.api
from muster.cli import PART_OF, PARTS, build_parser
from muster.shim_script import shim_text, site_paths
from shared.identity import encode_seed
from tests.support.ports import closed_port

FORBIDDEN = (
    "asyncio",
    "asyncpg",
    "encodings.idna",
    "getpass",
    "inspect",
    "logging",
    "nacl.bindings",
    "nacl.signing",
    "nats",
    "nkeys",
    "pathlib",
    "services",
    "ssl",
    "tomllib",
    "typing_extensions",
    "urllib",
    "uvloop",
)

PROBE = """
import sys
sys.path = [p for p in sys.path if p] + {paths!r}
{entry}
status = main({argv!r})
loaded = {{m for m in sys.modules if sys.modules[m] is not None}}
forbidden = {forbidden!r}
print(status, sorted(m for m in loaded if any(m == f or m.startswith(f + ".") for f in forbidden)))
"""


@pytest.fixture(scope="module")
def paths() -> list[str]:
    found = site_paths(sys.executable)
    assert found is not None
    return found


@pytest.mark.parametrize(
    ("module", "argv"),
    [
        ("muster.cli", ["queue"]),
        ("muster.cli", ["submit", "--hold", "job.sh"]),
        ("muster.shims", ["squeue", "-h"]),
        ("muster.shims", ["sbatch", "--parsable", "job.sh"]),
    ],
)
def test_a_call_signs_and_connects_without_loading_anything_heavy(
    module: str, argv: list[str], paths: list[str], tmp_path: Path
) -> None:
    entry = f"import muster.lean_msgspec; from {module} import main"
    code = PROBE.format(paths=paths, entry=entry, argv=argv, forbidden=FORBIDDEN)
    probe(code, tmp_path, MUSTER_USER="alice")


def probe(code: str, folder: Path, **env: str) -> None:
    """Run `code` as its own process without site, as a user with a key would against a
    cluster that refuses the connection: status 1 after the request was built and
    signed, and none of the forbidden modules loaded."""
    key = folder / "me.nk"
    key.write_text(encode_seed(bytes(range(32))) + "\n")
    key.chmod(0o600)
    (folder / "job.sh").write_text("#!/bin/sh\n#SBATCH --time=5\ntrue\n")
    env = {
        "PATH": "/usr/bin:/bin",
        "MUSTER_NATS_URL": f"nats://127.0.0.1:{closed_port()}",
        "MUSTER_KEY_FILE": str(key),
        **env,
    }
    out = subprocess.run(
        [sys.executable, "-S", "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=folder,
        timeout=60,
    )
    assert out.stdout.strip().splitlines()[-1] == "1 []", out.stdout + out.stderr
    assert "cannot reach the cluster" in out.stderr, out.stderr


def test_the_parts_table_names_every_command_in_the_parsers_order() -> None:
    whole = build_parser()._subparsers._group_actions[0]  # type: ignore[union-attr]
    assert list(whole.choices) == list(PART_OF)  # type: ignore[arg-type]
    for part, commands in PARTS.items():
        one = build_parser(commands[0])._subparsers._group_actions[0]  # type: ignore[union-attr]
        assert tuple(one.choices) == commands, part  # type: ignore[arg-type]


@pytest.mark.parametrize("command", list(PART_OF))
def test_one_commands_parser_has_the_whole_parsers_usage_and_help(command: str) -> None:
    whole, one = build_parser(), build_parser(command)
    assert one.format_usage() == whole.format_usage()
    assert _sub(one, command).format_help() == _sub(whole, command).format_help()


def _sub(parser: typing.Any, command: str) -> typing.Any:
    return parser._subparsers._group_actions[0].choices[command]


def test_msgspec_reads_every_api_struct_as_typing_extensions_would() -> None:
    structs = [
        v
        for v in vars(shared.api).values()
        if isinstance(v, type) and issubclass(v, msgspec.Struct) and v is not msgspec.Struct
    ]
    assert len(structs) > 10
    for struct in structs:
        assert typing.get_type_hints(struct, include_extras=True) == (
            typing_extensions.get_type_hints(struct, include_extras=True)
        ), struct.__name__
    assert typing_extensions.Required is typing.Required
    assert typing_extensions.NotRequired is typing.NotRequired


def test_a_shim_survives_quotes_and_dollars_in_its_paths(paths: list[str], tmp_path: Path) -> None:
    odd = str(tmp_path / 'it\'s "odd" $HOME `x`')
    shim = tmp_path / "squeue"
    shim.write_text(shim_text(sys.executable, "squeue", [*paths, odd]))
    shim.chmod(0o755)
    out = subprocess.run([str(shim), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: squeue"), out.stdout


def test_a_shim_for_an_interpreter_that_cannot_run_is_the_plain_one() -> None:
    assert site_paths("/nonexistent/python") is None
    want = '#!/bin/sh\nexec "/nonexistent/python" -m muster.shims squeue "$@"\n'
    assert shim_text("/nonexistent/python", "squeue", None) == want


# The lean forms (muster.lean) load none of these either: each costs a call here more
# than the command's own work.
LEAN_FORBIDDEN = (
    *FORBIDDEN,
    "argparse",
    "base64",
    "collections",
    "contextlib",
    "enum",
    "functools",
    "json",
    "msgspec",
    "re",
    "shared.api",
    "shared.identity",
    "signal",
    "typing",
)


@pytest.mark.parametrize(
    ("entry", "argv"),
    [
        ("main", ["queue"]),
        ("main", ["queue", "-u", "alice,bob", "-t", "PD", "--start"]),
        ("main", ["submit", "--hold", "job.sh"]),
        ("shim_main", ["squeue", "-h", "-o", "%i %T"]),
        ("shim_main", ["sbatch", "--parsable", "job.sh"]),
    ],
)
def test_a_lean_call_loads_neither_msgspec_nor_argparse_typing_enum_or_re(
    entry: str, argv: list[str], paths: list[str], tmp_path: Path
) -> None:
    start = f"from muster.lean import {entry} as main"
    code = PROBE.format(paths=paths, entry=start, argv=argv, forbidden=LEAN_FORBIDDEN)
    probe(code, tmp_path, USER="alice")  # no MUSTER_USER: the login name, without getpass
