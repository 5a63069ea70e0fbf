"""What a child runs for `graphlint time` (graphlint.run.wire's `TimeJob`): one target's training step, recorded
op by op and priced on the job's device (graphlint.timing), answered as plain data with the target's result: its
errors and notes, and the files and libraries the answer depends on, for the result cache."""

from __future__ import annotations

import dataclasses
import traceback
from pathlib import Path

from graphlint.errors import GraphlintError
from graphlint.results import TargetError, TargetResult, json_ready
from graphlint.run.wire import Reported, TimeJob
from graphlint.stages import reached

# graphlint.timing reports no stages of its own: a child that dies is said to have died during this.
TIMING_STAGE = "timing"


def time_estimate(job: TimeJob) -> Reported:
    """Time the target's step as the job asks; a problem with the target or the request is the target's error, as
    is an internal error (one line, with its traceback under --debug)."""
    from graphlint.pipeline import depends_on
    from graphlint.target import TargetSpec, add_target_folders
    from graphlint.timing.devices import accelerator, cpu_peaks
    from graphlint.timing.measure import time_step

    reached(TIMING_STAGE)
    result = TargetResult(target=job.target)
    project = job.project()
    try:
        device = accelerator(job.gpu) if job.gpu is not None else cpu_peaks(job.threads)
        step, _ = time_step(job.target, Path(job.base), job.request, device, project.pythonpath)
    except GraphlintError as error:
        result.errors.append(TargetError(job.target, str(error)))
        return Reported(result)
    except Exception as error:  # a bug in graphlint: one line, and the other targets go on
        if job.debug:
            traceback.print_exc()
        result.errors.append(TargetError(job.target, f"internal error in graphlint while timing "
                                                     f"({type(error).__name__}: {error}); please report it with the "
                                                     "output of --debug"))
        return Reported(result)
    spec = TargetSpec.parse(job.target, Path(job.base))
    if spec.file is not None:
        add_target_folders(project, spec)
    result.inputs, result.libraries = depends_on(project, spec)
    return Reported(result, json_ready(dataclasses.asdict(step)))


def step_time_from_wire(data: dict):
    """The StepTime that `time_estimate` sent; KeyError, TypeError or ValueError when `data` is not one."""
    from graphlint.timing.roofline import LineTime, StepTime

    return StepTime(**{**data, "lines": [LineTime(**line) for line in data["lines"]]})
