"""sbatch (and muster submit) read the script from standard input when none is named,
as Slurm's sbatch does for a here-document or a pipe (muster/lean_request.py); from a
terminal, the command says to give one rather than wait on a keyboard."""

from __future__ import annotations

import io

import pytest

from muster.lean_request import submit_fields

SCRIPT = "#!/bin/bash\n#SBATCH -J piped\necho hi\n"


class Terminal(io.TextIOWrapper):
    def isatty(self) -> bool:
        return True


def stdin(text: str, cls: type[io.TextIOWrapper] = io.TextIOWrapper) -> io.TextIOWrapper:
    return cls(io.BytesIO(text.encode()))


def test_a_piped_script_is_submitted_as_a_named_one_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", stdin(SCRIPT))
    fields = submit_fields(["-t", "5"], dry_run=False)
    assert isinstance(fields, dict)
    assert (fields["script"], fields["script_path"], fields["argv"]) == (SCRIPT, "", ("-t", "5"))


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (stdin(""), "the script read from standard input is empty: give a script"),
        (stdin(SCRIPT, Terminal), "give a script: muster submit [options] SCRIPT [ARGS]"),
    ],
)
def test_no_script_at_all_says_to_give_one(
    monkeypatch: pytest.MonkeyPatch, given: io.TextIOWrapper, said: str
) -> None:
    monkeypatch.setattr("sys.stdin", given)
    fields = submit_fields(["-t", "5"], dry_run=False)
    assert isinstance(fields, str) and fields.startswith(said), fields


def test_wrap_reads_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", stdin(SCRIPT))
    fields = submit_fields(["--wrap", "hostname"], dry_run=False)
    assert isinstance(fields, dict) and fields["script"] == ""
