"""Pure: the cluster configuration's types — partitions, QOS, accounts, users, billing,
reservations — as `config.load_config` builds them and every admission module reads them.

Kept apart from the loader so that its checks (`config_check`) and the admission cores
import the types without importing the loader (no import cycle).
"""

from __future__ import annotations

from enum import StrEnum

import msgspec

from .config_reservations import ReservationConfig


class PreemptMode(StrEnum):
    OFF = "off"  # jobs here are never preempted
    REQUEUE = "requeue"  # preempted jobs go back to the queue
    CANCEL = "cancel"  # preempted jobs end


class NodeTraits(msgspec.Struct, frozen=True, kw_only=True):
    """What a node set's table gives its nodes (like Slurm's `Features=` and gres.conf
    `Type=`): features `--constraint` matches, the short GPU type `--gres` names, and
    the fabric links the node's agent watches (config_fabric.py; empty: every HCA)."""

    features: tuple[str, ...] = ()
    gpu_type: str | None = None
    fabric: tuple[str, ...] = ()


class IoPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Storage I/O of a partition's or an account's jobs (`io_weight`, `io_read_bps`,
    `io_write_bps`), applied through each job's cgroup on its nodes; None: not set."""

    weight: int | None = None
    read_bps: int | None = None
    write_bps: int | None = None


class Partition(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    nodes: tuple[str, ...]  # as written: node_set labels, hostlists or "ALL"
    node_names: tuple[str, ...] | None  # resolved names; None means every node
    default_time_s: int
    max_time_s: int | None  # None: unlimited
    max_nodes: int | None = None
    max_gpus_per_job: int | None = None
    priority_tier: int = 0
    preempt_mode: PreemptMode = PreemptMode.REQUEUE
    grace_time_s: int = 0
    allowed_accounts: tuple[str, ...] = ()  # empty: every account
    allowed_qos: tuple[str, ...] = ()  # empty: every QOS
    default_qos: str | None = None
    requires_approval: bool = False
    can_preempt: tuple[str, ...] = ()  # partition names
    can_preempt_tiers: tuple[int, ...] = ()  # or every partition at these tiers
    reserved_gpus: int = 0  # GPUs on its nodes kept for this partition alone
    # --mem of a job that gives no memory option, per GPU or per CPU of a node (MiB; 0:
    # none): its cgroup's cap, and what the placer counts out of the node's memory
    def_mem_per_gpu_mib: int = 0
    def_mem_per_cpu_mib: int = 0
    io: IoPolicy = IoPolicy()


class Qos(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    priority: int = 0
    max_gpus_per_user: int | None = None
    max_running_jobs_per_user: int | None = None
    max_submitted_jobs_per_user: int | None = None
    max_gpus_per_account: int | None = None
    max_running_jobs_per_account: int | None = None
    max_submitted_jobs_per_account: int | None = None
    min_runtime_s: int = 0  # a job runs at least this long before it can be preempted
    preempt: tuple[str, ...] = ()  # QOS names this one may preempt

    @property
    def limits_submissions(self) -> bool:
        """A cap on a user's or an account's unfinished jobs: a submission into it is
        counted, under its lock."""
        return (
            self.max_submitted_jobs_per_user is not None
            or self.max_submitted_jobs_per_account is not None
        )


class Account(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    parent: str | None
    shares: int
    coordinators: tuple[str, ...] = ()
    description: str = ""
    io: IoPolicy = IoPolicy()  # over the partition's, field by field


class User(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    accounts: tuple[str, ...]
    default_account: str
    keys: tuple[str, ...] = ()  # public NKeys ("U...") whose signatures act as this user


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """Abuse limits (`[limits]`): per user and replica, refused with the limit named."""

    submit_rate: float = 100.0  # submissions per second, refilled continuously
    submit_burst: int = 500  # submissions at once before the rate applies
    max_script_bytes: int = 512 * 1024
    max_request_bytes: int = 1024 * 1024


class Billing(msgspec.Struct, frozen=True, kw_only=True):
    default_gpu_weight: float = 1.0
    gpu_weights: dict[str, float] = {}  # GPU model -> weight per GPU-second

    def weight(self, model: str | None) -> float:
        return self.gpu_weights.get(model or "", self.default_gpu_weight)


class ClusterConfig(msgspec.Struct, frozen=True, kw_only=True):
    name: str = "muster"
    default_partition: str
    default_qos: str
    max_array_index: int = 1000
    node_sets: dict[str, tuple[str, ...]] = {}
    node_traits: dict[str, NodeTraits] = {}  # node name -> from its node sets' tables
    partitions: dict[str, Partition]  # empty: an identity-only file, no placement policy
    qos: dict[str, Qos]
    accounts: dict[str, Account] = {}  # empty: accounting off, any user, any account
    users: dict[str, User] = {}
    operators: tuple[str, ...] = ()
    limits: Limits = Limits()
    billing: Billing = Billing()
    reservations: dict[str, ReservationConfig] = {}

    def ancestors(self, account: str) -> tuple[str, ...]:
        """The account and its parents up to the root."""
        chain: list[str] = []
        current: str | None = account
        while current is not None and current in self.accounts and current not in chain:
            chain.append(current)
            current = self.accounts[current].parent
        return tuple(chain)
