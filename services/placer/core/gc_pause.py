"""Pure core: the cyclic garbage collector paused for the length of one pass.

A pass makes no reference cycles, but its tens of thousands of Waits set off
collections that walk every live object of the caller (the snapshot, the queue, the
last plan): a fifth of a 50,000-job pass went to them. Collection resumes after the
pass as it was before (a pass inside a pass leaves it paused); the plan is the same
either way.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
