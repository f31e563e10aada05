"""Shell: the user's own key file, read on the client to sign its requests.

Apart from shared.identity_files (the services' side: configurations, key folders, with
logging and pathlib) so a one-shot CLI command loads only what reading one file takes.
"""

from __future__ import annotations

import os
import stat

from shared.identity import Signer


class KeyFileError(Exception):
    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path


def load_signer(path: str) -> Signer:
    """The user's key from `path`, refused (as ssh does) if others may read it."""
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
    try:
        return Signer(text.strip())
    except ValueError as err:
        raise KeyFileError(path, str(err)) from err
