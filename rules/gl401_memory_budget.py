"""GL401 memory-budget: a training step whose peak memory is above the project's budget."""

from __future__ import annotations

from graphlint.sizes import format_bytes
from graphlint.results import Severity
from graphlint.rule import Example, Problem, Rule


class MemoryBudget(Rule):
    id = "GL401"
    name = "memory-budget"
    severity = Severity.ERROR
    tags = ("memory", "training", "memory-budget")
    precision = "high"
    summary = "One training step of the target peaks above the memory budget."
    what = """
        Targets whose training step (zero_grad, forward, loss, backward, optimizer step, with AdamW's state made
        by a first step) peaks above `memory-budget` in `[tool.graphlint]` or `--memory-budget`. The step runs
        on the meta device under graphlint's allocation tracker, as `graphlint memory` runs it (docs/memory.md).
        Without a budget the rule does nothing.

        The finding is placed at the target's factory (or model class) and says where the peak falls, what it
        is made of, and the largest savings: the fixes of the target's other findings that keep less for
        backward (fused attention, norms and activations, one cast before a loop), with the bytes each rule's
        fixes save; activation checkpointing of the largest stack of repeated blocks (estimated: each block
        keeps its input, and backward recomputes one block at a time); and the batch that would fit, read as if
        the memory that grows with the batch grew in proportion to it. Saved activations are gone by the
        optimizer step, so a peak there is lowered by none of the first two, and the message says so.
    """
    why = """
        A step that does not fit fails with an out-of-memory error on the GPU, after the job has waited in the
        queue and loaded its data. Checked in CI, a change that adds a layer, widens a tensor or doubles a
        sequence is caught at review instead.
    """
    example = """
        # pyproject.toml: [tool.graphlint] memory-budget = "24GiB"
        def make():  # a 7B-parameter model with AdamW: about 100 GiB before any activation
            return Llama(), (torch.randint(0, 32000, (1, 4096)),)
    """
    instead = """
        # checkpoint the blocks, shrink the batch, shard the optimizer state, or raise the budget
        for layer in self.layers:
            x = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False)
    """
    bad_examples = (
        Example(
            title="a stack of blocks over a 1 MiB budget",
            settings=(("memory_budget", 2**20),),
            source='''
                import torch
                from torch import nn


                def make():  # expect: GL401
                    model = nn.Sequential(*(nn.Sequential(nn.Linear(64, 64), nn.GELU()) for _ in range(4)))
                    return model, (torch.randn(1024, 64),)
            ''',
        ),
    )
    good_examples = (
        Example(
            title="the same model under a 64 MiB budget",
            settings=(("memory_budget", 64 * 2**20),),
            source='''
                import torch
                from torch import nn


                def make():
                    model = nn.Sequential(*(nn.Sequential(nn.Linear(64, 64), nn.GELU()) for _ in range(4)))
                    return model, (torch.randn(1024, 64),)
            ''',
        ),
    )

    reads_findings = True

    def check(self, capture, findings=()):
        memory = capture.memory
        if memory is None or memory.device_memory is None or memory.fits:
            return
        yield Problem(message=_message(memory, findings))


def _fix_savings(findings) -> list[str]:
    """What fixing the other findings would keep less for backward, per rule, largest first. Rules run before
    the policy stage, so a finding a comment will suppress still counts here."""
    by_rule: dict[str, list] = {}
    for finding in findings:
        if finding.saves_bytes:
            by_rule.setdefault(finding.rule_id, []).append(finding)
    ranked = sorted(by_rule.items(), key=lambda item: -sum(f.saves_bytes for f in item[1]))
    return [f"fixing {rule_id} ({len(found)} finding{'s' if len(found) > 1 else ''}) would keep about "
            f"{format_bytes(sum(f.saves_bytes for f in found))} less for backward" for rule_id, found in ranked]


def _message(memory, findings=()) -> str:
    parts = ", ".join(f"{kind} {format_bytes(size)}" for kind, size in memory.at_peak.items() if size)
    savings = _fix_savings(findings)
    if memory.checkpointing:
        plan = memory.checkpointing
        blocks = f"{plan['blocks'][:-1]}0…{plan['count'] - 1}"
        savings.append(f"checkpointing the {plan['count']} blocks {blocks} would save about "
                       f"{format_bytes(plan['saves_bytes'])}")
    if savings and memory.peak_phase == "optimizer step":
        savings = [f"{', '.join(savings)}, which the optimizer step's peak does not include"]
    batch = _batch_that_fits(memory)
    if batch is not None:
        savings.append(f"batch {batch} would fit" if batch > 0 else "no smaller batch fits")
    advice = f"; {'; '.join(savings)}" if savings else ""
    return (f"One training step ({memory.optimizer}) peaks at {format_bytes(memory.peak_bytes)} during the "
            f"{memory.peak_phase}, above the memory budget of {format_bytes(memory.device_memory)} ({parts})"
            f"{advice}.")


def _batch_that_fits(memory) -> int | None:
    """The batch that would fit if what grows with the batch (activations, temporaries, inputs) grew in
    proportion to it; None when the inputs have no batch dimension or it is 1 already."""
    if not memory.batch or memory.batch <= 1:
        return None
    steady = memory.at_peak.get("parameter", 0) + memory.at_peak.get("gradient", 0) + \
        memory.at_peak.get("optimizer state", 0)
    growing = memory.peak_bytes - steady
    if memory.device_memory <= steady or growing <= 0:
        return 0
    return min(memory.batch - 1, int((memory.device_memory - steady) / (growing / memory.batch)))
