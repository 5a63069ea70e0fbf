"""Runs jobs in child processes of the warm parent, each within its time limit, and turns every way a child
can end into the job's answer: a lint job's own result (a graph or memory job's report), or one error line that
says what happened and the last stage it reached; a proof job's verdict, or why it has none. A lint job's
`Partial`, sent while its child still runs, is handed on as it comes.

`Children` keeps the running children of one warm parent; a `Scheduler` starts at most `jobs` of them at a time
and kills the child of a job that a newer one superseded. The session's `Runner` (graphlint.session) keeps one
for the command line's run and for the language server's whole life; a fix's proof runs one job (`run_job`).
"""

from __future__ import annotations

import pickle
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import wait

from graphlint.results import TargetError, TargetResult
from graphlint.run.parent import WarmParent
from graphlint.run.wire import GraphJob, Job, Linted, LintJob, MemoryJob, Partial, Proved, Reported, Stage, TimeJob


@dataclass
class _Child:
    key: object  # what the caller knows the child by: the target, unless it said otherwise
    job: Job
    process: object
    connection: object
    started: float
    timeout: float | None = None  # seconds; None or 0: no limit
    stage: str = "import"
    result: TargetResult | Reported | Proved | None = None
    imported: tuple[str, ...] = ()
    partial: Partial | None = None  # received and not yet handed on
    # Its pipe reached its end (the child closed it, or died): from then on only its exit is waited for, else the
    # pipe, readable at its end forever, would wake the wait at once again and again until the process is gone.
    closed: bool = False
    # Its sentinel is ready: its files are closed, so it is exiting, but the kernel may take a few milliseconds
    # (unmapping a large parent's copied memory) before it can be reaped; it is polled for, not waited on again.
    exiting: bool = False
    answered: float = 0.0  # when its pipe closed (time.monotonic())

    @property
    def target(self) -> str:
        return self.job.target


# Seconds between looks at a child that is exiting but not yet gone (_Child.exiting).
EXIT_POLL = 0.005
# Seconds a child that has answered and closed its pipe gets to exit (its threads, its atexit handlers, the output
# it still flushes) before it is stopped, its answer kept.
EXIT_GRACE = 2.0


class Children:
    """The running children of a warm parent, one per target, each killed when its time limit passes."""

    def __init__(self, parent: WarmParent, timeout: float | None) -> None:
        self.parent = parent
        self.timeout = timeout  # seconds per child; None or 0: no limit
        self.running: list[_Child] = []

    def __len__(self) -> int:
        return len(self.running)

    def start(self, job: Job, timeout: float | None = None, key: object = None, more: bool = True) -> None:
        """Start a child that runs `job`, known as `key` (default: the job's target); `timeout` overrides the
        default limit for this one; `more`: other jobs may follow (graphlint.run.parent.WarmParent.start)."""
        process, connection = self.parent.start(job, more)
        self.running.append(_Child(job.target if key is None else key, job, process, connection, time.monotonic(),
                                   self.timeout if timeout is None else timeout))

    def wait(self, also: list | None = None,
             limit: float | None = None) -> list[tuple[object, TargetResult | Reported | Proved | Partial]]:
        """Wait until a child finishes or sends a `Partial`, its time runs out, one of the `also` handles is
        ready, or `limit` seconds pass; the keys of the children that finished, with their answers (a lint job's
        TargetResult, a graph or memory job's Reported, a proof job's Proved), and of those still running that
        sent a `Partial`, with it, in the order they were started. A child that finished is never handed on with
        its `Partial`: its answer says more."""
        deadline = self._next_deadline()
        if limit is not None:
            deadline = limit if deadline is None else min(deadline, limit)
        if any(child.exiting for child in self.running):
            deadline = EXIT_POLL if deadline is None else min(deadline, EXIT_POLL)
        handles = [c.connection for c in self.running if not c.closed] \
            + [c.process.sentinel for c in self.running if not c.exiting] + list(also or ())
        if handles:
            ready = wait(handles, deadline)
        else:  # only exiting children (and nothing else to wait for): look again shortly
            ready = []
            time.sleep(deadline or 0)
        done = []
        for child in list(self.running):
            child.exiting = child.exiting or child.process.sentinel in ready
            _read(child)
            finished = not child.process.is_alive()
            if finished:
                _read(child)  # what it sent just before exiting
                child.process.join()
            elif child.closed and child.result is not None and time.monotonic() - child.answered > EXIT_GRACE:
                # It answered and closed its pipe but does not exit (a thread of the model's that never ends): its
                # answer stands, and nothing of it is still wanted.
                child.process.kill()
                child.process.join()
                finished = True
            elif child.timeout and time.monotonic() - child.started > child.timeout:
                child.process.kill()
                child.process.join()
                if child.result is None:  # an answer it finished sending stands
                    child.result = _failed(child, f"did not finish within {child.timeout:g} s (--timeout) during "
                                                  f"the {child.stage}; its forward may never return, or raise "
                                                  "--timeout (0 for no limit)")
                finished = True
            if finished:
                self.running.remove(child)
                child.connection.close()
                self.parent.preload(child.imported)
                done.append((child.key, child.result or _failed(child, _died(child))))
            elif child.partial is not None and child.result is None:
                done.append((child.key, child.partial))
            child.partial = None
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
        limits = [child.started + child.timeout for child in self.running if child.timeout] \
            + [child.answered + EXIT_GRACE for child in self.running if child.closed and child.result is not None]
        return max(0.0, min(limits) - time.monotonic()) if limits else None


