"""Runs jobs in child processes of the warm parent, each within its time limit, and turns every way a child
can end into the job's answer: a lint job's own result, or one error line that says what happened and the last
stage it reached; a proof job's verdict, or why it has none.

`Children` keeps the running children of one warm parent: the command line's run (`lint_in_children`) starts
at most `jobs` at a time and waits for them all; the language server (graphlint.server) keeps one for its whole
life, starts a child whenever a file is saved, and kills the child of a target that a newer save superseded.
"""

from __future__ import annotations

import pickle
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import wait

from graphlint.results import TargetError, TargetResult
from graphlint.run.parent import WarmParent
from graphlint.run.wire import Job, Linted, LintJob, Proved, Stage


@dataclass
class _Child:
    key: object  # what the caller knows the child by: the target, unless it said otherwise
    job: Job
    process: object
    connection: object
    started: float
    timeout: float | None = None  # seconds; None or 0: no limit
    stage: str = "import"
    result: TargetResult | Proved | None = None
    imported: tuple[str, ...] = ()

    @property
    def target(self) -> str:
        return self.job.target


class Children:
    """The running children of a warm parent, one per target, each killed when its time limit passes."""

    def __init__(self, parent: WarmParent, timeout: float | None) -> None:
        self.parent = parent
        self.timeout = timeout  # seconds per child; None or 0: no limit
        self.running: list[_Child] = []

    def __len__(self) -> int:
        return len(self.running)

    def start(self, job: Job, timeout: float | None = None, key: object = None) -> None:
        """Start a child that runs `job`, known as `key` (default: the job's target); `timeout` overrides the
        default limit for this one."""
        process, connection = self.parent.start(job)
        self.running.append(_Child(job.target if key is None else key, job, process, connection, time.monotonic(),
                                   self.timeout if timeout is None else timeout))

    def wait(self, also: list | None = None, limit: float | None = None) -> list[tuple[object, TargetResult | Proved]]:
        """Wait until a child finishes, its time runs out, one of the `also` handles is ready, or `limit`
        seconds pass; the keys of the children that finished, with their answers (a lint job's TargetResult, a
        proof job's Proved), in the order they were started."""
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
    targets: list[str], job_for: Callable[[str], LintJob], jobs: int, timeout: float | None,
    started: Callable[[str], None] | None = None, parent: WarmParent | None = None,
) -> Iterator[tuple[str, TargetResult]]:
    """Each target in its own child of `parent` (a new warm parent when None); results as the children finish."""
    children = Children(parent or WarmParent(), timeout)
    waiting = list(targets)
    try:
        while waiting or children:
            while waiting and len(children) < max(jobs, 1):
                text = waiting.pop(0)
                children.start(job_for(text))
                if started is not None:
                    started(text)
            yield from children.wait()
    finally:
        children.kill_all()  # interrupted (Ctrl-C): no child outlives the run


def run_job(parent: WarmParent, job: Job, timeout: float | None) -> TargetResult | Proved:
    """Run one job in a child of `parent` and wait for its answer."""
    children = Children(parent, timeout)
    children.start(job)
    try:
        while True:
            for _, answer in children.wait():
                return answer
    finally:
        children.kill_all()


def _read(child: _Child) -> None:
    """Everything the child has sent so far."""
    try:
        while child.connection.poll():
            message = child.connection.recv()
            if isinstance(message, Stage):
                child.stage = message.name
            elif isinstance(message, Linted):
                child.result, child.imported = message.result, message.imported
            elif isinstance(message, Proved):
                child.result = message
    except (EOFError, OSError, TypeError, ValueError, AttributeError, ImportError, pickle.UnpicklingError):
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


def _failed(child: _Child, message: str) -> TargetResult | Proved:
    if not isinstance(child.job, LintJob):
        return Proved(message)
    return TargetResult(target=child.target, errors=[TargetError(child.target, message, stage=child.stage)])
