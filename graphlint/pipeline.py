"""The pipeline, top to bottom: target → capture → rules → locate → policy → report.

Each target is linted on its own: a target that fails to load or run becomes one error line in the report,
and the other targets are still linted.
"""

from __future__ import annotations

import contextlib
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

from graphlint.baseline import read_baseline
from graphlint.capture import Capture, capture_target
from graphlint.config import Config
from graphlint.engine import run_rules, select_rules
from graphlint.errors import GraphlintError, one_line
from graphlint.locate import Locator
from graphlint.policy import apply_policy
from graphlint.project import Project
from graphlint.results import Report, TargetError, TargetResult
from graphlint.target import TargetSpec, load_factory


@dataclass(frozen=True)
class Options:
    """How to run, beyond what the configuration says."""

    debug: bool = False  # print tracebacks of internal errors
    show_suppressed: bool = False
    baseline: Path | None = None  # only findings not in this baseline file count


def check(
    targets: list[str],
    project: Project,
    config: Config | None = None,
    options: Options = Options(),
    base: Path | None = None,
) -> Report:
    """Lint every target string; relative paths are read from `base` (default: the working directory)."""
    config = config if config is not None else project.config
    rules = select_rules(config)
    baseline = read_baseline(options.baseline) if options.baseline is not None else None
    report = Report(project_root=str(project.root), rules=rules, show_suppressed=options.show_suppressed,
                    fail_on=config.fail_on, baseline=str(options.baseline) if options.baseline else None)
    locator = Locator(project)
    for text in targets:
        report.results.append(lint_target(text, base or Path.cwd(), locator, rules, config.device, options))
    apply_policy(report, config, locator, baseline)
    return report


def lint_target(text: str, base: Path, locator: Locator, rules: tuple, device: str, options: Options) -> TargetResult:
    result, capture = capture_one(text, base, locator, device, options.debug)
    if capture is not None:
        result.findings, errors = run_rules(rules, capture, locator, options.debug)
        result.errors.extend(errors)
    return result


def capture_one(text: str, base: Path, locator: Locator, device: str, debug: bool = False,
                vary_inputs=None) -> tuple[TargetResult, Capture | None]:
    """Load and capture one target; a failure is an error in the result (and no capture), never an exception."""
    result = TargetResult(target=text)
    try:
        spec = TargetSpec.parse(text, base)
        if spec.file is not None:
            locator.project.add_first_party(spec.file.parent)
        # The target's folder stays importable through the capture: forwards may import lazily.
        # The user's prints go to stderr so that stdout carries only graphlint's report.
        with _importable(spec.import_folder), contextlib.redirect_stdout(sys.stderr):
            capture = capture_target(load_factory(spec), device, vary_inputs)
    except GraphlintError as error:
        result.errors.append(TargetError(text, str(error)))
        return result, None
    except Exception as error:  # a bug in graphlint: still one line, and the other targets go on
        if debug:
            traceback.print_exc()
        result.errors.append(TargetError(text, f"internal error while capturing ({one_line(error)}); "
                                               "please report it with the output of --debug"))
        return result, None
    result.device = capture.device
    result.notes = list(capture.notes)
    result.files = tuple(sorted(f for f in capture.source_files if locator.project.is_first_party(f)))
    return result, capture


@contextlib.contextmanager
def _importable(folder: Path):
    saved = list(sys.path)
    sys.path.insert(0, str(folder))
    try:
        yield
    finally:
        sys.path[:] = saved
