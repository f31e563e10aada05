"""Plumbing: one frozen settings struct per process, read from `MUSTER_*` variables.

`__main__` modules call `Settings.from_env(os.environ)` once and pass the result down;
nothing reads the environment at import time.
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
    nats_url: str = "nats://127.0.0.1:4222"  # several servers: comma-separated URLs
    # Copies of each stream kept by a NATS cluster: 3 on a three-server cluster, so one
    # server lost loses nothing; 1 on a single server.
    stream_replicas: int = 1
    database_url: str = "postgresql://postgres@127.0.0.1:5432/muster"
    state_dir: str = ".muster"
    service_name: str = "muster"
    instance: str = "0"
    otel_exporter: str = "none"  # none | console | otlp
    otel_endpoint: str = ""
    log_level: str = "INFO"
    cycle_interval_s: float = 1.0
    heartbeat_interval_s: float = 1.0
    heartbeat_timeout_s: float = 10.0  # silent this long: the node is SUSPECT
    down_after_s: float = 20.0  # silent this long: DOWN, its jobs restarted elsewhere
    # This share of the nodes (two or more) silent at once looks like our outage, not
    # theirs: the health monitor declares none of them DOWN while it lasts.
    max_silent_share: float = 0.5
    # A node agent that has not reached the control plane for this long fences its jobs
    # (their workers are stopped): shorter than down_after_s, so the old attempt is gone
    # before the job restarts elsewhere.
    fence_s: float = 15.0
    lease_ttl_s: float = 5.0
    max_deliver: int = 5
    ack_wait_s: float = 30.0
    drain_timeout_s: float = 10.0
    # Every query has a deadline, so an outage or a stuck lock delays a loop instead of
    # hanging it: the server cancels a statement or a lock wait (both transient errors,
    # retried), asyncpg gives up a little later if the server is gone, and a transaction
    # left idle by a hung process is ended by the server.
    db_statement_timeout_s: float = 30.0
    db_lock_timeout_s: float = 10.0
    db_command_timeout_s: float = 40.0
    db_idle_in_transaction_timeout_s: float = 60.0
    db_connect_timeout_s: float = 5.0
    kill_wait_s: float = 30.0
    fault_kill_wait_s: float = 2.0
    restart_limit: int = 3
    replace_with_spare: bool = True  # fixed-size job on a fault: a spare first, else requeue
    grow_back: bool = False  # elastic jobs grow back to their maximum when nodes return
    usage_tick_s: float = 30.0
    node: str = ""
    gpus: int = 4
    gpu_model: str = "SIM-H100"
    topology: str = ""
    node_address: str = "127.0.0.1"
    kmsg_path: str = ""
    gpu_backend: str = "sim"  # sim | nvml
    cluster_config: str = ""
    # A folder of users' public keys (NAME.pub) honoured beside the configuration's
    # `[users.*] keys`: how a local or test cluster registers the users it creates.
    user_keys_dir: str = ""
    allow_root_jobs: bool = False  # a node agent never runs a job as root unless told
    sim_script: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str], **overrides: Any) -> Self:
        """Build settings from `MUSTER_<FIELD>` variables (upper case), then overrides.

        A process with settings of its own subclasses `Settings` (see the launcher's and
        fairshare's `__main__`); its fields are read the same way, so no module reads
        the environment but this one."""
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


def nats_servers(url: str) -> list[str]:
    """The servers a NATS URL setting names: one URL, or several comma-separated (a
    cluster: a client connects to any of them and fails over to the others)."""
    return [u.strip() for u in url.split(",") if u.strip()]


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
