"""Ordinary shell use ends in one line or nothing, never a traceback: a closed pipe, an
unreachable cluster, Ctrl-C while waiting for the cluster, `srun` outside a job.
Each drives the real command in a subprocess."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from subprocess import PIPE, Popen

import pytest

from muster.shims import ShimError, write_shims
from shared.identity_files import provision_keys
from tests.support.ports import closed_port


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A key of this module's own: a command signs before it connects, and a key left in
    the environment by another test (a cluster's MUSTER_KEY_DIR) is no key to count on."""
    folder = tmp_path_factory.mktemp("keys")
    provision_keys(str(folder), ("quiet",))
    return str(folder / "quiet.nk")


def muster(
    *args: str, url: str = "nats://127.0.0.1:1", stdout: int = -1, key: str = ""
) -> Popen[str]:
    env = {**os.environ, "MUSTER_NATS_URL": url}
    if key:
        env["MUSTER_KEY_FILE"] = key
    return Popen([sys.executable, "-m", *args], env=env, text=True, stdout=stdout, stderr=PIPE)


def test_a_reader_that_went_away_ends_the_command_silently(tmp_path: Path) -> None:
    read, write = os.pipe()
    os.close(read)  # `| head` already gone: the first write fails
    p = muster("muster.cli", "shims", str(tmp_path), stdout=write)
    os.close(write)
    _, err = p.communicate(timeout=60)
    assert (p.returncode, err) == (128 + signal.SIGPIPE, "")


@pytest.mark.parametrize("command", [("muster.cli", "queue"), ("muster.shims", "squeue")])
def test_an_unreachable_cluster_is_one_line(command: tuple[str, ...], key: str) -> None:
    port = closed_port()
    p = muster(*command, url=f"nats://127.0.0.1:{port}", stdout=subprocess.PIPE, key=key)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 1
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"cannot reach the cluster's NATS at nats://127.0.0.1:{port}" in err


def test_ctrl_c_while_waiting_for_the_cluster_says_nothing(key: str) -> None:
    with socket.socket() as server:  # accepts, then never speaks: the client waits
        server.bind(("127.0.0.1", 0))
        server.listen()
        url = f"nats://127.0.0.1:{server.getsockname()[1]}"
        p = muster("muster.cli", "queue", url=url, stdout=subprocess.PIPE, key=key)
        server.settimeout(60)
        conn, _ = server.accept()  # the command is past its imports, in its request
        with conn:
            p.send_signal(signal.SIGINT)
            _, err = p.communicate(timeout=60)
    assert (p.returncode, err.strip()) == (128 + signal.SIGINT, "")


def test_srun_outside_a_job_that_cannot_allocate_says_why_in_one_line() -> None:
    """Outside a job srun makes an allocation (muster/srun_alloc.py): here it has no key
    to ask with, and one line says so."""
    p = muster("muster.shims", "srun", "hostname", stdout=subprocess.PIPE)
    out, err = p.communicate(timeout=60)
    assert (p.returncode, out) == (1, "")
    assert err.startswith("srun: error: ")
    assert err.count("\n") == 1


def test_shims_are_never_written_over_a_file_unless_forced(tmp_path: Path) -> None:
    (tmp_path / "sbatch").write_text("#!/bin/sh\necho the real one\n")
    with pytest.raises(ShimError, match="sbatch already in"):
        write_shims(tmp_path)
    assert not (tmp_path / "squeue").exists()
    assert "the real one" in (tmp_path / "sbatch").read_text()
    names = write_shims(tmp_path, force=True, python="/opt/py")
    assert len(names) == 12 and "sreport" in names and "sprio" in names and "seff" in names
    assert (tmp_path / "sbatch").read_text() == (
        '#!/bin/sh\nexec "/opt/py" -m muster.shims sbatch "$@"\n'
    )
    assert os.access(tmp_path / "salloc", os.X_OK)
