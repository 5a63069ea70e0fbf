"""The cost stage (after the rules, in the child, only when the user names a device: `check --gpu NAME` or
`--cpu`): each performance finding's time in one training step on that device, and what its fix would save.

The step is the one `graphlint time` prices (graphlint.timing): every aten op of forward, backward (with
recomputation) and optimizer, each at the user's line it ran at. A finding's time is that of the ops at its lines;
what its fix saves is modelled per rule (FIX_MODELS, docs/time.md). Rules never see any of this.
"""

from __future__ import annotations

import dataclasses
import os
from collections import defaultdict
from dataclasses import dataclass

from graphlint.results import Cost, Finding

# The rules whose findings are priced: the performance rules, the two-step log-softmax and the graph break.
COSTED = frozenset({"GL101", "GL102", "GL103", "GL104", "GL105", "GL106", "GL107", "GL204", "GL301"})
# Rules whose pattern spans several lines, each a related location of the finding (the attention chain's steps).
WITH_RELATED_LINES = frozenset({"GL101", "GL106", "GL107", "GL204"})


@dataclass(frozen=True)
class PricedOp:
    """One op of the step at a user's line, priced on the device."""

    op: str  # "aten.softmax.default"
    kind: str  # graphlint.timing.record.OpRecord.kind
    phase: str
    seconds: float
    fixed: float = 0.0  # of `seconds`, what it pays beyond its kernel (graphlint.timing.roofline.fixed_cost)
    shapes: tuple[tuple[int, ...], ...] = ()  # its tensor arguments' shapes, where its call was kept (on this CPU)


@dataclass
class StepLines:
    """The step's ops by the user's source line they ran at, priced on one device."""

    device: str
    step_seconds: float
    batch: int | None
    lines: dict[tuple[str, int], list[PricedOp]]
    # priced on this machine's CPU (check --cpu), whose kernels torch can be asked about and timed: its measured
    # peaks (graphlint.timing.devices.CpuPeaks), else None
    cpu: object | None = None

    def ops_at(self, lines: set[tuple[str, int]]) -> list[PricedOp]:
        return [op for key in sorted(lines) for op in self.lines.get(key, ())]


def step_lines(records, device, step) -> StepLines:
    """The op records of a step (graphlint.timing.record) priced on `device` as graphlint.timing.roofline prices
    them (the roofline, or an op's time on this CPU where its call was timed), per line; `step` is the
    graphlint.timing.roofline.StepTime priced from the same records."""
    from graphlint.timing.calls import TensorLayout
    from graphlint.timing.devices import CpuPeaks
    from graphlint.timing.roofline import fixed_cost, op_seconds

    lines: dict[tuple[str, int], list[PricedOp]] = defaultdict(list)
    for record in records:
        if record.file is None or record.kind == "view":
            continue
        seconds, _ = op_seconds(record, device)
        shapes = tuple(arg.shape for arg in record.call.args if isinstance(arg, TensorLayout)) \
            if record.call is not None else ()
        lines[(_same(record.file), record.line)].append(
            PricedOp(record.op, record.kind, record.phase, seconds, fixed_cost(record, device), shapes))
    return StepLines(step.device, step.seconds, step.batch, dict(lines),
                     device if isinstance(device, CpuPeaks) else None)


def _same(path: str) -> str:
    return os.path.normcase(os.path.realpath(path))


def _attention(ops: list[PricedOp], finding: Finding) -> float:
    """Fused attention runs the same products and keeps the scores in the kernel: the elementwise and reduction
    ops of the chain (scale, mask, softmax, dropout and their backward), with the traffic of the L×L intermediates
    and their launches, go; copies on those lines (a transpose made contiguous for the heads) stay."""
    return sum(op.seconds for op in ops if op.kind == "memory" and not _copies(op.op))


