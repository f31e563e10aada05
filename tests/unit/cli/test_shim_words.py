"""`muster.shims._glued`: an option's value read as Slurm's getopt reads it."""

from __future__ import annotations

import pytest

from muster.shims import _glued

GLUED = {
    "a value that starts with -": (["-S", "-i", "-h"], ["--sort=-i", "-h"]),
    "the long name too": (["--sort", "-t,i"], ["--sort=-t,i"]),
    "written with = already": (["--sort=-i"], ["--sort=-i"]),
    "the option last, without its value": (["-h", "-S"], ["-h", "-S"]),
}


@pytest.mark.parametrize(("argv", "want"), GLUED.values(), ids=GLUED.keys())
def test_glued(argv: list[str], want: list[str]) -> None:
    assert _glued(argv, ("-S", "--sort")) == want
