"""What travels between the warm parent and its children: typed jobs one way, typed messages the other.

A job is plain data (strings, numbers, tuples) so that a spawned child can receive it as well as a forked one.
`LintJob` lints one target (graphlint.run.child); `ProofJob` runs one side of a fix's proof
(graphlint.run.proof); `GraphJob` and `MemoryJob` make `graphlint graph`'s report and `graphlint memory`'s
estimate of one target (graphlint.run.graph_and_memory), `TimeJob` `graphlint time`'s
(graphlint.run.step_time). A child sends `Stage` messages as it goes, then exactly
one `Linted`, `Proved` or `Reported`; one that exits without it has died, and the scheduler says how, with the
last stage it saw. A lint job that asks for it (`LintJob.partial`, the language server's) also sends one
`Partial` before the torch.compile analysis.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from graphlint.memory.request import Request
from graphlint.project import Project
from graphlint.results import TargetResult


@dataclass(frozen=True)
class LintJob:
    """Lint one target of a project with these rules."""

    target: str
    base: str  # the folder relative target paths are read from
    root: str  # the project's root
    first_party_folders: tuple[str, ...]
    device: str
    rules: tuple[str, ...]  # rule IDs
    debug: bool = False
    vary: tuple[str, ...] = ("batch",)  # the input dimensions the torch.compile analysis grows (GL302)
    memory_budget: int | None = None  # bytes a training step may peak at (GL401)
    pythonpath: tuple[str, ...] = ()  # the folders the target imports from (graphlint.project)
    compile_memo: str = ""  # the folder of torch.compile analyses kept across runs; "": none (--no-cache)
    partial: bool = False  # send the other rules' findings (`Partial`) before the torch.compile analysis
    cost_gpu: str | None = None  # price the findings' time per step on this GPU (graphlint.costs); None: no cost
    cost_cpu: str = ""  # or on this machine's CPU, named by its model (graphlint.timing.devices.cpu_label); "": not

    @classmethod
    def of(cls, target: str, base: Path, project: Project, device: str, rules: tuple[str, ...],
           debug: bool = False, vary: tuple[str, ...] = ("batch",), memory_budget: int | None = None,
           compile_memo: str = "", partial: bool = False, cost_gpu: str | None = None,
           cost_cpu: str = "") -> LintJob:
        return cls(target, str(base), str(project.root), tuple(str(f) for f in project.first_party_folders), device,
                   tuple(rules), debug, tuple(vary), memory_budget, tuple(str(f) for f in project.pythonpath),
                   compile_memo, partial, cost_gpu, cost_cpu)

    def project(self) -> Project:
        return _project(self)


def _folders(project: Project) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """The project as a job carries it: its root, first-party folders and import folders."""
    return (str(project.root), tuple(str(f) for f in project.first_party_folders),
            tuple(str(f) for f in project.pythonpath))


def _project(job) -> Project:
    """The project as the run knows it (its configuration is not read again: only the folders matter)."""
    return Project(root=Path(job.root), first_party_folders=[Path(f) for f in job.first_party_folders],
                   pythonpath=[Path(f) for f in job.pythonpath])


@dataclass(frozen=True)
class ProofJob:
    """Build the target from one source tree and run it in float64: `save` what it computed to `record`, or
    `compare` it with the record and write the verdict (graphlint.run.proof)."""

    mode: str  # "save" or "compare"
    target: str
    base: str  # the tree's folder the target is read from; the child's working directory
    record: str
    verdict: str | None = None  # compare only: where the verdict goes
    pythonpath: tuple[str, ...] = ()  # the tree's folders the target imports from

    @property
    def arguments(self) -> list[str]:
        return [self.mode, self.target, self.base, self.record, self.verdict or "", *self.pythonpath]


@dataclass(frozen=True)
class GraphJob:
    """Capture one target and describe its autograd graph (`graphlint graph`); with `vary`, capture it again with
    that input dimension doubled and compare."""

    target: str
    base: str  # the folder relative target paths are read from
    root: str  # the project's root
    first_party_folders: tuple[str, ...]
    pythonpath: tuple[str, ...]
    device: str
    vary: str | None = None  # "batch" or "seq"
    debug: bool = False

    @classmethod
    def of(cls, target: str, base: Path, project: Project, device: str, vary: str | None = None,
           debug: bool = False) -> GraphJob:
        return cls(target, str(base), *_folders(project), device, vary, debug)

    def project(self) -> Project:
        return _project(self)


@dataclass(frozen=True)
class MemoryJob:
    """Measure one training step of one target (`graphlint memory`) as `request` asks (graphlint.memory.request,
    plain frozen data that reaches the step unchanged)."""

    target: str
    base: str
    root: str
    first_party_folders: tuple[str, ...]
    pythonpath: tuple[str, ...]
    request: Request = Request()
    # The threads CPU kernels are measured with (graphlint.memory.kernels.probe_threads); None: the child's, one in
    # a forked child (graphlint.run.parent), since a parent that ran parallel CPU work would hang it with more;
    # PARENT_THREADS: as many as torch gives the warm parent, read in the child (the command imports no torch).
    threads: int | str | None = None
    debug: bool = False

    @classmethod
    def of(cls, target: str, base: Path, project: Project, request: Request | None = None,
           threads: int | str | None = None, debug: bool = False) -> MemoryJob:
        """The job of one target (default: `Request()`)."""
        return cls(target, str(base), *_folders(project), request or Request(), threads, debug)

    def project(self) -> Project:
        return _project(self)


@dataclass(frozen=True)
class TimeJob:
    """Time one training step of one target (`graphlint time`): the step as `request` asks, as memory's
    (graphlint.memory.request), and the device it is priced on: `gpu`, a row of
    graphlint.timing.devices.ACCELERATORS, or this machine's CPU when `gpu` is None."""

    target: str
    base: str
    root: str
    first_party_folders: tuple[str, ...]
    pythonpath: tuple[str, ...]
    request: Request = Request()
    gpu: str | None = None
    threads: int | str | None = None  # the CPU's threads, which its measured peaks are for (MemoryJob.threads)
    cpu: str = ""  # the CPU's model when it is priced: its peaks, measured once, belong to it
    debug: bool = False

    @classmethod
    def of(cls, target: str, base: Path, project: Project, request: Request | None = None, gpu: str | None = None,
           threads: int | str | None = None, cpu: str = "", debug: bool = False) -> TimeJob:
        """The job of one target (default: `Request()`)."""
        return cls(target, str(base), *_folders(project), request or Request(), gpu, threads, cpu, debug)

    def project(self) -> Project:
        return _project(self)


