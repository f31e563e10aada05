"""The command line: option forms, precedence over directives, and refusals."""

from __future__ import annotations

import msgspec
import pytest

from services.admission.errors import ErrorCode, SubmitError
from services.admission.sbatch import (
    MAX_SCRIPT_BYTES,
    CommandLine,
    parse_submission,
    split_command_line,
)
from shared.jobspec import JobSpec

from .builders import HOME, NOW, USER

SCRIPT = "#!/bin/bash\n#SBATCH -N 2\n#SBATCH -t 10:00\nsrun hostname\n"


def spec_for(*argv: str, script: str = SCRIPT) -> JobSpec:
    got = parse_submission(argv, script, user=USER, workdir=HOME, script_path="run.sh", now=NOW)
    assert got.errors == ()
    assert got.spec is not None
    return got.spec


def errors_for(*argv: str, script: str = SCRIPT) -> tuple[SubmitError, ...]:
    got = parse_submission(argv, script, user=USER, workdir=HOME, now=NOW)
    assert got.spec is None
    return got.errors


BASE = JobSpec(
    name="run.sh",
    user=USER,
    script=SCRIPT,
    script_name="run.sh",
    workdir=HOME,
    nodes_min=2,
    nodes_max=2,
    time_limit_s=600,
)

FORMS = {
    "the command line overrides a directive": (("-N", "3"), {"nodes_min": 3, "nodes_max": 3}),
    "--opt=value": (("--nodes=3",), {"nodes_min": 3, "nodes_max": 3}),
    "--opt value": (("--nodes", "3"), {"nodes_min": 3, "nodes_max": 3}),
    "--tasks-per-node, sbatch's older name": (("--tasks-per-node=4",), {"ntasks_per_node": 4}),
    "-N3 attached": (("-N3",), {"nodes_min": 3, "nodes_max": 3}),
    "grouped flags then a valued option": (("-HJx",), {"hold": True, "name": "x"}),
    "the last of repeated options wins": (("-t", "5", "-t", "7"), {"time_limit_s": 420}),
    "--nice alone is +100 as in Slurm": (("--nice",), {"nice": 100}),
    "--nice=-5 lowers the priority adjustment": (("--nice=-5",), {"nice": -5}),
    "--gpus-per-node with a type": (
        ("--gpus-per-node=h100:8",),
        {"gpus_per_node": 8, "gpu_model": "h100"},
    ),
    "--gres=gpu alone is one GPU": (("--gres=gpu",), {"gpus_per_node": 1}),
    "--gres=gpu:type with no count is one GPU": (
        ("--gres=gpu:a100",),
        {"gpus_per_node": 1, "gpu_model": "a100"},
    ),
    "--mem without a suffix is MiB": (("--mem=2048",), {"mem_mib": 2048}),
    "--mem in KiB rounds up to a MiB": (("--mem=1500K",), {"mem_mib": 2}),
    "--mem in TiB": (("--mem=1T",), {"mem_mib": 1024 * 1024}),
    "--mem=0 keeps Slurm's meaning: all of the node's memory": (("--mem=0",), {"mem_mib": 0}),
    "--signal with a name and SIG prefix": (
        ("--signal=SIGTERM@30",),
        {"signal": "TERM", "signal_before_s": 30},
    ),
    "--signal without a time defaults to 60 s before the end": (
        ("--signal=USR2",),
        {"signal": "USR2", "signal_before_s": 60},
    ),
    "--exclusive without a value": (("--exclusive",), {"exclusive": True}),
    "--export=NONE": (("--export=NONE",), {"export": "NONE"}),
    "--export of values only exports only those": (
        ("--export=A=1,B=x=y",),
        {"export": "NONE", "env": {"A": "1", "B": "x=y"}},
    ),
    "--begin at a clock time already past today means tomorrow": (
        ("--begin=07:00",),
        {"begin_at": NOW + 23 * 3600},
    ),
    "--begin tomorrow": (("--begin=tomorrow",), {"begin_at": NOW + 16 * 3600}),
    "--chdir absolute": (("-D", "/scratch/run"), {"workdir": "/scratch/run"}),
    "--time=0 means unlimited, as in Slurm": (("-t", "0"), {"time_limit_s": 2**31 - 1}),
    "--comment keeps spaces": (("--comment", "a b  c"), {"comment": "a b  c"}),
    "--account and --qos": (("-A", "prod", "-q", "low"), {"account": "prod", "qos": "low"}),
    "--torchrun is a Muster extra": (("--torchrun",), {"torchrun": True}),
    "--ray is a Muster extra": (("--ray",), {"ray": True}),
    "pyxis's container options; every node must have a runtime": (
        (
            "--container-image=nvcr.io/nvidia/pytorch:24.05-py3",
            "--container-workdir=/w",
            "--container-mounts=/data:/data:ro,/scratch",
        ),
        {
            "container_image": "nvcr.io/nvidia/pytorch:24.05-py3",
            "container_workdir": "/w",
            "container_mounts": ("/data:/data:ro", "/scratch"),
            "constraint": "container",
        },
    ),
    "a container job's constraint gains the runtime in every alternative": (
        ("--container-image=img", "-C", "[a100|h100]"),
        {"container_image": "img", "constraint": "[a100&container|h100&container]"},
    ),
}


