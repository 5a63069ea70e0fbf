"""What a child runs for `graphlint time` (graphlint.run.wire's `TimeJob`): one target's training step, recorded
op by op and priced on the job's device (graphlint.timing), answered as plain data with the target's result: its
errors and notes, and the files and libraries the answer depends on, for the result cache."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from graphlint.results import json_ready
from graphlint.run.graph_and_memory import step_answer
from graphlint.run.wire import Reported, TimeJob

# graphlint.timing reports no stages of its own: a child that dies is said to have died during this.
TIMING_STAGE = "timing"


def time_estimate(job: TimeJob) -> Reported:
    """Time the target's step as the job asks (see graphlint.run.graph_and_memory.step_answer)."""
    from graphlint.timing.devices import accelerator, cpu_peaks
    from graphlint.timing.measure import time_step

    def timed(project):
        device = accelerator(job.gpu) if job.gpu is not None else cpu_peaks(job.threads)
        return time_step(job.target, Path(job.base), job.request, device, project.pythonpath)[0]

    result, step = step_answer(job, TIMING_STAGE, "timing", timed)
    if step is None:
        return Reported(result)
    return Reported(result, json_ready(dataclasses.asdict(step)))


def step_time_from_wire(data: dict):
    """The StepTime that `time_estimate` sent; KeyError, TypeError or ValueError when `data` is not one."""
    from graphlint.timing.roofline import LineTime, StepTime

    return StepTime(**{**data, "lines": [LineTime(**line) for line in data["lines"]]})
