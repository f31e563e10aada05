"""Client: `muster salloc` (and the `salloc` shim) — an interactive allocation.

`salloc [sbatch options] [CMD ARGS]` submits a job whose script only holds the
allocation (it sleeps on every node until it is ended), waits until the job RUNS, then
runs CMD (default: the user's `$SHELL`) here, with the job's environment: SLURM_JOB_ID,
SLURM_JOB_NODELIST, SLURM_NNODES, ... — so `srun` from that shell runs steps on the
allocation. When CMD exits the allocation is released and the job ends as CMD did
(COMPLETED for status 0, FAILED with its status otherwise, as Slurm records a salloc
job); if salloc ends otherwise (interrupted before CMD ran) the job is cancelled. The
job's time limit still applies: when the job ends first (its limit, a cancel), CMD gets
SIGHUP, as Slurm's salloc does. salloc's own SIGTERM and SIGHUP are taken as Slurm's
salloc takes them (`run`'s `told`, docs/steps.md). `-I[N]` / `--immediate[=N]` gives
the request up when the allocation is not granted within N seconds (1 without N): the
job is cancelled and salloc exits 1, as Slurm's does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from muster.client import ApiRefused, current_user, nats_url, request
from muster.ending import Ended, handled
from shared.api import (
    JobSelector,
    Ok,
    ShowJobReply,
    ShowJobRequest,
    SubmitReply,
    SubmitRequest,
)
from shared.sbatch_options import Arg, Given, Spec, split_own

HOLD_SCRIPT = (
    "#!/bin/sh\n"
    "# muster salloc: this job only holds its allocation for an interactive session\n"
    "exec sleep 2147483647\n"
)
POLL_S = 0.5
WATCH_S = 2.0
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY"}
SALLOC_OWN = (Spec("immediate", "I", Arg.OPTIONAL),)  # salloc's, not sbatch's
IMMEDIATE_S = 1.0  # -I without a value: granted at once (within the start's own time)


class Voice:
    """What the client says while it holds an allocation (salloc, or an srun that made
    one, in Slurm's words): each takes the job id; "" says nothing."""

    def __init__(self, prog: str, pending: str, granted: str, released: str) -> None:
        self.prog = prog
        self.pending = pending
        self.granted = granted
        self.released = released

    def say(self, line: str, job_id: int) -> None:
        if line:
            print(f"{self.prog}: {line.format(job_id)}", file=sys.stderr, flush=True)


SALLOC = Voice(
    "salloc",
    "Pending job allocation {}",
    "Granted job allocation {}",
    "Relinquishing job allocation {}",
)
SRUN = Voice("srun", "", "job {} has been allocated resources", "")  # waiting: said once


class SallocError(Exception):
    """What salloc prints after `salloc: error:` before it exits 1."""


def submit_request(
    argv: list[str], cwd: str, env: dict[str, str]
) -> tuple[SubmitRequest, list[str], float | None]:
    """The holding job's request, the command to run once it runs, and how long to wait
    for the allocation (None: as long as it takes; `--immediate`)."""
    split = split_own(argv, SALLOC_OWN)
    line = split.line
    command = [] if line.script is None else [line.script, *line.args]
    req = SubmitRequest(
        user=current_user(),
        argv=(*line.options, "--job-name=interactive")
        if not _named(line.options)
        else line.options,
        script=HOLD_SCRIPT,
        script_path="",
        workdir=cwd,
        environment=env,
    )
    return req, command, _immediate(split.own)


def _immediate(own: tuple[Given, ...]) -> float | None:
    for given in reversed(own):  # the last one given wins, as with any option
        value = given.value
        if value is None:
            return IMMEDIATE_S
        if not value.isdigit():
            raise SallocError(f"invalid --immediate value '{value}': a number of seconds")
        return float(value) or IMMEDIATE_S
    return None


def _named(options: tuple[str, ...]) -> bool:
    return any(o in ("-J", "--job-name") or o.startswith(("-J", "--job-name=")) for o in options)


def session_env(env: dict[str, str], reply: ShowJobReply) -> dict[str, str]:
    """The shell's environment: the caller's plus the job's."""
    j = reply.job
    nodes = ",".join(j.nodelist)
    return env | {
        "SLURM_JOB_ID": str(j.job_id),
        "SLURM_JOBID": str(j.job_id),
        "MUSTER_JOB_ID": str(j.job_id),
        "SLURM_JOB_NAME": j.name,
        "SLURM_JOB_NODELIST": nodes,
        "SLURM_NODELIST": nodes,
        "SLURM_NNODES": str(len(j.nodelist)),
        "SLURM_JOB_NUM_NODES": str(len(j.nodelist)),
        "SLURM_JOB_PARTITION": j.partition,
        "SLURM_SUBMIT_DIR": os.getcwd(),
    }


def _show(url: str, job_id: int) -> ShowJobReply:
    return request(url, "show", ShowJobRequest(user=current_user(), job_id=job_id), ShowJobReply)


def _wait_running(url: str, job_id: int, prog: str, within_s: float | None = None) -> ShowJobReply:
    said = False
    deadline = None if within_s is None else time.monotonic() + within_s
    while True:
        reply = _show(url, job_id)
        if reply.job.state == "RUNNING":
            return reply
        if reply.job.state in ENDED:
            raise SallocError(f"job {job_id} ended before it ran: {reply.job.state}")
        if deadline is not None and time.monotonic() >= deadline:
            why = f" ({reply.job.reason})" if reply.job.reason else ""
            raise SallocError(
                f"job {job_id} not allocated within {within_s:g} s (--immediate){why}: "
                "request given up"
            )
        if not said:
            print(f"{prog}: job {job_id} queued and waiting for resources", file=sys.stderr)
            said = True
        time.sleep(POLL_S)


def _release(url: str, job_id: int, prog: str, status: int | None) -> None:
    """Let the allocation go: the job ends as the command did (`status`), or is
    cancelled when no command ran to its end."""
    reason = f"{prog} ended" if status is None else f"{prog}'s command exited {status}"
    req = JobSelector(user=current_user(), job_ids=(job_id,), reason=reason, exit_code=status)
    try:
        request(url, "cancel", req, Ok)
    except ApiRefused as err:
        print(f"{prog}: error: cannot release job {job_id}: {err}", file=sys.stderr)


def _watch(
    url: str, job_id: int, proc: subprocess.Popen[bytes], done: threading.Event, prog: str
) -> None:
    """The job ended under the session (its time limit, a cancel): hang the shell up."""
    while not done.wait(WATCH_S):
        try:
            state = _show(url, job_id).job.state
        except ApiRefused:
            continue
        if state in ENDED:
            print(
                f"\n{prog}: job {job_id} has ended ({state}): ending the session", file=sys.stderr
            )
            proc.send_signal(signal.SIGHUP)
            return


def run(argv: list[str], voice: Voice = SALLOC) -> int:
    env = dict(os.environ)
    req, command, within_s = submit_request(argv, os.getcwd(), env)
    url = nats_url()
    reply = request(url, "submit", req, SubmitReply)
    for warning in reply.warnings:
        print(f"{voice.prog}: warning: {warning}", file=sys.stderr)
    job_id = reply.job_ids[0]
    voice.say(voice.pending, job_id)
    status: int | None = None  # the command's, once it ended
    session: list[subprocess.Popen[bytes]] = []  # the command, once it runs

    def told(signum: int) -> None:
        """SIGTERM or SIGHUP (muster/ending.py). Waiting: give the request up. Once the
        command runs, as Slurm's salloc: SIGTERM is the command's to act on, SIGHUP
        hangs it up and lets the allocation go without waiting for it."""
        if session:
            session[0].send_signal(signum)
            if signum == signal.SIGTERM:
                return
        raise Ended(signum)

    try:
        with handled(told):
            shown = _wait_running(url, job_id, voice.prog, within_s)
            voice.say(voice.granted, job_id)
            argv_run = command or [env.get("SHELL") or "/bin/sh"]
            session.append(subprocess.Popen(argv_run, env=session_env(env, shown)))
            status = _session(url, job_id, session[0], voice.prog)
    except FileNotFoundError as err:
        raise SallocError(f"cannot run {err.filename}: no such command") from None
    except Ended as ended:
        print(f"{voice.prog}: job {job_id}: {ended}: ending the allocation", file=sys.stderr)
        return ended.status
    finally:
        voice.say(voice.released, job_id)
        _release(url, job_id, voice.prog, status)
    return status


def _session(url: str, job_id: int, proc: subprocess.Popen[bytes], prog: str) -> int:
    """The command's exit status (128 + N for signal N), watched meanwhile (`_watch`)."""
    done = threading.Event()
    watcher = threading.Thread(target=_watch, args=(url, job_id, proc, done, prog), daemon=True)
    watcher.start()
    try:
        while True:
            try:
                code = proc.wait()
                return code if code >= 0 else 128 - code
            except KeyboardInterrupt:  # Ctrl-C belongs to the shell, as in salloc
                continue
    finally:
        done.set()


def main(argv: list[str]) -> int:
    try:
        return run(argv)
    except (SallocError, ApiRefused) as err:
        print(f"salloc: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
