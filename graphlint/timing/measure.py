"""A target's training step, timed: the step `graphlint memory` runs (graphlint.memory.measure, with its request:
optimizer, autocast, input sizes, the device the step is meant for), recorded op by op and priced on a device."""

from __future__ import annotations

from pathlib import Path

from graphlint.memory.measure import Request, measure
from graphlint.timing.devices import Accelerator, CpuPeaks
from graphlint.timing.record import OpRecord, OpRecorder
from graphlint.timing.roofline import StepTime, price


def record_step(text: str, base: Path, request: Request,
                pythonpath: tuple[Path, ...] | list[Path] = ()) -> tuple[list[OpRecord], object]:
    """Every op of the target's step, and the step's memory estimate (its sizes and notes); a problem with the
    target or the request raises graphlint.errors.TargetFailure."""
    recorder = OpRecorder()
    estimate = measure(text, base, request, pythonpath, observer=recorder)
    return recorder.records, estimate


def time_step(text: str, base: Path, request: Request, device: Accelerator | CpuPeaks,
              pythonpath: tuple[Path, ...] | list[Path] = ()) -> tuple[StepTime, list[OpRecord]]:
    """The step's time on `device`, and the records it was priced from."""
    records, estimate = record_step(text, base, request, pythonpath)
    result = price(records, device, text)
    result.optimizer, result.train_on, result.autocast = request.optimizer, request.train_on, request.autocast
    result.batch, result.seq = estimate.batch, estimate.seq
    result.notes = list(estimate.notes)
    return result, records
