"""The child process that runs one job of the warm parent (graphlint.run.wire): lint a target (the per-target
pipeline, with its stages), make a target's graph report or memory estimate (graphlint.run.graph_and_memory), or
run one side of a fix's proof; its messages go to the parent over a one-way pipe.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import traceback
import warnings
from collections.abc import Callable

from graphlint import stages
from graphlint.errors import one_line
from graphlint.files import is_installed_file
from graphlint.libraries import imported_since, module_file, newest
from graphlint.results import TargetError, TargetResult
from graphlint.run.heap import leave_parent_heap, long_lived
from graphlint.run.stack import roomy
from graphlint.run.wire import (PARENT_THREADS, GraphJob, Job, Launch, LintJob, Linted, MemoryJob, Partial, ProofJob,
                                Proved, Reported, Stage, TimeJob)
from graphlint.target import script_name


def child_main(job: Job, launch: Launch, connection) -> None:
    """Run the job and send its messages (the entry point of every child process), beneath a roomy frame: the
    capture and dynamo's trace run deep stacks (graphlint.run.stack)."""
    roomy(lambda: _run(job, launch, connection))


def _run(job: Job, launch: Launch, connection) -> None:
    leave_parent_heap()
    for descriptor in launch.close_fds:  # the parent's own pipes are none of the job's business
        try:
            os.close(descriptor)
        except OSError:
            pass
    os.dup2(2, 1)  # everything the model prints, Python or native, goes to stderr: stdout carries the report
    parent_threads = None
    if launch.single_threaded:
        import torch

        parent_threads = torch.get_num_threads()  # what a memory job measures CPU kernels with (PARENT_THREADS)
        torch.set_num_threads(1)  # the parent's OpenMP pool did not survive the fork (see graphlint.run.parent)
    if isinstance(job, ProofJob):
        connection.send(_prove(job))
    elif isinstance(job, LintJob):
        # a lint pricing its findings on this CPU measures it with the warm parent's threads, as `time --cpu` does
        threads = (parent_threads or _threads()) if job.cost_cpu else None
        result, imported = _target_job(job.target, connection, lambda: _lint(job, connection, threads), job.debug)
        connection.send(Linted(result, imported))
    else:
        from graphlint.run.graph_and_memory import graph_report, memory_estimate
        from graphlint.run.step_time import time_estimate

        if isinstance(job, (MemoryJob, TimeJob)) and job.threads == PARENT_THREADS:
            job = dataclasses.replace(job, threads=parent_threads or _threads())
        run = graph_report if isinstance(job, GraphJob) else time_estimate if isinstance(job, TimeJob) \
            else memory_estimate
        answer, imported = _target_job(job.target, connection, lambda: run(job), job.debug)
        answer = answer if isinstance(answer, Reported) else Reported(answer)
        connection.send(dataclasses.replace(answer, imported=imported))
    connection.close()


def _threads() -> int:
    """This process's thread count: a spawned child's is what torch gives a new process, as the warm parent's."""
    import torch

    return torch.get_num_threads()


def _target_job(target: str, connection, run: Callable[[], object],
                debug: bool = False) -> tuple[object, tuple[str, ...]]:
    """Run a job of one target of the user's (`run()`'s answer, or the target's result with its error when the
    user's code called sys.exit or graphlint's own code raised past the stages' handlers), telling the parent each
    stage it reaches; and the modules it imported that the parent may preload (_preloadable)."""
    # A model file that parses arguments at import (argparse with defaults) sees its own name, not graphlint's
    # command line.
    sys.argv = [script_name(target)]
    mark, before = newest(), len(sys.modules)  # not a set of sys.modules: that touches, so copies, every module
    last = ["import"]

    def tell(stage: str) -> None:
        last[0] = stage
        connection.send(Stage(stage))

    stages.listen(tell)
    try:
        answer = run()
    except SystemExit as leaving:  # sys.exit() in the user's code (argparse at module level, often)
        answer = TargetResult(target=target, errors=[TargetError(target, _exited(leaving, last[0]), stage=last[0])])
    except Exception as error:  # the stages turn the user's errors into the target's: what gets here is graphlint's
        if debug:
            traceback.print_exc()
        answer = TargetResult(target=target, errors=[TargetError(
            target, f"internal error in graphlint during the {last[0]} ({one_line(error)}); please report it with the "
                    "output of --debug", stage=last[0])])
    added = imported_since(mark, before)  # None: every module is named, and the parent skips those it has
    return answer, tuple(_preloadable(set(sys.modules) if added is None else {name for name, _ in added}))


def _lint(job: LintJob, connection, cpu_threads: int | None = None) -> TargetResult:
    """Lint the job's target; `cpu_threads`, the threads its findings are priced on this CPU with (job.cost_cpu)."""
    from pathlib import Path

    with long_lived():  # a spawned child imports these itself; a forked one has them already
        from graphlint.engine import load_rules
        from graphlint.locate.place import Locator
        from graphlint.pipeline import lint_target

    rules = tuple(rule for rule in load_rules() if rule.id in set(job.rules))

    def early(result: TargetResult) -> None:
        connection.send(Partial(result))
        _lower_priority()

    return lint_target(job.target, Path(job.base), Locator(job.project(), job.debug), rules, job.device, job.debug,
                       job.vary, job.memory_budget, job.compile_memo, early if job.partial else None,
                       job.cost_gpu, cpu_threads)


# The torch.compile analysis after an early result is background work: the server publishing that result comes first.
COMPILE_STAGE_NICENESS = 10


def _lower_priority() -> None:
    try:
        os.nice(COMPILE_STAGE_NICENESS)
    except (AttributeError, OSError):  # no os.nice on Windows; a refused change leaves the priority as it was
        pass


def _prove(job: ProofJob) -> Proved:
    """One side of a proof, in the tree's folder, with the tree's files first on sys.path and the parent's
    working directory off it (the tree's files must not be shadowed by the originals they were copied from)."""
    cwd = os.getcwd()
    sys.path[:] = [p for p in sys.path if p not in ("", cwd)]
    os.chdir(job.base)
    quiet = os.open(os.devnull, os.O_WRONLY)  # the model's prints and warnings are not the proof's business
    os.dup2(quiet, 1)
    os.dup2(quiet, 2)
    warnings.simplefilter("ignore")
    try:
        from graphlint.run.proof import main

        main(job.arguments)
    except (Exception, SystemExit) as error:  # the tree cannot be built or run: the proof fails with why
        return Proved(one_line(error))
    return Proved()


def _exited(leaving: SystemExit, stage: str) -> str:
    code = leaving.code if leaving.code is not None else 0
    advice = ("guard a script's own code with `if __name__ == \"__main__\":` so that importing it does not run it"
              if stage == "import" else "a model's code must return, not exit the process")
    return f"the target called sys.exit({code!r}) during the {stage}; {advice}"


def _preloadable(names: set[str]) -> list[str]:
    """Among newly imported modules, those a warm parent may import before its next child: graphlint's own, each by
    name (locating a finding imports its span finder and rewriting modules, which no library's top-level import
    brings), and the top-level names of installed libraries (never their submodules: one the target's forward
    imported ran under the capture's state, and imported again in the parent it could hold other values, such as a
    tensor made at import on the CPU instead of meta); never the project's files."""
    found = set()
    for name in names:
        path = module_file(sys.modules.get(name))
        if not isinstance(path, str):
            continue
        if name.startswith("graphlint.") or ("." not in name and not name.startswith("_") and is_installed_file(path)):
            found.add(name)
    return sorted(found)
