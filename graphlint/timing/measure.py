"""A target's training step, timed: the step `graphlint memory` runs (graphlint.memory.measure, with its request:
optimizer, autocast, input sizes, the device the step is meant for), recorded op by op and priced on a device."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from graphlint.memory.measure import Request, measure
from graphlint.timing.devices import Accelerator, CpuPeaks
from graphlint.timing.record import OpRecord, OpRecorder
from graphlint.timing.replay import timed_records
from graphlint.timing.roofline import StepTime, price


def record_step(text: str, base: Path, request: Request, pythonpath: tuple[Path, ...] | list[Path] = (),
                calls: bool = False) -> tuple[list[OpRecord], object]:
    """Every op of the target's step, and the step's memory estimate (its sizes and notes); a problem with the
    target or the request raises graphlint.errors.TargetFailure. With `calls`, each record keeps its call to be
    timed again (graphlint.timing.replay)."""
    recording = record(text, base, request, pythonpath, calls)
    return recording.records, recording.estimate


@dataclass
class Recording:
    """A step recorded: its ops, its memory estimate, and the parameters its optimizer updated."""

    records: list[OpRecord]
    estimate: object
    parameters: int


def record(text: str, base: Path, request: Request, pythonpath: tuple[Path, ...] | list[Path] = (),
           calls: bool = False) -> Recording:
    """The target's step recorded (see record_step)."""
    recorder = OpRecorder(calls=calls)
    estimate = measure(text, base, request, pythonpath, observer=recorder)
    return Recording(recorder.with_host(), estimate, recorder.parameters)


def time_step(text: str, base: Path, request: Request, device: Accelerator | CpuPeaks,
              pythonpath: tuple[Path, ...] | list[Path] = ()) -> tuple[StepTime, list[OpRecord]]:
    """The step's time on `device`, and the records it was priced from. On this machine's CPU (a CpuPeaks
    device), each op call is timed here (graphlint.timing.replay), and the roofline prices only what could not
    be."""
    on_cpu = isinstance(device, CpuPeaks)
    recording = record(text, base, request, pythonpath, on_cpu)
    records, estimate = recording.records, recording.estimate
    times = None
    if on_cpu:
        records, times = timed_records(records, device.threads)
    result = price(records, device, text, recording.parameters)
    result.optimizer, result.train_on, result.autocast = request.optimizer, request.train_on, request.autocast
    result.batch, result.seq = estimate.batch, estimate.seq
    result.notes = list(estimate.notes) + (device.notes() if on_cpu else []) + (times.notes() if times is not None else [])
    if times is not None and times.seconds:
        result.device_source += f"; {len(times.seconds)} distinct op calls timed on it"
    return result, records
