"""`graphlint memory`'s report: in text, the peak and its parts as a table, then a bar per module; in JSON, each
estimate's documented shape (docs/memory.md)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from graphlint.sizes import format_bytes

if TYPE_CHECKING:  # an estimate from the result cache is rendered without torch
    from graphlint.memory.estimate import MemoryEstimate

BAR = 30
MODULE_LINES = 25


def distributed_lines(info: dict) -> list[str]:
    """The rank's view: the strategy, and the peak by what distribution makes of its bytes."""
    if info["strategy"] == "fsdp":
        how = (f"FSDP2 over {info['world_size']} ranks, fully_shard on {len(info['sharded_modules']) - 1} blocks "
               f"and the root, "
               + ("reshard_after_forward left to fully_shard (every block but the root)"
                  if info["reshard_after_forward"] is None else f"reshard_after_forward={info['reshard_after_forward']}")
               + (", bfloat16 parameters with float32 reduction" if info["mixed_precision"] == "bf16" else ""))
    else:
        how = (f"DDP over {info['world_size']} ranks, buckets of {info['bucket_cap_mb']:g} MiB "
               f"({format_bytes(info['bucket_bytes'])} in all)")
    lines = ["", f"  one rank of {how}; at the peak:"]
    for role, size in info["at_peak_by_role"].items():
        lines.append(f"  {role:<26}{format_bytes(size):>12}")
    return lines


def render_memory(results: list[MemoryEstimate], format: str) -> str:
    """The command's output for these estimates, in one of graphlint.report.MEMORY_FORMATS."""
    if format == "json":
        return json.dumps([r.to_dict() for r in results], indent=2, ensure_ascii=False) + "\n"
    return "\n".join(render_memory_text(r) for r in results)


def render_memory_text(result: MemoryEstimate) -> str:
    """A person's view of one estimate."""
    sizes = ", ".join(f"{name} {value}" for name, value in (("batch", result.batch), ("seq", result.seq))
                      if value is not None)
    lines = [f"{result.target}: peak {format_bytes(result.peak_bytes)} of one training step "
             f"({result.optimizer}{', ' + sizes if sizes else ''}), during the {result.peak_phase}"
             + (f" ({result.peak_during})" if result.peak_during else "")]
    lines.append("  the loop " + ("holds the output and loss until after optimizer.step() (--release-output: a loop "
                                  "that keeps only the loss)" if result.output_held else
                                  "keeps only the loss: the output is freed before backward (--release-output)"))
    lines.append("")
    lines.append(f"  {'at the peak':<18}{'bytes':>12}")
    for kind, size in result.at_peak.items():
        lines.append(f"  {kind:<18}{format_bytes(size):>12}")
    lines.append(f"  {'total':<18}{format_bytes(result.peak_bytes):>12}")
    if result.distributed:
        lines.extend(distributed_lines(result.distributed))
    lines.append("")
    lines.append(f"  parameters {format_bytes(result.parameter_bytes)}, gradients {format_bytes(result.gradient_bytes)}, "
                 f"optimizer state {format_bytes(result.optimizer_state_bytes)}, inputs {format_bytes(result.input_bytes)}")
    lines.append(f"  kept for backward at the end of the forward: {format_bytes(result.activation_bytes)}")
    if result.saved_by_module:
        lines.append("")
        lines.append("  kept for backward, by module:")
        top = max(line.bytes for line in result.saved_by_module) or 1
        shown = result.saved_by_module[:MODULE_LINES]
        width = max(len("  " * line.depth + line.path + (f" ×{line.count}" if line.count > 1 else ""))
                    for line in shown)
        for line in shown:
            name = "  " * line.depth + line.path + (f" ×{line.count}" if line.count > 1 else "")
            bar = "█" * max(1, round(BAR * line.bytes / top)) if line.bytes else ""
            lines.append(f"    {name:<{width}}  {format_bytes(line.bytes):>10}  {bar}")
        if len(result.saved_by_module) > MODULE_LINES:
            lines.append(f"    … {len(result.saved_by_module) - MODULE_LINES} more")
    for title, table in (("by dtype", result.saved_by_dtype), ("by autograd node", result.saved_by_category)):
        if table:
            lines.append(f"  kept for backward, {title}: "
                         + ", ".join(f"{name} {format_bytes(size)}" for name, size in table.items()))
    if result.alive_at_peak:
        lines.append("")
        lines.append("  largest blocks alive at the peak:")
        for block in result.alive_at_peak:
            where = f" in {block['module']}" if block["module"] else ""
            lines.append(f"    {format_bytes(block['bytes']):>10}  {block['kind']:<16} {block['dtype']}"
                         f"{block['shape']} by {block['op'] or 'the model'}{where}")
    if result.device_memory is not None:
        lines.append("")
        verdict = "fits in" if result.fits else "does not fit in"
        lines.append(f"  {verdict} {format_bytes(result.device_memory)}"
                     + (f"; the largest batch that fits: {result.largest_batch}" if result.largest_batch is not None
                        else ""))
    for note in result.notes:
        lines.append(f"  note: {note}")
    return "\n".join(lines) + "\n"
