"""Runs targets in child processes of the warm parent, each within its time limit, and turns every way a child
can end into that target's result: its own result, or one error line that says what happened and the last
stage it reached.

`Children` keeps the running children of one warm parent: the command line's run (`lint_in_children`) starts
at most `jobs` at a time and waits for them all; the language server (graphlint.server) keeps one for its whole
life, starts a child whenever a file is saved, and kills the child of a target that a newer save superseded.
"""

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
    key: object  # what the caller knows the child by: the target, unless it said otherwise
    target: str
    process: object
    connection: object
    started: float
    timeout: float | None = None  # seconds; None or 0: no limit
    stage: str = "import"
    result: TargetResult | None = None
    imported: list[str] = field(default_factory=list)


class Children:
    """The running children of a warm parent, one per target, each killed when its time limit passes."""

    def __init__(self, parent: WarmParent, timeout: float | None) -> None:
        self.parent = parent
        self.timeout = timeout  # seconds per child; None or 0: no limit
        self.running: list[_Child] = []

    def __len__(self) -> int:
        return len(self.running)

    def start(self, target: str, request: dict, timeout: float | None = None, key: object = None) -> None:
        """Start a child that lints `target`, known as `key` (default: the target); `timeout` overrides the
        default limit for this one."""
        process, connection = self.parent.start(request)
        self.running.append(_Child(target if key is None else key, target, process, connection, time.monotonic(),
                                   self.timeout if timeout is None else timeout))

    def wait(self, also: list | None = None, limit: float | None = None) -> list[tuple[str, TargetResult]]:
        """Wait until a child finishes, its time runs out, one of the `also` handles is ready, or `limit`
        seconds pass; the keys of the children that finished, with their results, in the order they were
        started."""
        deadline = self._next_deadline()
        if limit is not None:
            deadline = limit if deadline is None else min(deadline, limit)
        handles = [c.connection for c in self.running] + [c.process.sentinel for c in self.running] + list(also or ())
        if handles:
            wait(handles, deadline)
        done = []
        for child in list(self.running):
            _read(child)
            finished = not child.process.is_alive()
            if finished:
                _read(child)  # what it sent just before exiting
                child.process.join()
            elif child.timeout and time.monotonic() - child.started > child.timeout:
                child.process.kill()
                child.process.join()
                child.result = _failed(child, f"did not finish within {child.timeout:g} s (--timeout) during the "
                                              f"{child.stage}; its forward may never return, or raise --timeout "
                                              "(0 for no limit)")
                finished = True
            if finished:
                self.running.remove(child)
                child.connection.close()
                self.parent.preload(child.imported)
                done.append((child.key, child.result or _failed(child, _died(child))))
        return done

    def kill(self, key: object) -> bool:
        """Stop the child known as `key`, if one runs (its result is no longer wanted)."""
        found = [child for child in self.running if child.key == key]
        for child in found:
            self._end(child)
        return bool(found)

    def kill_all(self) -> None:
        for child in list(self.running):
            self._end(child)

    def _end(self, child: _Child) -> None:
        child.process.kill()
        child.process.join()
        child.connection.close()
        self.running.remove(child)

    def _next_deadline(self) -> float | None:
        limits = [child.started + child.timeout for child in self.running if child.timeout]
        return max(0.0, min(limits) - time.monotonic()) if limits else None


def lint_in_children(
    targets: list[str], request_for: Callable[[str], dict], jobs: int, timeout: float | None,
    started: Callable[[str], None] | None = None, parent: WarmParent | None = None,
) -> Iterator[tuple[str, TargetResult]]:
    """Each target in its own child of `parent` (a new warm parent when None); results as the children finish."""
    children = Children(parent or WarmParent(), timeout)
    waiting = list(targets)
    try:
        while waiting or children:
            while waiting and len(children) < max(jobs, 1):
                text = waiting.pop(0)
                children.start(text, request_for(text))
                if started is not None:
                    started(text)
            yield from children.wait()
    finally:
        children.kill_all()  # interrupted (Ctrl-C): no child outlives the run


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
