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


@dataclass
class StepLines:
    """The step's ops by the user's source line they ran at, priced on one device."""

    device: str
    step_seconds: float
    batch: int | None
    lines: dict[tuple[str, int], list[PricedOp]]

    def ops_at(self, lines: set[tuple[str, int]]) -> list[PricedOp]:
        return [op for key in sorted(lines) for op in self.lines.get(key, ())]


def step_lines(records, device, step) -> StepLines:
    """The op records of a step (graphlint.timing.record) priced on `device` as graphlint.timing.roofline prices
    them (the roofline, or an op's time on this CPU where its call was timed), per line; `step` is the
    graphlint.timing.roofline.StepTime priced from the same records."""
    from graphlint.timing.roofline import op_seconds

    lines: dict[tuple[str, int], list[PricedOp]] = defaultdict(list)
    for record in records:
        if record.file is None or record.kind == "view":
            continue
        seconds, _ = op_seconds(record, device)
        lines[(_same(record.file), record.line)].append(PricedOp(record.op, record.kind, record.phase, seconds))
    return StepLines(step.device, step.seconds, step.batch, dict(lines))


def _same(path: str) -> str:
    return os.path.normcase(os.path.realpath(path))


def _attention(ops: list[PricedOp], finding: Finding) -> float:
    """Fused attention runs the same products and keeps the scores in the kernel: the elementwise and reduction
    ops of the chain (scale, mask, softmax, dropout and their backward), with the traffic of the L×L intermediates
    and their launches, go; copies on those lines (a transpose made contiguous for the heads) stay."""
    return sum(op.seconds for op in ops if op.kind == "memory" and not _copies(op.op))


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
        model = FIX_MODELS.get(finding.rule_id)
        seconds = sum(op.seconds for op in ops)
        saves = min(model(ops, finding), seconds) if model is not None else None
        priced.append(dataclasses.replace(finding, cost=Cost(seconds, saves, step.step_seconds, step.device,
                                                             step.batch)))
    return priced
