"""The client's import path stays lean: a `muster queue` or `squeue` call loads no
service code, no asyncio, nats-py, asyncpg, ssl or TOML parser (each costs every call
its import; a sweep's loop and a monitoring poll pay it thousands of times)."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("asyncio", "nats", "asyncpg", "ssl", "tomllib", "uvloop", "opentelemetry", "services")

PROBE = """
import sys
sys.argv = [sys.argv[0], *{argv!r}]
try:
    import runpy
    runpy.run_module({module!r}, run_name="__main__")
except SystemExit:
    pass
heavy = {heavy!r}
print(sorted({{m.split(".")[0] for m in sys.modules}} & set(heavy)))
"""


@pytest.mark.parametrize(
    ("module", "argv"),
    [
        ("muster.cli", ["queue", "--help"]),
        ("muster.cli", ["submit", "--help"]),
        ("muster.shims", ["squeue", "--help"]),
        ("muster.shims", ["sbatch", "--help"]),
    ],
)
def test_a_command_loads_nothing_heavy(module: str, argv: list[str]) -> None:
    code = PROBE.format(module=module, argv=argv, heavy=HEAVY)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr
