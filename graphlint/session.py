"""One session of linting a project: targets → results → report → fixes, each step in one place.

`Session.results` answers each target from the result cache where nothing changed and lints the others, each
in its own child of a warm parent (graphlint.run); `Session.report` applies the policy stage across targets
(severities, per-file ignores, suppressions, the baseline) and is the only place a Report is finished;
`Session.fixes` proves the report's fixes in children of the same warm parent (graphlint.fix), and
`Session.without` is the report of what they leave. The command line, the Python API (graphlint.api) and the
language server (graphlint.server) are shells over it.

Nothing on the cached path imports torch, so a session that the cache answers in full never does; the warm
parent imports torch (and warms up) only when a target has to be captured, and stays for the fixes' proofs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from graphlint.baseline import read_baseline
from graphlint.cache import ResultCache
from graphlint.config import Config
from graphlint.errors import GraphlintError
from graphlint.policy import apply_policy
from graphlint.project import Project
from graphlint.results import Finding, Report, RuleInfo, TargetResult
from graphlint.run.heap import long_lived
from graphlint.selection import select
from graphlint.target import TargetSpec, add_target_folders, target_vary

if TYPE_CHECKING:  # imported only when a child has to start: multiprocessing and the fix stage are not free
    from graphlint.fix.apply import FixPlan
    from graphlint.run.parent import WarmParent
    from graphlint.run.wire import LintJob


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


def relint(target: str, project: Project, config: Config, base: Path, parent: WarmParent,
           timeout: float) -> Report:
    """What linting one target from `base` reports, suppressed findings included and no cache read: a fix's
    proof lints the rewritten copy with it, handed in by the session so the fix layer never imports it back."""
    return check([target], project, config, Options(show_suppressed=True, timeout=timeout), base, parent)


class Session:
    """Linting targets of one project: the rules that run, the result cache, the baseline, the warm parent
    (made when a target first has to be captured); the results, the report the policy stage makes of them,
    and the fixes."""

    def __init__(self, targets: list[str], project: Project, config: Config | None = None,
                 options: Options = Options(), base: Path | None = None, parent: WarmParent | None = None) -> None:
        self.project = project
        self.config = config if config is not None else project.config
        self.options = options
        self.base = base or Path.cwd()
        self.parent = parent
        for text in targets:  # every target's folder is first-party from the start, for every target
            try:
                spec = TargetSpec.parse(text, self.base)
            except GraphlintError:
                continue  # reported as that target's error when it is linted
            if spec.file is not None:
                add_target_folders(project, spec)
        self.cache = ResultCache(options.cache) if options.cache is not None else None
        self.rules = select(self.config, _rule_infos(self.cache))
        self.rule_ids = tuple(rule.id for rule in self.rules)
        self.baseline = read_baseline(options.baseline) if options.baseline is not None else None
        self._keys: dict[str, str] = {}

    # -- targets → results -------------------------------------------------------------------------------------

    def results(self, targets: list[str]) -> list[TargetResult]:
        """Every target's result, from the cache or linted in a child, in the order given (repeats once)."""
        results: dict[str, TargetResult] = {}
        pending = []
        for text in dict.fromkeys(targets):
            cached = self.cached(text)
            if cached is not None:
                results[text] = cached
                self._tell(text, "cached", result=cached)
                continue
            pending.append(text)
        if pending:
            for text, result, seconds in self._lint(pending):
                results[text] = result
                self.store(text, result)
                self._tell(text, "done", result=result, seconds=seconds)
        return [results[t] for t in dict.fromkeys(targets)]

    def cached(self, text: str) -> TargetResult | None:
        """The target's result from the cache, when nothing it depends on changed."""
        if self.cache is None:
            return None
        self._keys[text] = self.cache.key(text, self.base, self.project, self.config.device, self.rule_ids,
                                          target_vary(text, self.config.vary), self.config.memory_budget)
        return self.cache.load(self._keys[text])

    def store(self, text: str, result: TargetResult) -> None:
        """Keep a fresh result in the cache (not a failure: the next run tries again)."""
        if self.cache is not None and not result.errors:
            key = self._keys.get(text) or self.cache.key(text, self.base, self.project, self.config.device,
                                                         self.rule_ids, target_vary(text, self.config.vary),
                                                         self.config.memory_budget)
            self.cache.store(key, result)

    def job(self, text: str) -> LintJob:
        """What a child needs to lint the target."""
        from graphlint.run.wire import LintJob

        return LintJob.of(text, self.base, self.project, self.config.device, self.rule_ids, self.options.debug,
                          target_vary(text, self.config.vary), self.config.memory_budget)

    def warm_parent(self) -> WarmParent:
        """The warm parent children start from, made (torch imported, warmed up) the first time it is needed."""
        if self.parent is None:
            from graphlint.run import scheduler

            self.parent = scheduler.WarmParent()
        return self.parent

    def _lint(self, pending: list[str]) -> Iterator[tuple[str, TargetResult, float]]:
        """Each pending target in its own child process; (target, result, seconds) as they finish."""
        from graphlint.run.scheduler import lint_in_children

        starts: dict[str, float] = {}

        def started(text: str) -> None:
            starts[text] = time.monotonic()
            self._tell(text, "started")

        for text, result in lint_in_children(pending, self.job, self.options.jobs, self.options.timeout, started,
                                             self.warm_parent()):
            yield text, result, time.monotonic() - starts.get(text, time.monotonic())

    def _tell(self, text: str, event: str, **details) -> None:
        if self.options.progress is not None:
            self.options.progress(text, event, **details)

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

        return plan_fixes(report, self.project, self.base, unsafe, relint, self.warm_parent)

    @staticmethod
    def without(report: Report, fixed: list[Finding]) -> Report:
        """The report of what is left once these findings' fixes are applied."""
        gone = set(fixed)
        return replace(report, merged=[f for f in report.all_findings if f not in gone])


def finish(results: list[TargetResult], project: Project, config: Config, rules: tuple[RuleInfo, ...],
           show_suppressed: bool = False, baseline_path: Path | None = None, baseline=None) -> Report:
    """The report of these results: the policy stage across targets, applied here and nowhere else."""
    report = Report(results=results, project_root=str(project.root), rules=rules, show_suppressed=show_suppressed,
                    fail_on=config.fail_on, baseline=str(baseline_path) if baseline_path is not None else None)
    apply_policy(report, config, project, baseline)
    return report


def _rule_infos(cache: ResultCache | None) -> tuple[RuleInfo, ...]:
    infos = cache.rule_infos() if cache is not None else None
    if infos is None:
        with long_lived():
            from graphlint.engine import load_rules  # imports the rules, and torch with them

            infos = tuple(RuleInfo.of(rule) for rule in load_rules())
        if cache is not None:
            cache.store_rule_infos(infos)
    return infos
