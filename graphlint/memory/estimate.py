"""The peak of a training step and what it is made of, read from a `StepTrace`.

The peak is the largest sum, over every moment of the step, of the bytes alive then; PyTorch's memory profiler
reads its timeline the same way (the sum of its categories at each timestamp). Besides the peak: the steady
parts (parameters, gradients, optimizer state), where in the step the peak falls, what is alive at it, and the
memory kept for backward at the end of the forward, by module (repeated blocks folded), by dtype and by the kind
of autograd node that keeps it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from graphlint.graph.categories import categorize
from graphlint.memory.choices import KINDS, PHASES

if TYPE_CHECKING:  # an estimate from the result cache is rendered without the step's recorder, and without torch
    from graphlint.memory.step import Block, StepTrace

TOP_ALIVE = 10


@dataclass
class ModuleLine:
    """Memory kept for backward under one module path; numbered paths of a repeated block are folded into one
    line with `count` (`h.*.attn`, count 12) and `bytes` is the sum over them."""

    path: str
    depth: int
    bytes: int
    count: int = 1


@dataclass
class MemoryEstimate:
    target: str
    device: str
    optimizer: str
    peak_bytes: int
    peak_phase: str  # one of PHASES
    peak_during: str  # the op or autograd node that was running at the peak
    at_peak: dict[str, int]  # kind -> bytes alive at the peak, for each of KINDS
    parameter_bytes: int
    gradient_bytes: int
    optimizer_state_bytes: int
    input_bytes: int
    activation_bytes: int  # alive at the end of the loss, kept into backward
    end_of_forward_bytes: int  # everything alive at the end of the loss
    saved_by_module: list[ModuleLine]
    saved_by_dtype: dict[str, int]
    saved_by_category: dict[str, int]
    alive_at_peak: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    batch: int | None = None  # the batch and sequence sizes of the inputs the step ran with (None: no such dim)
    seq: int | None = None
    device_memory: int | None = None  # --device-memory, when asked
    largest_batch: int | None = None  # the largest batch whose step fits it (0: not even batch 1)
    # Activation checkpointing of the largest stack of repeated blocks, estimated: {"blocks", "count",
    # "saves_bytes"}; None when the model has no such stack.
    checkpointing: dict | None = None
    distributed: dict | None = None  # --fsdp/--ddp: graphlint.memory.distributed.describe; None for one device
    output_held: bool = True  # the loop's convention: the output held to the end of the step (False: --release-output)

    @property
    def fits(self) -> bool | None:
        return None if self.device_memory is None else self.peak_bytes <= self.device_memory

    def to_dict(self) -> dict:
        """The documented JSON shape (docs/memory.md)."""
        return {
            "target": self.target,
            "device": self.device,
            "optimizer": self.optimizer,
            "batch": self.batch,
            "seq": self.seq,
            "peak_bytes": self.peak_bytes,
            "peak_phase": self.peak_phase,
            "peak_during": self.peak_during,
            "at_peak": dict(self.at_peak),
            "parameter_bytes": self.parameter_bytes,
            "gradient_bytes": self.gradient_bytes,
            "optimizer_state_bytes": self.optimizer_state_bytes,
            "input_bytes": self.input_bytes,
            "activation_bytes": self.activation_bytes,
            "end_of_forward_bytes": self.end_of_forward_bytes,
            "activations_by_module": [
                {"module": line.path, "depth": line.depth, "bytes": line.bytes, "count": line.count}
                for line in self.saved_by_module
            ],
            "activations_by_dtype": dict(self.saved_by_dtype),
            "activations_by_node_category": dict(self.saved_by_category),
            "alive_at_peak": list(self.alive_at_peak),
            "device_memory": self.device_memory,
            "fits": self.fits,
            "largest_batch": self.largest_batch,
            "checkpointing": self.checkpointing,
            "distributed": self.distributed,
            "output_held": self.output_held,
            "notes": list(self.notes),
        }


def describe_block(block: Block) -> dict[str, Any]:
    """A block as plain data, for the report."""
    return {"bytes": block.nbytes, "kind": block.kind, "phase": block.phase, "module": block.module,
            "op": block.op, "dtype": str(block.dtype).removeprefix("torch."), "shape": list(block.shape)}


def estimate(trace: StepTrace, target: str = "model") -> MemoryEstimate:
    """The peak of the step and its breakdown."""
    deltas: list[tuple[int, int, Block]] = []  # (event, +bytes or -bytes, block)
    alive = dict.fromkeys(KINDS, 0)
    for block in trace.blocks:
        if block.made == -1:
            alive[block.kind] += block.nbytes
        else:
            deltas.append((block.made, block.nbytes, block))
        if block.freed is not None:
            deltas.append((block.freed, -block.nbytes, block))
    deltas.sort(key=lambda d: d[0])
    peak, peak_event, peak_kinds = sum(alive.values()), -1, dict(alive)
    for event, change, block in deltas:
        alive[block.kind] += change
        total = sum(alive.values())
        if total > peak:
            peak, peak_event, peak_kinds = total, event, dict(alive)
    backward = trace.phase_starts.get("backward")
    loss_end = backward if backward is not None else trace.events
    at_loss_end = [b for b in trace.blocks if _alive_at(b, loss_end - 0.5)]
    at_peak = sorted((b for b in trace.blocks if _alive_at(b, peak_event)), key=lambda b: -b.nbytes)
    activations = [b for b in trace.blocks if b.kind == "activation"]
    running = next((b.op for b in trace.blocks if b.made == peak_event), "")
    return MemoryEstimate(
        target=target,
        device=trace.device,
        optimizer=trace.optimizer,
        peak_bytes=peak,
        peak_phase=_phase_at(trace, peak_event),
        peak_during=running,
        at_peak=peak_kinds,
        parameter_bytes=_sum(trace.blocks, "parameter"),
        gradient_bytes=_sum(trace.blocks, "gradient"),
        optimizer_state_bytes=_sum(trace.blocks, "optimizer state"),
        input_bytes=_sum(trace.blocks, "input"),
        activation_bytes=sum(b.nbytes for b in activations),
        end_of_forward_bytes=sum(b.nbytes for b in at_loss_end),
        saved_by_module=module_tree(activations, trace.module_types),
        saved_by_dtype=_by(activations, lambda b: str(b.dtype).removeprefix("torch.")),
        saved_by_category=_by(activations, _category),
        alive_at_peak=[describe_block(b) for b in at_peak[:TOP_ALIVE]],
        checkpointing=checkpointing(activations, trace),
    )


def checkpointing(activations: list[Block], trace: StepTrace) -> dict | None:
    """What checkpointing each block of the largest stack of repeated blocks would save, estimated: each block
    then keeps only its input, and backward recomputes one block's activations at a time."""
    lines = [line for line in module_tree(activations, trace.module_types) if line.path.endswith("*")]
    if not lines:
        return None
    stack = max(lines, key=lambda line: line.bytes)
    blocks = sorted(p for p in trace.module_types if p.count(".") == stack.path.count(".")
                    and module_tree_fold(p, trace.module_types) == stack.path)
    kept = {p: sum(b.nbytes for b in activations if b.module == p or b.module.startswith(p + ".")) for p in blocks}
    inputs = sum(trace.module_inputs.get(p, 0) for p in blocks)
    saves = sum(kept.values()) - inputs - max(kept.values(), default=0)
    if saves <= 0:
        return None
    return {"blocks": stack.path, "count": len(blocks), "saves_bytes": saves}


