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
from multiprocessing.connection import wait
from pathlib import Path

from graphlint.errors import GraphlintError, one_line, single_line
from graphlint.report.columns import SourceColumns
from graphlint.results import TargetError, TargetResult
from graphlint.server.diagnostics import Shown, error_place, failure_message, shown_by_file
from graphlint.server.workspace import ProjectTargets, Settings, Workspace

_STOP = ("stop", "")

# Message types of window/showMessage and window/logMessage, as the protocol numbers them.
ERROR, WARNING, INFO, LOG = 1, 2, 3, 4


class Linter:
    """Lints in its own thread; `publish(files)` and `tell(type, message)` are called from that thread."""

    def __init__(self, settings: Settings, publish: Callable[[dict[str, list[Shown]]], None],
                 tell: Callable[[int, str], None]) -> None:
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
        self._running: dict[tuple[Path, str], ProjectTargets] = {}
        self._waiting: dict[tuple[Path, str], ProjectTargets] = {}  # in the order they will start
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
                    self.tell(ERROR, f"internal error in graphlint server ({one_line(error)}); please report it with "
                                     "the server's stderr")
        finally:
            if self._children is not None:
                self._children.kill_all()
            self._running.clear()

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
        self._start_waiting()
        self._publish_dirty()
        if self._children is not None and len(self._children):
            finished = self._children.wait(also=[self._wake_reader])
        else:
            wait([self._wake_reader])
            finished = []
        for key, result in finished:
            project = self._running.pop(key, None)
            if project is not None and self.workspace.projects.get(project.pyproject) is project:
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
            self.tell(ERROR, f"graphlint: {error}")
            return
        if own is not None and self._warming.ident is None:
            # The first project with targets: torch is imported now, while the cache answers what it can (an
            # editor may start the server in every Python folder, most without targets).
            self._warming.start()
        first = own is not None and not own.results and not any(p is own for p in self._waiting.values()) \
            and not any(p is own for p in self._running.values())
        touched = [(own, target) for target in own.targets] if first else []
        for project in self.workspace.projects.values():
            touched += [(project, target) for target in project.affected_by(path, saved=kind == "saved")]
        front = {}
        for project, target in touched:
            key = (project.pyproject, target)
            if key in self._running and kind == "saved":  # a newer save: the older lint is no longer wanted
                self._children.kill(key)
                del self._running[key]
            if key not in self._running:
                self._waiting.pop(key, None)
                front[key] = project
        self._waiting = {**front, **self._waiting}  # what the user just touched goes first

    def _reload(self, pyproject: Path) -> None:
        """The configuration changed: forget the project's results and lint all its targets again."""
        for key in [k for k in self._running if k[0] == pyproject]:
            self._children.kill(key)
            del self._running[key]
        self._waiting = {k: p for k, p in self._waiting.items() if k[0] != pyproject}
        known = pyproject in self.workspace.projects or pyproject in self._shown
        try:
            project = self.workspace.reload(pyproject)
        except GraphlintError as error:
            self.tell(ERROR, f"graphlint: {error}")
            project = None
        if project is None:
            if known:
                self._publish_project(pyproject, {})
            return
        for target in project.targets:
            self._waiting[(pyproject, target)] = project
        self._dirty[pyproject] = project

    def _start_waiting(self) -> None:
        while self._waiting and len(self._running) < max(self.settings.jobs, 1):
            key = next(iter(self._waiting))
            project = self._waiting.pop(key)
            target = key[1]
            cached = project.session.cached(target)
            if cached is not None:
                self._record(project, target, cached)
                continue
            children = self._warm_children()
            if children is None:
                self._record(project, target, TargetResult(target=target, errors=[TargetError(target, self._parent_error)]))
                continue
            children.start(project.session.job(target), timeout=project.timeout, key=key)
            self._running[key] = project

    def _record(self, project: ProjectTargets, target: str, result: TargetResult) -> None:
        project.session.store(target, result)
        project.record(target, result)
        self._dirty[project.pyproject] = project
        for note in result.notes:
            self.tell(LOG, single_line(f"graphlint: note: {target}: {note}"))
        for error in result.errors:  # a failure without a place in a file is a message instead of a diagnostic
            if error_place(error, project.files.get(target)) is None:
                self.tell(ERROR, failure_message(error))

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
            from graphlint.run.scheduler import Children

            self._children = Children(self._parent, None)
        return self._children
