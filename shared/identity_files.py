"""Shell: where identities are read from — the cluster configuration's `[users.*] keys`,
`[roles] operators`, `[accounts.*] coordinators` and `[cluster] private_data`; a folder
of public keys (`NAME.pub`, one key a line; how a local or test cluster registers the
users it creates); and, on the client, the user's own key file.

`IdentitySource.directory()` re-reads what changed at most once per `check_s`, so a key
an operator adds (`muster user add`) is honoured within a second or two, without a
restart, by every service that answers users.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shared.identity import Directory, directory_of, encode_seed
from shared.identity_key import KeyFileError as KeyFileError  # re-exported for the services
from shared.identity_key import load_signer as load_signer
from shared.logs import kv
from shared.privacy import DEFAULT_PRIVATE, PrivateData

log = logging.getLogger(__name__)
CHECK_S = 1.0


def _tables(doc: dict[str, Any], key: str) -> dict[str, dict[str, Any]]:
    value = doc.get(key, {})
    return (
        {k: v for k, v in value.items() if isinstance(v, dict)} if isinstance(value, dict) else {}
    )


def _strs(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()


def directory_from_toml(
    text: str, extra_keys: dict[str, tuple[str, ...]] | None = None
) -> Directory:
    """The identity part of a cluster configuration (admission validates the whole file;
    this reads only these keys). `extra_keys` adds keys from a key folder."""
    import tomllib  # the services read configurations; the CLI, which only signs, does not

    doc = tomllib.loads(text) if text else {}
    keys: dict[str, tuple[str, ...]] = {
        name: _strs(body.get("keys", ())) for name, body in _tables(doc, "users").items()
    }
    for name, more in (extra_keys or {}).items():
        keys[name] = keys.get(name, ()) + more
    accounts = _tables(doc, "accounts")
    cluster = doc.get("cluster", {})
    private = cluster.get("private_data") if isinstance(cluster, dict) else None
    roles = doc.get("roles", {})
    return directory_of(
        keys,
        operators=frozenset(_strs(roles.get("operators", ()) if isinstance(roles, dict) else ())),
        coordinators={a: _strs(b.get("coordinators", ())) for a, b in accounts.items()},
        parents={a: b.get("parent") for a, b in accounts.items()},
        private=(
            DEFAULT_PRIVATE
            if private is None
            else frozenset(PrivateData(p) for p in _strs(private) if p in set(PrivateData))
        ),
    )


def read_key_dir(folder: str) -> dict[str, tuple[str, ...]]:
    """`NAME.pub` files -> {NAME: keys}; `#` lines and blanks are skipped."""
    out: dict[str, tuple[str, ...]] = {}
    if not folder or not os.path.isdir(folder):
        return out
    for path in sorted(Path(folder).glob("*.pub")):
        lines = (line.strip() for line in path.read_text().splitlines())
        out[path.stem] = tuple(line for line in lines if line and not line.startswith("#"))
    return out


def _stamp(config_path: str, keys_dir: str) -> tuple[Any, ...]:
    """What `directory` compares to notice a change: every file's mtime and size."""
    paths = [config_path] if config_path else []
    if keys_dir:
        paths += [str(p) for p in sorted(Path(keys_dir).glob("*.pub"))]
    stamps: list[Any] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            stamps.append((path, None))
            continue
        stamps.append((path, st.st_mtime_ns, st.st_size))
    return tuple(stamps)


class IdentitySource:
    """The directory in force. `config_text` (when given) is the configuration text the
    service has accepted (admission keeps its own in force); otherwise the file at
    `config_path` is read. A file that no longer parses leaves the last directory."""

    def __init__(
        self,
        config_path: str,
        keys_dir: str = "",
        *,
        config_text: Callable[[], str] | None = None,
        check_s: float = CHECK_S,
    ) -> None:
        self.config_path = config_path
        self.keys_dir = keys_dir
        self.config_text = config_text
        self.check_s = check_s
        self._checked = float("-inf")
        self._stamps: tuple[Any, ...] = ()
        self._text: str | None = None
        self._seen: tuple[tuple[Any, ...], str | None] | None = None
        self._current = Directory()

    def directory(self) -> Directory:
        """The directory in force: files re-checked at most once per `check_s`; a new
        accepted configuration text (admission's reload) at once."""
        text = self.config_text() if self.config_text is not None else None
        now = time.monotonic()
        due = now - self._checked >= self.check_s
        if text is self._text and not due:
            return self._current
        if due:
            self._checked = now
            self._stamps = _stamp(self.config_path if text is None else "", self.keys_dir)
        if (self._stamps, text) != self._seen:
            self._reload(text)
            self._seen = (self._stamps, text)
        self._text = text
        return self._current

    def _reload(self, text: str | None) -> None:
        try:
            if text is None:
                text = Path(self.config_path).read_text() if self.config_path else ""
            self._current = directory_from_toml(text, read_key_dir(self.keys_dir))
        except (OSError, ValueError) as err:  # tomllib's error is a ValueError
            log.error("identities not reloaded", extra=kv(path=self.config_path, error=str(err)))


def write_seed(path: str, seed: str) -> None:
    """A new key file, mode 0600 from the start; an existing one is never overwritten."""
    Path(path).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(seed + "\n")


def provision_keys(folder: str, users: tuple[str, ...]) -> None:
    """A key per user in `folder`, kept if there: NAME.nk (the seed, 0600) and NAME.pub
    (what the services honour through `user_keys_dir`). For local and test clusters,
    whose one operator holds every user's key."""
    Path(folder).mkdir(parents=True, exist_ok=True, mode=0o700)
    for name in users:
        seed_file = os.path.join(folder, f"{name}.nk")
        if not os.path.exists(seed_file):
            write_seed(seed_file, encode_seed(os.urandom(32)))
        Path(folder, f"{name}.pub").write_text(load_signer(seed_file).public_key + "\n")
