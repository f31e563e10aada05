"""Client: `muster srun` (and the `srun` shim) — a job step inside a running job.

Inside a job (SLURM_JOB_ID / MUSTER_JOB_ID in the environment: a batch script, or a
shell under `muster salloc`) `srun [-N n] [-n n] [--ntasks-per-node n]
[--gpus-per-task n] [-l] CMD ARGS` asks the launcher (`muster.api.step`, signed as the
user) to run CMD on the allocation's nodes. Each task writes its stdout and stderr to
`<workdir>/.muster-steps/<job>-<token>/<procid>.out|.err` (the job's workdir is on
every node, as Slurm's is); srun follows those files while the step runs and prints
what they add, then removes them. Its exit status is the highest task's (docs/steps.md).

The launcher answers within a while (RUNNING: not ended yet) and srun asks again with
the same request, which names the step by its output folder; a request that no replica
answered (the one handling it died) is sent again too, so the step's end reaches srun
from whichever replica coordinates it by then.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from muster.client import ApiRefused, nats_url, request
from muster.ending import TOLD, Ended, handled, heard
from muster.srun_error import SrunError
from muster.step_output import JobNames, Routes
from shared.api import Ok, StepCancelRequest, StepReply, StepRequest
from shared.bus_inbox import user_pty

FOLLOW_S = 0.05
INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C ended
WAIT_S = 7 * 24 * 3600.0  # how long srun asks again while no replica answers
ASK_S = 15.0  # one request's wait: the launcher answers RUNNING within 5 s (steps.ANSWER_S)
RETRY_S = 1.0  # between asks when no replica answered
KEYS_BATCH = 65536  # keys queued while the last went (a paste) are sent as one message
AGAIN = frozenset({"unavailable", "unreachable"})  # no answer: ask again, the step lives
VALUED = {
    "-N": "nodes",
    "--nodes": "nodes",
    "-n": "ntasks",
    "--ntasks": "ntasks",
    "--ntasks-per-node": "ntasks_per_node",
    "--tasks-per-node": "ntasks_per_node",  # its older name, still in many scripts
    "-D": "chdir",
    "--chdir": "chdir",
    "--gpus-per-task": "gpus_per_task",
    "--gpus-per-node": "gpus_per_node",
    "--gres": "gres",
    "-G": "gpus",
    "--gpus": "gpus",
    "-w": "nodelist",
    "--nodelist": "nodelist",
    "--jobid": "jobid",
    "-J": "",
    "--job-name": "",
    "-t": "",
    "--time": "",
    "-p": "",
    "--partition": "",
    "--mpi": "",
    "-o": "output",
    "--output": "output",
    "-e": "error",
    "--error": "error",
    "--open-mode": "open_mode",
    "-c": "",
    "--cpus-per-task": "",
    "--mem": "",
    "--mem-per-cpu": "",  # the job's memory and CPUs hold its steps (its cgroup)
    "--mem-per-gpu": "",
    "--cpus-per-gpu": "",
    "--export": "",
    # Binding and layout hints DDP launch lines pass (`--cpu-bind=cores`, `-m block`):
    # accepted and left to the job's cgroup and CUDA_VISIBLE_DEVICES (docs/steps.md)
    **dict.fromkeys(
        (
            "--cpu-bind", "--gpu-bind", "--mem-bind", "--accel-bind", "-m", "--distribution",
            "--hint", "--ntasks-per-socket", "--ntasks-per-core", "--ntasks-per-gpu",
            "--threads-per-core", "--cores-per-socket", "--sockets-per-node", "--cpu-freq",
            "--network", "--wait", "-W",
        ),
        "",
    ),
    # The job's own: its allocation already has them (a step runs inside it)
    **dict.fromkeys(
        ("-A", "--account", "-q", "--qos", "--comment", "--reservation", "--propagate",
         "--gres-flags"),
        "",
    ),
}  # fmt: skip
FLAGS = {
    "-l": "label",
    "--label": "label",
    "--pty": "pty",
    "--overlap": "overlap",
    "--exclusive": "",  # a step's GPUs are its own already (--gpus-per-task); --overlap not
    "-u": "",
    "--unbuffered": "",
    "-Q": "",
    "--quiet": "",
    "-v": "",
    "--verbose": "",
    # a step holds the GPUs it asks alone already (--exact's point); -X: Ctrl-C ends it
    "--exact": "",
    "-X": "",
    "--disable-status": "",
}


OPTIONAL = {  # -K[=0|1]; -I[=seconds]: how long a step may wait for the GPUs it needs
    "-K": "kill_on_bad_exit",
    "--kill-on-bad-exit": "kill_on_bad_exit",
    "-I": "immediate",
    "--immediate": "immediate",
}
IMMEDIATE_S = 1.0  # -I without a value


def parse(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """srun's options (name -> value; flags "1") and the command, as Slurm splits them:
    options until `--` or the first word that is not one."""
    opts: dict[str, str] = {}
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return opts, argv[i + 1 :]
        if not word.startswith("-") or word == "-":
            return opts, argv[i:]
        name, eq, value = word.partition("=")
        if word[:2] in ("-K", "-I") and len(word) > 2 and not eq:  # -K0, -K1, -I5
            name, eq, value = word[:2], "=", word[2:]
        if name in OPTIONAL:  # -K, --kill-on-bad-exit[=0|1]; -I, --immediate[=N]
            key = OPTIONAL[name]
            if eq and key == "kill_on_bad_exit" and value not in ("0", "1"):
                raise SrunError(f"invalid {name} value '{value}': 0 or 1")
            if eq and key == "immediate" and not value.isdigit():
                raise SrunError(f"invalid {name} value '{value}': a number of seconds")
            opts[key] = value if eq else "1" if key == "kill_on_bad_exit" else ""
            i += 1
            continue
        if name in FLAGS:
            if eq:
                raise SrunError(f"option '{name}' takes no value")
            if FLAGS[name]:
                opts[FLAGS[name]] = "1"
            i += 1
            continue
        if name not in VALUED and not eq and word[:2] in VALUED and len(word) > 2:
            name, value, eq = word[:2], word[2:], "="  # -N2
        if name not in VALUED:
            raise SrunError(f"unrecognized option '{word}'")
        if not eq:
            if i + 1 >= len(argv):
                raise SrunError(f"option '{name}' requires an argument")
            value = argv[i + 1]
            i += 1
        if VALUED[name]:
            opts[VALUED[name]] = value
        i += 1
    return opts, []


def _count(opts: dict[str, str], name: str) -> int:
    raw = opts.get(name, "0").rpartition(":")[2]  # --gpus-per-task=h100:1 -> 1
    try:
        value = int(raw)
    except ValueError:
        raise SrunError(f"invalid --{name.replace('_', '-')} value '{opts[name]}'") from None
    if value < 0:
        raise SrunError(f"invalid --{name.replace('_', '-')} value '{opts[name]}'")
    return value


def immediate(opts: dict[str, str]) -> float | None:
    """`-I[N]` (in srun's parsed options): how long a step may wait for GPUs the job's
    running steps hold (None: as long as it takes, as without -I)."""
    value = opts.get("immediate")
    if value is None:
        return None
    return float(value) if value and int(value) else IMMEDIATE_S


def _per_node(opts: dict[str, str]) -> int:
    """`--gpus-per-node=[type:]N` or `--gres=gpu[:type][:N]` (a type is the job's)."""
    if "gres" not in opts:
        return _count(opts, "gpus_per_node")
    if "gpus_per_node" in opts:
        raise SrunError("--gres=gpu and --gpus-per-node both count a node's GPUs: give one")
    from services.admission.values import gres_gpus

    try:
        gpus, others = gres_gpus(opts["gres"])
    except ValueError as err:
        raise SrunError(str(err)) from None
    if others:  # as sbatch says of them
        print(
            f"srun: warning: --gres {', '.join(others)} ignored: "
            "Muster schedules GPUs only (gpu[:type]:N)",
            file=sys.stderr,
        )
    return 0 if gpus is None else gpus[1]


def _nodelist(opts: dict[str, str]) -> tuple[str, ...]:
    """`-w node[01-02]`, expanded (Slurm's hostlist)."""
    if "nodelist" not in opts:
        return ()
    from services.admission.hostlist import expand

    try:
        names = expand(opts["nodelist"])
    except ValueError as err:
        raise SrunError(f"-w: {err}") from None
    if not names:
        raise SrunError("-w names no node")
    return names


def step_request(argv: list[str], env: dict[str, str], cwd: str) -> StepRequest:
    opts, command = parse(argv)
    if not command:
        raise SrunError("no command to run: srun [options] CMD [ARGS]")
    if "pty" in opts and {"output", "error"} & opts.keys():
        raise SrunError("--pty: a terminal's output is the terminal; drop --output/--error")
    if opts.get("open_mode", "truncate") not in ("truncate", "append"):
        raise SrunError(f"invalid --open-mode '{opts['open_mode']}': append or truncate")
    job = opts.get("jobid") or env.get("MUSTER_JOB_ID") or env.get("SLURM_JOB_ID", "")
    if not job.isdigit():
        raise SrunError(
            "not inside a job (no SLURM_JOB_ID): run srun in a batch script or under salloc"
        )
    token = f"{job}-{os.getpid()}-{os.urandom(4).hex()}"
    return StepRequest(
        user=env.get("MUSTER_USER", ""),
        job_id=int(job),
        argv=tuple(command),
        nodes=_count(opts, "nodes"),
        ntasks=_count(opts, "ntasks"),
        ntasks_per_node=_count(opts, "ntasks_per_node"),
        gpus_per_task=_count(opts, "gpus_per_task"),
        gpus_per_node=_per_node(opts),
        gpus=_count(opts, "gpus"),
        overlap="overlap" in opts,
        nodelist=_nodelist(opts),
        # -K, else Slurm's variable for it (a site or a user sets it once for every srun)
        kill_on_bad_exit=opts.get("kill_on_bad_exit", env.get("SLURM_KILL_BAD_EXIT", "0")) == "1",
        workdir=os.path.join(cwd, opts["chdir"]) if "chdir" in opts else cwd,  # -D
        environment=dict(env),
        output_dir=str(Path(cwd) / ".muster-steps" / token),
        pty=f"{user_pty(_acting_user(env))}.{os.urandom(16).hex()}" if "pty" in opts else "",
        # --pty's terminal goes raw, --output's files open, once the step exists
        answer_made=bool({"pty", "output", "error"} & opts.keys()),
    )


def in_job(argv: list[str], env: dict[str, str]) -> bool:
    """A job to run the step in: named by the environment or `--jobid`."""
    if env.get("MUSTER_JOB_ID") or env.get("SLURM_JOB_ID"):
        return True
    try:
        return "jobid" in parse(argv)[0]
    except SrunError:  # not srun's own options alone: an allocation's (sbatch's)
        return False


def _acting_user(env: dict[str, str]) -> str:
    """Who the request will be signed as (muster/client_env.py's order): the terminal's
    subject must be that user's (shared/bus_inbox.py) for the bus to let it through."""
    from muster.client_env import login_name

    return env.get("MUSTER_USER") or login_name()


class _Follower:
    """Prints what the tasks' files add, stdout's to stdout and stderr's to stderr, or
    to the files of srun's --output/--error (`routes`, once the step is made)."""

    def __init__(self, folder: Path, label: bool, routes: Routes | None = None) -> None:
        self.folder = folder
        self.label = label
        self.routes = routes or Routes()
        self.offsets: dict[str, int] = {}
        self.partial: dict[str, bytes] = {}

    def poll(self, final: bool = False) -> None:
        if not self.routes.ready and not final:  # nowhere to write yet: the files keep it
            return
        try:
            names = sorted(os.listdir(self.folder), key=_procid_order)
        except FileNotFoundError:
            return
        for name in names:
            self._read(name, final)
        sys.stdout.flush()
        sys.stderr.flush()
        self.routes.flush()

    def _read(self, name: str, final: bool) -> None:
        try:
            with open(self.folder / name, "rb") as f:
                f.seek(self.offsets.get(name, 0))
                data = f.read()
        except OSError:
            return
        if not data and not final:
            return
        self.offsets[name] = self.offsets.get(name, 0) + len(data)
        out = self.routes.stream(name)
        if not self.label:
            out.write(data)
            return
        text = self.partial.pop(name, b"") + data
        *lines, rest = text.split(b"\n")
        if final and rest:
            lines, rest = [*lines, rest], b""
        prefix = name.partition(".")[0].encode() + b": "
        for line in lines:
            out.write(prefix + line + b"\n")
        if rest:
            self.partial[name] = rest


def _procid_order(name: str) -> tuple[int, str]:
    head = name.partition(".")[0]
    return (int(head) if head.isdigit() else 0, name)


def run(argv: list[str]) -> int:
    env = dict(os.environ)
    if not in_job(argv, env):  # Slurm's srun makes an allocation first (srun_alloc.py)
        from muster import srun_alloc

        return srun_alloc.run(argv)
    req = step_request(argv, env, os.getcwd())
    opts = parse(argv)[0]  # what the request does not carry: srun's own side
    patience = immediate(opts)
    if req.pty:
        import asyncio

        import msgspec

        from shared import pty_size

        size = window_size(sys.stdin.fileno())
        if size is not None:  # the task's terminal starts at this one's size
            req = msgspec.structs.replace(req, pty_window=pty_size.encode(*size))
        return asyncio.run(_terminal(req, patience))
    folder = Path(req.output_dir)
    folder.mkdir(parents=True, mode=0o700, exist_ok=True)
    routes = Routes(
        opts.get("output", ""), opts.get("error", ""), opts.get("open_mode") == "append"
    )
    names = JobNames.of(req.job_id, env, _acting_user(env))
    follower = _Follower(folder, label="label" in opts, routes=routes)
    result: list[StepReply | ApiRefused] = []

    done = threading.Event()  # not Thread.join: a Ctrl-C inside join can lose the thread
    stop = threading.Event()  # interrupted: a step still waiting for GPUs is not made

    def made(reply: StepReply) -> None:  # in the asking thread, as the step is made
        routes.open(reply, names, req.workdir)

    def ask() -> None:
        try:
            result.append(_until_ended(req, stop, made, patience))
        except ApiRefused as err:
            result.append(err)
        finally:
            done.set()

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    interrupted: int | None = None  # the status srun exits with, once told to end
    try:
        with handled():  # SIGTERM, SIGHUP (a closed terminal): as Ctrl-C
            while not done.is_set():
                try:
                    follower.poll()
                    done.wait(FOLLOW_S)
                except (KeyboardInterrupt, Ended) as told:
                    if interrupted is not None:  # told twice: leave at once, it is ending
                        raise
                    interrupted = told.status if isinstance(told, Ended) else INTERRUPTED
                    stop.set()
                    print("srun: interrupted: ending the step's tasks", file=sys.stderr)
                    _cancel(req)
        follower.poll(final=True)
    finally:
        routes.close()
        shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(OSError):
            folder.parent.rmdir()  # only when no other step's files are there
    if not result:
        raise SrunError("the step's request ended without an answer")
    outcome = result[0]
    if interrupted is not None:
        return interrupted
    if isinstance(outcome, ApiRefused):
        raise SrunError(str(outcome))
    if outcome.message:
        print(
            f"srun: error: step {req.job_id}.{outcome.step_id}: {outcome.message}", file=sys.stderr
        )
    if outcome.state == "CANCELLED":
        print(f"srun: error: step {req.job_id}.{outcome.step_id} was cancelled", file=sys.stderr)
    return outcome.exit_code if outcome.exit_code is not None else 1


def _until_ended(
    req: StepRequest,
    stop: threading.Event | None = None,
    made: Callable[[StepReply], None] | None = None,
    patience: float | None = None,
) -> StepReply:
    """The step's reply once it ended: the same request again while the launcher says
    RUNNING, or while no replica answers (the one asked died), up to WAIT_S; and while
    the GPUs it needs are held by the job's running steps ("busy", said once, as
    Slurm's srun waits), until `stop` is set or for `patience` seconds (`-I`), after
    which the refusal stands. `made()` is called at each answer that is not a refusal:
    the step exists."""
    began = time.monotonic()
    deadline = began + WAIT_S
    waited = False
    while True:
        try:
            reply = request(nats_url(), "step", req, StepReply, timeout=ASK_S)
        except ApiRefused as err:
            if err.code == "busy":
                if patience is not None and time.monotonic() - began >= patience:
                    raise ApiRefused(
                        f"step not created within {patience:g} s (--immediate): {err}",
                        err.code,
                        err.details,
                    ) from None
                if not waited:
                    print(
                        f"srun: job {req.job_id}: step creation temporarily disabled, "
                        f"retrying ({err})",
                        file=sys.stderr,
                        flush=True,
                    )
                    waited = True
                if stop is not None and stop.wait(RETRY_S):
                    raise
                if stop is None:
                    time.sleep(RETRY_S)
                continue
            if err.code not in AGAIN or time.monotonic() > deadline:
                raise
            time.sleep(RETRY_S)
            continue
        if made is not None:
            made(reply)
        if waited:
            print(f"srun: step created for job {req.job_id}", file=sys.stderr, flush=True)
            waited = False
        if reply.state != "RUNNING":
            return reply


class _Resized:
    """In srun's queue of keys: send the terminal's size now (shared/pty_size.py)."""


RESIZED = _Resized()


async def _terminal(req: StepRequest, patience: float | None = None) -> int:
    """`srun --pty`: this terminal, raw, wired to the task's pty on the first node: its
    output arrives on `<pty>.out`, every key goes to `<pty>.in` (Ctrl-C included), and
    so does the terminal's size: once the relay listens (its first output) and at every
    SIGWINCH. The terminal goes raw only once the step exists: while it waits for GPUs
    the job's other steps hold, Ctrl-C (SIGINT) ends srun and makes no step, as it does
    a batch srun's wait; so do SIGTERM and SIGHUP, at any time (the step is ended)."""
    import asyncio
    import signal
    import termios
    import tty
    from collections import deque

    import nats

    from muster.client import connect_options
    from muster.pty_keys import KeySender
    from shared import pty_size
    from shared.urls import nats_servers

    url = nats_url()
    nc = await nats.connect(nats_servers(url), connect_timeout=5, **connect_options(url))
    out = sys.stdout.buffer
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd) if os.isatty(fd) else None
    keys: asyncio.Queue[bytes | _Resized] = asyncio.Queue()
    shown_any = False
    loop = asyncio.get_running_loop()
    made: asyncio.Future[None] = loop.create_future()  # the step exists: keys may go

    def is_made() -> None:
        if not made.done():
            made.set_result(None)

    async def shown(msg: Any) -> None:
        nonlocal shown_any
        is_made()  # an older launcher answers only after its wait: the first output tells
        out.write(msg.data)
        out.flush()
        if not shown_any and saved is not None:  # the relay subscribed before it printed
            keys.put_nowait(RESIZED)
        shown_any = True

    await nc.subscribe(req.pty + ".out", cb=shown)
    await nc.flush()  # subscribed before the task can print anything

    def typed() -> None:
        try:
            data = os.read(fd, 4096)
        except OSError:  # EIO: the terminal hung up (SIGHUP follows): no more keys
            data = b""
        if not data:
            loop.remove_reader(fd)
        keys.put_nowait(data)

    keys_out = KeySender(nc, req.pty + ".in")

    async def send() -> None:  # in the order typed; keys queued meanwhile go as one
        held: deque[bytes | _Resized] = deque()
        while True:
            if not held:
                held.append(await keys.get())
            while not keys.empty():
                held.append(keys.get_nowait())
            item = held.popleft()
            if item == b"":
                return
            if isinstance(item, _Resized):
                size = window_size(fd)
                if size is not None:
                    header = {pty_size.WINDOW_HEADER: pty_size.encode(*size)}
                    await keys_out.send(b"", header)
                continue
            batch = bytearray(item)
            while held and len(batch) < KEYS_BATCH:
                more = held[0]
                if not isinstance(more, bytes) or not more:  # a size, or the end: its turn
                    break
                held.popleft()
                batch += more
            await keys_out.send(bytes(batch))

    def wire() -> asyncio.Task[None]:
        """The step exists: this terminal raw (keys typed ahead kept), its keys and
        size sent."""
        if saved is not None:
            tty.setraw(fd, termios.TCSANOW)
            loop.add_signal_handler(signal.SIGWINCH, keys.put_nowait, RESIZED)
        try:
            loop.add_reader(fd, typed)
        except PermissionError:  # a file or /dev/null: no reader to wait on; send it all
            while data := os.read(fd, 65536):
                keys.put_nowait(data)
            keys.put_nowait(b"")
        return asyncio.create_task(send())

    told: asyncio.Future[int] = loop.create_future()  # a signal: srun (and its step) ends
    listened = heard(TOLD)  # an inherited ignore (nohup, `cmd &` in a script) kept

    def on_told(signum: int) -> None:
        if not told.done():
            told.set_result(signum)

    for s in listened:
        loop.add_signal_handler(s, on_told, s)
    stop = threading.Event()  # told while the step waits for GPUs: none is made
    # asked again while RUNNING, as a batch step is: any replica answers its end
    ending = asyncio.ensure_future(_ended_in_daemon(req, stop, is_made, patience))
    sender: asyncio.Task[None] | None = None
    try:
        await asyncio.wait((made, ending, told), return_when=asyncio.FIRST_COMPLETED)
        if made.done() and not ending.done() and not told.done():
            sender = wire()
            await asyncio.wait((ending, told), return_when=asyncio.FIRST_COMPLETED)
        if not ending.done():  # told to end (Ctrl-C, a closed terminal, a kill)
            stop.set()
            ending.cancel()
            await asyncio.to_thread(_cancel, req)
            return Ended(told.result()).status
        reply = ending.result()
    finally:
        for s in listened:
            loop.remove_signal_handler(s)
        if sender is not None:
            loop.remove_reader(fd)
            sender.cancel()
            if saved is not None:
                loop.remove_signal_handler(signal.SIGWINCH)
        if saved is not None:
            with contextlib.suppress(termios.error):  # a terminal hung up has no settings
                termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        await nc.flush()
        await nc.close()
    return reply.exit_code if reply.exit_code is not None else 1


async def _ended_in_daemon(
    req: StepRequest,
    stop: threading.Event,
    made: Callable[[], None],
    patience: float | None = None,
) -> StepReply:
    """`_until_ended` in a daemon thread, as a batch srun asks: an srun interrupted
    meanwhile exits at once, not once the step ends (asyncio.to_thread's thread would be
    waited for as the loop closes). `made()` runs on the loop once the step exists."""
    import asyncio

    loop = asyncio.get_running_loop()
    done: asyncio.Future[StepReply] = loop.create_future()

    def settle(reply: StepReply | None, err: BaseException | None) -> None:
        if done.done():  # the wait was let go
            return
        if err is not None:
            done.set_exception(err)
        else:
            assert reply is not None
            done.set_result(reply)

    def on_loop(call: Callable[..., None], *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
            loop.call_soon_threadsafe(call, *args)

    def ask() -> None:
        try:
            reply, err = _until_ended(req, stop, lambda _made: on_loop(made), patience), None
        except Exception as exc:
            reply, err = None, exc
        on_loop(settle, reply, err)

    threading.Thread(target=ask, daemon=True).start()
    return await done


def window_size(fd: int) -> tuple[int, int] | None:
    """(rows, cols) of the terminal on `fd`; None when it is none or has no size."""
    import fcntl
    import struct
    import termios

    try:
        packed = fcntl.ioctl(fd, termios.TIOCGWINSZ, bytes(8))
    except OSError:
        return None
    rows, cols, _, _ = struct.unpack("HHHH", packed)
    return (rows, cols) if rows and cols else None


def _cancel(req: StepRequest) -> None:
    """Ask the launcher to end this step on every node (srun's Ctrl-C)."""
    cancel = StepCancelRequest(user=req.user, job_id=req.job_id, output_dir=req.output_dir)
    try:
        request(nats_url(), "step_cancel", cancel, Ok, timeout=30.0)
    except ApiRefused as err:
        print(f"srun: error: cannot end the step: {err}", file=sys.stderr)


def main(argv: list[str]) -> int:
    try:
        return run(argv)
    except (SrunError, ApiRefused) as err:  # a --pty step's refusal comes as itself
        print(f"srun: error: {err}", file=sys.stderr)
        return 1
    except Ended as told:  # told twice: srun leaves while its step ends
        return told.status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
