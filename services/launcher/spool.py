"""Shell: the node agent's spool, where a job's script is written before it runs.

The agent runs as root and the job as its user, so nothing here may follow a path the
user could have swapped. The spool root is the agent's own folder (created 0711, refused
if it is a symlink, not the agent's, or writable by others); each generation gets a
fresh folder `job-<id>-<attempt>-<generation>` made by the agent (0711: the user may
enter it, not list it or write in it; 0700 when the job runs as the agent itself), and
the script is created in it with `O_CREAT | O_EXCL | O_NOFOLLOW` through the folder's
descriptor, then handed to the user by `fchown` of that descriptor: the only thing ever
chowned is the file this call created. The folder is removed when the job ends.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path

from services.launcher.executor import LaunchError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeSpool(LaunchError):
    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"refusing to use the spool {path}: {reason}")


class Spool:
    def __init__(self, root: str) -> None:
        self.root = Path(root)

    def folder(self, job_id: int, attempt: int, generation: int) -> Path:
        return self.root / f"job-{job_id}-{attempt}-{generation}"

    def write(
        self, job_id: int, attempt: int, generation: int, name: str, script: str,
        uid: int | None,
    ) -> str:  # fmt: skip
        """A fresh folder for this generation holding `script` as `name`, owned by `uid`
        (None: the agent's own user); the folder's path."""
        folder = self.folder(job_id, attempt, generation)
        root_fd = self._open_root()
        try:
            _remove_at(root_fd, folder.name)  # a leftover of an agent that died mid-job
            os.mkdir(folder.name, 0o700, dir_fd=root_fd)
            fd = os.open(folder.name, _DIR_FLAGS, dir_fd=root_fd)
        finally:
            os.close(root_fd)
        try:
            os.fchmod(fd, 0o711 if uid is not None else 0o700)
            _write_script(fd, Path(name).name or "script.sh", script, uid)
        finally:
            os.close(fd)
        return str(folder)

    def remove(self, job_id: int, attempt: int, generation: int) -> None:
        self.remove_folder(str(self.folder(job_id, attempt, generation)))

    def remove_folder(self, path: str) -> None:
        """Remove a folder this spool made (anything else is left alone)."""
        folder = Path(path)
        if not path or folder.parent != self.root or not folder.name.startswith("job-"):
            return
        with contextlib.suppress(FileNotFoundError, UnsafeSpool):
            root_fd = self._open_root()
            try:
                _remove_at(root_fd, folder.name)
            finally:
                os.close(root_fd)

    def _open_root(self) -> int:
        """The spool root's descriptor, made if missing, checked to be the agent's own."""
        self.root.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.root, 0o711)
        try:
            fd = os.open(self.root, _DIR_FLAGS)
        except OSError as err:  # ELOOP: a symlink
            raise UnsafeSpool(
                str(self.root), f"cannot open it as a folder ({err.strerror})"
            ) from err
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            os.close(fd)
            raise UnsafeSpool(
                str(self.root), "it must belong to the agent's user and be writable by no other"
            )
        if st.st_mode & 0o011 != 0o011:  # made under a strict umask: jobs must enter it
            os.fchmod(fd, stat.S_IMODE(st.st_mode) | 0o011)
        return fd


def _write_script(folder_fd: int, name: str, script: str, uid: int | None) -> None:
    fd = os.open(name, _FILE_FLAGS, 0o500, dir_fd=folder_fd)
    try:
        os.write(fd, script.encode("utf-8", errors="surrogateescape"))
        if uid is not None:
            os.fchown(fd, uid, -1)
        os.fchmod(fd, 0o500)  # readable and runnable by its owner only
    finally:
        os.close(fd)


def _remove_at(root_fd: int, name: str) -> None:
    """Remove `name` under the root descriptor without following a symlink anywhere."""
    try:
        st = os.stat(name, dir_fd=root_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=root_fd)  # fd-based on Linux: symlinks are not followed
    else:
        os.unlink(name, dir_fd=root_fd)
