"""Every event shape keeps one recorded payload under tests/wire/ (one file per tag);
they must decode forever (STYLE.md rule 7: add fields with defaults, never rename,
retype or reuse).

The payloads are recorded from a live run (`python -m tests.wire.record`: a local
cluster, a gang job, an XID, a cancel, a drain...), so nested collections (`Grant`,
`GpuSlot`, `RunningWorker`) hold what the services really send. A payload must decode
to its type AND re-encode to the same JSON, so a renamed or retyped field, nested or
not, fails here. Every field is filled but those `LIVE_GAPS` names: a live run leaves
them empty (one of two alternatives, or a value the simulated GPUs never give). A new
field (with its default) fails until the tag is recorded again or its value added."""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Any

import msgspec
import pytest

from shared import events

WIRE = Path(__file__).resolve().parents[1] / "wire"
EVENT_TYPES = typing.get_args(events.AnyEvent)


def _tag(kind: type[events.Event]) -> str:
    tag = kind.__struct_config__.tag
    assert isinstance(tag, str)
    return tag


def _recorded(kind: type[events.Event]) -> bytes:
    path = WIRE / f"{_tag(kind)}.json"
    if not path.exists():
        pytest.fail(
            f"no recorded payload for {_tag(kind)}: write {path} by hand, a realistic"
            " message with every field filled and nested collections non-empty"
        )
    return path.read_bytes()


def round_trip(raw: bytes, decoder: msgspec.json.Decoder[Any]) -> tuple[Any, Any]:
    """(what was recorded, what decoding and re-encoding it gives), as JSON values."""
    return json.loads(raw), json.loads(msgspec.json.encode(decoder.decode(raw)))


def unfilled(value: Any, at: str = "") -> list[str]:
    """The paths of null values and empty strings or collections, at any depth."""
    if value is None or value in ("", [], {}):
        return [at or "."]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in unfilled(v, f"{at}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in unfilled(v, f"{at}[{i}]")]
    return []


@pytest.mark.parametrize("kind", EVENT_TYPES, ids=_tag)
def test_every_recorded_payload_still_decodes_to_its_type(kind: type[events.Event]) -> None:
    decoded = events.decode(_recorded(kind))
    assert type(decoded) is kind
    want = f"muster.{_tag(kind)}"  # a node event's ends with its node (NODE_SUBJECT_TAGS)
    assert events.subject_of(decoded) in (want, f"{want}.{getattr(decoded, 'node', '')}")


@pytest.mark.parametrize("kind", EVENT_TYPES, ids=_tag)
def test_every_recorded_payload_re_encodes_to_the_same_json(kind: type[events.Event]) -> None:
    recorded, again = round_trip(_recorded(kind), events.DECODER)
    assert again == recorded


# What a live run leaves empty, per tag, and why; never a nested collection (NESTED).
LIVE_GAPS: dict[str, set[str]] = {
    # `signal` (and its scope) set only by `cancel --signal`, `exit_code` only by a
    # release (salloc's)
    "job.cancel_requested": {".signal", ".signal_scope", ".exit_code"},
    "job.finished": {".exit_code", ".signal"},  # an exit code or a signal, or neither
    "job.requeued": {".excluded_nodes"},  # a preemption excludes no node
    "worker.exited": {".exit_code", ".signal", ".spawn_failed"},  # one of them at most
    # the simulated GPU names no process with an XID
    "gpu.xid_observed": {".pid"},
    # a healthy node's registration: no problems, no unhealthy GPU, no reset pending
    # ... and no features: the local topology file gives its nodes none
    "node.registered": {".check_problems", ".unhealthy_gpus", ".reset_pending", ".features"},
}
NESTED = {".grants", ".gpus", ".running", ".stopped", ".keep"}


@pytest.mark.parametrize("kind", EVENT_TYPES, ids=_tag)
def test_every_field_of_a_recorded_payload_is_filled(kind: type[events.Event]) -> None:
    gaps = set(unfilled(json.loads(_recorded(kind))))
    assert gaps - LIVE_GAPS.get(_tag(kind), set()) == set()


def test_no_nested_collection_may_stay_empty() -> None:
    assert all(not gaps & NESTED for gaps in LIVE_GAPS.values())


def test_every_recorded_file_names_an_event_type() -> None:
    assert sorted(p.stem for p in WIRE.glob("*.json")) == sorted(map(_tag, EVENT_TYPES))


# The round trip on shapes changed on purpose, so it is known to catch what it claims.
class _GrantRetyped(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    gpus: tuple[str, ...] = ()  # was tuple[int, ...]


class _GrantRenamed(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    gpu_ids: tuple[int, ...] = ()  # was gpus


class _AllocatedRetyped(events.Event, frozen=True, tag="job.allocated"):
    job_id: int
    attempt: int
    alloc_id: int
    grants: tuple[_GrantRetyped, ...]
    epoch: int
    backfilled: bool = False


class _AllocatedRenamed(events.Event, frozen=True, tag="job.allocated"):
    job_id: int
    attempt: int
    alloc_id: int
    grants: tuple[_GrantRenamed, ...]
    epoch: int
    backfilled: bool = False


def test_a_retyped_nested_field_fails_to_decode() -> None:
    with pytest.raises(msgspec.ValidationError, match=r"grants\[0\]\.gpus"):
        round_trip(_recorded(events.JobAllocated), msgspec.json.Decoder(_AllocatedRetyped))


def test_a_renamed_nested_field_does_not_re_encode_to_the_same_json() -> None:
    recorded, again = round_trip(
        _recorded(events.JobAllocated), msgspec.json.Decoder(_AllocatedRenamed)
    )
    assert again != recorded
    assert again["grants"][0] == {"node": recorded["grants"][0]["node"], "gpu_ids": []}


FILLED = {
    "a full payload": ({"node": "n1", "gpus": [{"index": 0, "healthy": False}]}, []),
    "an empty nested collection": ({"node": "n1", "gpus": []}, [".gpus"]),
    "a null deep inside": ({"running": [{"job_id": 1, "pid": None}]}, [".running[0].pid"]),
    "an empty string": ({"boot_id": ""}, [".boot_id"]),
}


@pytest.mark.parametrize(("value", "want"), FILLED.values(), ids=FILLED.keys())
def test_unfilled_finds_every_gap(value: Any, want: list[str]) -> None:
    assert unfilled(value) == want
