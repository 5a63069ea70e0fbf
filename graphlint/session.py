"""One session of linting a project: targets → results → report → fixes, each step in one place.

`Session.lint` answers each target from the result cache where nothing changed and puts the others on the
session's `Runner`, each to be linted in its own child of a warm parent (graphlint.run); `Runner.finished`
delivers results as they come, a newer `lint(..., supersede=True)` of a target being linted replaces it, and
`Session.stream` and `Session.results` are built on the two, so the command line and the language server (whose
projects' sessions share one runner) lint, cache and schedule through one path; `Session.report` applies the
policy stage across targets (severities, per-file ignores, suppressions, the baseline) and is the only place a
Report is finished; `Session.fixes` proves the report's fixes in children of the same warm parent
(graphlint.fix), and `Session.without` is the report of what they leave. `Session.graph` and `Session.memory` make
`graphlint graph`'s report and `graphlint memory`'s estimates as jobs of the same runner, answered from the same
cache. The command line, the Python API (graphlint.api) and the language server (graphlint.server) are shells over
it.

Nothing on the cached path imports torch, so a session that the cache answers in full never does; the warm
parent imports torch (and warms up) only when a target has to be captured, and stays for the fixes' proofs.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from graphlint.baseline import read_baseline
from graphlint.cache import ResultCache
from graphlint.config import Config
from graphlint.errors import GraphlintError, one_line
from graphlint.policy import apply_policy
from graphlint.project import Project
from graphlint.results import Finding, Report, RuleInfo, TargetError, TargetResult
from graphlint.run.heap import long_lived
from graphlint.selection import select
from graphlint.target import TargetSpec, add_target_folders, refused_before_import, target_vary

if TYPE_CHECKING:  # imported only when a child has to start: multiprocessing and the fix stage are not free
    from graphlint.fix.apply import FixPlan
    from graphlint.graph import GraphReport
    from graphlint.memory.estimate import MemoryEstimate
    from graphlint.memory.request import Request
    from graphlint.run.parent import WarmParent
    from graphlint.run.wire import GraphJob, Job, MemoryJob, ProofJob, Proved, Reported, TimeJob
    from graphlint.timing.roofline import StepTime

    # What a session is asked for: a target to lint (its text), or a graph or memory job of one target.
    Item = str | GraphJob | MemoryJob | TimeJob


@dataclass(frozen=True)
class Options:
    """How to run, beyond what the configuration says."""

    debug: bool = False  # print tracebacks of internal errors
    show_suppressed: bool = False
    baseline: Path | None = None  # only findings not in this baseline file count
    cache: Path | None = None  # the result cache's folder; None: no cache
    jobs: int = 1  # targets linted at once, each always in its own child process
    timeout: float | None = None  # seconds per target, after which its process is killed; None or 0: no limit
    progress: Callable[..., None] | None = None  # progress(target, event, **details)
    # Each child also sends its target's other findings before the torch.compile analysis (`Runner.partials`):
    # the language server shows them at once; nothing else reads them, and the cache keeps only complete results.
    partial: bool = False


def check(
    targets: list[str],
    project: Project,
    config: Config | None = None,
    options: Options = Options(),
    base: Path | None = None,
    parent: WarmParent | None = None,
) -> Report:
    """Lint every target string and report; relative paths are read from `base` (default: the working
    directory). `parent` is a warm parent to start the children from (the language server keeps one); None: a
    new one when a target has to be captured."""
    session = Session(targets, project, config, options, base, parent)
    return session.report(session.results(targets))


class Session:
    """Linting targets of one project: the rules that run, the result cache, the baseline, the warm parent
    (made when a target first has to be captured); the results, the report the policy stage makes of them,
    and the fixes; and the graph and memory reports of its targets.

    `lints`: the session lints, so its rules are read at once (a configuration that selects unknown rules is an
    error here); a session that only makes graph and memory reports never reads them."""

    def __init__(self, targets: list[str], project: Project, config: Config | None = None,
                 options: Options = Options(), base: Path | None = None, parent: WarmParent | None = None,
                 runner: Runner | None = None, lints: bool = True) -> None:
        self.project = project
        self.config = config if config is not None else project.config
        self.options = options
        self.base = base or Path.cwd()
        for text in targets:  # every target's folder is first-party from the start, for every target
            try:
                spec = TargetSpec.parse(text, self.base)
            except GraphlintError:
                continue  # reported as that target's error when it is linted
            if spec.file is not None:
                add_target_folders(project, spec)
        self.cache = ResultCache(options.cache) if options.cache is not None else None
        if lints:
            self.rules  # noqa: B018 - read now, so that a wrong selection fails the session's making
        self.baseline = read_baseline(options.baseline) if options.baseline is not None else None
        self.runner = runner if runner is not None else Runner(parent)
        self.runner.jobs = max(self.runner.jobs, options.jobs)
        self._keys: dict[Item, str] = {}
        self._starts: dict[Item, float] = {}

    @functools.cached_property
    def rule_infos(self) -> tuple[RuleInfo, ...]:
        """Every rule known, selected or not."""
        return _rule_infos(self.cache)

    @functools.cached_property
    def rules(self) -> tuple[RuleInfo, ...]:
        """The rules that run, as the configuration selects them."""
        return select(self.config, self.rule_infos)

    @functools.cached_property
    def rule_ids(self) -> tuple[str, ...]:
        return tuple(rule.id for rule in self.rules)

    @functools.cached_property
    def rule_tags(self) -> frozenset[str]:
        return frozenset(tag for rule in self.rules for tag in rule.tags)  # which settings matter

    # -- targets → results -------------------------------------------------------------------------------------

    def results(self, targets: list[str]) -> list[TargetResult]:
        """Every target's result, from the cache or linted in a child, in the order given (repeats once)."""
        found = dict(self.stream(targets))
        return [found[t] for t in dict.fromkeys(targets)]

    def stream(self, targets: Sequence[Item]) -> Iterator[tuple[Item, TargetResult | Reported]]:
        """Lint the targets and yield (target, result) as each is answered: the cache's answers at once, the
        others as their children finish. For a session that has its runner to itself: the results of other
        sessions sharing it are not this stream's (the language server reads `Runner.finished` instead)."""
        self.lint(targets)
        try:
            while self.linting:
                for session, text, result in self.runner.finished():
                    if session is self:
                        yield text, result
        finally:
            self.cancel()  # interrupted (Ctrl-C) or abandoned: no child outlives the stream

    def lint(self, targets: Sequence[Item], first: bool = False, supersede: bool = False) -> None:
        """Start linting the targets; their results are delivered by `Runner.finished` (or `stream`). A target
        whose inputs did not change is answered from the cache, the others wait for a child of the runner, in the
        order given, ahead of those already waiting when `first` (the file the user just touched). A target
        already waiting moves; one being linted is left to finish, unless `supersede` (a newer save of its file):
        then its child is killed and only the newer result is delivered. A graph or memory job in place of a
        target's text is run alike, and answered with its `Reported`."""
        misses = []
        for text in dict.fromkeys(targets):
            if not supersede and self.runner.running(self, text):
                continue
            cached = self._cached(text)
            if cached is None:
                refused = self._refused(text)
                if refused is None:
                    misses.append(text)
                else:
                    self.runner.answer(self, text, refused)
                    self._tell(text, "done", result=refused, seconds=0.0)
                continue
            self.runner.answer(self, text, cached)  # and a stale lint of it, waiting or running, is dropped
            self._tell(text, "cached", result=cached)
        self.runner.put(self, misses, first, supersede)

    def cancel(self) -> None:
        """Forget this session's targets waiting for a child, and kill the children linting the others."""
        self.runner.drop(self)

    @property
    def linting(self) -> bool:
        """Whether some of this session's targets are waiting, running, or answered and not yet delivered."""
        return self.runner.holds(self)

    def warm_parent(self) -> WarmParent:
        """The warm parent children start from, made (torch imported, warmed up) the first time it is needed."""
        return self.runner.warm_parent()

    @property
    def parent(self) -> WarmParent | None:
        return self.runner.parent

    def _cached(self, text: Item) -> TargetResult | Reported | None:
        """The target's result (a job's answer) from the cache, when nothing it depends on changed."""
        if self.cache is None:
            return None
        self._keys[text] = self._key(text)
        if isinstance(text, str):
            return self.cache.load(self._keys[text])
        from graphlint.run.wire import Reported

        found = self.cache.load_report(self._keys[text])
        return None if found is None else Reported(*found)

    def _refused(self, text: Item) -> TargetResult | Reported | None:
        """The answer of a target whose file shows that it cannot load, as its child would have said it: a path or
        a name mistyped needs no child, and no torch (graphlint.target.refused_before_import)."""
        from graphlint.run.wire import MemoryJob, Reported

        target, base = (text, self.base) if isinstance(text, str) else (text.target, Path(text.base))
        try:
            message = refused_before_import(TargetSpec.parse(target, base))
        except GraphlintError:
            return None  # a target that does not parse is the child's error, as before
        if message is None:
            return None
        stage = None if isinstance(text, MemoryJob) else "import"  # a memory child names no stage of a failed load
        result = TargetResult(target=target, errors=[TargetError(target, message, stage=stage)])
        return result if isinstance(text, str) else Reported(result)

    def _key(self, text: Item) -> str:
        if not isinstance(text, str):
            # Every field of the job changes the answer but --debug, and the first-party folders, which as in a
            # lint's key follow from the root and the targets (a run of several targets adds each one's folder).
            from graphlint.run.wire import PARENT_THREADS, thread_settings

            fields = {k: v for k, v in dataclasses.asdict(text).items() if k not in ("debug", "first_party_folders")}
            if fields.get("threads") == PARENT_THREADS:  # the count torch will give the warm parent, by what it follows
                fields["threads"] = thread_settings()
            return self.cache.job_key(type(text).__name__, fields)
        return self.cache.key(text, self.base, self.project, self.config.device, self.rule_ids,
                              target_vary(text, self.config.vary), self.config.memory_budget, self.rule_tags,
                              self.config.cost_gpu, self.config.cost_cpu)

    def _store(self, text: Item, result: TargetResult | Reported) -> None:
        """Keep a fresh result in the cache (not a failure, nor an answer measured while the CPU's threads waited
        for cores: the next run tries again). A cache hit is not written back: it is there already."""
        from graphlint.timing.devices import spoiled_by_waiting

        if self.cache is None:
            return
        if isinstance(result, TargetResult):
            if not result.errors and not spoiled_by_waiting(result.notes):
                self.cache.store(self._keys.get(text) or self._key(text), result)
        elif result.report is not None and not result.result.errors and not spoiled_by_waiting(
                [*result.result.notes, *result.report.get("notes", ())]):
            self.cache.store_report(self._keys.get(text) or self._key(text), result.result, result.report)

    def _job(self, text: Item) -> Job:
        """What a child needs to lint the target (a graph or memory job is its own)."""
        if not isinstance(text, str):
            return text
        from graphlint.run.wire import LintJob

        memo = self.cache.compile_folder() if self.cache is not None else ""
        return LintJob.of(text, self.base, self.project, self.config.device, self.rule_ids, self.options.debug,
                          target_vary(text, self.config.vary), self.config.memory_budget, memo, self.options.partial,
                          self.config.cost_gpu, self.config.cost_cpu or "")

    def _failure(self, text: Item, message: str) -> TargetResult | Reported:
        """The answer of a target, or a job, that no child could run: the reason as its error."""
        target = text if isinstance(text, str) else text.target
        result = TargetResult(target=target, errors=[TargetError(target, message)])
        if isinstance(text, str):
            return result
        from graphlint.run.wire import Reported

        return Reported(result)

    def _started(self, text: Item) -> None:
        self._starts[text] = time.monotonic()
        self._tell(text, "started")

    def _linted(self, text: Item, result: TargetResult | Reported) -> None:
        """A child's result, before it is delivered: kept in the cache, and told."""
        self._store(text, result)
        self._tell(text, "done", result=result, seconds=time.monotonic() - self._starts.pop(text, time.monotonic()))

    def _tell(self, text: Item, event: str, **details) -> None:
        if self.options.progress is not None and isinstance(text, str):  # the command line's progress is check's
            self.options.progress(text, event, **details)

    # -- targets → graph and memory reports --------------------------------------------------------------------

    def graph(self, target: str, vary: str | None = None) -> tuple[TargetResult, GraphReport | None]:
        """`graphlint graph`'s report of one target (with `vary`, "batch" or "seq", compared with a capture at that
        input dimension doubled), and the target's result (its notes; its errors, and no report, when it
        failed): from the cache, else made in a child of the runner."""
        from graphlint.graph import GraphReport
        from graphlint.run.wire import GraphJob

        job = GraphJob.of(target, self.base, self.project, self.config.device, vary, self.options.debug)
        [(result, report)] = self.reports([job])
        return result, None if report is None else GraphReport.from_wire(report)

    def memory(self, targets: list[str], request: Request | None = None, threads: int | str | None = None,
               **fields) -> list[tuple[TargetResult, MemoryEstimate | None]]:
        """`graphlint memory`'s estimate of each target's training step as `request` asks (else as the Request of
        these `fields` does), in the order given: from the cache, else measured in children of the runner (CPU
        kernels probed with `threads`, see graphlint.run.wire.MemoryJob), at most `Options.jobs` at once."""
        from graphlint.memory.request import Request
        from graphlint.run.graph_and_memory import estimate_from_wire
        from graphlint.run.wire import MemoryJob

        request = request or Request(**fields)

        jobs = [MemoryJob.of(target, self.base, self.project, request, threads, self.options.debug)
                for target in targets]
        return [(result, None if data is None else estimate_from_wire(data)) for result, data in self.reports(jobs)]

    def time(self, targets: list[str], request: Request | None = None, gpu: str | None = None,
             threads: int | str | None = None, cpu: str = "", **fields) -> list[tuple[TargetResult, StepTime | None]]:
        """`graphlint time`'s estimate of each target's training step as `request` asks (else as the Request of
        these `fields` does), priced on `gpu` (else on this machine's CPU, `cpu` its model), in the order given:
        from the cache, else timed in children of the runner, at most `Options.jobs` at once."""
        from graphlint.memory.request import Request
        from graphlint.run.step_time import step_time_from_wire
        from graphlint.run.wire import TimeJob

        request = request or Request(**fields)

        jobs = [TimeJob.of(target, self.base, self.project, request, gpu, threads, cpu, self.options.debug)
                for target in targets]
        return [(result, None if data is None else step_time_from_wire(data)) for result, data in self.reports(jobs)]

    def reports(self, jobs: list[GraphJob | MemoryJob | TimeJob]) -> list[tuple[TargetResult, dict | None]]:
        """Each job's result and report (plain data; None when the target failed), in the order given: from the
        cache, else run in children of the runner, within `Options.timeout` each (a child that dies or runs out
        of time is the target's error, with the stage it reached)."""
        found = dict(self.stream(jobs))
        return [(found[job].result, found[job].report) for job in jobs]

    # -- results → report --------------------------------------------------------------------------------------

    def report(self, results: list[TargetResult]) -> Report:
        """The report of these results under the configuration, suppressions and baseline."""
        return finish(results, self.project, self.config, self.rules, self.options.show_suppressed,
                      self.options.baseline, self.baseline)

    # -- report → fixes ----------------------------------------------------------------------------------------

    def fixes(self, report: Report, unsafe: bool) -> FixPlan:
        """The report's fixes, each target's proven in children of this session's warm parent; `unsafe` keeps
        those that failed their proof."""
        from graphlint.fix.apply import plan_fixes

        return plan_fixes(report, self.project, self.base, unsafe, self)

    # -- what a fix's proof asks of the session (graphlint.fix.prove.Prover) ----------------------------------

    def run_proof(self, job: ProofJob, timeout: float) -> str | None:
        """One side of a fix's proof in a child of this session's runner: None, or why the model did not run."""
        return self.runner.run(job, timeout).failure

    def relint(self, target: str, project: Project, config: Config, base: Path, timeout: float) -> Report:
        """What linting one target of another project (a fix's rewritten copy) from `base` reports, as `graphlint
        check --no-cache --show-suppressed` would: one lint job in a child of this session's runner."""
        from graphlint.run.wire import LintJob

        try:
            spec = TargetSpec.parse(target, base)
        except GraphlintError:
            spec = None  # the child reports it as the target's error
        if spec is not None and spec.file is not None:
            add_target_folders(project, spec)
        rules = select(config, self.rule_infos)
        job = LintJob.of(target, base, project, config.device, tuple(rule.id for rule in rules), self.options.debug,
                         target_vary(target, config.vary), config.memory_budget)
        return finish([self.runner.run(job, timeout)], project, config, rules, show_suppressed=True)

    @staticmethod
    def without(report: Report, fixed: list[Finding]) -> Report:
        """The report of what is left once these findings' fixes are applied."""
        gone = set(fixed)
        return replace(report, merged=[f for f in report.all_findings if f not in gone])


