"""Which targets a file belongs to: the projects the server has met, each with its `[tool.graphlint]` targets,
what each target was last found to depend on (`TargetResult.inputs`, the files the result cache keys on) and
its latest result (the early one, without the torch.compile analysis's findings, until the complete one comes).

A file's project is the nearest `pyproject.toml` above it whose `[tool.graphlint]` lists targets, read as
`graphlint check` reads it from that folder (the targets' relative paths from the project root). A saved file
affects the targets of every known project whose inputs include it; a target that has not been linted
successfully yet may depend on any Python file of its project, so any of them affects it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from graphlint.cache import default_folder
from graphlint.errors import GraphlintError
from graphlint.project import Project, find_pyproject
from graphlint.results import Report, TargetResult
from graphlint.session import Options, Runner, Session
from graphlint.target import TargetSpec


@dataclass(frozen=True)
class Settings:
    """`graphlint server`'s options: the command line's, applied to every project."""

    device: str | None = None  # overrides [tool.graphlint] device
    timeout: float | None = None  # seconds per target; overrides [tool.graphlint] timeout
    baseline: Path | None = None  # an absolute path
    cache_dir: str | None = None
    no_cache: bool = False
    jobs: int = 2  # targets linted at once
    debug: bool = False


class ProjectTargets:
    """One project's targets, what each depends on, and their latest results."""

    def __init__(self, pyproject: Path, settings: Settings, runner: Runner) -> None:
        """Read the project's configuration; `GraphlintError` when it is wrong. Its session lints in the
        server's `runner`, with the server's job count and the project's time limit."""
        project = Project.discover(pyproject.parent)
        config = project.config.overridden(device=settings.device, timeout=settings.timeout)
        self.pyproject = pyproject
        self.project = project
        self.targets = list(dict.fromkeys(config.targets))
        # partial: the other rules' diagnostics are shown before the torch.compile analysis has finished.
        options = Options(debug=settings.debug, baseline=settings.baseline, jobs=settings.jobs,
                          timeout=config.timeout or None, partial=True,
                          cache=None if settings.no_cache else default_folder(project, settings.cache_dir))
        self.session = Session(self.targets, project, config, options, project.root, runner=runner)
        self.files: dict[str, str] = {}  # target → its file, for targets that name one
        for target in self.targets:
            try:
                spec = TargetSpec.parse(target, project.root)
            except GraphlintError:
                continue
            if spec.file is not None:
                self.files[target] = str(spec.file)
        self.inputs: dict[str, frozenset[str]] = {}  # target → the real paths of the files it last depended on
        self.results: dict[str, TargetResult] = {}

    def affected_by(self, path: str, saved: bool) -> list[str]:
        """The targets whose result may change when `path` changes. A target that failed (or never ran) may
        depend on any Python file of the project, but only a save is a reason to try it again."""
        real = os.path.realpath(path)
        mine = saved and path.endswith(".py") and self.project.is_first_party(real)
        affected = []
        for target in self.targets:
            result = self.results.get(target)
            if result is None or result.errors or target not in self.inputs:
                if mine or real == os.path.realpath(self.files.get(target, "")):
                    affected.append(target)
            elif real in self.inputs.get(target, ()):
                affected.append(target)
        return affected

    def record(self, target: str, result: TargetResult, partial: bool = False) -> None:
        """The target's latest result; a `partial` one (graphlint.session.Runner.partials) is shown until the
        complete one comes, and says nothing of what the target depends on."""
        self.results[target] = result
        if not result.errors and not partial:
            own = (self.files[target],) if target in self.files else ()
            self.inputs[target] = frozenset(os.path.realpath(p) for p in (*result.inputs, *own))

    def report(self) -> Report:
        """The report of the latest results, under the configuration, suppressions and baseline."""
        return self.session.report([self.results[t] for t in self.targets if t in self.results])


class Workspace:
    """The projects the server has met, by their pyproject.toml; their sessions share one runner."""

    def __init__(self, settings: Settings, runner: Runner) -> None:
        self.settings = settings
        self.runner = runner
        self.projects: dict[Path, ProjectTargets] = {}

    def project_of(self, path: str) -> ProjectTargets | None:
        """The project whose targets `path` belongs with, read now if it was not known; `GraphlintError` when
        its pyproject.toml is wrong."""
        folder = Path(path).resolve().parent
        while True:
            pyproject = find_pyproject(folder)
            if pyproject is None:
                return None
            if pyproject in self.projects:
                return self.projects[pyproject]
            project = ProjectTargets(pyproject, self.settings, self.runner)
            if project.targets:
                self.projects[pyproject] = project
                return project
            if pyproject.parent.parent == pyproject.parent:
                return None
            folder = pyproject.parent.parent

    def reload(self, pyproject: Path) -> ProjectTargets | None:
        """Read a project's configuration again (its pyproject.toml changed); None when it lists no targets any
        more. `GraphlintError` when it is wrong, and the project is forgotten."""
        self.projects.pop(pyproject, None)
        project = ProjectTargets(pyproject, self.settings, self.runner)
        if not project.targets:
            return None
        self.projects[pyproject] = project
        return project
