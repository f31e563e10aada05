"""Pure: the storage I/O policy of a job (docs/isolation.md) from the cluster
configuration: its account's `io_*` settings (the nearest ancestor that sets each)
over its partition's, field by field."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from .config_model import ClusterConfig, IoPolicy


def io_policy(fields: Mapping[str, object]) -> IoPolicy:
    """The `io_weight` / `io_read_bps` / `io_write_bps` keys of one read table."""

    def get(key: str) -> int | None:
        value = fields.get(key)
        return value if isinstance(value, int) else None

    return IoPolicy(
        weight=get("io_weight"), read_bps=get("io_read_bps"), write_bps=get("io_write_bps")
    )


def job_io(config: ClusterConfig, account: str, partition: str) -> IoPolicy:
    """What a job of `account` in `partition` gets."""
    chain = [config.accounts[a].io for a in config.ancestors(account)]
    part = config.partitions.get(partition)
    chain.append(part.io if part is not None else IoPolicy())
    picked: dict[str, int | None] = {}
    for field in ("weight", "read_bps", "write_bps"):
        picked[field] = next((v for io in chain if (v := getattr(io, field)) is not None), None)
    return msgspec.convert(picked, IoPolicy)