@pytest.mark.parametrize(("argv", "changes"), FORMS.values(), ids=FORMS.keys())
def test_option_forms(argv: tuple[str, ...], changes: dict[str, object]) -> None:
    assert spec_for(*argv) == msgspec.structs.replace(BASE, **changes)


def err(code: ErrorCode, message: str, field: str) -> SubmitError:
    return SubmitError(code=code, message=message, field=field)


REFUSALS = {
    "an unknown long option": (
        ("--foo",),
        (err(ErrorCode.UNKNOWN_OPTION, "unrecognized option '--foo'", "foo"),),
    ),
    "an unknown short option": (
        ("-Z",),
        (err(ErrorCode.UNKNOWN_OPTION, "invalid option -- 'Z'", "Z"),),
    ),
    "an ambiguous abbreviation lists the candidates": (
        ("--gpus-per",),
        (
            err(
                ErrorCode.AMBIGUOUS_OPTION,
                "option '--gpus-per' is ambiguous; possibilities: --gpus-per-node, "
                "--gpus-per-socket, --gpus-per-task",
                "gpus-per",
            ),
        ),
    ),
    "a missing value": (
        ("--time",),
        (err(ErrorCode.MISSING_VALUE, "option '--time' requires an argument", "time"),),
    ),
    "a value on a flag": (
        ("--hold=yes",),
        (err(ErrorCode.UNEXPECTED_VALUE, "option '--hold' doesn't allow an argument", "hold"),),
    ),
    "a negative node count": (
        ("-N", "-2"),
        (err(ErrorCode.BAD_VALUE, "node count cannot be negative (-2); give 1 or more", "nodes"),),
    ),
    "a backwards node range": (
        ("-N", "4-2"),
        (
            err(
                ErrorCode.BAD_VALUE,
                "invalid --nodes '4-2': the maximum 2 is below the minimum 4",
                "nodes",
            ),
        ),
    ),
    "negative total GPUs": (
        ("-G", "-8"),
        (
            err(
                ErrorCode.BAD_VALUE,
                "GPU count in --gpus cannot be negative (-8); give 0 or more",
                "gpus",
            ),
        ),
    ),
    "total GPUs that do not divide over the nodes": (
        ("-G", "5"),
        (
            err(
                ErrorCode.CONFLICTING_OPTIONS,
                "--gpus=5 does not divide evenly over 2 nodes; give --gpus-per-node instead",
                "gpus",
            ),
        ),
    ),
    "total GPUs that disagree with GPUs per node": (
        ("-G", "8", "--gpus-per-node=2"),
        (
            err(
                ErrorCode.CONFLICTING_OPTIONS,
                "--gpus=8 (total) disagrees with --gpus-per-node=2 on 2 node(s); give only one "
                "of them",
                "gpus",
            ),
        ),
    ),
    "--ray and --torchrun together": (
        ("--ray", "--torchrun"),
        (
            err(
                ErrorCode.CONFLICTING_OPTIONS,
                "--ray and --torchrun are two launch modes; give one of them",
                "ray",
            ),
        ),
    ),
    "a container mount that is not an absolute path": (
        ("--container-image=img", "--container-mounts=data:/data"),
        (
            err(
                ErrorCode.BAD_VALUE,
                "--container-mounts=data:/data: each mount is /SRC[:/DST[:ro|rw]], comma-separated",
                "container-mounts",
            ),
        ),
    ),
    "a container with --torchrun": (
        ("--container-image=img", "--torchrun"),
        (
            err(
                ErrorCode.CONFLICTING_OPTIONS,
                "--container-image runs the script once per node; not with --ray or --torchrun",
                "container-image",
            ),
        ),
    ),
    "--mem and --mem-per-cpu together": (
        ("--mem=1G", "--mem-per-cpu=1G"),
        (
            err(
                ErrorCode.CONFLICTING_OPTIONS,
                "--mem, --mem-per-cpu are mutually exclusive; give one of them",
                "mem-per-cpu",
            ),
        ),
    ),
    "a dependency type Muster lacks": (
        ("-d", "expand:5"),
        (
            err(
                ErrorCode.BAD_VALUE,
                "invalid --dependency 'expand:5': 'expand' is not one of after, afterany, "
                "afterok, afternotok, aftercorr, singleton (each as type:jobid[:jobid...])",
                "dependency",
            ),
        ),
    ),
    "a delay on afterok": (
        ("-d", "afterok:5+10"),
        (
            err(
                ErrorCode.BAD_VALUE,
                "invalid --dependency 'afterok:5+10': a +minutes delay is allowed only with "
                "'after' (after:jobid+minutes)",
                "dependency",
            ),
        ),
    ),
    "an array over the maximum index": (
        ("-a", "0-5000"),
        (
            err(
                ErrorCode.BAD_VALUE,
                "invalid --array '0-5000': task id 5000 is over the maximum 1000",
                "array",
            ),
        ),
    ),
    "a node list given as a file": (
        ("-w", "./hosts.txt"),
        (
            err(
                ErrorCode.BAD_VALUE,
                "--nodelist './hosts.txt' looks like a file; Muster takes a hostlist such as "
                "gpu[01-04]",
                "nodelist",
            ),
        ),
    ),
    "a bad signal name": (
        ("--signal=B:NOPE",),
        (
            err(
                ErrorCode.BAD_VALUE,
                "invalid --signal 'B:NOPE': expected [B:]SIGNAL[@seconds], e.g. B:USR1@90, with "
                "a signal name such as USR1, TERM or a number",
                "signal",
            ),
        ),
    ),
    "a stray word among the options": (
        ("-N", "2", "oops"),
        (
            err(
                ErrorCode.BAD_VALUE,
                "unexpected argument(s) 'oops' among the options; options go before SCRIPT",
                "argv",
            ),
        ),
    ),
    "--batch-nodes=first with --torchrun (torchrun runs on every node)": (
        ("--torchrun", "--batch-nodes=first"),
        (
            err(
                ErrorCode.CONFLICTING_OPTIONS,
                "--batch-nodes=first: --ray and --torchrun run on every node; drop one of them",
                "batch-nodes",
            ),
        ),
    ),
    "--batch-nodes of neither first nor all": (
        ("--batch-nodes=some",),
        (
            err(
                ErrorCode.BAD_VALUE,
                "--batch-nodes=some: give first (Slurm's: the script on the first node only)"
                " or all",
                "batch-nodes",
            ),
        ),
    ),
    "an empty job name": (
        ("-J", ""),
        (err(ErrorCode.BAD_VALUE, "--job-name cannot be empty", "job-name"),),
    ),
}


