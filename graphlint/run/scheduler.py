"""Runs targets in child processes of the warm parent, at most `jobs` at a time, each within its time limit,
and turns every way a child can end into that target's result: its own result, or one error line that says
what happened and the last stage it reached."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import wait

from graphlint.results import TargetError, TargetResult, from_wire
from graphlint.run.parent import WarmParent


@dataclass
class _Child:
    target: str
    process: object
    connection: object
    started: float
    stage: str = "import"
    result: TargetResult | None = None
    imported: list[str] = field(default_factory=list)


def lint_in_children(
    targets: list[str], request_for: Callable[[str], dict], jobs: int, timeout: float | None,
    started: Callable[[str], None] | None = None,
) -> Iterator[tuple[str, TargetResult]]:
    """Each target in its own child; results as the children finish."""
    parent = WarmParent()
    waiting = list(targets)
    running: list[_Child] = []
    try:
        while waiting or running:
            while waiting and len(running) < max(jobs, 1):
                text = waiting.pop(0)
                process, connection = parent.start(request_for(text))
                running.append(_Child(text, process, connection, time.monotonic()))
                if started is not None:
                    started(text)
            wait([c.connection for c in running] + [c.process.sentinel for c in running], _next_deadline(running, timeout))
            for child in list(running):
                _read(child)
                finished = not child.process.is_alive()
                if finished:
                    _read(child)  # what it sent just before exiting
                    child.process.join()
                elif timeout and time.monotonic() - child.started > timeout:
                    child.process.kill()
                    child.process.join()
                    child.result = _failed(child, f"did not finish within {timeout:g} s (--timeout) during the "
                                                  f"{child.stage}; its forward may never return, or raise --timeout "
                                                  "(0 for no limit)")
                    finished = True
                if finished:
                    running.remove(child)
                    child.connection.close()
                    parent.preload(child.imported)
                    yield child.target, child.result or _failed(child, _died(child))
    finally:
        for child in running:  # interrupted (Ctrl-C): no child outlives the run
            child.process.kill()
            child.process.join()


def _next_deadline(running: list[_Child], timeout: float | None) -> float | None:
    if not timeout:
        return None
    now = time.monotonic()
    return max(0.0, min(child.started + timeout - now for child in running))


def _read(child: _Child) -> None:
    """Everything the child has sent so far."""
    try:
        while child.connection.poll():
            message = child.connection.recv()
            if "stage" in message:
                child.stage = message["stage"]
            elif "result" in message:
                child.result = from_wire(message["result"])
                child.imported = list(message.get("imported", ()))
    except (EOFError, OSError, KeyError, TypeError, ValueError):
        pass  # a child that died mid-message, or sent something else: judged by its exit below


def _died(child: _Child) -> str:
    code = child.process.exitcode
    if code is not None and code < 0:
        name = _signal_name(-code)
        what = {
            "SIGSEGV": "crashed with SIGSEGV (a segmentation fault in native code)",
            "SIGKILL": "was killed with SIGKILL (often the system running out of memory)",
            "SIGABRT": "aborted (SIGABRT, often a failed check in native code)",
        }.get(name, f"was stopped by {name}")
    else:
        what = f"exited with code {code} (os._exit or a native exit)"
    return (f"its process {what} during the {child.stage}, before reporting; run this target alone with --debug "
            "to see how far it gets")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _failed(child: _Child, message: str) -> TargetResult:
    return TargetResult(target=child.target, errors=[TargetError(child.target, message)])
