"""`graphlint graph`: one capture's autograd graph, read as one would by hand with `grad_fn.next_functions`.

How many nodes, which are compute and which are metadata-only shape ops, which kernels are fused and which
hand-written chains could be, how many AccumulateGrad sinks against trainable parameters, where the saved
activation memory goes by source line, and what the capture device changes. Sizes come from the capture's
shapes, so this works on the meta device for models that do not fit in memory.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from graphlint.files import display_path
from graphlint.graph.categories import CATEGORIES, categorize, is_fused
from graphlint.results import Finding, Location, finding_from_wire, json_ready

# The report and its pictures need no torch: a report from the result cache is drawn without importing it. What
# reads a capture (describe and the functions below it) imports the capture's layers when it is called.
if TYPE_CHECKING:
    from graphlint.capture import Capture
    from graphlint.locate.place import Locator

TOP_LINES = 10


@dataclass
class NodeView:
    """One autograd node as the report and the picture show it."""

    index: int
    name: str
    category: str
    module_path: str
    source: str  # `path:line` of the forward call that made it; "" when unknown
    saved_bytes: int  # activation memory it keeps alive for backward (weights not counted)
    next: tuple[int, ...]


@dataclass
class SavedLine:
    """Saved activation memory attributed to one source line."""

    location: str  # `path:line:column`
    ops: list[str]
    where: str  # module paths
    bytes: int
    tensors: int


@dataclass
class GraphReport:
    target: str
    device: str
    nodes: list[NodeView]
    categories: dict[str, dict[str, int]]  # category -> node name -> count, in CATEGORIES order
    fused: dict[str, int]  # fused kernels' node names -> count
    fused_calls: dict[str, int]  # fused functions the forward called -> count
    could_fuse: list[Finding]  # GL101's hand-written attention chains
    sinks: int
    trainable: int
    without_sink: list[str]
    saved_bytes: int
    saved_tensors: int
    saved_by_line: list[SavedLine]
    device_note: str
    sizes: list[tuple[str, int, int]] = field(default_factory=list)  # (--vary label, nodes, saved bytes)
    # category -> activation bytes its nodes keep for backward (each storage counted once, at its first saver)
    saved_by_category: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return len(self.nodes)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["total"] = self.total
        data["could_fuse"] = [
            {"message": f.message, "path": display_path(f.location.path), "line": f.location.line,
             "occurrences": f.occurrences} for f in self.could_fuse
        ]
        data["sizes"] = [{"label": label, "nodes": nodes, "saved_bytes": saved} for label, nodes, saved in self.sizes]
        return data

    def to_wire(self) -> dict:
        """The report as JSON-ready data that `from_wire` rebuilds as it was, findings whole (a child's answer, the
        result cache); `to_dict` is the documented JSON shape."""
        return json_ready(asdict(self))

    @classmethod
    def from_wire(cls, data: dict) -> GraphReport:
        """The report that `to_wire` made; KeyError, TypeError or ValueError when `data` is not one."""
        return cls(**{
            **data,
            "nodes": [NodeView(**{**node, "next": tuple(node["next"])}) for node in data["nodes"]],
            "could_fuse": [finding_from_wire(finding) for finding in data["could_fuse"]],
            "saved_by_line": [SavedLine(**line) for line in data["saved_by_line"]],
            "sizes": [tuple(size) for size in data["sizes"]],
        })


def describe(capture: Capture, locator: Locator) -> GraphReport:
    """The graph report of one capture."""
    from graphlint.capture import facts
    from graphlint.ops import op

    autograd = capture.autograd
    source_of: dict = {}
    nodes = []
    for node in autograd.nodes:
        forward = node.forward_node
        in_loss = forward is not None and facts(forward).phase == "loss"
        if node.parameter is not None:
            module_path = node.parameter.rpartition(".")[0]
        elif in_loss:
            module_path = "(loss)"
        else:
            module_path = facts(forward).module_path if forward is not None else ""
        nodes.append(NodeView(
            index=node.index,
            name=node.name,
            category=categorize(node.name, in_loss),
            module_path=module_path,
            source=_source(forward, capture, locator, source_of),
            saved_bytes=sum(s.storage_nbytes for s in node.saved if not s.parameter),
            next=node.next,
        ))
    categories = {category: Counter() for category in CATEGORIES}
    for view in nodes:
        categories[view.category][view.name] += 1
    trainable = [name for name, info in capture.parameters.items() if info.requires_grad]
    sinks = autograd.accumulate_grad
    saved_bytes, saved_tensors, saved_by_line = _saved_memory(capture, locator, source_of)
    category_of = {view.index: view.category for view in nodes}
    saved_by_category = Counter()
    for node, saved in saved_activations(capture):
        saved_by_category[category_of[node.index]] += saved.storage_nbytes
    return GraphReport(
        target=capture.target,
        device=capture.device,
        nodes=nodes,
        categories={c: dict(counts.most_common()) for c, counts in categories.items()},
        fused=dict(Counter(v.name for v in nodes if is_fused(v.name)).most_common()),
        fused_calls=dict(Counter(op(n) for n in capture.ops if op(n) in _FUSED_CALLS).most_common()),
        could_fuse=_hand_written_attention(capture, locator),
        sinks=len(sinks),
        trainable=len(trainable),
        without_sink=[name for name in trainable if name not in sinks],
        saved_bytes=saved_bytes,
        saved_tensors=saved_tensors,
        saved_by_line=saved_by_line,
        device_note=_device_note(capture),
        saved_by_category={c: saved_by_category[c] for c in CATEGORIES if saved_by_category[c]},
    )


_FUSED_CALLS = {"scaled_dot_product_attention", "multi_head_attention_forward", "layer_norm", "rms_norm",
                "group_norm", "batch_norm"}


def _source(forward, capture: Capture, locator: Locator, cache: dict) -> str:
    if forward is None:
        return ""
    if forward not in cache:
        from graphlint.locate.sites import node_sites

        primary, _ = node_sites(forward, locator.project, capture.factory)
        cache[forward] = _show(locator.location(primary)) if primary is not None else ""
    return cache[forward]


def _show(location: Location) -> str:
    return f"{display_path(location.path)}:{location.line}:{location.column}"


def saved_activations(capture: Capture):
    """(autograd node, saved tensor) for every activation kept for backward, each storage once (a tensor
    saved by two ops, or views of one tensor, keep one storage alive); weights are left out."""
    order = {node: index for index, node in enumerate(capture.forward.nodes)}
    seen: set = set()
    for node in sorted(capture.autograd.nodes, key=lambda n: order.get(n.forward_node, len(order))):
        for saved in node.saved:
            key = saved.storage if saved.storage is not None else ("tensor", saved.index)
            if not saved.parameter and key not in seen:
                seen.add(key)
                yield node, saved


def _saved_memory(capture: Capture, locator: Locator, source_of: dict) -> tuple[int, int, list[SavedLine]]:
    """Activation bytes kept for backward, in total and by the line of the op that saved them."""
    from graphlint.capture import facts
    from graphlint.locate.place import describe_where

    lines: dict[str, SavedLine] = {}
    paths: dict[str, list[str]] = {}
    total = count = 0
    for node, saved in saved_activations(capture):
        total += saved.storage_nbytes
        count += 1
        forward = node.forward_node
        where = _source(forward, capture, locator, source_of) or "(unknown)"
        line = lines.setdefault(where, SavedLine(where, [], "", 0, 0))
        line.bytes += saved.storage_nbytes
        line.tensors += 1
        name = (facts(forward).op or node.name) if forward is not None else node.name
        if name not in line.ops:
            line.ops.append(name)
        paths.setdefault(where, []).append(facts(forward).module_path if forward is not None else "")
    for where, line in lines.items():
        line.where = describe_where(paths[where])
    ranked = sorted(lines.values(), key=lambda line: -line.bytes)
    return total, count, ranked[:TOP_LINES]


def _hand_written_attention(capture: Capture, locator: Locator) -> list[Finding]:
    from graphlint.engine import load_rules
    from graphlint.tags import FUSABLE_ATTENTION_TAG

    rules = [rule for rule in load_rules() if FUSABLE_ATTENTION_TAG in rule.tags]
    return [finding for rule in rules for finding in locator.place(rule, rule().check(capture), capture)]


def _device_note(capture: Capture) -> str:
    from graphlint.ops import op

    calls = sum(1 for n in capture.ops if op(n) in ("scaled_dot_product_attention", "multi_head_attention_forward"))
    if capture.device == "meta":
        note = ("Captured on the meta device: nothing was allocated and sizes come from shapes, so the graph "
                "has the same structure as on a real device.")
        if calls:
            note += (f" The forward called fused attention (scaled_dot_product_attention or nn.MultiheadAttention) "
                     f"{calls} time(s); on meta it runs as its math decomposition (bmm and _safe_softmax), so "
                     "those nodes look unfused here. --device cpu or cuda shows the fused kernel a real run uses.")
        return note
    if capture.device == "cpu":
        return ("Captured on CPU: node names are the CPU kernels' (fused attention is "
                "ScaledDotProductFlashAttentionForCpu, where CUDA runs Flash or memory-efficient attention; "
                "inputs the CPU kernel does not take fall back to the math path).")
    return f"Captured on {capture.device}."


def vary_inputs(kind: str):
    """An input transform for --vary: double the batch or the sequence (`kind`) in the input tensors that carry it
    (graphlint.capture.dimensions), by repeating their rows (so ids stay valid ids and masks stay masks)."""
    from graphlint.capture import dimensions
    from graphlint.errors import TargetFailure

    def transform(args, kwargs):
        found = dimensions.sizes(args, kwargs)
        if kind not in found:
            what = ("a batch dimension (dimension 0)" if kind == "batch"
                    else "a sequence dimension (dimension 1 of token ids or of (batch, seq, features) inputs)")
            raise TargetFailure(f"--vary {kind} does not apply: no input tensor of the target has {what}")
        return dimensions.resized(args, kwargs, found, {kind: 2 * found[kind]})

    return transform


def input_size(capture: Capture, kind: str) -> int | None:
    """The batch (or sequence) size the capture ran with, read from its inputs' shapes and dtypes."""
    import torch

    from graphlint.capture import dimensions
    from graphlint.ops import tensor_meta

    inputs = [torch.empty(meta.shape, dtype=meta.dtype, device="meta") for node in capture.forward.nodes
              if node.op == "placeholder" and (meta := tensor_meta(node)) is not None]
    return dimensions.sizes(tuple(inputs), {}).get(kind)