def _attention_on_cpu(ops: list[PricedOp], finding: Finding, cpu) -> float | None:
    """On this CPU the fused kernel is not always faster (on small heads its blocking costs more than the chain it
    replaces), so the call the fix writes is priced as the step's own calls are: with dropout, the CPU's
    scaled_dot_product_attention takes its math path, a composite of the chain's own kernels, and only the Python
    between them goes (_composite_saving); without, its flash kernel's forward and backward are timed here at the
    chain's sizes (read from its first product, q @ k^T), causal where the chain masks, once per occurrence, and set
    against every op of the chain but its copies, products included. None when the chain's product was not
    recorded or the kernel could not be timed."""
    if any("dropout" in op.op or "bernoulli" in op.op for op in ops):
        return _composite_saving(ops, cpu)
    operands = next((_batched_operands(op) for op in ops if op.phase == "forward" and _batched_operands(op)), None)
    if operands is None:
        return None
    (*batch, length, width), (*_, _, keys) = operands
    heads = 1
    for size in batch:
        heads *= size
    masked = any("masked_fill" in op.op or "where" in op.op for op in ops)
    fused = _flash_attention_seconds(cpu, heads, length, keys, width, masked and length == keys)
    if fused is None:
        return None
    chain = sum(op.seconds for op in ops if not _copies(op.op))
    return chain - fused * max(finding.occurrences, 1)  # one fused call per time the chain ran (every layer)


