"""Plumbing: one frozen settings struct per process kind, read from `MUSTER_*` variables.

`Settings` holds what every process uses (servers, identity, logging and telemetry, bus
and database deadlines); each process kind has a subclass with only its own fields
(`PlacerSettings`, `LauncherSettings`, `NodeSettings`, ...). A `__main__` module calls
`<Kind>Settings.from_env(os.environ)` once and passes the result down; nothing else
reads the environment, nothing reads it at import time. A parent (`muster up`, the test
cluster) hands every child one environment: each child reads only its own fields and
ignores the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

import msgspec


class SettingsError(ValueError):
    """A `MUSTER_*` variable has a value that cannot be used."""

    def __init__(self, variable: str, value: str, expected: str) -> None:
        super().__init__(f"{variable}={value!r}: expected {expected}")
        self.variable = variable
        self.value = value
        self.expected = expected


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """What every process uses: where the servers are, who it is, how it logs and traces,
    and the bus and database deadlines. A process kind's own fields live in its subclass
    below; a variable for a field its class lacks is simply not read."""

    nats_url: str = "nats://127.0.0.1:4222"  # several servers: comma-separated URLs
    # Copies of each stream kept by a NATS cluster: 3 on a three-server cluster, so one
    # server lost loses nothing; 1 on a single server.
    stream_replicas: int = 1
    # A secured bus (docs/security.md): this process's NKey seed file, the CA that
    # verifies the servers' TLS certificates, and its identity's own inbox prefix.
    nats_creds: str = ""
    nats_tls_ca: str = ""
    nats_inbox_prefix: str = ""
    database_url: str = "postgresql://postgres@127.0.0.1:5432/muster"
    # The CA that verifies PostgreSQL's certificate (and name): set, every connection is
    # TLS and refused unless verified. The URL may say it instead (`muster up --tls`:
    # `?sslmode=verify-full&sslrootcert=<ca>`, so every client of the URL verifies).
    db_tls_ca: str = ""
    state_dir: str = ".muster"
    service_name: str = "muster"
    instance: str = "0"
    otel_exporter: str = "none"  # none | console | otlp
    otel_endpoint: str = ""
    # Where /metrics is served (shared/metrics.py): 0 an ephemeral port, -1 off; the
    # bound URL is written to <state_dir>/metrics/<process>.url.
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    log_level: str = "INFO"
    max_deliver: int = 5
    # A message not acked (nor marked in progress) this long goes to another replica:
    # what a paused (SIGSTOPped) or hung replica had pulled waits this long. Handlers'
    # messages in hand are marked in progress every third of it (shared/bus.py).
    ack_wait_s: float = 10.0
    drain_timeout_s: float = 10.0
    # The outbox and the inbox are trimmed every `prune_every_s` (shared/retention.py):
    # events published this long ago go, the node faults excepted; the inbox keeps at
    # least what the stream can still redeliver (8 days), whatever is set here.
    outbox_keep_s: float = 7 * 24 * 3600.0
    inbox_keep_s: float = 8 * 24 * 3600.0
    prune_every_s: float = 600.0
    # The hourly records `muster report` reads (usage per user, fairshare's; the cluster's
    # GPU time per state, health's) are kept this long (Slurm's PurgeUsageAfter): two
    # years, never less than a day; 0 keeps them for ever.
    usage_keep_s: float = 730 * 24 * 3600.0
    # Every query has a deadline, so an outage or a stuck lock delays a loop instead of
    # hanging it: the server cancels a statement or a lock wait (both transient errors,
    # retried), asyncpg gives up a little later if the server is gone, and a transaction
    # left idle by a hung process is ended by the server. Every transaction here is
    # database work and short computing between its statements; one left idle by a
    # paused (SIGSTOPped) replica keeps the rows it locked, and every replica and
    # service that needs them waits, until the server ends it (10 s, not a minute).
    db_statement_timeout_s: float = 30.0
    db_lock_timeout_s: float = 10.0
    db_command_timeout_s: float = 40.0
    db_idle_in_transaction_timeout_s: float = 10.0
    db_connect_timeout_s: float = 5.0

    @classmethod
    def from_env(cls, env: Mapping[str, str], **overrides: Any) -> Self:
        """Build settings from `MUSTER_<FIELD>` variables (upper case), then overrides.

        A subclass's fields are read the same way; variables naming fields the class
        lacks (another process kind's) are ignored, so no module reads the environment
        but this one."""
        values: dict[str, Any] = {}
        defaults = cls()
        for field in cls.__struct_fields__:
            key = f"MUSTER_{field.upper()}"
            if key not in env:
                continue
            raw = env[key]
            values[field] = _coerce(key, raw, getattr(defaults, field))
        values.update(overrides)
        return msgspec.structs.replace(defaults, **values)

    def to_env(self) -> dict[str, str]:
        """The variables that rebuild these settings in a child process."""
        out: dict[str, str] = {}
        for field in self.__struct_fields__:
            value = getattr(self, field)
            out[f"MUSTER_{field.upper()}"] = (
                str(value).lower() if isinstance(value, bool) else str(value)
            )
        return out


class PlacerSettings(Settings, frozen=True, kw_only=True):
    service_name: str = "placer"
    cycle_interval_s: float = 1.0
    lease_ttl_s: float = 5.0  # the leader's lease: a silent placer is replaced after this


class HealthSettings(Settings, frozen=True, kw_only=True):
    """The cluster-side health monitor (liveness of the node agents)."""

    service_name: str = "health"
    lease_ttl_s: float = 5.0
    heartbeat_timeout_s: float = 10.0  # silent this long: the node is SUSPECT
    down_after_s: float = 20.0  # silent this long: DOWN, its jobs restarted elsewhere
    # This share of the nodes (two or more) silent at once looks like our outage, not
    # theirs: the health monitor declares none of them DOWN while it lasts.
    max_silent_share: float = 0.5


class IdentitySettings(Settings, frozen=True, kw_only=True):
    """A service that authenticates users: the cluster configuration (accounts, users'
    keys, operators) and a folder of more users' keys."""

    cluster_config: str = ""
    # A folder of users' public keys (NAME.pub) honoured beside the configuration's
    # `[users.*] keys`: how a local or test cluster registers the users it creates.
    user_keys_dir: str = ""


class AdmissionSettings(IdentitySettings, frozen=True, kw_only=True):
    service_name: str = "admission"
    # A local cluster's bus secrets folder: the users' keys are rendered into its
    # authorization file and the NATS servers reload it (services/admission/bus_users.py).
    nats_auth_dir: str = ""
    # A finished job, with every row about it, is purged this long after it ended
    # (services/admission/purge.py; Slurm's PurgeJobAfter): a year, never less than 8
    # days; 0 keeps finished jobs for ever.
    job_keep_s: float = 365 * 24 * 3600.0


class FairShareSettings(IdentitySettings, frozen=True, kw_only=True):
    service_name: str = "fairshare"
    fairshare_config: str = ""  # a TOML file of fair-share knobs (docs/fairshare.md)


class LauncherSettings(IdentitySettings, frozen=True, kw_only=True):
    """The job coordinator (and, for job steps, an identity checker: srun is signed by its
    user). The restart policy's defaults are `CoordinatorConfig`'s
    (tests/unit/test_settings.py checks they agree)."""

    service_name: str = "launcher"
    kill_wait_s: float = 30.0
    fault_kill_wait_s: float = 2.0
    restart_limit: int = 3
    replace_with_spare: bool = True  # fixed-size job on a fault: a spare first, else requeue
    grow_back: bool = False  # elastic jobs grow back to their maximum when nodes return
    usage_tick_s: float = 30.0
    failure_settle_s: float = 2.0
    restart_backoff_s: float = 1.0
    restart_backoff_max_s: float = 60.0
    # A replica silent this long loses its shards of the jobs to another (owners.py).
    launcher_lease_s: float = 2.0
    # The key that signs every start and stop sent to the agents (shared/agent_auth.py);
    # empty: <state_dir>/launcher/launcher.nk.
    launcher_key_file: str = ""
    # How long past the job's time limit a node may stay silent about a step of it (srun)
    # before the step counts as lost there (docs/steps.md).
    step_silence_s: float = 60.0


class NodeSettings(Settings, frozen=True, kw_only=True):
    """One node's agent (health probe and node executor, `python -m muster.node`)."""

    service_name: str = "node"
    node: str = ""
    gpus: int = 4
    gpu_model: str = "SIM-H100"
    # What the node announces besides its GPUs (sinfo's CPUS, MEMORY; the placer puts a
    # job only where its --mem and CPUs fit): 0, the machine's own
    cpus: int = 0
    memory_mib: int = 0
    topology: str = ""
    features: str = ""  # comma list: what --constraint matches on this node
    # Containers (--container-image): auto (the feature "container" where podman is
    # installed), podman (always), none (never).
    container_runtime: str = "auto"
    node_address: str = "127.0.0.1"
    kmsg_path: str = ""
    gpu_backend: str = "sim"  # sim | nvml
    heartbeat_interval_s: float = 1.0
    # A node agent that has not reached the control plane for this long fences its jobs
    # (their workers are stopped): shorter than the health monitor's down_after_s, so the
    # old attempt is gone before the job restarts elsewhere.
    fence_s: float = 15.0
    fault_kill_wait_s: float = 2.0  # SIGTERM -> SIGKILL when a fault stops the workers
    allow_root_jobs: bool = False  # a node agent never runs a job as root unless told
    # No job runs as a system account: a uid below min_job_uid (Slurm-like 1000) only if
    # its name is in allowed_job_users (comma-separated); root only with allow_root_jobs.
    min_job_uid: int = 1000
    allowed_job_users: str = ""
    # The launcher public keys this agent trusts, one a line; empty:
    # <state_dir>/launcher/launcher.pub.
    launcher_public_keys: str = ""
    # Isolation (docs/isolation.md): a cgroup per worker (auto | required | off) under
    # cgroup_root in the agent's own cgroup; GPU device nodes by index for the devices
    # controller; whole-disk block devices the I/O caps apply to (comma-separated).
    cgroups: str = "auto"
    cgroup_root: str = "muster"
    job_pids_max: int = 0  # 0: no pids limit
    cgroup_cpu_quota: bool = True  # --cpus-per-task as a CFS quota
    gpu_device_template: str = "/dev/nvidia{index}"
    io_devices: str = ""
    # Site hooks (Slurm's Prolog / Epilog as root, TaskProlog as the user): paths, and
    # the time after which a hanging one is killed (a failed prolog drains the node).
    prolog: str = ""
    epilog: str = ""
    task_prolog: str = ""
    hook_timeout_s: float = 60.0
    # Fabric watch (docs/health.md): the links that matter ("mlx5_0,mlx5_1/1,ib0"; empty:
    # every HCA found), read under fabric_root's sysfs, polled (and woken by netlink).
    fabric: str = ""
    # The cluster configuration: with MUSTER_FABRIC unset, the links its node sets name
    # for this node (`fabric = [...]`, muster/node_fabric.py) are watched.
    cluster_config: str = ""
    fabric_root: str = "/"
    fabric_poll_s: float = 1.0
    fabric_down_grace_s: float = 2.0  # a shorter bounce is damped (a warning)
    fabric_stable_s: float = 30.0  # a faulted link must stay clean this long to return
    fabric_flap_max: int = 3  # bounces within fabric_flap_window_s: flapping
    fabric_flap_window_s: float = 300.0
    fabric_error_threshold: int = 50  # error counter increments within the window
    fabric_error_window_s: float = 60.0
    fabric_hook: str = ""  # a site executable whose JSON reports fabric faults
    fabric_hook_s: float = 60.0


class GatewaySettings(Settings, frozen=True, kw_only=True):
    """The gateway (services/gateway): where it listens (`MUSTER_HTTP_PORT` 0: any free
    port) and whom it acts as. It serves one user, whose key it signs with (found as the
    CLI finds it: `key_file`, else NAME.nk in `key_dir` or `<state_dir>/keys`, else
    ~/.muster/user.nk; NAME is `user` or the login name), so it listens on loopback."""

    service_name: str = "gateway"
    http_host: str = "127.0.0.1"
    http_port: int = 8780
    user: str = ""  # MUSTER_USER
    key_file: str = ""  # MUSTER_KEY_FILE
    key_dir: str = ""  # MUSTER_KEY_DIR
    cache_s: float = 1.0  # queue and nodes replies are shared by viewers this long
    output_tail_bytes: int = 16384


class ToolSettings(Settings, frozen=True, kw_only=True):
    """The cluster tooling's processes (`muster up`'s supervisor): the common settings
    (the state folder, the log level) and nothing of any service's."""

    service_name: str = "supervisor"


def _coerce(key: str, raw: str, default: object) -> object:
    if isinstance(default, bool):
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off"):
            return False
        raise SettingsError(key, raw, "true or false")
    if isinstance(default, int):
        try:
            return int(raw)
        except ValueError as err:
            raise SettingsError(key, raw, "an integer") from err
    if isinstance(default, float):
        try:
            return float(raw)
        except ValueError as err:
            raise SettingsError(key, raw, "a number") from err
    return raw
