"""`pytest --graphlint`: lint the models a test session builds and runs, with no factory written.

Registered through the `pytest11` entry point, so pytest loads it in every session of an environment where
graphlint is installed; it does nothing unless `--graphlint` is given (this module imports neither torch nor
graphlint's capture). With the option, graphlint.recorded records each distinct model's first outermost call
while the tests run; when the session ends, each recording is linted like any target, in its own child
process, under the project's `[tool.graphlint]` settings, suppressions and `--graphlint-baseline`, and the
findings are printed in the terminal summary in graphlint's text form. The session fails when findings at or
above `fail-on` exist, unless `--graphlint-no-fail`. Under pytest-xdist each worker records its own models and
the controlling process lints them all, once per distinct model (`_results`): many tests building the same
model cost one lint.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import Counter
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

FORMATS = ("text", "json", "sarif", "github", "gitlab", "junit")
_FOLDER = "GRAPHLINT_PYTEST_RECORDINGS"  # where xdist workers leave their recordings for the controlling process


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("graphlint", "graphlint: lint the models the tests build and run")
    group.addoption("--graphlint", action="store_true",
                    help="record each model the tests call and lint it when the session ends")
    group.addoption("--graphlint-output", metavar="FILE", help="also write graphlint's report to FILE")
    group.addoption("--graphlint-format", choices=FORMATS, default="text",
                    help="the report's format in --graphlint-output (default: text)")
    group.addoption("--graphlint-baseline", metavar="FILE", help="report only findings not in this baseline file")
    group.addoption("--graphlint-no-fail", action="store_true",
                    help="report graphlint's findings without failing the session")
    group.addoption("--graphlint-debug", action="store_true",
                    help="print the tracebacks of graphlint's internal errors (graphlint check's --debug)")
    group.addoption("--graphlint-configurations", type=int, default=4, metavar="N",
                    help="lint at most N distinct configurations (constructor arguments) of a class built at one "
                         "line, each as a target of its own (default: 4)")


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser, args) -> None:
    # Before conftest.py files are imported: a model they build at import is recorded too.
    if getattr(early_config.known_args_namespace, "graphlint", False):
        early_config.pluginmanager.register(_GraphlintSession(early_config), "graphlint-session")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("graphlint") and not config.pluginmanager.has_plugin("graphlint-session"):
        config.pluginmanager.register(_GraphlintSession(config), "graphlint-session")


class _GraphlintSession:
    """The recorder for one test session, and the lint after it."""

    def __init__(self, config: pytest.Config) -> None:
        from graphlint.recorded import ModelRecorder

        self.config = config
        # The first process to start makes the folder; pytest-xdist workers, started later, inherit it.
        self.owner = _FOLDER not in os.environ
        if self.owner:
            os.environ[_FOLDER] = tempfile.mkdtemp(prefix="graphlint-pytest-")
        self.folder = Path(os.environ[_FOLDER])
        bound = getattr(config.known_args_namespace, "graphlint_configurations", None)
        self.recorder = ModelRecorder(max_configurations=max(1, bound if bound is not None else 4))
        self.recorder.install()
        self.lines: list[str] = []

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.recorder.uninstall()  # before any child is forked from this process
        worker = hasattr(self.config, "workerinput")  # a pytest-xdist worker records; the main process lints
        saved = _save(self.recorder.recordings.values(), self.folder, "worker-" + str(os.getpid()), not worker,
                      _left_out(self.recorder))
        if worker:
            return
        try:
            if session.exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
                return  # interrupted, or a usage error: nothing worth linting, and no time to take
            self.lines, failing = _lint(_load_all(self.folder, saved), self.config)
        finally:
            if self.owner:
                shutil.rmtree(self.folder, ignore_errors=True)
                del os.environ[_FOLDER]
        if failing and not self.config.getoption("graphlint_no_fail") and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.lines:
            return
        terminalreporter.section("graphlint")
        for line in self.lines:
            terminalreporter.write_line(line)


def _left_out(recorder) -> list[dict]:
    """An entry for each class and site with more configurations than the bound, saying how many were left out."""
    entries = []
    for (cls, site), configurations in recorder.left_out.items():
        name = f"{cls.__module__}.{cls.__qualname__}"
        count = len(configurations)
        entries.append({"key": [name, list(site or ()), f"{count} more"], "target": None, "problem":
                        f"{count} more configuration{'s' if count > 1 else ''} (other constructor arguments) "
                        f"{'were' if count > 1 else 'was'} left out: at most {recorder.max_configurations} are "
                        "linted per class and line (--graphlint-configurations N)"})
    return entries


def _save(recordings, folder: Path, prefix: str, linting_here: bool, left_out: list[dict] = ()) -> list[dict]:
    """Each recording's data to a file in `folder`; their descriptions, which an index file in it also lists.
    What torch.save could not write stays in memory for the children of the process that lints (they are
    forked from it); a pytest-xdist worker's is named in a note instead."""
    from graphlint.recorded import IN_MEMORY

    described = []
    for index, recording in enumerate(recordings):
        entry = {"key": [recording.cls, list(recording.site or ()), recording.configuration], "problem": recording.problem,
                 "target": recording.target, "factory": recording.factory, "model": recording.model,
                 "values": recording.values}
        if recording.data is not None:
            path = folder / f"{prefix}-{index}.pt"
            path.write_bytes(recording.data)
            entry["path"] = str(path)
        elif recording.kept is not None and linting_here:
            entry["path"], entry["problem"] = f"memory:{prefix}-{index}", None
            IN_MEMORY[entry["path"]] = recording.kept
        described.append(entry)
    described += left_out
    (folder / f"{prefix}.json").write_text(json.dumps(described), encoding="utf-8")
    return described