@pytest.mark.parametrize(("argv", "want"), REFUSALS.values(), ids=REFUSALS.keys())
def test_refusals(argv: tuple[str, ...], want: tuple[SubmitError, ...]) -> None:
    assert errors_for(*argv) == want


def test_a_script_over_four_mebibytes_is_refused() -> None:
    big = "#!/bin/bash\n" + "#" * MAX_SCRIPT_BYTES
    (error,) = errors_for(script=big)
    assert error.code is ErrorCode.SCRIPT_TOO_LARGE
    assert "the limit is 4194304 bytes (4 MiB)" in error.message


def test_undecodable_bytes_are_refused_as_binary() -> None:
    (error,) = errors_for(script=b"#!/bin/bash\n\xff\xfe\n")  # type: ignore[arg-type]
    assert error.code is ErrorCode.SCRIPT_BINARY


def test_begin_without_a_clock_is_refused_rather_than_guessed() -> None:
    got = parse_submission(["--begin=now+1hour"], SCRIPT, user=USER, workdir=HOME)
    assert [e.field for e in got.errors] == ["begin"]


def test_wrap_makes_a_shell_script_and_needs_no_file() -> None:
    got = parse_submission(["--wrap", "python -c 'print(1)'"], "", user=USER, workdir=HOME)
    assert got.spec is not None
    assert (got.spec.name, got.spec.script) == ("wrap", "#!/bin/sh\npython -c 'print(1)'\n")