Job = LintJob | ProofJob | GraphJob | MemoryJob | TimeJob

# MemoryJob.threads, TimeJob.threads: the warm parent's thread count, which torch sets at its import from what
# `thread_settings` reads.
PARENT_THREADS = "parent"


def thread_settings() -> dict[str, object]:
    """What torch's thread count in a new process follows (the OpenMP and MKL variables, the CPUs and those this
    process may run on), read without torch: a memory job's key in place of PARENT_THREADS."""
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        usable = None
    return {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "MKL_NUM_THREADS": os.environ.get("MKL_NUM_THREADS"),
            "cpus": os.cpu_count(), "usable": usable}


@dataclass(frozen=True)
class Launch:
    """How the parent wants a child to start, beside its job."""

    single_threaded: bool = False  # CPU ops on one thread (a forked child cannot use the parent's OpenMP pool)
    close_fds: tuple[int, ...] = ()  # the parent's descriptors that are none of the job's business


@dataclass(frozen=True)
class Stage:
    """The child reached this stage (graphlint.stages)."""

    name: str


@dataclass(frozen=True)
class Linted:
    """A lint job's result, and the modules of graphlint's and of installed libraries it imported (for the parent to
    preload)."""

    result: TargetResult
    imported: tuple[str, ...] = ()


@dataclass(frozen=True)
class Partial:
    """A lint job's findings of every rule but those that need the torch.compile analysis, sent before that
    analysis starts; the job's `Linted` follows and replaces it (only it is ever kept in the result cache)."""

    result: TargetResult


@dataclass(frozen=True)
class Reported:
    """A graph or memory job's answer: the target's result (its errors, notes and the files it depends on, for the
    result cache) and the report as plain data (graphlint.run.graph_and_memory), None when the target failed."""

    result: TargetResult
    report: dict | None = None
    imported: tuple[str, ...] = ()  # graphlint's and libraries' modules it imported, for the parent to preload


@dataclass(frozen=True)
class Proved:
    """A proof job finished: None, or why the model could not be run (its last line of error)."""

    failure: str | None = None

