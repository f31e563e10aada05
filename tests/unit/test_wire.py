"""Every event shape keeps one recorded payload under tests/wire/; they must decode
forever (STYLE.md rule 7: add fields with defaults, never rename, retype or reuse).

A new event type gets its payload recorded by running this file with
MUSTER_RECORD_WIRE=1 once; an existing payload is never rewritten."""

from __future__ import annotations

import os
import typing
import uuid
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest

from shared import events

WIRE = Path(__file__).resolve().parents[1] / "wire"
EVENT_TYPES = typing.get_args(events.AnyEvent)
T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def _example(kind: type[events.Event]) -> events.Event:
    """A value of `kind` with every required field filled."""
    values: dict[str, object] = {"event_id": uuid.UUID(int=1), "occurred_at": T0}
    samples = {int: 7, str: "node01", float: 12.5, bool: True}
    for field in msgspec.structs.fields(kind):
        if field.required and field.name not in values:
            hint = field.type
            if hint in samples:
                values[field.name] = samples[hint]
            elif typing.get_origin(hint) is tuple:
                values[field.name] = ()
            else:
                values[field.name] = None
    return kind(**values)


@pytest.mark.parametrize("kind", EVENT_TYPES, ids=lambda k: k.__struct_config__.tag)
def test_every_recorded_payload_still_decodes_to_its_type(kind: type[events.Event]) -> None:
    tag = kind.__struct_config__.tag
    path = WIRE / f"{tag}.json"
    if not path.exists():
        if not os.environ.get("MUSTER_RECORD_WIRE"):
            pytest.fail(f"no recorded payload for {tag}: run with MUSTER_RECORD_WIRE=1 once")
        path.write_bytes(events.encode(_example(kind)) + b"\n")
    decoded = events.decode(path.read_bytes())
    assert type(decoded) is kind
    assert events.subject_of(decoded) == f"muster.{tag}"