def test_dry_run_is_reported_apart_from_the_spec() -> None:
    got = parse_submission(["--dry-run"], SCRIPT, user=USER, workdir=HOME)
    assert got.dry_run
    assert got.spec is not None


def test_explicit_names_the_fields_the_submitter_set() -> None:
    got = parse_submission(["-p", "debug", "-A", "prod"], SCRIPT, user=USER, workdir=HOME)
    assert got.explicit == {
        "partition",
        "partitions",
        "account",
        "nodes_min",
        "nodes_max",
        "time_limit_s",
    }


SPLITS = {
    "options, script, then the script's own arguments": (
        ["-N", "2", "--partition", "debug", "train.sh", "--lr", "3e-4", "-N", "9"],
        CommandLine(
            options=("-N", "2", "--partition", "debug"),
            script="train.sh",
            args=("--lr", "3e-4", "-N", "9"),
        ),
    ),
    "attached values do not swallow the script": (
        ["-N2", "--time=5", "run.sh"],
        CommandLine(options=("-N2", "--time=5"), script="run.sh", args=()),
    ),
    "-- ends the options": (
        ["-H", "--", "-weird-name.sh", "x"],
        CommandLine(options=("-H",), script="-weird-name.sh", args=("x",)),
    ),
    "no script (with --wrap)": (
        ["--wrap", "hostname"],
        CommandLine(options=("--wrap", "hostname"), script=None, args=()),
    ),
}


@pytest.mark.parametrize(("argv", "want"), SPLITS.values(), ids=SPLITS.keys())
def test_split_command_line(argv: list[str], want: CommandLine) -> None:
    assert split_command_line(argv) == want


def test_bytes_the_cli_kept_with_surrogateescape_are_refused_as_binary() -> None:
    text = b"#!/bin/bash\n\xff\n".decode("utf-8", errors="surrogateescape")
    (error,) = errors_for(script=text)
    assert error.code is ErrorCode.SCRIPT_BINARY


@pytest.mark.parametrize(
    ("directive", "want_output", "want_comment"),
    [
        ("#SBATCH -o out#1.txt  # a comment", "out#1.txt", None),
        ('#SBATCH --comment="run #3" -o x # end', "x", "run #3"),
        ("#SBATCH --comment='it''s' -o y", "y", "its"),
        ("#SBATCH -o a\\ b", "a b", None),
    ],
)
def test_directive_comments_start_only_at_a_word(
    directive: str, want_output: str, want_comment: str | None
) -> None:
    spec = spec_for(script=f"#!/bin/bash\n{directive}\nrun\n")
    assert (spec.output, spec.comment) == (want_output, want_comment)


def test_a_byte_order_mark_from_a_windows_editor_is_dropped() -> None:
    got = parse_submission(
        [], "\ufeff#!/bin/bash\r\n#SBATCH -N 3\r\nrun\r\n", user=USER, workdir=HOME
    )
    assert got.spec is not None
    assert (got.spec.script, got.spec.nodes_max) == ("#!/bin/bash\n#SBATCH -N 3\nrun\n", 3)
    assert got.warnings == (
        "the script started with a UTF-8 byte order mark; removed it",
        "the script had DOS line endings (\\r\\n); converted to \\n",
    )


BATCH_NODES = {
    "muster submit's default: every node": ((), "", False, False),
    "sbatch's default: the first node, as Slurm's batch host": ((), "", True, True),
    "--batch-nodes=all on the command line over sbatch's default": (
        ("--batch-nodes=all",), "", True, False,
    ),
    "a directive over sbatch's default": ((), "#SBATCH --batch-nodes=all\n", True, False),
    "--batch-nodes=first asked of muster submit": (("--batch-nodes=first",), "", False, True),
    "--torchrun runs on every node whatever sbatch's default": (("--torchrun",), "", True, False),
    "--ray too": (("--ray",), "", True, False),
}  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "directive", "default", "first"), BATCH_NODES.values(), ids=BATCH_NODES.keys()
)
def test_where_the_batch_script_runs(
    argv: tuple[str, ...], directive: str, default: bool, first: bool
) -> None:
    script = SCRIPT.replace("#SBATCH -N 2\n", f"#SBATCH -N 2\n{directive}")
    got = parse_submission(argv, script, user=USER, workdir=HOME, batch_first_node=default)
    assert got.errors == ()
    assert got.spec is not None
    assert got.spec.batch_first_node is first
