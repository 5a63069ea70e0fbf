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
    # priced on this machine's CPU (check --cpu), whose kernels torch can be asked about: the fixed cost of an op
    # a composite issues from C++ in the forward (CpuPeaks.native), else None
    composite_op: float | None = None

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
    composite = device.native.get("forward", 0.0) if isinstance(device, CpuPeaks) else None
    return StepLines(step.device, step.seconds, step.batch, dict(lines), composite)


def _same(path: str) -> str:
    return os.path.normcase(os.path.realpath(path))


def _attention(ops: list[PricedOp], finding: Finding) -> float:
    """Fused attention runs the same products and keeps the scores in the kernel: the elementwise and reduction
    ops of the chain (scale, mask, softmax, dropout and their backward), with the traffic of the L×L intermediates
    and their launches, go; copies on those lines (a transpose made contiguous for the heads) stay."""
    return sum(op.seconds for op in ops if op.kind == "memory" and not _copies(op.op))


def _attention_on_cpu(ops: list[PricedOp], finding: Finding) -> float | None:
    """On this CPU the fused kernel is timed at the chain's own sizes (read from its first product, q @ k^T), for
    the fused kernel is not always faster there (on small heads its blocking costs more than the chain it
    replaces): what goes is every op of the chain but the copies, forward and backward, products included, and what
    comes is the fused kernel's forward and backward, once per occurrence. None when the chain's product was not
    recorded."""
    product = next((op for op in ops if op.phase == "forward" and op.kind == "matmul" and len(op.shapes) >= 2
                    and len(op.shapes[0]) >= 2 and len(op.shapes[1]) >= 2), None)
    if product is None:
        return None
    (*batch, length, width), (*_, _, keys) = product.shapes[0], product.shapes[1]
    heads = 1
    for size in batch:
        heads *= size
    chain = sum(op.seconds for op in ops if not _copies(op.op))
    # the call the fix writes: causal where the chain masks, with dropout where it drops (which takes the CPU's
    # math path instead of its flash kernel)
    masked = any("masked_fill" in op.op or "where" in op.op for op in ops)
    dropped = any("dropout" in op.op or "bernoulli" in op.op for op in ops)
    fused = _fused_attention_seconds(heads, length, keys, width, masked, dropped)
    return chain - fused * max(finding.occurrences, 1)  # one fused call per time the chain ran (every layer)


_fused_times: dict[tuple, float] = {}


def _fused_attention_seconds(heads: int, length: int, keys: int, width: int, causal: bool, dropout: bool) -> float:
    """The seconds of scaled_dot_product_attention's forward and backward on this CPU for `heads` heads of
    `length` queries, `keys` keys and values, `width` wide (float32), causal or not, with dropout or not, beyond a
    step that only sums its inputs."""
    size = (heads, length, keys, width, causal, dropout)
    if size not in _fused_times:
        import time

        import torch

        from graphlint.timing.devices import call_seconds

        seeded = torch.Generator().manual_seed(0)  # torch's global generator is the step's, left as it is
        q = torch.rand(1, heads, length, width, generator=seeded, requires_grad=True)
        k, v = (torch.rand(1, heads, keys, width, generator=seeded, requires_grad=True) for _ in range(2))

        def fused():
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal and length == keys,
                                                             dropout_p=0.1 if dropout else 0.0).sum().backward()

        def plain():
            (q.sum() + k.sum() + v.sum()).backward()

        clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
        state = torch.get_rng_state()  # the dropout draws from torch's global generator, which is the step's
        try:
            _fused_times[size] = max(call_seconds(fused, clock, budget=0.05, median=True)
                                     - call_seconds(plain, clock, budget=0.05, median=True), 0.0)
        finally:
            torch.set_rng_state(state)
    return _fused_times[size]


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
    if step.composite_op is not None and finding.rule_id == "GL101":
        measured = _attention_on_cpu(ops, finding)
        if measured is not None:
            return measured
    if step.composite_op is not None and finding.rule_id == "GL106":
        call = NORM_CALLS.get(finding.message.split(" ", 1)[0])
        if call is not None and not _one_cpu_kernel(call):
            return sum(max(op.fixed - step.composite_op, 0.0) for op in ops if op.phase == "forward")
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