def module_tree_fold(path: str, types: dict[str, str]) -> str:
    """`path` with the layer numbers of repeated stacks replaced by `*`, as module_tree folds it."""
    parts = path.split(".") if path else []
    return ".".join("*" if part.isdigit() and ".".join(parts[: i + 1]) in repeated_children(types, ".".join(parts[:i]))
                    else part for i, part in enumerate(parts))


def _alive_at(block: Block, event: float) -> bool:
    return block.made <= event and (block.freed is None or block.freed > event)


def _phase_at(trace: StepTrace, event: int) -> str:
    phase = "forward"
    for name in PHASES:
        start = trace.phase_starts.get(name)
        if start is not None and start <= event:
            phase = name
    return phase


def _sum(blocks: list[Block], kind: str) -> int:
    return sum(b.nbytes for b in blocks if b.kind == kind)


def _by(blocks: list[Block], key) -> dict[str, int]:
    totals: dict[str, int] = defaultdict(int)
    for block in blocks:
        totals[key(block)] += block.nbytes
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def _category(block: Block) -> str:
    """The seeds' category of the first autograd node that keeps the block; `output` for blocks no node keeps
    (the model's output and the loss, alive because the training loop still holds them)."""
    if not block.saved_by:
        return "output"
    if block.phase == "loss":
        return "loss"
    return categorize(block.saved_by[0])


def repeated_children(types: dict[str, str], parent: str) -> set[str]:
    """The numbered children of `parent` of its most common class, when there are two or more of them: the
    layers of a stack (`h.0` … `h.11`)."""
    by_class: dict[str, set[str]] = defaultdict(set)
    for path, kind in types.items():
        head, _, last = path.rpartition(".")
        if path and head == parent and last.isdigit():
            by_class[kind].add(path)
    largest = max(by_class.values(), key=len, default=set())
    return largest if len(largest) > 1 else set()


def module_tree(blocks: list[Block], types: dict[str, str] | None = None) -> list[ModuleLine]:
    """Bytes per module path, each path's total including its submodules, children under their parent with
    the largest first. Numbered siblings of one class (the layers of a stack) fold into one `*` line whose count
    is how many there are; the lines under it sum over all of them."""
    types = types or {}
    folded_paths: dict[str, str] = {}

    def fold(path: str) -> str:
        if path not in folded_paths:
            parts = path.split(".") if path else []
            out = []
            for depth, part in enumerate(parts):
                real = ".".join(parts[: depth + 1])
                out.append("*" if part.isdigit() and real in _repeated(".".join(parts[:depth])) else part)
            folded_paths[path] = ".".join(out)
        return folded_paths[path]

    repeated: dict[str, set[str]] = {}

    def _repeated(parent: str) -> set[str]:
        if parent not in repeated:
            repeated[parent] = repeated_children(types, parent)
        return repeated[parent]

    totals: dict[str, int] = defaultdict(int)
    counts: dict[str, set[str]] = defaultdict(set)
    for block in blocks:
        parts = block.module.split(".") if block.module else []
        totals[""] += block.nbytes
        for depth in range(1, len(parts) + 1):
            real = ".".join(parts[:depth])
            totals[fold(real)] += block.nbytes
            counts[fold(real)].add(real)
    children: dict[str, list[str]] = defaultdict(list)
    for path in totals:
        if path:
            children[path.rpartition(".")[0]].append(path)
    lines: list[ModuleLine] = []

    def walk(path: str, depth: int) -> None:
        count = len(counts[path]) if path.endswith("*") else 1
        lines.append(ModuleLine(path or "(model)", depth, totals[path], count))
        for child in sorted(children.get(path, ()), key=lambda p: -totals[p]):
            walk(child, depth + 1)

    if totals:
        walk("", 0)
    return lines
