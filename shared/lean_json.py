"""Plumbing: JSON for a one-shot command, on the C accelerator module alone.

`import json` loads `re` (and with it `enum`), and msgspec loads `typing`, `datetime`,
`decimal` and `uuid`: on a small machine each costs a `squeue` call more than its own
work. `_json`, which `json` itself runs on, encodes and scans without them. `dumps`
writes compact JSON (no spaces, UTF-8 kept as is, keys in insertion order: what
msgspec writes for a dict); `loads` reads any JSON text into dicts, lists, str, int,
float, bool and None, as `json.loads` does, and raises ValueError for anything else.
"""

from __future__ import annotations

import _json

TYPE_CHECKING = False  # mypy takes it as true
if TYPE_CHECKING:
    from typing import Any


class _Scanning:
    """The settings `_json.make_scanner` reads from `json.JSONDecoder` (its defaults)."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int

    @staticmethod
    def parse_constant(name: str) -> float:
        return float(name)  # NaN, Infinity, -Infinity, as json.loads reads them


def _refuse(value: object) -> object:
    raise TypeError(f"not JSON: {type(value).__name__}")


_scan = _json.make_scanner(_Scanning())  # type: ignore[arg-type]  # what it reads, duck-typed
_encode = _json.make_encoder(
    None, _refuse, _json.encode_basestring, None, ":", ",", False, False, True
)
_SPACE = " \t\n\r"


def dumps(value: Any) -> str:
    """Compact JSON of dicts (str keys), lists, tuples, str, int, float, bool, None."""
    return "".join(_encode(value, 0))


def loads(text: str | bytes) -> Any:
    """The value of one JSON document; ValueError when it is not one."""
    doc = text.decode() if isinstance(text, bytes) else text
    start = len(doc) - len(doc.lstrip(_SPACE))
    try:
        value, end = _scan(doc, start)
    except StopIteration as err:
        raise ValueError(f"not JSON at character {err.value}") from None
    if doc[end:].strip(_SPACE):
        raise ValueError(f"extra data after the JSON value at character {end}")
    return value
