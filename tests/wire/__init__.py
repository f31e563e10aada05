"""Tooling beside the recorded payloads: `python -m tests.wire.record`."""
