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

from graphlint.baseline import read_baseline
from graphlint.cache import ResultCache
from graphlint.config import Config
from graphlint.errors import GraphlintError
from graphlint.policy import apply_policy
from graphlint.project import Project
from graphlint.results import Report, RuleInfo, TargetResult
from graphlint.selection import select
from graphlint.target import TargetSpec


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
) -> Report:
    """Lint every target string; relative paths are read from `base` (default: the working directory)."""
    config = config if config is not None else project.config
    base = base or Path.cwd()
    for text in targets:  # every target's folder is first-party from the start, for every target
        try:
            spec = TargetSpec.parse(text, base)
        except GraphlintError:
            continue  # reported as that target's error when it is linted
        if spec.file is not None:
            project.add_first_party(spec.file.parent)
    cache = ResultCache(options.cache) if options.cache is not None else None
    rules = select(config, _rule_infos(cache))
    baseline = read_baseline(options.baseline) if options.baseline is not None else None
    results: dict[str, TargetResult] = {}
    keys: dict[str, str] = {}
    pending = []
    for text in dict.fromkeys(targets):
        if cache is not None:
            keys[text] = cache.key(text, base, project, config.device, tuple(rule.id for rule in rules))
            cached = cache.load(keys[text])
            if cached is not None:
                results[text] = cached
                _tell(options, text, "cached", result=cached)
                continue
        pending.append(text)
    if pending:
        for text, result, seconds in _lint(pending, base, project, config, tuple(r.id for r in rules), options):
            results[text] = result
            if cache is not None and not result.errors:
                cache.store(keys[text], result)
            _tell(options, text, "done", result=result, seconds=seconds)
    report = Report(results=[results[t] for t in dict.fromkeys(targets)], project_root=str(project.root),
                    rules=rules, show_suppressed=options.show_suppressed, fail_on=config.fail_on,
                    baseline=str(options.baseline) if options.baseline is not None else None)
    apply_policy(report, config, project, baseline)
    return report


def _rule_infos(cache: ResultCache | None) -> tuple[RuleInfo, ...]:
    infos = cache.rule_infos() if cache is not None else None
    if infos is None:
        from graphlint.engine import load_rules  # imports the rules, and torch with them

        infos = tuple(RuleInfo.of(rule) for rule in load_rules())
        if cache is not None:
            cache.store_rule_infos(infos)
    return infos


def _lint(pending: list[str], base: Path, project: Project, config: Config, rule_ids: tuple[str, ...],
          options: Options) -> Iterator[tuple[str, TargetResult, float]]:
    """Each pending target in its own child process; (target, result, seconds) as they finish."""
    from graphlint.run.child import request
    from graphlint.run.scheduler import lint_in_children

    starts: dict[str, float] = {}

    def started(text: str) -> None:
        starts[text] = time.monotonic()
        _tell(options, text, "started")

    def request_for(text: str) -> dict:
        return request(text, base, project, config.device, rule_ids, options.debug)

    for text, result in lint_in_children(pending, request_for, options.jobs, options.timeout, started):
        yield text, result, time.monotonic() - starts.get(text, time.monotonic())


def _tell(options: Options, text: str, event: str, **details) -> None:
    if options.progress is not None:
        options.progress(text, event, **details)
