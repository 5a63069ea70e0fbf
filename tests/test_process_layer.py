"""The process layer (graphlint.run): typed jobs in children of a warm parent, spawned where fork is not used,
failures that carry their file, line and stage, and the scheduler the command line and the server share."""

from __future__ import annotations

import multiprocessing

import pytest

from conftest import fix_plan, lint_file, write
from graphlint.project import Project
from graphlint.results import TargetResult
from graphlint.run import parent as parent_module
from graphlint.run.scheduler import Scheduler, run_job
from graphlint.run.wire import GraphJob, LintJob, MemoryJob, Reported
from test_cli import ATTENTION


def test_a_failing_factory_is_an_error_at_the_line_that_raised_in_the_factory_stage(tmp_path):
    path = write(tmp_path, "model.py", "import torch\n\n\ndef make():\n    size = 4\n    raise ValueError(size)\n")
    (error,) = lint_file(path).errors
    assert (error.path, error.line, error.stage) == (str(path), 6, "factory")
    assert error.message.endswith("(at model.py:6)") or error.message.endswith(f"(at {path}:6)")


def test_a_syntax_error_is_an_error_at_its_line_in_the_import_stage(tmp_path):
    path = write(tmp_path, "model.py", "import torch\n\ndef make(:\n    pass\n")
    (error,) = lint_file(path).errors
    assert (error.path, error.line, error.stage) == (str(path), 3, "import")


def test_a_target_that_names_no_file_has_no_place_but_its_stage(tmp_path):
    path = write(tmp_path, "model.py", "import torch\n")
    (error,) = lint_file(path, name="missing").errors
    assert (error.path, error.line, error.stage) == (None, None, "import")


def test_spawned_children_run_a_lint_job_like_forked_ones(tmp_path, monkeypatch):
    monkeypatch.setattr(parent_module, "start_method", lambda: "spawn")
    path = write(tmp_path, "model.py", ATTENTION)
    project = Project(root=tmp_path, first_party_folders=[tmp_path])
    spawned = parent_module.WarmParent()
    assert spawned.context.get_start_method() == "spawn"
    job = LintJob.of(f"{path}:make", tmp_path, project, "auto", ("GL101",))
    result = run_job(spawned, job, 300)
    assert isinstance(result, TargetResult) and not result.errors, result
    assert [f.rule_id for f in result.findings] == ["GL101"]


@pytest.mark.parametrize("kind", ["graph", "memory"])
def test_spawned_children_make_graph_and_memory_reports_like_forked_ones(tmp_path, monkeypatch, kind):
    path = write(tmp_path, "model.py", ATTENTION)
    project = Project(root=tmp_path, first_party_folders=[tmp_path])
    job = (GraphJob.of(f"{path}:make", tmp_path, project, "auto") if kind == "graph"
           else MemoryJob.of(f"{path}:make", tmp_path, project))
    forked = run_job(parent_module.WarmParent(), job, 300)
    monkeypatch.setattr(parent_module, "start_method", lambda: "spawn")
    spawned = parent_module.WarmParent()
    assert spawned.context.get_start_method() == "spawn"
    answer = run_job(spawned, job, 300)
    assert isinstance(answer, Reported) and not answer.result.errors, answer.result
    assert answer.report is not None and answer.report == forked.report
    assert str(path) in answer.result.inputs  # what the result cache checks before answering again


@pytest.mark.proof
def test_spawned_children_prove_a_fix_like_forked_ones(tmp_path, monkeypatch):
    path = write(tmp_path, "model.py", ATTENTION)
    report = lint_file(path)
    assert [f.rule_id for f in report.findings if f.fix is not None] == ["GL101"]
    monkeypatch.setattr(parent_module, "start_method", lambda: "spawn")
    spawned = parent_module.WarmParent()
    plan = fix_plan(report, tmp_path, parent=lambda: spawned)
    assert plan.refused == [] and [f.rule_id for f in plan.applied] == ["GL101"]
    assert "scaled_dot_product_attention" in plan.texts[str(path)]


class _Children:
    """Children that finish in the order they were started, one per wait (the scheduler's logic alone)."""

    def __init__(self) -> None:
        self.started: list[object] = []
        self.killed: list[object] = []
        self.live: list[object] = []
        self.more: list[bool] = []

    def start(self, job, timeout=None, key=None, more=True) -> None:
        self.started.append(key)
        self.live.append(key)
        self.more.append(more)

    def wait(self, also=None):
        return [(self.live.pop(0), "answer")] if self.live else []

    def kill(self, key) -> bool:
        self.killed.append(key)
        self.live.remove(key)
        return True

    def kill_all(self) -> None:
        self.live.clear()


def test_the_scheduler_starts_touched_targets_first_and_a_newer_save_supersedes_a_running_one():
    children = _Children()
    scheduler = Scheduler(lambda: children, 1, lambda key, item: f"job {key}")
    scheduler.put([("a", 1), ("b", 2), ("c", 3)])
    scheduler.start_waiting()
    assert children.started == ["a"] and list(scheduler.waiting) == ["b", "c"]
    scheduler.put([("c", 3)], first=True)  # the file of target c was saved: it goes ahead of b
    assert list(scheduler.waiting) == ["c", "b"]
    scheduler.put([("a", 1)], first=True)  # opened again: the running lint of a stays
    assert children.killed == [] and "a" not in scheduler.waiting
    scheduler.put([("a", 1)], first=True, supersede=True)  # saved again: the running child is killed
    assert children.killed == ["a"] and list(scheduler.waiting) == ["a", "c", "b"]
    finished = []
    while scheduler:
        finished += [key for key, _, _ in scheduler.wait()]
    assert finished == ["a", "c", "b"] and children.started == ["a", "a", "c", "b"]


