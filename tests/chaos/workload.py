"""Shell: the chaos run's mixed workload, submitted through the real API while faults
land, and the one poison message the dead-letter check expects.

Job kinds: single-GPU jobs, gangs (two nodes, all or nothing), arrays, elastic
torchrun-style jobs (`--nodes=1:2`: they shrink when a node goes and read their world
from MUSTER_NODELIST), preemption pairs (a low-tier job holding a whole node, then a
high-tier one that needs it), and two-node jobs whose batch script runs on the first
node only, as sbatch's does, its sleep an srun step (a task on each node, each under a
stepd of its own, the other node's under the job's holder there: they
must end with their job, whatever agent or replica is killed meanwhile), and one-node sweeps: three
one-GPU steps side by side on two GPUs (steps hold their GPUs alone). Every job sleeps a drawn
while and exits 0, in the run's own working folder (how tests/chaos/machine.py tells
its workers, step tasks included, from other tests').
Which job comes next is drawn from the run's seed too.

Every request is signed by its user (the bed's test keys). Between submissions the
workload also cancels one of its latest jobs (drawn from a stream of its own, so the
submissions of a seed stay as they were): mostly as their owner, now and then as
mallory, who neither owns them nor is an operator. Admission must refuse her, whatever
else is going on; a forged cancel it accepts is a finding (`forged_accepted`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import nats
import nats.errors

from muster.client import ApiRefused, call, connect_options
from shared.api import JobSelector, Ok
from shared.urls import nats_servers
from tests.support.cluster import submit

# The cluster config of a chaos run: two tiers, so a high job preempts (requeues) a
# low one after a one-second grace.
CONFIG = """
[cluster]
name = "chaos"
default_partition = "low"

[partitions.low]
default_time = "5:00"
priority_tier = 10
preempt_mode = "requeue"
grace_time = "0:01"

[partitions.high]
default_time = "5:00"
priority_tier = 100
preempt_mode = "off"
can_preempt = ["low"]

[roles]
operators = ["root", "admin"]
"""

SLEEPER = "#!/bin/bash\nsleep {seconds}\n"
# An elastic job as torchrun would see it: its world is the node list of this generation.
ELASTIC = (
    '#!/bin/bash\necho "world ${{MUSTER_NODELIST}} gen ${{MUSTER_GENERATION}}"\nsleep {seconds}\n'
)
# srun signs its request as the submitter, with the bed's test keys (the launcher passes
# no MUSTER_ variable of the submitter's); the interpreter is this one (its packages).
# A Slurm user's script: `--batch-nodes=first` (sbatch's) runs it on node 0 alone, and
# its unguarded srun makes one step with a task on each node, node 1's under the
# holder that keeps the node for it (docs/steps.md).
STEPPED = "#!/bin/bash\nexport MUSTER_KEY_DIR={keys}\n{python} -m muster.cli srun sleep {seconds}\n"
# A sweep inside one allocation: three one-GPU steps on two GPUs, the third waiting
# ("busy") until one of the first two ends; no two may hold one GPU at once.
SWEPT = (
    "#!/bin/bash\nexport MUSTER_KEY_DIR={keys}\n"
    + "{python} -m muster.cli srun -n1 --gpus-per-task=1 sleep {seconds} &\n" * 2
    + "{python} -m muster.cli srun -n1 --gpus-per-task=1 sleep {seconds}\nwait\n"
)
KINDS: dict[str, tuple[tuple[str, ...], str]] = {
    "single": (("--gpus-per-node=1",), SLEEPER),
    "gang": (("--nodes=2", "--gpus-per-node=1"), SLEEPER),
    "array": (("--array=0-2", "--gpus-per-node=1"), SLEEPER),
    "elastic": (("--nodes=1:2", "--gpus-per-node=1"), ELASTIC),
    "preemptible": (("--partition=low", "--gpus-per-node=2"), SLEEPER),
    "urgent": (("--partition=high", "--gpus-per-node=2"), SLEEPER),
    "stepped": (("--nodes=2", "--gpus-per-node=1", "--batch-nodes=first"), STEPPED),
    "swept": (("--gpus-per-node=2",), SWEPT),
}
# What the dead-letter stream must hold, and nothing else: undecodable on purpose.
POISON = b"\x00chaos-poison: not an event\xff"
POISON_SUBJECT = "muster.job.submitted"
SUBMIT_ERRORS = (ApiRefused, TimeoutError, OSError, nats.errors.Error)
OWNER, FORGER = "root", "mallory"  # the workload submits as root; mallory owns nothing
CANCEL_SHARE, FORGED_SHARE = 0.15, 0.05  # of the workload's ticks
RECENT = 3  # a cancel picks one of the last jobs accepted


@dataclass
class Workload:
    url: str
    workdir: Path
    seed: int
    every_s: float = 1.5
    keys: str = field(default_factory=lambda: os.environ.get("MUSTER_KEY_DIR", ""))
    accepted: list[int] = field(default_factory=list)
    submitted: dict[str, int] = field(default_factory=dict)
    refused: int = 0
    cancels: int = 0  # jobs the owner's cancels acted on
    forged_refused: int = 0  # forged cancels refused as forbidden
    forged_accepted: list[int] = field(default_factory=list)  # the jobs of any it accepted

    async def run(self, stop: asyncio.Event) -> None:
        """Submit a drawn job every `every_s` until `stop`; a refusal (the control plane
        is down) is counted and the job is not retried: it was never accepted."""
        rng = random.Random(self.seed ^ 0x5EED)
        cancels = random.Random(self.seed ^ 0xCA1C)
        while not stop.is_set():
            await self._cancel(cancels)
            kind = rng.choice(tuple(KINDS))
            argv, script = KINDS[kind]
            seconds = round(rng.uniform(1.0, 4.0), 1)
            text = script.format(seconds=seconds, keys=self.keys, python=sys.executable)
            try:
                reply = await submit(self.url, text, argv, str(self.workdir))
            except SUBMIT_ERRORS:
                self.refused += 1
            else:
                self.accepted += reply.job_ids
                self.submitted[kind] = self.submitted.get(kind, 0) + len(reply.job_ids)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.every_s)

    async def _cancel(self, rng: random.Random) -> None:
        """Now and then a signed cancel of one accepted job: the owner's, or a forgery."""
        draw = rng.random()
        if not self.accepted or draw >= CANCEL_SHARE + FORGED_SHARE:
            return
        job_id = rng.choice(self.accepted[-RECENT:])  # likely not ended yet
        user = OWNER if draw < CANCEL_SHARE else FORGER
        try:
            reply = await call(self.url, "cancel", JobSelector(user=user, job_ids=(job_id,)), Ok)
        except ApiRefused as err:
            if user == FORGER and err.code == "forbidden":
                self.forged_refused += 1
        except SUBMIT_ERRORS:
            pass  # the control plane is away: nothing was decided
        else:
            if user == OWNER:
                self.cancels += len(reply.job_ids)  # 0: it had ended already
            else:
                self.forged_accepted.append(job_id)


async def send_poison(url: str) -> None:
    """Publish the poison on a subject every service consumes, as a broken producer would
    (with the operator's credential on a secured bus: no service's may publish it)."""
    options = connect_options(url, operator=True)
    nc = await nats.connect(nats_servers(url), connect_timeout=5, **options)
    try:
        await nc.jetstream().publish(
            POISON_SUBJECT, POISON, headers={"Nats-Msg-Id": f"poison-{uuid.uuid4()}"}, timeout=5
        )
    finally:
        await nc.close()
