"""The garbage collector around a warm parent's heap.

Imports and warm-up make hundreds of thousands of objects that live as long as the process (modules, functions,
torch's registrations); each full collection walks them all, about 0.2 s apiece, and a forked child's first one
also writes to every page it shares with its parent, copying them. So imports run with the collector paused and
their objects leave its generations (`gc.freeze`), and a child leaves its parent's objects out the same way.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def long_lived() -> Iterator[None]:
    """Run a block that makes only long-lived objects (imports) with the collector paused, then freeze them."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


def leave_parent_heap() -> None:
    """In a forked child: never walk what the parent made (the child is short-lived; it frees nothing of it)."""
    gc.freeze()
