"""The language server's linting thread: it owns the workspace and turns opened and saved files into
diagnostics, off the thread that answers the client. It is a shell over the projects' sessions
(graphlint.session): they answer from the result cache, lint in children of one runner shared by all of them
(one warm parent for the server's whole life, at most `jobs` children at once), and deliver results as they
finish; nothing here starts or reads a process.

A file event asks the sessions of the targets it affects to lint them again, ahead of what is waiting; a save
supersedes a lint of the same target still running (its child is killed, only the newer result is delivered).
Whenever targets of a project finish, the project's report is made again (the policy stage across its targets)
and every file that has diagnostics, or had them, is published. A target is published twice per lint when a rule
that needs the torch.compile analysis (the slow part) runs: first with the other rules' findings, which its child
sends before that analysis starts (graphlint.session's `Options.partial`), then complete; a newer save supersedes both.
The warm parent warms up (imports torch) in a thread of its own once a project with targets is met.

After publishing, once none of the project's lints is running, the fixes declared unsafe that are not yet
judged are proven on the model, as `--unsafe-fixes` proves them (graphlint.fix.apply), so that the editor
offers exactly what `--unsafe-fixes` would write: each verdict is kept by the finding's fingerprint and edits
in `unsafe_verdicts` ("" where the fix may be written, else why not), which the code actions read.
"""

from __future__ import annotations

import queue
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import replace
from multiprocessing import Pipe
from pathlib import Path

from lsprotocol.types import MessageType

from graphlint.errors import GraphlintError, one_line, single_line
from graphlint.report.columns import SourceColumns
from graphlint.results import UNSAFE, Finding, Report, TargetResult
from graphlint.server.diagnostics import Shown, error_place, failure_message, shown_by_file
from graphlint.server.workspace import ProjectTargets, Settings, Workspace
from graphlint.session import Runner
from graphlint.tags import COMPILE_TAG

_STOP = ("stop", "")


