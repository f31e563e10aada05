"""Plumbing: msgspec imported without typing_extensions, for a one-shot command.

msgspec (its `_utils`) imports `typing_extensions` when it is installed, for
`get_type_hints` and `Required`/`NotRequired`, and falls back to `typing`'s own when the
import fails. On Python 3.11+ these are the same: typing_extensions re-exports typing's
`Required`, and its `get_type_hints(..., include_extras=True)` returns typing's answer
unchanged (tests/unit/cli/test_hot_path.py checks it for every API struct). But
importing typing_extensions loads inspect, ast, dis and tokenize: about a third of a
`muster queue` call's own CPU time. The CLI and the shims import this module before
anything imports msgspec; typing_extensions stays importable for whatever wants it later.
"""

from __future__ import annotations

import contextlib
import sys

if (
    sys.version_info >= (3, 11)
    and "msgspec" not in sys.modules
    and "typing_extensions" not in sys.modules
):
    sys.modules["typing_extensions"] = None  # type: ignore[assignment]  # its import fails
    try:
        # A msgspec that cannot do without it fails here; the next import then loads it.
        with contextlib.suppress(ImportError):
            import msgspec  # noqa: F401  # what this module is for
    finally:
        del sys.modules["typing_extensions"]