def _batched_operands(op: PricedOp) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The two operands of a batched product of the chain (q and k^T: [..., L, D] and [..., D, S]), past the
    added input of `baddbmm`; None for any other op, and for a 2-d product (a Linear's, on the scores' line)."""
    name = op.op.split(".")[1] if op.op.count(".") >= 2 else op.op
    shapes = op.shapes[1:] if name in ("baddbmm", "addmm") else op.shapes
    if op.kind != "matmul" or name not in ("bmm", "matmul", "baddbmm") or len(shapes) < 2:
        return None
    left, right = shapes[0], shapes[1]
    if len(left) < 3 or len(right) < 3 or left[-1] != right[-2]:
        return None
    return left, right


def _composite_saving(ops: list[PricedOp], cpu) -> float:
    """What a fix saves whose library call runs the same kernels as the code it replaces, issued from C++: the
    Python between its forward ops, each op's fixed cost beyond such an op's (CpuPeaks.native)."""
    issued = cpu.native.get("forward", 0.0)
    return sum(max(op.fixed - issued, 0.0) for op in ops if op.phase == "forward")


def _flash_attention_seconds(cpu, heads: int, length: int, keys: int, width: int, causal: bool) -> float | None:
    """The CPU flash attention kernel's forward and backward for `heads` heads of `length` queries, `keys` keys and
    values, `width` wide (float32, contiguous), each call timed as the step's calls are (graphlint.timing.replay,
    its cache, threads and floor) plus the fixed cost of an op of its phase; None if either could not be timed."""
    import torch

    from graphlint.timing.calls import call_of
    from graphlint.timing.replay import time_calls

    aten = torch.ops.aten

    def meta(*shape: int) -> torch.Tensor:
        return torch.empty(shape, device="meta")

    q, k, v = meta(1, heads, length, width), meta(1, heads, keys, width), meta(1, heads, keys, width)
    out, logsumexp = meta(1, heads, length, width), meta(1, heads, length)
    forward = call_of(aten._scaled_dot_product_flash_attention_for_cpu.default, (q, k, v, 0.0, causal), {},
                      (out.numel() + logsumexp.numel()) * 4)
    backward = call_of(aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
                       (out, q, k, v, out, logsumexp, 0.0, causal), {}, (q.numel() + k.numel() + v.numel()) * 4)
    if forward is None or backward is None:
        return None
    times = time_calls([forward, backward], cpu.threads)
    if forward.key not in times.seconds or backward.key not in times.seconds:
        return None
    return (max(times.seconds[forward.key] - times.floor, 0.0) + cpu.launch["forward"]
            + max(times.seconds[backward.key] - times.floor, 0.0) + cpu.launch["backward"])


def _copies(op: str) -> bool:
    return "clone" in op or "copy" in op


def _fused(ops: list[PricedOp], finding: Finding) -> float:
    """One fused kernel replaces the chain's elementwise ops: in each phase it costs about as much as the chain's
    largest pass (it reads the input and writes the output once), the other passes go."""
    saved = 0.0
    for phase in {op.phase for op in ops}:
        passes = [op.seconds for op in ops if op.phase == phase and op.kind == "memory"]
        if passes:
            saved += sum(passes) - max(passes)
    return saved


def _hoisted(ops: list[PricedOp], finding: Finding) -> float:
    """A cast hoisted out of the loop runs once instead of once per occurrence."""
    casts = sum(op.seconds for op in ops if _copies(op.op))
    count = max(finding.occurrences, 1)
    return casts * (count - 1) / count


# What each rule's fix saves, from the ops at its lines; a rule not listed has no model (GL103's stall, GL104's
# host-to-device copy and GL301's lost fusion are not in the roofline; GL105's bias add is fused into its product).
FIX_MODELS = {"GL101": _attention, "GL102": _hoisted, "GL106": _fused, "GL107": _fused, "GL204": _fused}


# The library call a GL106 fix writes, by the norm's kind (its message's first word).
NORM_CALLS = {"RMSNorm": "rms_norm", "LayerNorm": "layer_norm"}
_one_kernel: dict[str, bool] = {}


def _one_cpu_kernel(call: str) -> bool:
    """Whether torch runs `torch.nn.functional.<call>` on the CPU as one kernel, asked of torch once by making the
    call on tiny tensors: F.rms_norm is, on the CPU of torch 2.13, a composite of the very ops a hand-written
    RMSNorm runs; F.layer_norm is one kernel."""
    if call not in _one_kernel:
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        kernels = []

        class Count(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if not func.is_view and func.__name__.split(".")[0] not in ("detach", "alias"):
                    kernels.append(func)
                return func(*args, **(kwargs or {}))

        x, weight = torch.ones(2, 4, requires_grad=True), torch.ones(4, requires_grad=True)
        with Count():
            getattr(torch.nn.functional, call)(x, (4,), weight)
        _one_kernel[call] = len(kernels) <= 1
    return _one_kernel[call]


def _saves(finding: Finding, ops: list[PricedOp], step: StepLines) -> float | None:
    """What the finding's fix would save on the step's device (FIX_MODELS). On this CPU, where the fix's library
    call is a composite that runs the same kernels (_one_cpu_kernel), only the Python between its forward ops goes:
    the composite issues them from C++, at the fixed cost of such ops."""
    model = FIX_MODELS.get(finding.rule_id)
    if model is None:
        return None
    if step.cpu is not None and finding.rule_id == "GL101":
        measured = _attention_on_cpu(ops, finding, step.cpu)
        if measured is not None:
            return measured
    if step.cpu is not None and finding.rule_id == "GL106":
        call = NORM_CALLS.get(finding.message.split(" ", 1)[0])
        if call is not None and not _one_cpu_kernel(call):
            return _composite_saving(ops, step.cpu)
    return model(ops, finding)


def finding_lines(finding: Finding) -> set[tuple[str, int]]:
    """The source lines whose ops a finding stands for: its span, and for a pattern of several lines the lines of
    its steps (its related locations in the user's files)."""
    where = finding.location
    lines = {(_same(where.path), line) for line in range(where.line, where.end_line + 1)}
    if finding.rule_id in WITH_RELATED_LINES:
        lines |= {(_same(r.location.path), line) for r in finding.related if r.location.first_party
                  for line in range(r.location.line, r.location.end_line + 1)}
    return lines


def with_costs(findings: list[Finding], step: StepLines) -> list[Finding]:
    """The findings, those of COSTED rules with their cost on the step's device."""
    priced = []
    for finding in findings:
        if finding.rule_id not in COSTED:
            priced.append(finding)
            continue
        ops = step.ops_at(finding_lines(finding))
        seconds = sum(op.seconds for op in ops)
        saves = _saves(finding, ops, step)
        saves = min(saves, seconds) if saves is not None else None
        priced.append(dataclasses.replace(finding, cost=Cost(seconds, saves, step.step_seconds, step.device,
                                                             step.batch)))
    return priced
