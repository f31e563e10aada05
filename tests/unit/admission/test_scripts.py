"""A corpus of real-looking batch scripts: each parses to a whole JobSpec or exact errors."""

from __future__ import annotations

import pytest

from services.admission.errors import ErrorCode, SubmitError
from services.admission.sbatch import parse_submission
from shared.jobspec import Dependency, JobSpec

from .builders import HOME, NOW, USER, job, script


def parse(name: str, argv: tuple[str, ...] = ()) -> tuple[JobSpec | None, tuple[str, ...]]:
    got = parse_submission(
        argv, script(name), user=USER, workdir=HOME, script_path=f"{HOME}/{name}", now=NOW
    )
    assert got.errors == (), got.errors
    return got.spec, got.warnings


ACCEPTED = {
    "a script with only a command gets every default": ("minimal.sh", job("minimal.sh"), ()),
    "a large pretraining script sets every common option": (
        "llm_pretrain.sbatch",
        job(
            "llm_pretrain.sbatch",
            name="llama-pretrain",
            account="research",
            qos="high",
            partition="normal",
            partitions=("normal",),
            nodes_min=4,
            nodes_max=4,
            gpus_per_node=8,
            ntasks_per_node=8,
            cpus_per_task=12,
            mem_mib=512 * 1024,
            time_limit_s=2 * 86400,
            exclusive=True,
            signal="USR1",
            signal_before_s=120,
            signal_batch_only=True,
            output="logs/%x-%j.out",
            error="logs/%x-%j.err",
        ),
        (),
    ),
    "an elastic torchrun job takes MIN:MAX nodes and a typed gres": (
        "elastic_torchrun.sh",
        job(
            "elastic_torchrun.sh",
            name="finetune",
            nodes_min=2,
            nodes_max=4,
            gpus_per_node=4,
            gpu_model="a100",
            torchrun=True,
            elastic=True,
        ),
        (),
    ),
    "MIN-MAX nodes is elastic too, several options share one directive": (
        "elastic_dash_range.sh",
        job(
            "elastic_dash_range.sh",
            nodes_min=1,
            nodes_max=3,
            gpus_per_node=4,
            time_limit_s=4 * 3600,
            elastic=True,
        ),
        (),
    ),
    "comments after directives and between them are ignored, quotes are honoured": (
        "comments_after_directives.sh",
        job(
            "comments_after_directives.sh",
            name="my job",
            nodes_min=2,
            nodes_max=2,
            gpus_per_node=2,
            time_limit_s=90 * 60,
        ),
        (),
    ),
    "a script with Windows line endings is read and stored with Unix ones": (
        "windows_crlf.sh",
        job("windows_crlf.sh", name="from-windows", nodes_min=2, nodes_max=2),
        ("the script had DOS line endings (\\r\\n); converted to \\n",),
    ),
    "a directive after the first command is ignored, with a warning": (
        "directive_after_command.sh",
        job("directive_after_command.sh"),
        (
            "line 4: #SBATCH after the first command is ignored "
            "(directives must come before any command, as in sbatch)",
        ),
    ),
    "sbatch options Muster does not implement are named in one warning": (
        "unsupported_options.sh",
        job("unsupported_options.sh"),
        (
            "sbatch option(s) not supported by Muster, ignored: --mail-type, --mail-user, "
            "--licenses, --reservation",
        ),
    ),
    "time as minutes": ("time_minutes.sh", job("time_minutes.sh", time_limit_s=1800), ()),
    "time as minutes:seconds": (
        "time_minutes_seconds.sh",
        job("time_minutes_seconds.sh", time_limit_s=1815),
        (),
    ),
    "time as hours:minutes:seconds": (
        "time_hours_minutes_seconds.sh",
        job("time_hours_minutes_seconds.sh", time_limit_s=12 * 3600 + 1800),
        (),
    ),
    "time as days-hours": (
        "time_days_hours.sh",
        job("time_days_hours.sh", time_limit_s=36 * 3600),
        (),
    ),
    "time as days-hours:minutes, attached to -t": (
        "time_days_hours_minutes.sh",
        job("time_days_hours_minutes.sh", time_limit_s=2 * 86400 + 6 * 3600 + 1800),
        (),
    ),
    "time as days-hours:minutes:seconds": (
        "time_days_hours_minutes_seconds.sh",
        job("time_days_hours_minutes_seconds.sh", time_limit_s=3 * 86400 + 5),
        (),
    ),
    "UNLIMITED time is kept as the sentinel admission turns into the partition maximum": (
        "time_unlimited.sh",
        job(
            "time_unlimited.sh",
            partition="large",
            partitions=("large",),
            time_limit_s=2**31 - 1,
        ),
        (),
    ),
    "a strided, throttled array is normalised": (
        "array_throttled.sh",
        job(
            "array_throttled.sh",
            name="sweep",
            array_spec="0,4,8,12%2",
            array_max_running=2,
            output="sweep-%A_%a.out",
        ),
        (),
    ),
    "an array given as a list": ("array_list.sh", job("array_list.sh", array_spec="1,3,5-7"), ()),
    "comma-separated dependencies must all hold": (
        "dependency_all.sh",
        job(
            "dependency_all.sh",
            dependencies=(
                Dependency(kind="afterok", job_ids=(100, 101)),
                Dependency(kind="afterany", job_ids=(102,)),
            ),
        ),
        (),
    ),
    "question-mark-separated dependencies need any one": (
        "dependency_any.sh",
        job(
            "dependency_any.sh",
            dependencies=(
                Dependency(kind="afternotok", job_ids=(5,)),
                Dependency(kind="afterok", job_ids=(6,)),
            ),
            dependency_any=True,
        ),
        (),
    ),
    "after with a delay in minutes, and singleton": (
        "dependency_delay_singleton.sh",
        job(
            "dependency_delay_singleton.sh",
            dependencies=(
                Dependency(kind="after", job_ids=(7,), delay_s=600),
                Dependency(kind="singleton"),
            ),
        ),
        (),
    ),
    "node lists and exclusions are hostlist expressions": (
        "hostlists.sh",
        job(
            "hostlists.sh",
            nodes_min=2,
            nodes_max=2,
            required_nodes=("node01", "node02"),
            excluded_nodes=("node03", "node04", "node07"),
        ),
        (),
    ),
    "begin relative to the injected now": (
        "begin_relative.sh",
        job("begin_relative.sh", begin_at=NOW + 3600),
        (),
    ),
    "begin at a date and time (UTC)": (
        "begin_date.sh",
        job("begin_date.sh", begin_at=1796113800.0),
        (),
    ),
    "hold, nice, comment and export with a value": (
        "hold_nice_comment_export.sh",
        job(
            "hold_nice_comment_export.sh",
            hold=True,
            nice=50,
            comment="nightly eval",
            export="ALL",
            env={"WANDB_MODE": "offline"},
        ),
        (),
    ),
    "switches with a wait, and a feature constraint": (
        "switches_constraint.sh",
        job(
            "switches_constraint.sh",
            nodes_min=2,
            nodes_max=2,
            gpus_per_node=8,
            max_switches=1,
            switches_wait_s=600,
            constraint="a100&ib",
        ),
        (),
    ),
    "total GPUs over a fixed node count become GPUs per node": (
        "gpus_total.sh",
        job("gpus_total.sh", nodes_min=2, nodes_max=2, gpus_total=16, gpus_per_node=8),
        (),
    ),
    "total GPUs without a node count are left for admission to split": (
        "gpus_total_typed.sh",
        job("gpus_total_typed.sh", gpus_total=16, gpu_model="a100"),
        (),
    ),
    "no-requeue and a signal given by number": (
        "no_requeue_signal_number.sh",
        job("no_requeue_signal_number.sh", requeue=False, signal="USR1", signal_before_s=60),
        (),
    ),
    "variables in directives stay literal, with a warning": (
        "variables_not_expanded.sh",
        job(
            "variables_not_expanded.sh",
            output="$HOME/logs/%j.out",
            workdir="/home/alice/$SCRATCH",
        ),
        (
            "line 2: '$' in a directive is not expanded (as in sbatch): '-o $HOME/logs/%j.out'",
            "line 3: '$' in a directive is not expanded (as in sbatch): '-D $SCRATCH'",
        ),
    ),
    "short options with attached values": (
        "short_forms.sh",
        job(
            "short_forms.sh",
            name="short",
            nodes_min=2,
            nodes_max=2,
            cpus_per_task=4,
            time_limit_s=3600,
            partition="debug",
            partitions=("debug",),
        ),
        (),
    ),
    "#MUSTER directives override #SBATCH ones whatever their order": (
        "muster_overrides_sbatch.sh",
        job(
            "muster_overrides_sbatch.sh",
            nodes_min=4,
            nodes_max=4,
            gpus_per_node=4,
            torchrun=True,
        ),
        (),
    ),
    "ntasks spread over nodes, memory per CPU multiplied out": (
        "ntasks_mem_per_cpu.sh",
        job(
            "ntasks_mem_per_cpu.sh",
            nodes_min=2,
            nodes_max=2,
            ntasks_per_node=8,
            cpus_per_task=2,
            mem_mib=2 * 8 * 4096,
        ),
        (),
    ),
    "non-GPU gres are ignored with a warning": (
        "gres_other_resources.sh",
        job("gres_other_resources.sh", gpus_per_node=2),
        ("--gres nic ignored: Muster schedules GPUs only (gpu[:type]:N)",),
    ),
    "chdir is relative to the submit directory; -p takes a list": (
        "chdir_partition_list.sh",
        job(
            "chdir_partition_list.sh",
            workdir="/home/alice/results/run1",
            partition="debug",
            partitions=("debug", "normal"),
        ),
        (),
    ),
    "long options may be abbreviated to a unique prefix, as getopt allows": (
        "abbreviated_long_options.sh",
        job(
            "abbreviated_long_options.sh",
            partition="debug",
            partitions=("debug",),
            gpus_per_node=2,
        ),
        (),
    ),
}


