"""Seconds per op and per step: a roofline per op, max(FLOPs / compute peak, bytes / bandwidth), plus a fixed cost.

On a GPU of the table (graphlint.timing.devices.ACCELERATORS) the peaks are the datasheet's, scaled by a share per
op class (GPU_EFFICIENCY), and every op that runs a kernel pays one launch (GPU_LAUNCH). On this machine's CPU the
peaks are those measured at the op's own size (a small product reaches less of the peak than a large one; a copy
that fits in cache runs faster than one that does not); every op pays the fixed cost measured for an op of its
phase (a view that of a view; an op a recurrent layer's C++ loop issues that of such ops), and each phase its own
once per step. An op whose call was timed on this CPU (graphlint.timing.replay) costs that time instead of its
roofline, less the cheapest call's (which the fixed cost already counts).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from graphlint.timing.devices import GPU_EFFICIENCY, GPU_LAUNCH, Accelerator, CpuPeaks
from graphlint.timing.phases import PHASES

if TYPE_CHECKING:
    from graphlint.timing.record import OpRecord

TOP_LINES = 10


def op_seconds(record: OpRecord, device: Accelerator | CpuPeaks) -> tuple[float, bool]:
    """The op's estimated seconds on `device`, and whether its bytes, not its FLOPs, bound it; on this machine's
    CPU, a record whose call was timed there costs that time (OpRecord.timed) beside its fixed cost."""
    if isinstance(device, CpuPeaks):
        if record.kind == "view":
            return fixed_cost(record, device), False
        direction = "backward" if "backward" in record.op else "forward"
        compute = (record.flops / device.flops_at(record.dtype, record.flops, record.kind, direction)
                   if record.flops else 0.0)
        if record.work_flops:
            compute += record.work_flops / device.flops_at(record.dtype, record.work_grain or record.work_flops,
                                                           "recurrent", direction)
        transfer = record.bytes / device.bandwidth_at(record.bytes) if record.bytes else 0.0
        kernel = max(compute, transfer) if record.timed is None else record.timed
        return kernel + fixed_cost(record, device), transfer >= compute
    if record.kind == "view":
        return 0.0, False
    work = record.flops + record.work_flops
    compute = work / (device.peak(record.dtype, record.kind) * GPU_EFFICIENCY[record.kind]) if work else 0.0
    transfer = record.bytes / (device.bandwidth * GPU_EFFICIENCY["memory"])
    return max(compute, transfer) + GPU_LAUNCH, transfer >= compute


def fixed_cost(record: OpRecord, device: Accelerator | CpuPeaks) -> float:
    """What the op pays beyond its kernel: a launch on a GPU; on this CPU its probed host seconds (HostProbe,
    scaled), else the fixed cost of an op of its phase (of a view, of a recurrent loop's op)."""
    if not isinstance(device, CpuPeaks):
        return GPU_LAUNCH
    if record.host is not None and device.host_scale:
        return record.host * device.host_scale  # the forward's own Python, probed (HostProbe)
    if record.kind == "view":
        return device.view
    native = device.native.get(record.phase) if record.native else None
    return native if native is not None else device.launch[record.phase]


@dataclass
class LineTime:
    """What the ops of one source line cost in the step (every pass of a loop, every layer, both directions)."""

    file: str
    line: int
    seconds: float
    flops: int
    bytes: int
    ops: int
    memory_bound_seconds: float

    def to_dict(self) -> dict:
        return {"file": self.file, "line": self.line, "seconds": self.seconds, "flops": self.flops,
                "bytes": self.bytes, "ops": self.ops, "memory_bound_seconds": self.memory_bound_seconds}


@dataclass
class StepTime:
    """One training step priced on one device."""

    target: str
    device: str  # the device's label ("NVIDIA H100 SXM5 80GB", or the CPU's model)
    device_source: str
    flops: int
    bytes: int
    seconds: float
    phases: dict[str, float]  # seconds per phase (PHASES)
    phase_flops: dict[str, int]
    memory_bound_seconds: float
    recompute_seconds: float
    overhead_seconds: float  # the launches' share of `seconds`
    ops: int
    mfu: float  # model FLOPs utilisation: flops / (seconds * the peak of the dtype most FLOPs ran in)
    mfu_peak: float  # that peak, FLOP/s
    lines: list[LineTime] = field(default_factory=list)  # every line, most seconds first
    unplaced_seconds: float = 0.0  # ops that belong to no source line (the optimizer's loops, gradient sums)
    optimizer: str = ""
    train_on: str = ""
    autocast: str | None = None
    batch: int | None = None
    seq: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def memory_bound_share(self) -> float:
        return self.memory_bound_seconds / self.seconds if self.seconds else 0.0

    def to_dict(self, top: int | None = TOP_LINES) -> dict:
        """The documented JSON shape (docs/time.md); `top`: how many lines (None: all)."""
        return {
            "target": self.target, "device": self.device, "device_source": self.device_source,
            "flops": self.flops, "seconds": self.seconds, "bytes": self.bytes,
            "phases": {name: {"seconds": self.phases[name], "flops": self.phase_flops[name]} for name in PHASES},
            "memory_bound_share": self.memory_bound_share, "recompute_seconds": self.recompute_seconds,
            "overhead_seconds": self.overhead_seconds, "ops": self.ops, "mfu": self.mfu, "mfu_peak": self.mfu_peak,
            "lines": [line.to_dict() for line in (self.lines if top is None else self.lines[:top])],
            "unplaced_seconds": self.unplaced_seconds, "optimizer": self.optimizer, "train_on": self.train_on,
            "autocast": self.autocast, "batch": self.batch, "seq": self.seq, "notes": list(self.notes),
        }


def price(records: list[OpRecord], device: Accelerator | CpuPeaks, target: str = "", parameters: int = 0) -> StepTime:
    """The step's time on `device`, op by op, summed per phase and per source line; `parameters`, the tensors the
    optimizer updates, whose gradients the loop's zero_grad drops (host time on a CPU, in the optimizer phase)."""
    phases = dict.fromkeys(PHASES, 0.0)
    phase_flops = dict.fromkeys(PHASES, 0)
    flops_by_dtype: dict[str, int] = defaultdict(int)
    lines: dict[tuple[str, int], list] = {}
    total = bound = recompute = overhead = unplaced = 0.0
    for record in records:
        seconds, memory_bound = op_seconds(record, device)
        total += seconds
        phases[record.phase] += seconds
        phase_flops[record.phase] += record.flops
        if record.flops:
            flops_by_dtype[record.dtype] += record.flops
        if memory_bound and record.kind != "view":
            bound += seconds
        if record.recompute:
            recompute += seconds
        if record.kind != "view":
            overhead += fixed_cost(record, device)
        elif isinstance(device, CpuPeaks):
            overhead += seconds
        if record.file is None:
            unplaced += seconds
            continue
        entry = lines.setdefault((record.file, record.line), [0.0, 0, 0, 0, 0.0])
        entry[0] += seconds
        entry[1] += record.flops
        entry[2] += record.bytes
        entry[3] += 1
        if memory_bound and record.kind != "view":
            entry[4] += seconds
    if isinstance(device, CpuPeaks):
        # each phase the step runs pays its fixed cost once (autograd's engine starting, optimizer.step()'s checks)
        probed = device.host_scale and any(record.host is not None for record in records)
        for phase in {record.phase for record in records}:
            if phase == "forward" and probed:
                continue  # the probe timed the forward's whole host side, its start and end included
            once = device.per_phase.get(phase, 0.0) + (device.zero_grad * parameters if phase == "optimizer" else 0.0)
            phases[phase] += once
            total += once
            overhead += once
            unplaced += once
    flops = sum(phase_flops.values())
    dominant = max(flops_by_dtype, key=flops_by_dtype.get) if flops_by_dtype else "float32"
    if isinstance(device, CpuPeaks):
        curve = device.matmul.get(dominant) or device.matmul["float32"]
        peak = max(rate for _, rate in curve)
        label, source = device.label, f"measured on this machine ({device.threads} threads)"
    else:
        peak = device.peak(dominant, "matmul")
        label, source = device.label, device.source
    ranked = sorted((LineTime(file, line, *values) for (file, line), values in lines.items()),
                    key=lambda line: -line.seconds)
    return StepTime(target, label, source, flops, sum(r.bytes for r in records), total, phases, phase_flops,
                    bound, recompute, overhead, len(records), flops / (total * peak) if total and peak else 0.0,
                    peak, ranked, unplaced)
