"""A run over several targets: answered from the result cache where nothing changed, linted otherwise, each
target in its own child process of a warm parent (`scheduler.py`, `parent.py`, `child.py`), then the policy
stage across targets. Nothing on the cached path imports torch, so a run that the cache answers in full never
does; the parent imports torch (and warms up) only when a target has to be captured.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from graphlint.baseline import read_baseline
from graphlint.cache import ResultCache
from graphlint.config import Config
from graphlint.errors import GraphlintError
from graphlint.policy import apply_policy
from graphlint.project import Project
from graphlint.results import Report, RuleInfo, TargetResult
from graphlint.selection import select
from graphlint.target import TargetSpec

if TYPE_CHECKING:
    from graphlint.run.parent import WarmParent  # imported only when a child has to start (see _lint)


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
    """Lint every target string; relative paths are read from `base` (default: the working directory).
    `parent` is a warm parent to start the children from (the language server keeps one); None: a new one
    when a target has to be captured."""
    run = Run(targets, project, config, options, base)
    results: dict[str, TargetResult] = {}
    pending = []
    for text in dict.fromkeys(targets):
        cached = run.cached(text)
        if cached is not None:
            results[text] = cached
            _tell(options, text, "cached", result=cached)
            continue
        pending.append(text)
    if pending:
        for text, result, seconds in _lint(pending, run, parent):
            results[text] = result
            run.store(text, result)
            _tell(options, text, "done", result=result, seconds=seconds)
    return run.report([results[t] for t in dict.fromkeys(targets)])


class Run:
    """What linting targets of one project needs besides the targets' own results: the rules that run, the
    result cache, the baseline; and the report that the policy stage makes of the results."""

    def __init__(self, targets: list[str], project: Project, config: Config | None = None,
                 options: Options = Options(), base: Path | None = None) -> None:
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
                project.add_first_party(spec.file.parent)
        self.cache = ResultCache(options.cache) if options.cache is not None else None
        self.rules = select(self.config, _rule_infos(self.cache))
        self.rule_ids = tuple(rule.id for rule in self.rules)
        self.baseline = read_baseline(options.baseline) if options.baseline is not None else None
        self._keys: dict[str, str] = {}

    def cached(self, text: str) -> TargetResult | None:
        """The target's result from the cache, when nothing it depends on changed."""
        if self.cache is None:
            return None
        self._keys[text] = self.cache.key(text, self.base, self.project, self.config.device, self.rule_ids,
                                          self.config.vary)
        return self.cache.load(self._keys[text])

    def store(self, text: str, result: TargetResult) -> None:
        """Keep a fresh result in the cache (not a failure: the next run tries again)."""
        if self.cache is not None and not result.errors:
            key = self._keys.get(text) or self.cache.key(text, self.base, self.project, self.config.device,
                                                         self.rule_ids, self.config.vary)
            self.cache.store(key, result)

    def request(self, text: str) -> dict:
        """What a child needs to lint the target."""
        from graphlint.run.child import request

        return request(text, self.base, self.project, self.config.device, self.rule_ids, self.options.debug,
                       self.config.vary)

    def report(self, results: list[TargetResult]) -> Report:
        """The report of these results under the configuration, suppressions and baseline."""
        options = self.options
        report = Report(results=results, project_root=str(self.project.root), rules=self.rules,
                        show_suppressed=options.show_suppressed, fail_on=self.config.fail_on,
                        baseline=str(options.baseline) if options.baseline is not None else None)
        apply_policy(report, self.config, self.project, self.baseline)
        return report


def _rule_infos(cache: ResultCache | None) -> tuple[RuleInfo, ...]:
    infos = cache.rule_infos() if cache is not None else None
    if infos is None:
        from graphlint.engine import load_rules  # imports the rules, and torch with them

        infos = tuple(RuleInfo.of(rule) for rule in load_rules())
        if cache is not None:
            cache.store_rule_infos(infos)
    return infos


def _lint(pending: list[str], run: Run, parent: WarmParent | None) -> Iterator[tuple[str, TargetResult, float]]:
    """Each pending target in its own child process; (target, result, seconds) as they finish."""
    from graphlint.run.scheduler import lint_in_children

    options = run.options
    starts: dict[str, float] = {}

    def started(text: str) -> None:
        starts[text] = time.monotonic()
        _tell(options, text, "started")

    for text, result in lint_in_children(pending, run.request, options.jobs, options.timeout, started, parent):
        yield text, result, time.monotonic() - starts.get(text, time.monotonic())


def _tell(options: Options, text: str, event: str, **details) -> None:
    if options.progress is not None:
        options.progress(text, event, **details)
