"""Shell: runs a site hook (Prolog, Epilog) as root on this node, with the job's
environment (`hooks_core.hook_env`), in its own session, killed with all it started
when it outlives its timeout. TaskProlog runs as the user inside the worker's own
prologue (`executor.spawn_worker`), not here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal as _signal

from services.launcher.executor import LaunchError
from services.launcher.hooks_core import Hook, HookResult, tail

log = logging.getLogger(__name__)
_OUTPUT_LIMIT = 64 * 1024


async def run_hook(hook: Hook, path: str, env: dict[str, str], timeout_s: float) -> HookResult:
    """Run `path` to its end or `timeout_s`; how it ended. A hook that cannot be
    started at all ended badly too (exit 127), so a typo in the path drains the node
    rather than skipping the site's checks."""
    try:
        proc = await asyncio.create_subprocess_exec(
            path,
            env=env,
            cwd="/",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as err:
        return HookResult(hook=hook, path=path, exit_code=127, output=str(err))
    assert proc.stdout is not None
    reader = asyncio.ensure_future(proc.stdout.read(_OUTPUT_LIMIT))
    try:
        await asyncio.wait_for(proc.wait(), timeout=timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, _signal.SIGKILL)
        await proc.wait()
        output = await _drain(reader)
        log.warning("hook timed out", extra={"hook": str(hook), "path": path})
        return HookResult(hook=hook, path=path, timed_out=True, output=tail(output))
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, _signal.SIGKILL)  # what it left running in the background
    output = await _drain(reader)
    code = proc.returncode
    assert code is not None
    if code < 0:
        return HookResult(hook=hook, path=path, signal=-code, output=tail(output))
    return HookResult(hook=hook, path=path, exit_code=code, output=tail(output))


async def _drain(reader: asyncio.Future[bytes]) -> str:
    try:
        data = await asyncio.wait_for(reader, timeout=2.0)
    except TimeoutError:
        return ""
    return data.decode(errors="replace")


class PrologFailed(LaunchError):
    """The site Prolog failed on this node: the job is requeued, the node drained."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)
