"""What a child runs for `graphlint graph` and `graphlint memory` (graphlint.run.wire's `GraphJob` and
`MemoryJob`): the graph report of one target (graphlint.graph) or the estimate of one training step
(graphlint.memory.measure), each answered as plain data with the target's result: its errors and notes, and the
files and libraries the answer depends on, for the result cache. The parent renders the data as the command asks.
"""

from __future__ import annotations

import dataclasses
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from graphlint.errors import GraphlintError
from graphlint.results import TargetError, TargetResult, json_ready
from graphlint.run.wire import GraphJob, MemoryJob, Reported, TimeJob
from graphlint.stages import reached

if TYPE_CHECKING:
    from graphlint.project import Project

T = TypeVar("T")

# graphlint.memory.measure reports no stages of its own: a memory child that dies is said to have died during this.
MEASUREMENT_STAGE = "measurement"


def graph_report(job: GraphJob) -> Reported:
    """Capture the target and describe its autograd graph; with `job.vary`, capture it again with that input
    dimension doubled, on the device of the first capture (so that only the input size differs), and compare."""
    from graphlint.graph import describe, input_size, saved_activations, vary_inputs
    from graphlint.locate.place import Locator
    from graphlint.pipeline import capture_one

    locator = Locator(job.project())
    result, capture = capture_one(job.target, Path(job.base), locator, job.device, job.debug)
    if capture is None:
        return Reported(result)
    report = describe(capture, locator)
    if job.vary:
        varied, bigger = capture_one(job.target, Path(job.base), locator, capture.device, job.debug,
                                     vary_inputs(job.vary))
        if bigger is None:
            result.errors.extend(dataclasses.replace(error, target=f"{error.target} with a larger {job.vary}")
                                 for error in varied.errors)
            return Reported(result)
        bigger_saved = sum(saved.storage_nbytes for _, saved in saved_activations(bigger))
        report.sizes = [(f"{job.vary} {input_size(capture, job.vary)}", report.total, report.saved_bytes),
                        (f"{job.vary} {input_size(bigger, job.vary)}", len(bigger.autograd.nodes), bigger_saved)]
    return Reported(result, report.to_wire())


def memory_estimate(job: MemoryJob) -> Reported:
    """Measure the target's training step as the job asks (see `step_answer`)."""
    from graphlint.memory.kernels import probe_threads
    from graphlint.memory.measure import measure

    def measured(project):
        with probe_threads(job.threads):
            return measure(job.target, Path(job.base), job.request, project.pythonpath)

    result, estimate = step_answer(job, MEASUREMENT_STAGE, "measuring", measured)
    if estimate is None:
        return Reported(result)
    result.device = estimate.device
    return Reported(result, estimate_to_wire(estimate))


def step_answer(job: MemoryJob | TimeJob, stage: str, doing: str, run: Callable[[Project], T]) -> \
        tuple[TargetResult, T | None]:
    """The child's side of a job on the target's training step (`memory`, `time`): `run(project)` under `stage`.
    A problem with the target or the request is the target's error, as is an internal error (one line saying
    what graphlint was `doing`, its traceback under --debug): then (the result, None). Else (the result, with the
    files and libraries the answer depends on for the result cache, the answer)."""
    from graphlint.pipeline import depends_on
    from graphlint.target import TargetSpec, add_target_folders

    reached(stage)
    result = TargetResult(target=job.target)
    project = job.project()
    try:
        answer = run(project)
    except GraphlintError as error:
        result.errors.append(TargetError(job.target, str(error)))
        return result, None
    except Exception as error:  # a bug in graphlint: one line, and the other targets go on
        if job.debug:
            traceback.print_exc()
        result.errors.append(TargetError(job.target, f"internal error in graphlint while {doing} "
                                                     f"({type(error).__name__}: {error}); please report it with the "
                                                     "output of --debug"))
        return result, None
    spec = TargetSpec.parse(job.target, Path(job.base))
    if spec.file is not None:
        add_target_folders(project, spec)
    result.inputs, result.libraries = depends_on(project, spec)
    return result, answer


def estimate_to_wire(estimate) -> dict:
    """A graphlint.memory.estimate.MemoryEstimate as JSON-ready data, field by field, that `estimate_from_wire`
    rebuilds as it was (its `to_dict` is the documented JSON shape, which a text report cannot be made from)."""
    return json_ready(dataclasses.asdict(estimate))


def estimate_from_wire(data: dict):
    """The MemoryEstimate that `estimate_to_wire` made; KeyError, TypeError or ValueError when `data` is not one."""
    from graphlint.memory.estimate import MemoryEstimate, ModuleLine

    return MemoryEstimate(**{**data, "saved_by_module": [ModuleLine(**line) for line in data["saved_by_module"]]})
