"""How far one target's lint got: `import`, `factory`, `forward`, `backward`, `rules`.

The capture and the pipeline call `reached(stage)`; the child process that lints a target forwards each stage
to the run, so that a child that dies (`os._exit`, a crash in native code, a timeout) is reported with the
last stage it reached (`graphlint graph`'s child too; `graphlint memory`'s reports one stage, the
measurement). Without a listener (the Python API, tests) it does nothing.
"""

from __future__ import annotations

from collections.abc import Callable

STAGES = ("import", "factory", "forward", "backward", "rules")

_listener: Callable[[str], None] | None = None
_last: str | None = None  # the stage reached last, for a failure to say where it happened


def last() -> str | None:
    """The stage reached last in this process, None before any."""
    return _last


def listen(listener: Callable[[str], None] | None) -> None:
    global _listener
    _listener = listener


def reached(stage: str) -> None:
    global _last
    _last = stage
    if _listener is not None:
        _listener(stage)