class Runner:
    """The children that lint the targets of one or more sessions (graphlint.run): one warm parent, made the first
    time a target needs a child (or ahead of time, `warm_up`), and the targets waiting for a child and those
    running, at most `jobs` at once (the largest `Options.jobs` of its sessions), each within its session's
    `Options.timeout`. A session makes its own; the language server gives every project's session the same one,
    so that they share the warm parent and the limit, and reads their results from `finished`.

    `close_in_children` are file descriptors that a forked child closes first (the server's protocol pipes);
    `open_ended`: targets keep coming for as long as it lives (the language server), not all put at once."""

    def __init__(self, parent: WarmParent | None = None, close_in_children: tuple[int, ...] = (),
                 open_ended: bool = False) -> None:
        self.parent = parent
        self.close_in_children = close_in_children
        self.open_ended = open_ended
        self.jobs = 1
        self._scheduler = None  # made when a target first needs a child (multiprocessing is not free)
        self._answered: list[tuple[Session, str, TargetResult]] = []  # answered without a child, not delivered
        self._partials: list[tuple[Session, str, TargetResult]] = []  # sent ahead by running children, not delivered
        self._warming: threading.Thread | None = None
        self._child_wanted = threading.Event()  # a target waits for the warm parent: warm nothing more ahead
        self._parent_error: str | None = None

    # -- what sessions ask -----------------------------------------------------------------------------------

    def put(self, session: Session, targets: list[str], first: bool = False, supersede: bool = False) -> None:
        """Targets of a session to lint in children (Session.lint has answered the others), started at once
        while fewer than `jobs` run."""
        if not targets:
            return
        scheduler = self._made()
        scheduler.jobs = self.jobs
        if supersede:  # a running child's early findings are of the older save
            self._forget_partials(lambda key: key[0] is session and key[1] in targets)
        scheduler.put([((session, text), session) for text in targets], first=first, supersede=supersede)
        scheduler.start_waiting()

    def answer(self, session: Session, text: str, result: TargetResult) -> None:
        """A target answered without a child, delivered by the next `finished`; a lint of it that is waiting or
        running is no longer wanted."""
        self._drop(lambda key: key == (session, text))
        self._forget_partials(lambda key: key == (session, text))
        self._answered = [a for a in self._answered if a[:2] != (session, text)]
        self._answered.append((session, text, result))

    def drop(self, session: Session) -> None:
        """Forget the session's targets: waiting, running (killed) and answered."""
        self._drop(lambda key: key[0] is session)
        self._forget_partials(lambda key: key[0] is session)
        self._answered = [a for a in self._answered if a[0] is not session]

    def running(self, session: Session, text: str) -> bool:
        return self._scheduler is not None and (session, text) in self._scheduler.running

    def holds(self, session: Session) -> bool:
        """Whether some of the session's targets are waiting, running, or answered and not yet delivered."""
        keys = [] if self._scheduler is None else [*self._scheduler.waiting, *self._scheduler.running]
        return any(key[0] is session for key in keys) or any(a[0] is session for a in self._answered)

    # -- what the owner of the runner asks ---------------------------------------------------------------------

    def finished(self, also: list | None = None) -> list[tuple[Session, str, TargetResult]]:
        """(session, target, result) of targets answered since the last call, each child's kept in its session's
        cache: those answered without a child at once, else once a child finishes or one of the `also` handles
        is ready (the server's wake-up), whichever comes first."""
        if self._scheduler is not None:
            self._scheduler.start_waiting()  # may answer a target with the warm parent's failure
        if not self._answered:
            if self._scheduler is not None:
                from graphlint.run.wire import Partial

                for (session, text), _, result in self._scheduler.wait(also=also):
                    if isinstance(result, Partial):
                        self._partials.append((session, text, result.result))
                        continue
                    done = (session, text)
                    self._forget_partials(lambda key, done=done: key == done)  # its complete result is here
                    session._linted(text, result)
                    self._answered.append((session, text, result))
            elif also:
                from multiprocessing.connection import wait

                wait(also)
        answered, self._answered = self._answered, []
        return answered

    def partials(self) -> list[tuple[Session, str, TargetResult]]:
        """(session, target, result) of the early results that `finished` received since the last call from
        children still linting (sessions with `Options.partial`): every finding but those of the rules that need
        the torch.compile analysis. Each is replaced by the target's complete result, which a later `finished`
        delivers; none is kept in the cache."""
        partials, self._partials = self._partials, []
        return partials

    def warm_up(self, background: bool = False, ahead: bool | None = None) -> None:
        """Make the warm parent now rather than when a target first needs a child; `background`: in a thread of
        its own, while the cache answers what it can. A warm parent that cannot start (no torch) is then each
        target's error rather than an exception. `ahead` (None: not) also warms what the first child would
        otherwise pay for itself (`WarmParent.warm_ahead`; True: the torch.compile rules run too), for a runner
        that expects to wait before its first target (the language server at start); a target that needs a child
        meanwhile stops it after the step under way."""
        if self.parent is not None or self._warming is not None:
            return
        self._warming = threading.Thread(target=self._warm, args=(ahead,), name="graphlint-warm-up", daemon=True)
        self._warming.start()
        if not background:
            self._warming.join()

    def warm_parent(self) -> WarmParent:
        """The warm parent, made (torch imported, warmed up) the first time it is needed; `GraphlintError` when a
        warm-up in the background failed."""
        if self._warming is not None:
            self._child_wanted.set()
            self._warming.join()
        if self.parent is None:
            if self._parent_error is not None:
                raise GraphlintError(self._parent_error)
            from graphlint.run import scheduler

            self.parent = scheduler.WarmParent(close_in_children=self.close_in_children)
        return self.parent

    def run(self, job: Job, timeout: float | None) -> TargetResult | Proved:
        """Run one job (a fix's proof, or the lint of its rewritten copy) in a child of the warm parent and wait
        for its answer: a lint job's result, a proof job's `Proved`."""
        from graphlint.run.scheduler import run_job

        return run_job(self.warm_parent(), job, timeout)

    def close(self) -> None:
        """Kill every child (the server is shutting down)."""
        if self._scheduler is not None:
            self._scheduler.kill_all()
            self._scheduler.waiting.clear()
        self._answered = []
        self._partials = []

    # -- the process layer -------------------------------------------------------------------------------------

    def _made(self):
        if self._scheduler is None:
            from graphlint.run.scheduler import Children, Scheduler

            self._scheduler = Scheduler(lambda: Children(self.warm_parent(), None), self.jobs, self._job,
                                        timeout=lambda session: session.options.timeout or None,
                                        started=lambda key: key[0]._started(key[1]), open_ended=self.open_ended)
        return self._scheduler

    def _job(self, key: tuple[Session, Item], session: Session) -> Job | None:
        """The job of a target about to start, or None when no warm parent can start (then that is its answer)."""
        try:
            self.warm_parent()
        except GraphlintError as error:
            self._answered.append((session, key[1], session._failure(key[1], str(error))))
            return None
        return session._job(key[1])

    def _drop(self, unwanted: Callable[[tuple[Session, str]], bool]) -> None:
        if self._scheduler is not None:
            self._scheduler.drop(unwanted)

    def _forget_partials(self, unwanted: Callable[[tuple[Session, str]], bool]) -> None:
        self._partials = [p for p in self._partials if not unwanted(p[:2])]

    def _warm(self, ahead: bool | None = None) -> None:
        from graphlint.run import scheduler

        try:
            parent = scheduler.WarmParent(close_in_children=self.close_in_children)
            if ahead is not None:
                parent.warm_ahead(ahead, self._child_wanted.is_set)
            self.parent = parent
        except ImportError as error:
            self._parent_error = (f"cannot import torch ({error}); install PyTorch in the environment graphlint "
                                  "runs in" if (error.name or "").startswith("torch") else
                                  f"internal error in graphlint while starting ({one_line(error)})")
        except GraphlintError as error:  # a rule plugin that no longer imports, when the rules came from the cache
            self._parent_error = str(error)
        except Exception as error:
            traceback.print_exc(file=sys.stderr)
            self._parent_error = f"internal error in graphlint while starting ({one_line(error)}); please report it"


def finish(results: list[TargetResult], project: Project, config: Config, rules: tuple[RuleInfo, ...],
           show_suppressed: bool = False, baseline_path: Path | None = None, baseline=None) -> Report:
    """The report of these results: the policy stage across targets, applied here and nowhere else."""
    report = Report(results=results, project_root=str(project.root), rules=rules, show_suppressed=show_suppressed,
                    fail_on=config.fail_on, baseline=str(baseline_path) if baseline_path is not None else None)
    apply_policy(report, config, project, baseline)
    return report


@functools.cache
def _info(rule) -> RuleInfo:
    """A rule class's info, its documentation rendered once per process (about 3 ms for all the rules, which every
    session reads: a test worker or a notebook makes one per check)."""
    return RuleInfo.of(rule)


def _rule_infos(cache: ResultCache | None) -> tuple[RuleInfo, ...]:
    infos = cache.rule_infos() if cache is not None else None
    if infos is None:
        with long_lived():
            from graphlint.engine import listed_rules  # built-in rules read from their source: no torch

            infos = tuple(_info(rule) for rule in listed_rules())
        if cache is not None:
            cache.store_rule_infos(infos)
    return infos