def _load_all(folder: Path, own: list[dict]) -> list[dict]:
    """This process's recordings and those the workers left, one per class and construction site."""
    found = {}
    for entry in own + [e for index in sorted(folder.glob("worker-*.json"))
                        for e in json.loads(index.read_text(encoding="utf-8"))]:
        found.setdefault(json.dumps(entry["key"]), entry)
    return list(found.values())


def _lint(recordings: list[dict], pytest_config: pytest.Config) -> tuple[list[str], bool]:
    """The lines of the terminal summary, and whether the findings fail the session."""
    from graphlint.errors import GraphlintError, single_line
    from graphlint.project import Project
    from graphlint.report import FORMATS as RENDER
    from graphlint.report.text import diagnostics, render_text
    from graphlint.session import Options, Session
    from graphlint.target import target_text

    here = Path(pytest_config.invocation_params.dir)  # where pytest was started: the tests may change folders
    try:  # the project as `graphlint check` finds it from the same folder (pytest's rootdir follows the arguments)
        project = Project.discover(here)
    except GraphlintError as error:
        return [single_line(f"graphlint: error: {error}")], True
    root = project.root
    sites = Counter((r["key"][0], tuple(r["key"][1])) for r in recordings if r.get("path"))
    for recording in recordings:
        cls, site, configuration = recording["key"]
        where = f"{_shown(site[0], root)}:{site[1]}" if site else "an unknown place"
        recording["name"] = f"{cls.rpartition('.')[2]} built at {where}"
        if recording.get("path") and sites[(cls, tuple(site))] > 1:  # one of several configurations built at that line: say which
            recording["name"] += f" with ({configuration})"
    notes = [f"graphlint: note: {r['name']} was not linted: {r['problem']}" for r in recordings if r.get("problem")]
    for recording in recordings:
        if recording.get("path"):
            recording["text"] = target_text("graphlint.recorded:rebuild", kwargs={"path": recording["path"]})
    names = {r["text"]: r["name"] for r in recordings if r.get("path")}
    if not names:
        return notes or ["graphlint: no model was called by the tests"], False
    try:
        baseline = pytest_config.getoption("graphlint_baseline")
        options = Options(baseline=here / baseline if baseline else None, timeout=project.config.timeout or None,
                          debug=pytest_config.getoption("graphlint_debug"))
        session = Session([], project, project.config, options, project.root)
        report = session.report(_results(session, [r for r in recordings if r.get("path")]))
    except GraphlintError as error:
        return [single_line(f"graphlint: error: {error}")], True
    _rename(report, names)
    from graphlint.cache import default_folder

    commands = _commands(report, recordings, here, default_folder(project, None) / "factories")
    hint = "the command named for each model below proves and applies it" if commands else None
    text = render_text(report, *([hint] if hint else [])).rstrip("\n").splitlines() + commands
    output = pytest_config.getoption("graphlint_output")
    if output:
        try:
            (here / output).write_text(RENDER[pytest_config.getoption("graphlint_format")](report), encoding="utf-8")
        except OSError as error:
            return [f"graphlint: error: cannot write {output}: {error.strerror or error}"], True
        text.append(f"graphlint: report written to {output}")
    return notes + diagnostics(report) + text, report.failing


