"""Chaos, the short variant CI runs: a few seeds, each a run of its own (about a dozen
faults of every kind over 45 s while a mixed workload flows), then invariants 1-9 from
the machine, the database and the dead-letter stream (tests/chaos/harness.py). The bed
runs with authentication on, as `muster up` does (bus credentials and permissions per
service and per node, SCRAM PostgreSQL with a role per service, signed requests).

A failing run prints its seed and what broke, on stdout and in the assertion. Replay it:

    MUSTER_CHAOS_SEED=<seed> .venv/bin/python -m pytest -q tests/chaos/test_chaos.py

(MUSTER_CHAOS_FAULTS, MUSTER_CHAOS_DURATION_S, MUSTER_CHAOS_NATS_SERVERS and
MUSTER_CHAOS_REPLICAS change the run's size and shape, MUSTER_CHAOS_INSECURE=1 runs the
old bed without authentication; bench/chaos_soak.py runs the long variant.)
"""

from __future__ import annotations

import json
import os

import pytest

from tests.chaos.harness import ChaosSettings, run_chaos

pytestmark = pytest.mark.slow

REPLAY = os.environ.get("MUSTER_CHAOS_SEED")
FAULTS = int(os.environ.get("MUSTER_CHAOS_FAULTS", "12"))
DURATION_S = float(os.environ.get("MUSTER_CHAOS_DURATION_S", "45"))
# seed -> (NATS servers, replicas of every service): one server (nodes in network
# namespaces, so partitions too) at one and two replicas, and a three-server JetStream
# cluster (one of three killed) at two replicas.
CI_SEEDS = {1: (1, 1), 2: (1, 2), 3: (3, 2)}
REPLAY_SHAPE = (
    int(os.environ.get("MUSTER_CHAOS_NATS_SERVERS", "1")),
    int(os.environ.get("MUSTER_CHAOS_REPLICAS", "1")),
)
SEEDS = {int(REPLAY): REPLAY_SHAPE} if REPLAY else CI_SEEDS
SECURE = os.environ.get("MUSTER_CHAOS_INSECURE", "") in ("", "0")


@pytest.mark.parametrize(("seed", "shape"), SEEDS.items(), ids=[f"seed{s}" for s in SEEDS])
async def test_a_seeded_chaos_run_keeps_every_invariant(seed: int, shape: tuple[int, int]) -> None:
    nats_servers, replicas = shape
    settings = ChaosSettings(
        seed=seed,
        n_faults=FAULTS,
        duration_s=DURATION_S,
        nats_servers=nats_servers,
        replicas=replicas,
        secure=SECURE,
    )
    report = await run_chaos(settings)
    summary = report.summary()
    print(json.dumps(summary))
    verdict = report.verdict()
    if verdict:
        print(verdict)
    assert not verdict, verdict
    assert summary["jobs_submitted"], "no job was accepted: the run checked nothing"
    assert report.poison_copies >= 1
    assert report.workers_seen, "no worker was seen on the machine: its checks judged nothing"
    assert report.secure == SECURE
