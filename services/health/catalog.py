"""Pure core: what an XID means for the job, the GPU and the node.

The table follows NVIDIA's Xid catalog for Ampere and newer GPUs ("Analyzing Xid Errors
with the Xid Catalog", docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html),
whose "Resolution Bucket (Immediate Action)" column maps to our actions:

    RESTART_APP  -> the job fails or restarts, the GPU stays in service (APPLICATION)
    RESET_GPU    -> exclude the GPU, drain the node, reset the GPU, health-check (GPU_RESET)
    RESTART_BM   -> reboot the node (NODE_REBOOT)
    WORKFLOW_*   -> the workflows for Xid 48 (ECC) and NVLink errors, see the rows
    XID_154_EVAL -> read the recovery action (NVML field 230) and do what it says

A recovery action the driver reports (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230, or the
value carried by Xid 154) is the driver's own verdict for this fault, so it wins over
the table. An XID the table does not know gets a conservative default: restart the job,
keep the GPU out, drain the node for a reset and a health check.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum

import msgspec

from services.health.gpu import XID_RECOVERY_ACTION


class FaultClass(StrEnum):
    APPLICATION = "application"  # the job's bug; the GPU is healthy
    GPU_RESET = "gpu_reset"  # the GPU needs a reset before it is used again
    NODE_REBOOT = "node_reboot"  # only a reboot (or a power cycle) brings the GPU back
    ROW_REMAP = "row_remap"  # memory row remap pending: reset when convenient
    ECC = "ecc"  # uncorrectable memory error
    NVLINK = "nvlink"  # NVLink fabric error
    INFO = "info"  # logged for the record; nothing to do
    UNKNOWN = "unknown"  # not in the table


class Action(StrEnum):
    """The remedy, strongest last; `Classification.action` is the node/GPU remedy and
    `Classification.job_action` what happens to the job that held the GPU."""

    NONE = "none"
    RESTART_JOB = "restart_job"
    FAIL_JOB = "fail_job"
    RESET_GPU_AT_DRAIN = "reset_gpu_at_drain"  # keep running; reset once drained
    EXCLUDE_GPU = "exclude_gpu"  # no new work on the GPU
    DRAIN_NODE = "drain_node"  # no new work on the node; reset GPUs once idle
    REBOOT_NODE = "reboot_node"


class Severity(StrEnum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"
    CRITICAL = "critical"


class RecoveryAction(IntEnum):
    """nvmlDeviceGpuRecoveryAction_t (NVML field 230, Xid 154)."""

    NONE = 0
    GPU_RESET = 1
    NODE_REBOOT = 2
    DRAIN_P2P = 3
    DRAIN_AND_RESET = 4
    RECOVER_IMEX_DOMAIN = 5
    BUS_RESET = 6
    SYSTEM_REBOOT = 7


class Classification(msgspec.Struct, frozen=True, kw_only=True):
    xid: int
    fault_class: FaultClass
    action: Action  # what to do to the GPU / node
    job_action: Action  # NONE, RESTART_JOB or FAIL_JOB
    severity: Severity
    excludes_gpu: bool  # the GPU gets no new work until healthy again
    excludes_node: bool  # the node gets no new work (drain, reboot) until healthy again
    affects_job: bool  # the job on the GPU is (or must be) stopped
    description: str
    source: str = "catalog"  # catalog | recovery_action | default

    @property
    def node_fault(self) -> bool:
        """Whether this is a hardware fault the cluster must act on (node.fault)."""
        return self.excludes_gpu or self.excludes_node


class _Row(msgspec.Struct, frozen=True):
    fault_class: FaultClass
    description: str
    job_action: Action | None = None  # overrides the class's job action


class _Shape(msgspec.Struct, frozen=True, kw_only=True):
    action: Action
    job_action: Action
    severity: Severity
    excludes_gpu: bool
    excludes_node: bool


def _shape(action: Action, job: Action, severity: Severity, gpu: bool, node: bool) -> _Shape:
    return _Shape(
        action=action, job_action=job, severity=severity, excludes_gpu=gpu, excludes_node=node
    )


_A, _S = Action, Severity
# What each fault class does: one place, so every row of a class behaves alike.
# fmt: off
_SHAPES: dict[FaultClass, _Shape] = {
    # class: _shape(action, job action, severity, excludes gpu, excludes node)
    FaultClass.APPLICATION: _shape(_A.NONE, _A.FAIL_JOB, _S.WARNING, False, False),
    FaultClass.GPU_RESET: _shape(_A.DRAIN_NODE, _A.RESTART_JOB, _S.ERROR, True, True),
    FaultClass.NODE_REBOOT: _shape(_A.REBOOT_NODE, _A.RESTART_JOB, _S.CRITICAL, True, True),
    FaultClass.ROW_REMAP: _shape(_A.RESET_GPU_AT_DRAIN, _A.NONE, _S.WARNING, False, False),
    FaultClass.ECC: _shape(_A.DRAIN_NODE, _A.RESTART_JOB, _S.CRITICAL, True, True),
    FaultClass.NVLINK: _shape(_A.DRAIN_NODE, _A.RESTART_JOB, _S.ERROR, True, True),
    FaultClass.INFO: _shape(_A.NONE, _A.NONE, _S.INFO, False, False),
    FaultClass.UNKNOWN: _shape(_A.DRAIN_NODE, _A.RESTART_JOB, _S.ERROR, True, True),
}
# fmt: on

# fmt: off
_TABLE: dict[int, _Row] = {
    # Catalog bucket RESTART_APP: the application's own fault; the GPU recovers by itself.
    8: _Row(FaultClass.APPLICATION, "GPU stopped processing (channel idle timeout)"),
    13: _Row(FaultClass.APPLICATION, "Graphics engine exception (illegal address, bad kernel)"),
    31: _Row(FaultClass.APPLICATION, "GPU memory page fault (MMU fault: bad pointer)"),
    43: _Row(FaultClass.APPLICATION, "GPU stopped processing (reset channel verification)"),
    45: _Row(FaultClass.APPLICATION, "Preemptive cleanup after an earlier error or kill"),
    68: _Row(FaultClass.APPLICATION, "NVDEC0 (video decoder) exception"),
    69: _Row(FaultClass.APPLICATION, "Graphics engine class error"),
    137: _Row(FaultClass.APPLICATION, "NVLink FLA privilege error (access not granted)"),
    # Catalog WORKFLOW_XID_48: a DBE kills the contexts on the GPU; the row is remapped
    # (Xid 63) at the next reset, or remapping fails (Xid 64) and the GPU is an RMA case.
    48: _Row(FaultClass.ECC, "Uncorrectable double-bit ECC error (DBE)"),
    # Catalog RESTART_APP + reset when drained (Xid 154 DRAIN_AND_RESET linkage).
    94: _Row(FaultClass.ROW_REMAP, "Contained ECC error: restart the job, reset at drain",
             Action.RESTART_JOB),
    # Catalog: row remapping recorded; takes effect at the next GPU reset.
    63: _Row(FaultClass.ROW_REMAP, "Row remap pending (ECC page retirement recorded)"),
    # Catalog bucket RESET_GPU.
    46: _Row(FaultClass.GPU_RESET, "GPU stopped processing (engine hang)"),
    95: _Row(FaultClass.GPU_RESET, "Uncontained ECC error: the GPU must be reset"),
    140: _Row(FaultClass.GPU_RESET, "Unrecovered ECC error"),
    62: _Row(FaultClass.GPU_RESET, "Internal micro-controller halt"),
    64: _Row(FaultClass.GPU_RESET, "Row remapper / page retirement recording failure"),
    109: _Row(FaultClass.GPU_RESET, "Context switch timeout"),
    119: _Row(FaultClass.GPU_RESET, "GSP RPC timeout"),
    120: _Row(FaultClass.GPU_RESET, "GSP error"),
    143: _Row(FaultClass.GPU_RESET, "GPU initialization failure"),
    # Catalog WORKFLOW_NVLINK_ERR / WORKFLOW_NVLINK5_ERR: a fatal link error stops NCCL
    # traffic; the GPU and its NVLink peers need a reset (the whole board on NVSwitch).
    74: _Row(FaultClass.NVLINK, "NVLink error"),
    144: _Row(FaultClass.NVLINK, "NVLink error (NVLink5 workflow)"),
    145: _Row(FaultClass.NVLINK, "NVLink error (NVLink5 workflow)"),
    146: _Row(FaultClass.NVLINK, "NVLink error (NVLink5 workflow)"),
    147: _Row(FaultClass.NVLINK, "NVLink error (NVLink5 workflow)"),
    148: _Row(FaultClass.NVLINK, "NVLink error (NVLink5 workflow)"),
    149: _Row(FaultClass.NVLINK, "NVLink error (NVLink5 workflow)"),
    150: _Row(FaultClass.NVLINK, "NVLink error (NVLink5 workflow)"),
    # Catalog bucket RESTART_BM: the GPU is gone from PCIe; only a reboot brings it back.
    79: _Row(FaultClass.NODE_REBOOT, "GPU has fallen off the bus"),
    # Catalog: informational; counted, nothing to do.
    92: _Row(FaultClass.INFO, "High single-bit ECC error rate"),
    154: _Row(FaultClass.INFO, "GPU recovery action changed (see the action)"),
}
# fmt: on

# The driver's verdict (nvmlDeviceGpuRecoveryAction_t) as class, shape, description.
# fmt: off
_RECOVERY: dict[int, tuple[FaultClass, _Shape, str]] = {
    RecoveryAction.NONE: (FaultClass.INFO, _SHAPES[FaultClass.INFO],
                          "driver: no recovery needed; the GPU is usable by a new process"),
    RecoveryAction.GPU_RESET: (FaultClass.GPU_RESET, _SHAPES[FaultClass.GPU_RESET],
                               "driver: GPU reset required"),
    RecoveryAction.NODE_REBOOT: (FaultClass.NODE_REBOOT, _SHAPES[FaultClass.NODE_REBOOT],
                                 "driver: node reboot required"),
    RecoveryAction.DRAIN_P2P: (FaultClass.NVLINK, _SHAPES[FaultClass.NVLINK],
                               "driver: drain peer-to-peer traffic, then re-read the action"),
    RecoveryAction.DRAIN_AND_RESET: (
        FaultClass.GPU_RESET,
        _shape(_A.RESET_GPU_AT_DRAIN, _A.NONE, _S.WARNING, True, False),
        "driver: running work may finish; no new work; reset the GPU once drained"),
    RecoveryAction.RECOVER_IMEX_DOMAIN: (FaultClass.NVLINK, _SHAPES[FaultClass.NVLINK],
                                         "driver: recover the IMEX (multi-node NVLink) domain"),
    RecoveryAction.BUS_RESET: (FaultClass.GPU_RESET, _SHAPES[FaultClass.GPU_RESET],
                               "driver: PCIe bus reset of the GPU required"),
    RecoveryAction.SYSTEM_REBOOT: (FaultClass.NODE_REBOOT, _SHAPES[FaultClass.NODE_REBOOT],
                                   "driver: system reboot required"),
}
# fmt: on


def classify(xid: int, recovery_action: int | None = None) -> Classification:
    """What `xid` means; a known driver `recovery_action` overrides the table."""
    if recovery_action is not None and recovery_action in _RECOVERY:
        return _from_recovery_action(xid, recovery_action)
    row = _TABLE.get(xid)
    if row is None:
        row = _Row(FaultClass.UNKNOWN, f"Xid {xid}: not in the catalog")
        return _shaped(xid, row, "default")
    return _shaped(xid, row, "catalog")


def _shaped(xid: int, row: _Row, source: str) -> Classification:
    shape = _SHAPES[row.fault_class]
    job_action = row.job_action or shape.job_action
    return _build(xid, row.fault_class, shape, job_action, row.description, source)


def _from_recovery_action(xid: int, recovery_action: int) -> Classification:
    fault_class, shape, text = _RECOVERY[recovery_action]
    job_action = shape.job_action
    if recovery_action == RecoveryAction.NONE and xid != XID_RECOVERY_ACTION:
        # The XID still happened and its job action stands, but the driver says the GPU
        # is fine: nothing is excluded.
        base = classify(xid)
        fault_class, job_action = base.fault_class, base.job_action
    return _build(xid, fault_class, shape, job_action, text, "recovery_action")


def _build(
    xid: int, fault_class: FaultClass, shape: _Shape, job_action: Action, text: str, source: str
) -> Classification:
    return Classification(
        xid=xid,
        fault_class=fault_class,
        action=shape.action,
        job_action=job_action,
        severity=shape.severity,
        excludes_gpu=shape.excludes_gpu,
        excludes_node=shape.excludes_node,
        affects_job=job_action is not Action.NONE,
        description=text,
        source=source,
    )


def catalogued_xids() -> tuple[int, ...]:
    """Every XID with its own row (for docs and tests)."""
    return tuple(sorted(_TABLE))


class LemonPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """A GPU is a suspected lemon when application XIDs hit `distinct_jobs` different
    jobs on it within `window_s`: one buggy job repeats; a bad GPU fails everyone."""

    window_s: float = 24 * 3600.0
    distinct_jobs: int = 3


class _Strike(msgspec.Struct, frozen=True):
    at: float
    job: str
    xid: int


class LemonTracker(msgspec.Struct, frozen=True, kw_only=True):
    """Immutable record of recent application XIDs per GPU (keyed by GPU UUID)."""

    policy: LemonPolicy = LemonPolicy()
    strikes: dict[str, tuple[_Strike, ...]] = {}

    def observe(self, gpu: str, job: str, xid: int, now: float) -> tuple[LemonTracker, bool]:
        """Record an XID on `gpu` under `job`; return the new tracker and whether the GPU
        is now a suspected lemon. Only APPLICATION-class XIDs count; others (which
        already take the GPU out) leave the tracker as it is."""
        if classify(xid).fault_class is not FaultClass.APPLICATION:
            return self, self.suspected(gpu, now)
        horizon = now - self.policy.window_s
        kept = tuple(s for s in self.strikes.get(gpu, ()) if s.at > horizon)
        strikes = dict(self.strikes)
        strikes[gpu] = (*kept, _Strike(now, job, xid))
        tracker = LemonTracker(policy=self.policy, strikes=strikes)
        return tracker, tracker.suspected(gpu, now)

    def suspected(self, gpu: str, now: float) -> bool:
        horizon = now - self.policy.window_s
        jobs = {s.job for s in self.strikes.get(gpu, ()) if s.at > horizon}
        return len(jobs) >= self.policy.distinct_jobs

    def forget(self, gpu: str) -> LemonTracker:
        """After the GPU was replaced or cleared by an operator."""
        strikes = {k: v for k, v in self.strikes.items() if k != gpu}
        return LemonTracker(policy=self.policy, strikes=strikes)


# -- fabric faults -------------------------------------------------------------------------
# What a fabric condition (fabric_core.FabricCondition, as the probe reports it) means for
# the node: a link that is down or flapping stalls every collective of a multi-node job,
# so the node is drained and its jobs restart elsewhere, as for an XID; errors and a link
# trained down to a lower speed slow a job's collectives but not a single-node job's
# work: the node is kept out of multi-node jobs only; a damped bounce is a warning.


class FabricClass(StrEnum):
    LINK_DOWN = "network_link_down"
    LINK_FLAPPING = "network_link_flapping"
    ERRORS = "network_errors"
    DEGRADED = "network_degraded"
    SITE = "network_site"  # the site hook's verdict (subnet manager, ibdiagnet)
    BOUNCE = "network_bounce"  # one bounce, damped
    UNKNOWN = "network_unknown"


class FabricAction(StrEnum):
    DRAIN_NODE = "drain_node"  # no new work; its jobs restart elsewhere
    EXCLUDE_MULTI_NODE = "exclude_multi_node"  # no multi-node work; single-node work stays
    WARN = "warn"


class FabricClassification(msgspec.Struct, frozen=True, kw_only=True):
    link: str
    condition: str  # as the probe reported it
    fault_class: FabricClass
    action: FabricAction
    severity: Severity
    detail: str = ""

    @property
    def excludes_node(self) -> bool:
        return self.action is FabricAction.DRAIN_NODE

    @property
    def affects_job(self) -> bool:
        return self.action is FabricAction.DRAIN_NODE


_F, _FA = FabricClass, FabricAction
# fmt: off
_FABRIC: dict[str, tuple[FabricClass, FabricAction, Severity]] = {
    "link_down": (_F.LINK_DOWN, _FA.DRAIN_NODE, _S.ERROR),
    "link_flapping": (_F.LINK_FLAPPING, _FA.DRAIN_NODE, _S.ERROR),
    "site": (_F.SITE, _FA.DRAIN_NODE, _S.ERROR),
    "errors_rising": (_F.ERRORS, _FA.EXCLUDE_MULTI_NODE, _S.WARNING),
    "speed_degraded": (_F.DEGRADED, _FA.EXCLUDE_MULTI_NODE, _S.WARNING),
    "link_bounced": (_F.BOUNCE, _FA.WARN, _S.INFO),
}
# fmt: on


def classify_fabric(link: str, condition: str, detail: str = "") -> FabricClassification:
    """What a fabric condition on `link` means; one the table does not know drains the
    node (a link we cannot judge is a link we cannot trust)."""
    fault_class, action, severity = _FABRIC.get(
        condition, (FabricClass.UNKNOWN, FabricAction.DRAIN_NODE, Severity.ERROR)
    )
    return FabricClassification(
        link=link,
        condition=condition,
        fault_class=fault_class,
        action=action,
        severity=severity,
        detail=detail,
    )