def _results(session, recordings: list[dict]) -> list:
    """Each recording's result, linting one recording of each distinct model: the same class, constructor call
    (module arguments by their own constructor calls, tensors by value), torch's defaults and inputs of the same
    kinds, dtypes and shapes, which is all a capture on the meta device sees. Where that capture ran elsewhere
    (the CPU: the model needs its inputs' values), the recordings of the model with other input values are linted
    too, one per distinct value. A result shared is reported under each recording's name, so that every finding
    names each test's model it comes from."""
    linted: dict[str, object] = {}

    def lint(group: list[dict]) -> None:
        if group:
            texts = [r["text"] for r in group]
            linted.update(zip(texts, session.results(texts), strict=True))

    first: dict[str, dict] = {}  # the `model` digest (or, without one, the recording's own target) -> its lint
    for recording in recordings:
        first.setdefault(recording.get("model") or recording["text"], recording)
    lint(list(first.values()))
    again: dict[tuple, dict] = {}  # (model, values) -> the lint of a model that saw its inputs' values
    for recording in recordings:
        model = recording.get("model") or recording["text"]
        if linted[first[model]["text"]].device != "meta" and recording.get("values") != first[model].get("values"):
            again.setdefault((model, recording.get("values")), recording)
    lint(list(again.values()))
    results = []
    for recording in recordings:
        model = recording.get("model") or recording["text"]
        source = again.get((model, recording.get("values")), first[model])
        results.append(_as_result_of(linted[source["text"]], recording["text"]))
    return results


def _as_result_of(result, target: str):
    """Another target's result as this target's: the same findings, notes and errors under its name."""
    def own(text: str) -> str:
        return target if text == result.target else text

    return dataclasses.replace(
        result, target=target, findings=[dataclasses.replace(f, targets=tuple(map(own, f.targets))) for f in result.findings],
        errors=[dataclasses.replace(e, target=own(e.target)) for e in result.errors], notes=list(result.notes),
        failures=list(result.failures))


def _commands(report, recordings: list[dict], here: Path, factories: Path) -> list[str]:
    """For each recorded model with findings, the command that lints it as a target (`--fix` when a fix is
    offered), run from where pytest was started. A model whose arguments are no literals gets a factory file in
    `factories`, written from its recorded constructor calls, where they can be written; else it needs one."""
    from graphlint.errors import GraphlintError
    from graphlint.results import SAFE
    from graphlint.target import TargetSpec

    by_name = {r["name"]: r.get("target") for r in recordings if r.get("path")}
    factory_of = {r["name"]: r.get("factory") for r in recordings if r.get("path")}
    lines = []
    for result in report.results:
        findings = [f for f in report.findings if result.target in f.targets and not f.suppressed]
        if not findings or result.target not in by_name:
            continue
        fixable = any(f.fix is not None and f.fix.applicability == SAFE for f in findings)
        target = by_name[result.target]
        if target is None and factory_of.get(result.target):
            written = _write_factory(factories, result.target, factory_of[result.target])
            if written is not None:
                lines.append(f"graphlint: {result.target}: graphlint check {os.path.relpath(written, here)}:make"
                             f"{' --fix' if fixable else ''} (a factory written from the test's constructor calls: "
                             "keep it beside your code and edit it freely)")
                continue
        if target is None:
            lines.append(f"graphlint: {result.target}: its constructor arguments or inputs are no literals: write a "
                         "factory function that builds it and returns (model, args), and run graphlint check "
                         f"path/to/file.py:FACTORY{' --fix' if fixable else ''}")
            continue
        try:
            spec = TargetSpec.parse(target, here)
            shown = spec.relocated(os.path.relpath(spec.file, here) if spec.file is not None else spec.module)
        except (GraphlintError, ValueError):
            shown = target
        lines.append(f"graphlint: {result.target}: graphlint check {shown}{' --fix' if fixable else ''}")
    return lines


def _write_factory(folder: Path, name: str, source: str) -> Path | None:
    """Write a generated factory as `folder/<Class>_<line>.py`; None when the folder cannot be written."""
    stem = re.sub(r"\W+", "_", name.replace(" built at ", "_")).strip("_")
    if len(stem) > 80 or " with (" in name:
        # Configurations of one class built at one line share the start of their names: a digest of the whole
        # name keeps each one's file its own when the name is cut (or differs only in characters made `_`).
        stem = f"{stem[:71]}_{hashlib.sha1(name.encode()).hexdigest()[:8]}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{stem}.py"
        path.write_text(source, encoding="utf-8")
    except OSError:
        return None
    return path


def _rename(report, names: dict[str, str]) -> None:
    """Name each recorded model in the report by its class and the line that built it, not by its temporary file."""
    def named(finding):
        return dataclasses.replace(finding, targets=tuple(names.get(t, t) for t in finding.targets))

    for result in report.results:
        result.target = names.get(result.target, result.target)
        # Under pytest, `--debug` is pytest's own option: the hints name the plugin's.
        result.errors = [dataclasses.replace(e, target=names.get(e.target, e.target),
                                             message=re.sub(r"(?<![\w-])--debug\b", "--graphlint-debug", e.message))
                         for e in result.errors]
        result.findings = [named(f) for f in result.findings]
    if report.merged is not None:
        report.merged = [named(f) for f in report.merged]


def _shown(path: str, root: Path) -> str:
    """A file relative to the project root when it is inside it."""
    try:
        return Path(path).resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return path