@pytest.mark.parametrize(("name", "want", "want_warnings"), ACCEPTED.values(), ids=ACCEPTED.keys())
def test_script_is_accepted(name: str, want: JobSpec, want_warnings: tuple[str, ...]) -> None:
    spec, warnings = parse(name)
    assert spec == want
    assert warnings == want_warnings


def bad(code: ErrorCode, message: str, field: str) -> SubmitError:
    return SubmitError(code=code, message=message, field=field)


REFUSED = {
    "an option sbatch does not know is refused as sbatch refuses it": (
        "invalid_option.sh",
        (
            bad(
                ErrorCode.UNKNOWN_OPTION,
                "line 2 (#SBATCH): unrecognized option '--frobnicate'",
                "frobnicate",
            ),
        ),
    ),
    "bad values are each reported with what is accepted": (
        "bad_values.sh",
        (
            bad(
                ErrorCode.BAD_VALUE,
                "line 2 (#SBATCH): invalid node count 'two': expected a whole number",
                "nodes",
            ),
            bad(
                ErrorCode.BAD_VALUE,
                "line 3 (#SBATCH): invalid --time '1:xx': expected M, M:S, H:M:S, D-H, "
                "D-H:M, D-H:M:S or UNLIMITED",
                "time",
            ),
            bad(
                ErrorCode.BAD_VALUE,
                "line 4 (#SBATCH): invalid memory size '12Q': expected a number with an "
                "optional K, M, G or T suffix, e.g. 64G",
                "mem",
            ),
        ),
    ),
    "a negative GPU count is refused clearly": (
        "negative_gpus.sh",
        (
            bad(
                ErrorCode.BAD_VALUE,
                "line 2 (#SBATCH): GPU count in --gpus-per-node cannot be negative (-1); "
                "give 0 or more",
                "gpus-per-node",
            ),
        ),
    ),
    "a script without a shebang is refused, as sbatch does": (
        "missing_shebang.sh",
        (
            bad(
                ErrorCode.SCRIPT_NO_SHEBANG,
                "the script does not start with '#!': the first line must name an "
                "interpreter, e.g. #!/bin/bash",
                "script",
            ),
        ),
    ),
    "an empty script is refused": (
        "empty.sh",
        (
            bad(
                ErrorCode.SCRIPT_EMPTY,
                "the script is empty; it needs at least a '#!' line and a command",
                "script",
            ),
        ),
    ),
    "a binary file is refused": (
        "binary.sh",
        (
            bad(
                ErrorCode.SCRIPT_BINARY,
                "the script is not text (it holds NUL bytes or is not UTF-8); "
                "submit a shell script",
                "script",
            ),
        ),
    ),
    "an unclosed quote in a directive is refused with its line": (
        "unclosed_quote.sh",
        (
            bad(
                ErrorCode.BAD_DIRECTIVE,
                "line 2: cannot read '#SBATCH --comment=\"oops': No closing quotation; "
                "check the quotes",
                "script",
            ),
        ),
    ),
}


@pytest.mark.parametrize(("name", "want"), REFUSED.values(), ids=REFUSED.keys())
def test_script_is_refused(name: str, want: tuple[SubmitError, ...]) -> None:
    got = parse_submission([], script(name), user=USER, workdir=HOME, script_path=name, now=NOW)
    assert (got.spec, got.errors) == (None, want)