class Linter:
    """Lints in its own thread; `publish(files)` and `tell(type, message)` are called from that thread."""

    def __init__(self, settings: Settings, publish: Callable[[dict[str, list[Shown]]], None],
                 tell: Callable[[MessageType, str], None]) -> None:
        self.settings = settings
        self.publish = publish
        self.tell = tell
        self.unit = "utf-16"  # how the client counts columns
        self.runner = Runner(open_ended=True)  # every project's session lints in it: one warm parent, one limit
        self.workspace = Workspace(settings, self.runner)
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._wake_reader, self._wake_writer = Pipe(duplex=False)
        self._thread = threading.Thread(target=self._main, name="graphlint-linter", daemon=True)
        self._dirty: dict[Path, ProjectTargets] = {}
        self._shown: dict[Path, dict[str, list[Shown]]] = {}  # per project: what it published, per file
        # An unsafe fix's proof, by `fix_key`: "" where --unsafe-fixes would write it, else why it would not.
        self.unsafe_verdicts: dict[tuple, str] = {}

    def start(self, close_in_children: tuple[int, ...] = ()) -> None:
        """Start the thread; children close the file descriptors given."""
        self.runner.close_in_children = close_in_children
        self._thread.start()

    def folder(self, path: str) -> None:
        """A workspace folder the editor opened: when it holds a project with targets, the warm parent warms up
        now, ahead of the first file opened."""
        self._post(("folder", path))

    def opened(self, path: str) -> None:
        self._post(("opened", path))

    def saved(self, path: str) -> None:
        self._post(("saved", path))

    def stop(self, wait_seconds: float = 10.0) -> None:
        """Kill every child and end the thread (the server is shutting down)."""
        if self._thread.is_alive():
            self._post(_STOP)
            self._thread.join(wait_seconds)

    def _post(self, event: tuple[str, str]) -> None:
        self._events.put(event)
        try:
            self._wake_writer.send_bytes(b"!")
        except OSError:
            pass  # the thread has ended

    # -- the thread --------------------------------------------------------------------------------------------

    def _main(self) -> None:
        try:
            while True:
                try:
                    if not self._step():
                        return
                except Exception as error:  # a bug in graphlint: say so, and go on serving
                    traceback.print_exc(file=sys.stderr)
                    self.tell(MessageType.Error, f"internal error in graphlint server ({one_line(error)}); please "
                                                 "report it with the server's stderr")
        finally:
            self.runner.close()

    def _step(self) -> bool:
        """Handle what happened, publish, then wait for results or the next event; False when stopping."""
        while self._wake_reader.poll():  # before reading the events: a wake-up sent after this one is kept
            self._wake_reader.recv_bytes()
        while True:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                break
            if event == _STOP:
                return False
            self._handle(*event)
        self._publish_dirty()
        for session, target, result in self.runner.finished(also=[self._wake_reader]):
            project = self._project_of(session)
            if project is not None:  # else a project whose configuration was read again since
                self._record(project, target, result)
        for session, target, result in self.runner.partials():  # shown now, replaced by the complete result
            project = self._project_of(session)
            if project is not None:
                project.record(target, result, partial=True)
                self._dirty[project.pyproject] = project
        return True

    def _folder(self, path: str) -> None:
        try:
            own = self.workspace.project_of(str(Path(path) / "pyproject.toml"))
        except GraphlintError:
            return  # said when one of its files is opened, the first time it matters
        if own is not None:
            # An editor starts the server with the workspace, a while before the user opens a model: enough for
            # torch, libcst and, where those rules run, dynamo.
            self.runner.warm_up(background=True, ahead=COMPILE_TAG in own.session.rule_tags)

    def _project_of(self, session) -> ProjectTargets | None:
        return next((p for p in self.workspace.projects.values() if p.session is session), None)

    def _handle(self, kind: str, path: str) -> None:
        if kind == "folder":
            self._folder(path)
            return
        pyproject = Path(path).resolve()
        if pyproject.name == "pyproject.toml" and kind == "saved":
            self._reload(pyproject)
            return
        try:
            own = self.workspace.project_of(path)
        except GraphlintError as error:
            self.tell(MessageType.Error, f"graphlint: {error}")
            return
        if own is not None:
            # The first project with targets: torch is imported now, while the cache answers what it can (an
            # editor may start the server in every Python folder, most without targets).
            self.runner.warm_up(background=True)
        touched: dict[ProjectTargets, list[str]] = {}
        if own is not None and not own.results and not own.session.linting:
            touched[own] = list(own.targets)
        for project in self.workspace.projects.values():
            affected = project.affected_by(path, saved=kind == "saved")
            if affected:
                touched[project] = list(dict.fromkeys([*touched.get(project, []), *affected]))
        # What the user just touched goes first (the last put goes ahead of the others); a newer save supersedes
        # the older lint of the same target.
        for project, targets in reversed(touched.items()):
            project.session.lint(targets, first=True, supersede=kind == "saved")

    def _reload(self, pyproject: Path) -> None:
        """The configuration changed: forget the project's results and lint all its targets again."""
        old = self.workspace.projects.get(pyproject)
        if old is not None:
            old.session.cancel()
        known = old is not None or pyproject in self._shown
        try:
            project = self.workspace.reload(pyproject)
        except GraphlintError as error:
            self.tell(MessageType.Error, f"graphlint: {error}")
            project = None
        if project is None:
            if known:
                self._publish_project(pyproject, {})
            return
        project.session.lint(project.targets)
        self._dirty[pyproject] = project

    def _record(self, project: ProjectTargets, target: str, result: TargetResult) -> None:
        project.record(target, result)
        self._dirty[project.pyproject] = project
        for note in result.notes:
            self.tell(MessageType.Log, single_line(f"graphlint: note: {target}: {note}"))
        for error in result.errors:  # a failure without a place in a file is a message instead of a diagnostic
            if error_place(error, project.files.get(target)) is None:
                self.tell(MessageType.Error, failure_message(error))

    def _publish_dirty(self) -> None:
        dirty, self._dirty = self._dirty, {}
        for pyproject, project in dirty.items():
            if self.workspace.projects.get(pyproject) is not project:
                continue
            report = project.report()
            files = shown_by_file(report, project.files, SourceColumns(self.unit))
            self._publish_project(pyproject, files)
            self._prove_unsafe(project, report)

    def _prove_unsafe(self, project: ProjectTargets, report: Report) -> None:
        """Prove the report's unsafe fixes not yet judged, each alone, as `--unsafe-fixes` does; the other
        findings stay in the report (the proof counts what is left) without their fixes."""
        from graphlint.fix.apply import fixable

        # Proofs wait for the project's lints to finish: a first-stage result is replaced by the complete one, and
        # a proof's children would hold the slots the torch.compile stage is running in.
        if project.session.linting:
            return
        pending = [f for f in fixable(report) if f.fix.applicability == UNSAFE and fix_key(f) not in self.unsafe_verdicts]
        if not pending:
            return
        alone = replace(report, merged=[f if f in pending else replace(f, fix=None) for f in report.all_findings])
        try:
            plan = project.session.fixes(alone, unsafe=True)
        except GraphlintError as error:  # no warm parent (no torch): nothing is offered, the server goes on
            self.tell(MessageType.Log, single_line(f"graphlint: the unsafe fixes could not be proven: {error}"))
            return
        reasons = dict(plan.refused)
        for finding in pending:
            self.unsafe_verdicts[fix_key(finding)] = "" if finding in plan.applied else \
                reasons.get(finding, "the fix could not be applied")

    def _publish_project(self, pyproject: Path, files: dict[str, list[Shown]]) -> None:
        """Publish the files this project shows now and those it showed before; a file that several projects
        show gets all of theirs."""
        before = self._shown.get(pyproject, {})
        if files:
            self._shown[pyproject] = files
        else:
            self._shown.pop(pyproject, None)
        changed = {}
        for path in sorted(set(before) | set(files)):
            changed[path] = [shown for shown_files in self._shown.values() for shown in shown_files.get(path, ())]
        if changed:
            self.publish(changed)


def fix_key(finding: Finding) -> tuple:
    """What an unsafe fix's proof is kept by: the finding and the edits it makes."""
    return finding.fingerprint, finding.fix.edits if finding.fix is not None else ()