class Scheduler:
    """Keyed jobs waiting for a child and the children running them: at most `jobs` at once, in the order they
    were put, except that jobs put `first` go ahead of those waiting (the file the user just saved); putting a
    key that is waiting moves it, and one that is running is killed and started again when `supersede` (a newer
    save: the older result is no longer wanted). graphlint.session's `Runner` keeps one, for the command line's run
    and the language server alike.

    `children()` gives the warm parent's `Children`, asked for when a job first has to start; `start(key, item)`
    makes the job for a waiting item, or None when the caller answered it without a child (the result cache);
    `timeout(item)` is its time limit (None: the children's default); `started(key)` is told once it runs.
    `open_ended`: jobs keep coming after those put (the language server); else a job that starts with none
    waiting is the last, and the warm parent warms nothing up for later ones."""

    def __init__(self, children: Callable[[], Children], jobs: int, start: Callable[[object, object], Job | None],
                 timeout: Callable[[object], float | None] = lambda item: None,
                 started: Callable[[object], None] = lambda key: None, open_ended: bool = False) -> None:
        self._children = children
        self.open_ended = open_ended
        self.jobs = max(jobs, 1)
        self._start = start
        self._timeout = timeout
        self._started = started
        self.waiting: dict[object, object] = {}  # key -> the caller's item, in the order they start
        self.running: dict[object, object] = {}
        self._made: Children | None = None

    def __bool__(self) -> bool:
        return bool(self.waiting or self.running)

    def put(self, items: list[tuple[object, object]], first: bool = False, supersede: bool = False) -> None:
        front = {}
        for key, item in items:
            if key in self.running:
                if not supersede:
                    continue
                self._made.kill(key)
                del self.running[key]
            self.waiting.pop(key, None)
            front[key] = item
        self.waiting = {**front, **self.waiting} if first else {**self.waiting, **front}

    def drop(self, unwanted: Callable[[object], bool]) -> None:
        """Forget the waiting jobs and kill the running children whose key is unwanted."""
        for key in [k for k in self.running if unwanted(k)]:
            self._made.kill(key)
            del self.running[key]
        self.waiting = {k: item for k, item in self.waiting.items() if not unwanted(k)}

    def start_waiting(self) -> None:
        """Start waiting jobs while fewer than `jobs` run."""
        while self.waiting and len(self.running) < self.jobs:
            key = next(iter(self.waiting))
            item = self.waiting.pop(key)
            job = self._start(key, item)
            if job is None:
                continue
            if self._made is None:
                self._made = self._children()
            self._made.start(job, timeout=self._timeout(item), key=key, more=self.open_ended or bool(self.waiting))
            self.running[key] = item
            self._started(key)

    def wait(self, also: list | None = None) -> list[tuple[object, object, TargetResult | Reported | Proved | Partial]]:
        """Start what may start, then wait until a child finishes or sends a `Partial`, or one of the `also`
        handles is ready; (key, item, answer) of the jobs that finished, and (key, item, Partial) of those still
        running that sent one."""
        self.start_waiting()
        if not self.running:
            if also:
                wait(also)
            return []
        return [(key, self.running[key] if isinstance(answer, Partial) else self.running.pop(key), answer)
                for key, answer in self._made.wait(also=also) if key in self.running]

    def kill_all(self) -> None:
        if self._made is not None:
            self._made.kill_all()
        self.running.clear()


def run_job(parent: WarmParent, job: Job, timeout: float | None) -> TargetResult | Reported | Proved:
    """Run one job in a child of `parent` and wait for its answer."""
    children = Children(parent, timeout)
    children.start(job)
    try:
        while True:
            for _, answer in children.wait():
                if not isinstance(answer, Partial):
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
            elif isinstance(message, Partial):
                child.partial = message
            elif isinstance(message, Linted):
                child.result, child.imported = message.result, message.imported
            elif isinstance(message, Reported):
                child.result, child.imported = message, message.imported
            elif isinstance(message, Proved):
                child.result = message
    except (EOFError, OSError):
        if not child.closed:  # all it sent is read; a child that died mid-message is judged by its exit below
            child.closed, child.answered = True, time.monotonic()
    except (TypeError, ValueError, AttributeError, ImportError, pickle.UnpicklingError):
        pass  # something else than graphlint's messages: judged by its exit below


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


def _failed(child: _Child, message: str) -> TargetResult | Reported | Proved:
    if not isinstance(child.job, (LintJob, GraphJob, MemoryJob, TimeJob)):
        return Proved(message)
    result = TargetResult(target=child.target, errors=[TargetError(child.target, message, stage=child.stage)])
    return result if isinstance(child.job, LintJob) else Reported(result)
