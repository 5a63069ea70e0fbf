"""The language server's linting thread: it owns the workspace, one warm parent for the server's whole life and
its children, and turns opened and saved files into diagnostics, off the thread that answers the client.

A file event re-lints the targets it affects: a target whose inputs did not change answers from the result
cache; the others run in fresh children of the warm parent, at most `jobs` at a time, and a newer save of a
target still being linted kills the older child. Whenever targets of a project finish, the project's report is
made again (the policy stage across its targets) and every file that has diagnostics, or had them, is
published. The warm parent warms up (imports torch) in a thread of its own once a project with targets is met.
"""

from __future__ import annotations

import queue
import sys
import threading
import traceback
from collections.abc import Callable
from multiprocessing import Pipe
from pathlib import Path

from lsprotocol.types import MessageType

from graphlint.errors import GraphlintError, one_line, single_line
from graphlint.report.columns import SourceColumns
from graphlint.results import TargetError, TargetResult
from graphlint.run.scheduler import Children, Scheduler
from graphlint.run.wire import LintJob
from graphlint.server.diagnostics import Shown, error_place, failure_message, shown_by_file
from graphlint.server.workspace import ProjectTargets, Settings, Workspace

_STOP = ("stop", "")



class Linter:
    """Lints in its own thread; `publish(files)` and `tell(type, message)` are called from that thread."""

    def __init__(self, settings: Settings, publish: Callable[[dict[str, list[Shown]]], None],
                 tell: Callable[[MessageType, str], None]) -> None:
        self.settings = settings
        self.publish = publish
        self.tell = tell
        self.unit = "utf-16"  # how the client counts columns
        self.workspace = Workspace(settings)
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._wake_reader, self._wake_writer = Pipe(duplex=False)
        self._thread = threading.Thread(target=self._main, name="graphlint-linter", daemon=True)
        self._parent = None
        self._parent_error: str | None = None
        self._warming = threading.Thread(target=self._warm_up, name="graphlint-warm-up", daemon=True)
        self._close_in_children: tuple[int, ...] = ()
        self._children = None
        # (pyproject, target) -> its project: the same scheduler as the command line's run
        self._scheduler = Scheduler(lambda: self._children, settings.jobs, self._job_for,
                                    timeout=lambda project: project.timeout)
        self._dirty: dict[Path, ProjectTargets] = {}
        self._shown: dict[Path, dict[str, list[Shown]]] = {}  # per project: what it published, per file

    def start(self, close_in_children: tuple[int, ...] = ()) -> None:
        """Start the thread; children close the file descriptors given."""
        self._close_in_children = close_in_children
        self._thread.start()

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
                    self.tell(MessageType.Error, f"internal error in graphlint server ({one_line(error)}); please report it with "
                                     "the server's stderr")
        finally:
            self._scheduler.kill_all()

    def _step(self) -> bool:
        """Handle what happened, start what is waiting, publish, then wait; False when stopping."""
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
        self._scheduler.start_waiting()
        self._publish_dirty()
        for key, project, result in self._scheduler.wait(also=[self._wake_reader]):
            if self.workspace.projects.get(project.pyproject) is project:
                self._record(project, key[1], result)
        return True

    def _handle(self, kind: str, path: str) -> None:
        pyproject = Path(path).resolve()
        if pyproject.name == "pyproject.toml" and kind == "saved":
            self._reload(pyproject)
            return
        try:
            own = self.workspace.project_of(path)
        except GraphlintError as error:
            self.tell(MessageType.Error, f"graphlint: {error}")
            return
        if own is not None and self._warming.ident is None:
            # The first project with targets: torch is imported now, while the cache answers what it can (an
            # editor may start the server in every Python folder, most without targets).
            self._warming.start()
        first = own is not None and not own.results and not any(p is own for p in self._scheduler.waiting.values()) \
            and not any(p is own for p in self._scheduler.running.values())
        touched = [(own, target) for target in own.targets] if first else []
        for project in self.workspace.projects.values():
            touched += [(project, target) for target in project.affected_by(path, saved=kind == "saved")]
        # What the user just touched goes first; a newer save kills the older lint of the same target.
        self._scheduler.put([((project.pyproject, target), project) for project, target in touched], first=True,
                            supersede=kind == "saved")

    def _reload(self, pyproject: Path) -> None:
        """The configuration changed: forget the project's results and lint all its targets again."""
        self._scheduler.drop(lambda key: key[0] == pyproject)
        known = pyproject in self.workspace.projects or pyproject in self._shown
        try:
            project = self.workspace.reload(pyproject)
        except GraphlintError as error:
            self.tell(MessageType.Error, f"graphlint: {error}")
            project = None
        if project is None:
            if known:
                self._publish_project(pyproject, {})
            return
        self._scheduler.put([((pyproject, target), project) for target in project.targets])
        self._dirty[pyproject] = project

    def _job_for(self, key: tuple[Path, str], project: ProjectTargets) -> LintJob | None:
        """The job that lints a waiting target, or None when the cache answered it or no child can start."""
        target = key[1]
        cached = project.session.cached(target)
        if cached is not None:
            self._record(project, target, cached)
            return None
        if self._warm_children() is None:
            self._record(project, target, TargetResult(target=target, errors=[TargetError(target, self._parent_error)]))
            return None
        return project.session.job(target)

    def _record(self, project: ProjectTargets, target: str, result: TargetResult) -> None:
        project.session.store(target, result)
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
            files = shown_by_file(project.report(), project.files, SourceColumns(self.unit))
            self._publish_project(pyproject, files)

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

    # -- the warm parent ---------------------------------------------------------------------------------------

    def _warm_up(self) -> None:
        try:
            from graphlint.run.parent import WarmParent

            self._parent = WarmParent(close_in_children=self._close_in_children)
        except ImportError as error:
            self._parent_error = (f"cannot import torch ({error}); install PyTorch in the environment graphlint "
                                  "server runs in" if (error.name or "").startswith("torch") else
                                  f"internal error in graphlint server while starting ({one_line(error)})")
        except Exception as error:
            traceback.print_exc(file=sys.stderr)
            self._parent_error = f"internal error in graphlint server while starting ({one_line(error)}); please report it"

    def _warm_children(self):
        """The children of the warm parent, once it is warm; None if it could not start."""
        if self._children is None:
            if self._warming.ident is None:
                self._warming.start()
            self._warming.join()
            if self._parent is None:
                return None
            self._children = Children(self._parent, None)
        return self._children
