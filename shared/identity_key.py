"""Shell: the user's own key file, read on the client to sign its requests.

Apart from shared.identity_files (the services' side: configurations, key folders, with
logging and pathlib) so a one-shot CLI command loads only what reading one file takes.
"""

from __future__ import annotations

import os
import stat

from shared.identity_sodium import KEYGEN_HINT, SeedPair, checked_seed

TYPE_CHECKING = False  # mypy takes it as true
if TYPE_CHECKING:
    from shared.identity import Signer

__all__ = ["KEYGEN_HINT", "KeyFileError", "load_pair", "load_signer"]


class KeyFileError(Exception):
    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path


def load_signer(path: str) -> Signer:
    """The user's key from `path`, refused (as ssh does) if others may read it."""
    from shared.identity import Signer

    try:
        return Signer(read_seed(path))
    except ValueError as err:
        raise KeyFileError(path, str(err)) from err


def load_pair(path: str) -> SeedPair:
    """`load_signer` for the lean commands (muster.lean): the key pair alone, which
    signs the same bytes, without shared.identity's msgspec."""
    try:
        seed = read_seed(path)
        checked_seed(seed)  # a damaged file is refused, as load_signer refuses it
        return SeedPair(seed)
    except ValueError as err:
        raise KeyFileError(path, str(err)) from err


def read_seed(path: str) -> str:
    """The seed text in `path`, refused (as ssh does) if others may read it."""
    try:
        st = os.stat(path)
        with open(path) as f:
            text = f.read()
    except FileNotFoundError as err:
        raise KeyFileError(path, "no key file here") from err
    except OSError as err:
        raise KeyFileError(path, f"cannot read the key: {err.strerror}") from err
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyFileError(
            path,
            f"the key is readable by others (mode {stat.S_IMODE(st.st_mode):04o}): chmod 600 it",
        )
    return text.strip()
