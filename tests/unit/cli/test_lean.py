"""The lean commands (muster.lean) ask exactly what the full ones ask, print what they
print, or leave the words to them; and their hand-made parts (JSON, base32, the format
scanner) agree with the library code they stand in for."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

import muster.cli
import muster.cli_jobs
import muster.shims
from muster import lean, lean_request, render
from muster import slurm_format as fmt
from muster.exchange import API_PREFIX
from shared import api, states
from shared.api import JobView, QueueReply, QueueRequest
from shared.identity_sodium import b32decode, b32encode
from shared.lean_json import dumps, loads


class Captured(Exception):
    def __init__(self, value: Any) -> None:
        self.value = value


def _capture(*_: Any, **__: Any) -> Any:
    raise Captured(_[2] if len(_) > 2 else _[-1])


@pytest.fixture(autouse=True)
def cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MUSTER_NATS_URL", "nats://127.0.0.1:4222")
    monkeypatch.setenv("MUSTER_USER", "alice")
    monkeypatch.delenv("MUSTER_NO_LEAN", raising=False)
    monkeypatch.setattr(muster.cli_jobs, "request", _capture)
    monkeypatch.setattr(muster.shims, "request", _capture)
    monkeypatch.setattr(lean, "call", _capture)


def _lean(run: Any) -> Any:
    with pytest.raises(Captured) as got:
        run()
    return got.value.value


QUEUE_WORDS = [
    [],
    ["-u", "alice"],
    ["-ualice,bob", "-u", "carol"],
    ["--user=alice", "--partition", "gpu,cpu"],
    ["-t", "pd,r"],
    ["-a"],
    ["--all", "--start"],
    ["-p", "gpu", "-A", "ml", "-n", "sweep", "-j", "12_3", "--jobs=7"],
]
SQUEUE_WORDS = [
    [],
    ["-h"],
    ["-h", "-o", "%i %T"],
    ["--format=%.18i %j"],
    ["-t", "PD,R"],
    ["-t", "all"],
    ["--me"],
    ["-u", "bob", "--me", "--noheader"],
]
# forms the lean parsers leave to argparse (it may take them, or say what is wrong)
DECLINED = [["--json"], ["-hu", "x"], ["--us", "alice"], ["-u"], ["-u", "-h"], ["-x"], ["x"]]


@pytest.mark.parametrize("words", QUEUE_WORDS)
def test_muster_queue_asks_what_the_full_command_asks(words: list[str]) -> None:
    args = muster.cli.parse(["queue", *words])
    full = _lean(lambda: args.fn(args))
    fields = _lean(lambda: lean.muster(["queue", *words]))
    assert msgspec.convert(fields, QueueRequest) == full


@pytest.mark.parametrize("words", SQUEUE_WORDS)
def test_squeue_asks_what_the_full_shim_asks(words: list[str]) -> None:
    full = _lean(lambda: muster.shims.squeue(words))
    fields = _lean(lambda: lean.shim("squeue", words))
    assert msgspec.convert(fields, QueueRequest) == full


@pytest.mark.parametrize("words", DECLINED)
def test_forms_the_lean_parsers_do_not_read_are_left_to_the_full_commands(
    words: list[str],
) -> None:
    assert lean.muster(["queue", *words]) is None
    assert lean.shim("squeue", words) is None


@pytest.mark.parametrize(
    "words",
    [
        ["--json", "job.sh"],
        ["--dry-run", "job.sh"],
        ["--help"],
        ["--state", "x", "queue"],
    ],
)
def test_submit_forms_with_the_clis_own_options_are_left_to_it(words: list[str]) -> None:
    first = ["submit", *words] if words[0] != "--state" else words
    assert lean.muster(first) is None


@pytest.mark.parametrize(
    "words",
    [
        ["job.sh"],
        ["--hold", "-N", "2", "job.sh", "--lr", "3e-4"],
        ["-n", "4", "--gres=gpu:h100:2", "job.sh", "--json"],
        ["-p", "gpu", "--", "job.sh", "-x"],
    ],
)
def test_submit_and_sbatch_send_what_the_full_commands_send(
    words: list[str], tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.sh").write_text("#!/bin/sh\n#SBATCH --time=5\ntrue\n")
    args = muster.cli.parse(["submit", *words])
    full = _lean(lambda: args.fn(args))
    fields = _lean(lambda: lean.muster(["submit", *words]))
    assert msgspec.convert(fields, api.SubmitRequest) == full
    assert dumps(fields).encode() == msgspec.json.encode(full)  # the same bytes are signed
    sbatch_full = _lean(lambda: muster.shims.sbatch(["--parsable", *words]))
    sbatch = _lean(lambda: lean.shim("sbatch", ["--parsable", *words]))
    assert msgspec.convert(sbatch, api.SubmitRequest) == sbatch_full
    # sbatch's script runs on the first node (Slurm's batch host), muster submit's on all
    assert (sbatch_full.batch_first_node, full.batch_first_node) == (True, False)


def test_sbatch_wait_is_left_to_the_full_shim() -> None:
    assert lean.shim("sbatch", ["--wait", "job.sh"]) is None
    assert lean.shim("sbatch", ["-W", "job.sh"]) is None


COMMON: dict[str, Any] = {
    "qos": "normal",
    "submitted_at": 1.7e9,
    "time_limit_s": 3600,
    "exit_code": None,
    "restart_count": 0,
}
REPLY = QueueReply(
    jobs=(
        JobView(
            **COMMON,
            started_at=1.7e9 + 5,
            ended_at=None,
            job_id=7,
            name="train",
            user="alice",
            account="ml",
            partition="gpu",
            state="RUNNING",
            nodes=2,
            gpus=8,
            elapsed_s=3725,
            nodelist=("node01", "node02"),
            reason="",
        ),
        JobView(
            **COMMON,
            job_id=9,
            name="eval",
            user="bob",
            account="ml",
            partition="gpu",
            state="PENDING",
            nodes=1,
            gpus=1,
            elapsed_s=0,
            reason="Priority behind 7",
            array_job_id=8,
            array_task_id=1,
            nodelist=(),
            started_at=None,
            ended_at=None,
            estimated_start=1.7e9 + 600,
        ),
    )
)


def test_the_views_print_what_the_structs_print() -> None:
    view = lean_request.View(loads(msgspec.json.encode(REPLY)))
    assert render.queue_lines(view, start=False) == render.queue_lines(REPLY, start=False)  # type: ignore[arg-type]
    for form in (None, "%i %T %R", "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R"):
        assert fmt.squeue_lines(view.jobs, form, None, True) == fmt.squeue_lines(  # type: ignore[attr-defined]
            REPLY.jobs, form, None, True
        )


def test_the_lean_constants_are_the_libraries() -> None:
    assert API_PREFIX == api.API_PREFIX
    assert {str(s) for s in states.LIVE_RUN} == render.LIVE_RUN


PERCENT = re.compile(r"%(\.)?(\d+)?(.)")


@given(st.text(alphabet="%.12ab\n x", max_size=12))
def test_the_format_scanner_finds_what_the_regular_expression_finds(text: str) -> None:
    want = [(m.start(), m.end(), m[1] or "", m[2] or "", m[3]) for m in PERCENT.finditer(text)]
    assert list(fmt._percents(text)) == want


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(JSON)
def test_lean_json_reads_and_writes_what_json_does(value: Any) -> None:
    assert json.loads(dumps(value)) == value
    assert loads(json.dumps(value)) == value
    assert loads(msgspec.json.encode(value)) == value


@pytest.mark.parametrize("bad", ["", "{", "[1] x", "nan", "{'a': 1}"])
def test_lean_json_refuses_what_is_not_json(bad: str) -> None:
    with pytest.raises(ValueError):
        loads(bad)


@given(st.binary(max_size=40))
def test_base32_is_rfc_4648s_without_padding(data: bytes) -> None:
    assert b32encode(data) == base64.b32encode(data).rstrip(b"=")
    assert b32decode(b32encode(data)) == data