def test_the_warm_parent_warms_dynamo_up_only_for_jobs_still_to_come(monkeypatch):
    """A run of one target has no later child to warm dynamo up for (a second of CPU the child competes with); the
    language server's jobs keep coming, so it warms up after its first child as before."""
    children = _Children()
    scheduler = Scheduler(lambda: children, 1, lambda key, item: f"job {key}")
    scheduler.put([("a", 1), ("b", 2)])
    while scheduler:
        scheduler.wait()
    assert children.started == ["a", "b"] and children.more == [True, False]
    server = _Children()
    scheduler = Scheduler(lambda: server, 1, lambda key, item: f"job {key}", open_ended=True)
    scheduler.put([("a", 1)])
    scheduler.wait()
    assert server.more == [True]

    warmed = []
    parent = parent_module.WarmParent.__new__(parent_module.WarmParent)  # its start() alone: no torch warm-up
    parent.context, parent.close_in_children = multiprocessing.get_context("fork"), ()
    parent._tried, parent._wanted, parent._compile_warm = set(), [], False
    monkeypatch.setattr(parent, "_warm_compile", lambda: warmed.append(True))
    monkeypatch.setattr(parent_module, "_needs_compile", lambda job: True)
    monkeypatch.setattr(parent.context, "Process", _NoProcess)
    job = LintJob("model.py:make", ".", ".", (), "meta", ("GL301",))
    parent.start(job, more=False)
    assert warmed == []
    parent.start(job)
    assert warmed == [True]


class _NoProcess:
    """A process that never starts (the warm parent's decision is what is tested)."""

    def __init__(self, target=None, args=(), daemon=None) -> None:
        pass

    def start(self) -> None:
        pass


def test_the_scheduler_leaves_jobs_the_caller_answered_itself_and_drops_unwanted_ones():
    children = _Children()
    answered = []

    def start(key, item):
        if item == "cached":
            answered.append(key)
            return None
        return f"job {key}"

    scheduler = Scheduler(lambda: children, 2, start)
    scheduler.put([("x", "cached"), ("y", "lint"), ("z", "lint"), ("w", "lint")])
    scheduler.start_waiting()
    assert answered == ["x"] and children.started == ["y", "z"] and list(scheduler.waiting) == ["w"]
    scheduler.drop(lambda key: key in ("z", "w"))
    assert children.killed == ["z"] and not scheduler.waiting and list(scheduler.running) == ["y"]


def test_modules_a_child_imported_are_imported_before_the_next_child_of_any_warm_parent_of_the_process(monkeypatch):
    """A test worker or a notebook makes a warm parent for each check: what the children of one imported (graphlint's
    fixers, libcst) is imported once, in this process, for the children of the next."""
    monkeypatch.setattr(parent_module, "_WANTED", [])  # not what earlier tests' children in this worker imported
    monkeypatch.setattr(parent_module, "_TRIED", set())
    first, second, third = (parent_module.WarmParent() for _ in range(3))
    imported = []
    real = parent_module.importlib.import_module

    def noted(parent):
        with monkeypatch.context() as patched:
            patched.setattr(parent_module.importlib, "import_module", lambda name: imported.append(name) or real(name))
            parent._import_wanted()

    first.preload(["graphlint.not_a_real_module"])
    noted(second)
    assert imported == ["graphlint.not_a_real_module"]
    second.preload(["graphlint.not_a_real_module"])  # tried once (it failed): never again, by any warm parent
    noted(third)
    assert imported == ["graphlint.not_a_real_module"]


def test_a_child_that_lingers_after_its_answer_is_waited_for_without_spinning(tmp_path, monkeypatch):
    """A child's pipe, once closed, is readable for ever: waiting on it again and again while the process exits
    (here a thread the model started keeps it alive for half a second) burned the parent's CPU."""
    from graphlint.run import scheduler

    path = write(tmp_path, "model.py", """
        import threading
        import time

        import torch


        def make():
            threading.Thread(target=time.sleep, args=(0.5,)).start()  # not a daemon: the process waits for it
            return torch.nn.Linear(4, 4), (torch.randn(2, 4),)
    """)
    waits = []
    waited = scheduler.wait
    monkeypatch.setattr(scheduler, "wait", lambda *args: waits.append(1) or waited(*args))
    [result] = lint_file(path).results
    assert not result.errors
    assert len(waits) < 20, len(waits)


def test_a_child_that_answered_but_never_exits_is_stopped_and_its_answer_kept(tmp_path):
    """A model's thread that never ends keeps its child alive after the child sent everything: the answer stands,
    and the child is stopped after a grace period instead of being reported as a target that timed out."""
    path = write(tmp_path, "model.py", """
        import threading
        import time

        import torch


        def make():
            threading.Thread(target=time.sleep, args=(600,)).start()  # not a daemon: the process waits for it
            return torch.nn.Linear(4, 4), (torch.randn(2, 4),)
    """)
    from graphlint.config import Config
    from graphlint.session import Options, check

    project = Project(root=tmp_path, first_party_folders=[tmp_path])
    [result] = check([f"{path}:make"], project, Config(ignore=("GL3",)), Options(timeout=6)).results
    assert not result.errors, result.errors
