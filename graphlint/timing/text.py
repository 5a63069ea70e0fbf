"""`graphlint time`'s text report: the step's seconds by phase, its FLOPs and bytes, the memory-bound share and
the implied MFU, then the source lines that take the most time."""

from __future__ import annotations

import linecache
import os

from graphlint.sizes import format_bytes
from graphlint.timing.phases import PHASES
from graphlint.timing.roofline import TOP_LINES, StepTime


def format_seconds(seconds: float) -> str:
    """3.1 ms, 850 µs, 1.42 s."""
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} µs"


def format_flops(flops: float) -> str:
    """6.37 GFLOP, 1.2 TFLOP."""
    for unit, size in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if flops >= size:
            return f"{flops / size:.3g} {unit}"
    return f"{flops:.0f} FLOP"


def _where(file: str, line: int) -> str:
    try:
        relative = os.path.relpath(file)
    except ValueError:  # another drive
        relative = file
    return f"{file if relative.startswith('..') else relative}:{line}"


def render_time_text(step: StepTime, top: int = TOP_LINES) -> str:
    """A person's view of one step's time."""
    sizes = ", ".join(f"{name} {value}" for name, value in (("batch", step.batch), ("seq", step.seq))
                      if value is not None)
    how = ", ".join(part for part in (step.optimizer, f"autocast {step.autocast}" if step.autocast else "", sizes)
                    if part)
    lines = [f"{step.target}: {format_seconds(step.seconds)} per training step on {step.device} ({how})", ""]
    for phase in PHASES:
        share = step.phases[phase] / step.seconds if step.seconds else 0.0
        lines.append(f"  {phase:<10}{format_seconds(step.phases[phase]):>10}{share:>6.0%}"
                     f"{format_flops(step.phase_flops[phase]):>14}")
    lines.append("")
    lines.append(f"  {format_flops(step.flops)}, {format_bytes(step.bytes)} read and written, {step.ops} ops; "
                 f"memory-bound ops take {step.memory_bound_share:.0%} of the time, launches "
                 f"{step.overhead_seconds / step.seconds if step.seconds else 0:.0%}")
    lines.append(f"  implied MFU {step.mfu:.1%} (of {format_flops(step.mfu_peak)}/s)")
    if step.recompute_seconds:
        lines.append(f"  recomputation under activation checkpointing: {format_seconds(step.recompute_seconds)}")
    if step.lines:
        lines.append("")
        lines.append("  the lines that take the most time:")
        shown = step.lines[:top]
        places = [_where(line.file, line.line) for line in shown]
        width = max(len(place) for place in places)
        for place, line in zip(places, shown, strict=True):
            share = line.seconds / step.seconds if step.seconds else 0.0
            bound = line.memory_bound_seconds / line.seconds if line.seconds else 0.0
            code = linecache.getline(line.file, line.line).strip()
            code = code if len(code) <= 48 else code[:47] + "…"
            lines.append(f"    {place:<{width}}  {format_seconds(line.seconds):>9}{share:>5.0%}  "
                         f"{format_flops(line.flops):>11}  memory-bound {bound:>4.0%}  {code}".rstrip())
    if step.unplaced_seconds:
        lines.append(f"    no source line (the optimizer's loops, gradient accumulation): "
                     f"{format_seconds(step.unplaced_seconds)}")
    lines.append("")
    lines.append(f"  figures: {step.device_source}")
    lines.extend(f"  note: {note}" for note in step.notes)
    return "\n".join(lines) + "\n"
