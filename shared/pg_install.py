"""Plumbing: which PostgreSQL binaries run an embedded server. The pgserver wheel's
by default; its build has no OpenSSL, so a server with TLS runs a system PostgreSQL
built with it (Debian's `postgresql` package, `/usr/lib/postgresql/<major>/bin`), and
a data folder runs the binaries of the major version that made it."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

SYSTEM_PG = Path("/usr/lib/postgresql")  # Debian's: one <major>/bin per version


class PgInstallError(RuntimeError):
    """No PostgreSQL here fits (the message says what to install)."""


def pg_bin(data: Path | None = None, *, tls: bool = False) -> Path:
    """The PostgreSQL binaries to run: the pgserver wheel's, unless `tls` is asked for
    (that build has no OpenSSL) or the data folder `data` was made by another major
    version; then a system PostgreSQL that fits (built with OpenSSL for `tls`)."""
    version = _folder_version(data)
    for bin_dir in _pg_candidates():
        if tls and not _has_openssl(bin_dir):
            continue
        if version and _major(bin_dir) not in (version, ""):  # "": cannot tell, try it
            continue
        return bin_dir
    wanted = ", ".join(
        w
        for w in (
            "built with OpenSSL" if tls else "",
            f"major version {version}" if version else "",
        )
        if w
    )
    raise PgInstallError(
        f"no PostgreSQL ({wanted}) found: the pgserver wheel's has no TLS; "
        "apt-get install postgresql (Debian's is built with OpenSSL)"
    )


def pg_tls_available() -> bool:
    """Whether a PostgreSQL with TLS can be started here (tests skip without one)."""
    return any(_has_openssl(b) for b in _pg_candidates())


def _pg_candidates() -> list[Path]:
    from pgserver._commands import POSTGRES_BIN_PATH

    system = sorted(SYSTEM_PG.glob("*/bin/postgres"), key=lambda p: _numeric(p.parent.parent))
    return [Path(POSTGRES_BIN_PATH), *(p.parent for p in reversed(system))]


def _numeric(path: Path) -> int:
    return int(path.name) if path.name.isdigit() else 0


def _folder_version(data: Path | None) -> str:
    version = data / "PG_VERSION" if data is not None else None
    return version.read_text().strip() if version is not None and version.exists() else ""


@functools.cache
def _pg_config(bin_dir: Path, flag: str) -> str:
    done = subprocess.run([str(bin_dir / "pg_config"), flag], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else ""


def _major(bin_dir: Path) -> str:
    """The major version: "16" of "PostgreSQL 16.2"."""
    return _pg_config(bin_dir, "--version").removeprefix("PostgreSQL ").split(".")[0]


def _has_openssl(bin_dir: Path) -> bool:
    options = _pg_config(bin_dir, "--configure")
    return "--with-openssl" in options or "--with-ssl=openssl" in options
