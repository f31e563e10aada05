"""XID classification: each catalogued class, the driver's recovery action, lemons."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.health.catalog import (
    Action,
    FaultClass,
    LemonPolicy,
    LemonTracker,
    RecoveryAction,
    Severity,
    catalogued_xids,
    classify,
)

# xid -> (fault class, action, job action, excludes gpu, excludes node)
Want = tuple[FaultClass, Action, Action, bool, bool]
APP: Want = (FaultClass.APPLICATION, Action.NONE, Action.FAIL_JOB, False, False)
RESET: Want = (FaultClass.GPU_RESET, Action.DRAIN_NODE, Action.RESTART_JOB, True, True)
REBOOT: Want = (FaultClass.NODE_REBOOT, Action.REBOOT_NODE, Action.RESTART_JOB, True, True)
ECC: Want = (FaultClass.ECC, Action.DRAIN_NODE, Action.RESTART_JOB, True, True)
NVLINK: Want = (FaultClass.NVLINK, Action.DRAIN_NODE, Action.RESTART_JOB, True, True)
REMAP: Want = (FaultClass.ROW_REMAP, Action.RESET_GPU_AT_DRAIN, Action.NONE, False, False)
INFO: Want = (FaultClass.INFO, Action.NONE, Action.NONE, False, False)

TABLE: dict[str, tuple[int, Want]] = {
    "13 graphics exception is the application's bug": (13, APP),
    "31 MMU fault is the application's bug": (31, APP),
    "43 stopped processing is the application's": (43, APP),
    "45 preemptive cleanup is the application's": (45, APP),
    "68 video decoder exception is the application's": (68, APP),
    "69 graphics class error is the application's": (69, APP),
    "137 NVLink FLA privilege error is the application's": (137, APP),
    "94 contained ECC restarts the job and resets at drain": (
        94,
        (FaultClass.ROW_REMAP, Action.RESET_GPU_AT_DRAIN, Action.RESTART_JOB, False, False),
    ),
    "63 row remap pending waits for a drain": (63, REMAP),
    "46 engine hang needs a GPU reset": (46, RESET),
    "62 micro-controller halt needs a GPU reset": (62, RESET),
    "64 remap failure needs a GPU reset": (64, RESET),
    "109 context switch timeout needs a GPU reset": (109, RESET),
    "119 GSP RPC timeout needs a GPU reset": (119, RESET),
    "120 GSP error needs a GPU reset": (120, RESET),
    "143 init failure needs a GPU reset": (143, RESET),
    "48 double-bit ECC follows the ECC workflow": (48, ECC),
    "95 uncontained ECC needs a GPU reset": (95, RESET),
    "140 unrecovered ECC needs a GPU reset": (140, RESET),
    "74 NVLink error follows the NVLink workflow": (74, NVLINK),
    "144 NVLink5 SAW error follows the NVLink workflow": (144, NVLINK),
    "79 fallen off the bus needs a reboot": (79, REBOOT),
    "92 high single-bit rate is informational": (92, INFO),
    "154 alone (action unknown) is informational": (154, INFO),
    "an unknown xid gets the conservative default": (
        9999,
        (FaultClass.UNKNOWN, Action.DRAIN_NODE, Action.RESTART_JOB, True, True),
    ),
}


@pytest.mark.parametrize(("xid", "want"), TABLE.values(), ids=TABLE.keys())
def test_classify(xid: int, want: Want) -> None:
    c = classify(xid)
    assert (c.fault_class, c.action, c.job_action, c.excludes_gpu, c.excludes_node) == want
    assert c.xid == xid
    assert c.affects_job == (c.job_action is not Action.NONE)


def test_every_catalogued_xid_is_tested() -> None:
    assert set(catalogued_xids()) - {x for x, _ in TABLE.values()} <= {8, *range(145, 151)}


RECOVERY: dict[str, tuple[int, int, Want]] = {
    "the driver asks for a reset on an application xid": (
        13,
        RecoveryAction.GPU_RESET,
        RESET,
    ),
    "the driver asks for a reboot via xid 154": (154, RecoveryAction.NODE_REBOOT, REBOOT),
    "system reboot is a reboot": (154, RecoveryAction.SYSTEM_REBOOT, REBOOT),
    "drain and reset lets work finish but keeps the GPU out": (
        94,
        RecoveryAction.DRAIN_AND_RESET,
        (FaultClass.GPU_RESET, Action.RESET_GPU_AT_DRAIN, Action.NONE, True, False),
    ),
    "drain P2P drains the node": (74, RecoveryAction.DRAIN_P2P, NVLINK),
    "IMEX domain recovery drains the node": (154, RecoveryAction.RECOVER_IMEX_DOMAIN, NVLINK),
    "a bus reset is a GPU reset": (154, RecoveryAction.BUS_RESET, RESET),
    "none on a DBE: the driver says the GPU is fine, the job still restarts": (
        48,
        RecoveryAction.NONE,
        (FaultClass.ECC, Action.NONE, Action.RESTART_JOB, False, False),
    ),
    "none on an application xid keeps the job failing": (
        13,
        RecoveryAction.NONE,
        (FaultClass.APPLICATION, Action.NONE, Action.FAIL_JOB, False, False),
    ),
    "154 back to none clears": (154, RecoveryAction.NONE, INFO),
}


@pytest.mark.parametrize(("xid", "action", "want"), RECOVERY.values(), ids=RECOVERY.keys())
def test_the_drivers_recovery_action_wins_over_the_table(xid: int, action: int, want: Want) -> None:
    c = classify(xid, action)
    assert (c.fault_class, c.action, c.job_action, c.excludes_gpu, c.excludes_node) == want
    assert c.source == "recovery_action"


def test_an_unknown_recovery_action_falls_back_to_the_table() -> None:
    assert classify(79, 99) == classify(79)


@given(xid=st.integers(-10, 100_000), action=st.none() | st.integers(-5, 20))
def test_classify_is_total_and_consistent(xid: int, action: int | None) -> None:
    c = classify(xid, action)
    assert c.affects_job == (c.job_action is not Action.NONE)
    if c.excludes_node:
        assert c.action in (Action.DRAIN_NODE, Action.REBOOT_NODE)
    if c.action is Action.REBOOT_NODE:
        assert c.severity is Severity.CRITICAL and c.excludes_node


def test_node_fault_means_something_is_excluded() -> None:
    assert classify(79).node_fault and not classify(13).node_fault


# -- lemons --------------------------------------------------------------------------

POLICY = LemonPolicy(window_s=100.0, distinct_jobs=3)

LEMON: dict[str, tuple[list[tuple[str, str, int, float]], bool]] = {
    "three jobs failing on one GPU make a lemon": (
        [("g0", "j1", 13, 0.0), ("g0", "j2", 31, 10.0), ("g0", "j3", 13, 20.0)],
        True,
    ),
    "one buggy job repeating is not a lemon": (
        [("g0", "j1", 13, 0.0), ("g0", "j1", 13, 1.0), ("g0", "j1", 31, 2.0)],
        False,
    ),
    "strikes spread over GPUs are not a lemon": (
        [("g0", "j1", 13, 0.0), ("g1", "j2", 13, 1.0), ("g2", "j3", 13, 2.0)],
        False,
    ),
    "old strikes leave the window": (
        [("g0", "j1", 13, 0.0), ("g0", "j2", 13, 50.0), ("g0", "j3", 13, 150.0)],
        False,
    ),
    "hardware xids do not count as strikes": (
        [("g0", "j1", 79, 0.0), ("g0", "j2", 48, 1.0), ("g0", "j3", 13, 2.0)],
        False,
    ),
}


@pytest.mark.parametrize(("strikes", "want"), LEMON.values(), ids=LEMON.keys())
def test_lemon_tracker(strikes: list[tuple[str, str, int, float]], want: bool) -> None:
    tracker = LemonTracker(policy=POLICY)
    suspected = False
    for gpu, job, xid, at in strikes:
        tracker, suspected = tracker.observe(gpu, job, xid, at)
    assert suspected is want


def test_a_forgotten_lemon_starts_clean_and_the_old_tracker_is_unchanged() -> None:
    tracker = LemonTracker(policy=POLICY)
    for job in ("a", "b", "c"):
        tracker, _ = tracker.observe("g0", job, 13, 1.0)
    cleared = tracker.forget("g0")
    assert not cleared.suspected("g0", 2.0)
    assert tracker.suspected("g0", 2.0)
