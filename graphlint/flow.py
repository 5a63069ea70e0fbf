"""Data-flow questions about a capture that several rules ask: which values reach the model's output, which
parameters get no gradient, and where a parameter's influence stops. The answers about a whole capture are
computed once per capture (`Capture.answers`) and shared by every rule that asks; rules only read them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import fx
from torch.fx.passes.shape_prop import TensorMetadata

from graphlint.capture import Capture, facts
from graphlint.capture.forward import HOST_OPS
from graphlint.lines import SourceLine
from graphlint.ops import op
from graphlint.walk import DOWN, UP, find, reachable


def reaches_loss(graph: fx.Graph) -> set[fx.Node]:
    """Every node whose value flows into the loss the backward differentiated (a `Target.loss` may use only
    part of the output); the model's output when the loss is not in the graph."""
    roots = [n for n in graph.nodes if facts(n).is_loss]
    if not roots:
        output = next((n for n in reversed(graph.nodes) if n.op == "output"), None)
        roots = list(output.all_input_nodes) if output is not None else []
    return reachable(roots, UP)


def parameter_nodes(graph: fx.Graph) -> dict[str, fx.Node]:
    """The `get_attr` node of every parameter or buffer the forward read, by qualified name."""
    return {n.target: n for n in graph.nodes if n.op == "get_attr" and facts(n).is_parameter}


def _once(capture: Capture, question: Callable[[Capture], Any]) -> Any:
    """The answer to `question` about this capture, computed on the first ask."""
    name = question.__name__
    if name not in capture.answers:
        capture.answers[name] = question(capture)
    return capture.answers[name]


def trainable_without_gradient(capture: Capture) -> list[str]:
    """Trainable parameters that get no gradient: those the real backward did not reach, or, when the backward
    failed, those with no AccumulateGrad node in the graph of the loss, except those a reentrant checkpoint
    read (it hides its block's parameters from that graph, and only its backward could tell). Empty when
    there was no loss."""
    return _once(capture, _trainable_without_gradient)


def _trainable_without_gradient(capture: Capture) -> list[str]:
    if capture.autograd.root is None:
        return []
    backward = capture.autograd.backward
    if backward.ran and backward.error is None:
        reached = backward.reached
    else:
        reads = parameter_nodes(capture.forward)
        unknown = {name for name, node in reads.items() if any(map(in_reentrant_checkpoint, node.users))}
        reached = capture.autograd.accumulate_grad.keys() | unknown
    return [name for name, info in capture.parameters.items() if info.requires_grad and name not in reached]


def first_stops(start: fx.Node, is_stop: Callable[[fx.Node], bool]) -> list[fx.Node]:
    """Walking forward from `start` through the nodes that use it, the first nodes where `is_stop` holds
    (the walk goes on past the others)."""
    return [step.node for step in find(start.users, DOWN, is_stop)]


def cut_kind(node: fx.Node) -> str | None:
    """How a node stops gradients flowing back through it: "detach", "data", "host" (the value leaves torch),
    "no_grad" or "inference_mode"; None when it does not."""
    name = op(node)
    if name in ("detach", "detach_"):
        return "detach"
    if name == "data":
        return "data"
    if leaves_torch(node):
        return "host"
    if in_reentrant_checkpoint(node):
        return None  # the checkpoint's backward recomputes this with grad on
    mode = facts(node).grad_mode
    return mode if mode != "enabled" else None


def leaves_torch(node: fx.Node) -> bool:
    """Whether the op turned a tensor into a Python value (`.item()`, `float(t)`, `if t:`); the `.float()`,
    `.int()` and `.bool()` casts share those names but return tensors, so gradients flow through them."""
    return op(node) in HOST_OPS and not isinstance(facts(node).tensor_meta, TensorMetadata)


def in_reentrant_checkpoint(node: fx.Node) -> bool:
    """Whether the op ran inside the no_grad forward of a reentrant `torch.utils.checkpoint`."""
    region = facts(node).grad_region
    return region is not None and region.checkpoint


def gradient_cuts(capture: Capture) -> dict[str, list[fx.Node]]:
    """For every trainable parameter that the forward read but that gets no gradient: the cuts that matter on
    its way to the loss. A cut matters when what it passes on reaches the loss (a detach inside a term the
    loss drops cuts nothing); a value that left torch (`.item()`) cannot be followed, so that cut always
    counts; the ops of a reentrant checkpoint's block count only when nothing else cuts the parameter. An
    empty list: used, but its results never reach the loss. Without a loss, only the parameters that a cut
    kept out of the output."""
    return _once(capture, _gradient_cuts)


def _gradient_cuts(capture: Capture) -> dict[str, list[fx.Node]]:
    reads = parameter_nodes(capture.forward)
    live = reaches_loss(capture.forward)

    def matters(node: fx.Node) -> bool:
        kind = cut_kind(node)
        return kind == "host" or (kind is not None and node in live)

    # A reentrant checkpoint whose inputs do not require grad never runs its backward: when nothing else cuts
    # a parameter inside it, the block's ops are the cut (only a backward that ran can tell).
    backward = capture.autograd.backward
    trusted = backward.ran and backward.error is None

    def checkpointed(node: fx.Node) -> bool:
        return trusted and in_reentrant_checkpoint(node) and node in live

    if capture.autograd.root is None:
        # No backward at all (the output needs no grad): the parameters that autograd was off for on their way
        # to the output, as under @torch.no_grad() or @torch.inference_mode() on the whole forward. An output
        # that is simply not differentiable (integer predictions, a Python number) cuts nothing: no loss is meant.
        def switched_off(node: fx.Node) -> bool:
            return matters(node) and cut_kind(node) in ("no_grad", "inference_mode")

        trainable = [name for name, info in capture.parameters.items() if info.requires_grad and name in reads]
        cuts = {name: first_stops(reads[name], switched_off) for name in trainable}
        return {name: stops for name, stops in cuts.items() if stops}
    return {name: first_stops(reads[name], matters) or first_stops(reads[name], checkpointed)
            for name in trainable_without_gradient(capture) if name in reads}


def cut_lines(capture: Capture) -> set[SourceLine]:
    """The source lines where GL202 reports a gradient cut: each cut's own line and, for a cut
    inside a `no_grad` block, the statement's. A host trip on such a line is reported once, as the cut."""
    lines = set()
    for cuts in gradient_cuts(capture).values():
        for cut in cuts:
            stack = facts(cut).stack
            region = facts(cut).grad_region
            for frames in (stack, region.statement_of(stack) if region is not None else ()):
                if frames:
                    lines.add(SourceLine.of(frames[-1]))
    return lines
