"""What a step runner (services/launcher/steps_agent.py) needs of its node agent, real
where it touches processes: a state folder, a zygote, job 1's worker (attempt 0,
generation 0) running, launches signed by `SIGNER` trusted, and a bus when given one."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from services.launcher.accounts import AccountPolicy
from services.launcher.stepd_client import Zygote
from services.launcher.worker_table import WorkerRecord, WorkerTable
from shared.agent_auth import GrantSigner
from shared.identity import Signer, encode_seed

SIGNER = GrantSigner(Signer(encode_seed(b"\x03" * 32)))


class Keys:
    def current(self) -> frozenset[str]:
        return frozenset({SIGNER.public_key})


class Run:
    """The job's worker as the agent tracks it (`_Running`): its record, and whether it ended."""

    def __init__(self) -> None:
        self.record = WorkerRecord(job_id=1, attempt=0, generation=0, boot_id="b", folder="/")
        self.ended = asyncio.Event()


class Executor:
    node = "n0"
    trusted_keys: Any = Keys()
    allow_root = True
    accounts = AccountPolicy(allow_root=True)
    fence_s = 3600.0

    def __init__(self, state: Path, bus: Any = None) -> None:
        self.bus = bus
        self.table = WorkerTable(state)
        self.zygote = Zygote()
        self.running: dict[int, Any] = {1: Run()}
