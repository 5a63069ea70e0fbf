"""What a finding's fix would save for backward, read from the capture's saved tensors at the target's shapes.

The price is the activation memory autograd keeps for the hand-written form that the fused form does not keep.
For hand-written attention, that is every tensor kept by the chain's ops whose last two dimensions are the
scores' (queries × keys): the scores, the probabilities, dropout and causal masks. The fused kernel keeps its
inputs, its output and a log-sum-exp per query, which the hand-written chain keeps too, or keeps in other form.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import fx

from graphlint.capture.contract import Capture
from graphlint.ops import op as _op_name, tensor_meta


def attention_savings(capture: Capture, chain: Iterable[fx.Node], scores: fx.Node) -> int:
    """Bytes the chain's ops keep for backward in tensors of the scores' queries × keys shape (each storage once)."""
    meta = tensor_meta(scores)
    shape = getattr(meta, "shape", None)
    if shape is None or len(shape) < 2:
        return 0
    square = tuple(shape[-2:])
    members = set(chain)
    seen: set = set()
    total = 0
    for node in capture.autograd.nodes:
        if node.forward_node not in members:
            continue
        for saved in node.saved:
            key = saved.storage if saved.storage is not None else ("tensor", saved.index)
            if saved.parameter or key in seen or tuple(saved.shape[-2:]) != square:
                continue
            seen.add(key)
            total += saved.storage_nbytes
    return total


def chain_savings(capture: Capture, end: fx.Node, start: fx.Node | None = None, depth: int = 10) -> int:
    """What a hand-written elementwise chain (a norm, an activation) keeps for backward beyond what its one-kernel
    form keeps: the bytes kept by the ops on paths from `start` (its input) to `end` (its last step), each
    storage once, less one tensor of the input's size, which the library call keeps (its input, or its output of
    the same size). Without `start`, the input is the latest op before `end` that two steps of the chain read
    (x in x * sigmoid(x), exp(x) in exp(x) / exp(x).sum())."""
    ancestors = _ancestors(end, depth)
    if start is None:
        order = {node: index for index, node in enumerate(capture.forward.nodes)}
        shared = [n for n in ancestors if sum(1 for user in n.users if user in ancestors or user is end) >= 2]
        if not shared:
            return 0
        start = max(shared, key=lambda n: order.get(n, -1))
    region = {n for n in (*ancestors, end) if n is not start and start in _ancestors(n, depth)}
    seen: set = set()
    total = 0
    for node in capture.autograd.nodes:
        if node.forward_node not in region:
            continue
        for saved in node.saved:
            key = saved.storage if saved.storage is not None else ("tensor", saved.index)
            if saved.parameter or key in seen:
                continue
            seen.add(key)
            total += saved.storage_nbytes
    meta = tensor_meta(start)
    kept = 0
    if meta is not None and hasattr(meta, "shape"):
        count = 1
        for size in meta.shape:
            count *= size
        kept = count * meta.dtype.itemsize
    return max(0, total - kept)


def norm_savings(capture: Capture, end: fx.Node, mean: fx.Node) -> int:
    """`chain_savings` of a hand-written norm, from the tensor its mean (or mean of squares) reads."""
    reduction = mean.args[0] if _op_name(mean) == "getitem" else mean
    source = reduction.args[0] if isinstance(reduction, fx.Node) and reduction.args else None
    if isinstance(source, fx.Node) and _op_name(source) in ("pow", "square", "mul") and source.args:
        source = source.args[0]  # the mean of squares reads x squared: its input is x
    return chain_savings(capture, end, source if isinstance(source, fx.Node) else None)


def _ancestors(node: fx.Node, depth: int) -> set[fx.Node]:
    found: set[fx.Node] = set()
    frontier = [node]
    for _ in range(depth):
        frontier = [n for current in frontier for n in current.all_input_nodes if n not in found]
        found.update(frontier)
        if not frontier:
            break
    return found


def kept_output(capture: Capture, node: fx.Node) -> int:
    """Bytes autograd keeps of `node`'s output: the tensors of its shape and dtype that the ops reading it keep
    for backward (each storage once)."""
    meta = tensor_meta(node)
    if meta is None or not hasattr(meta, "shape"):
        return 0
    readers = set(node.users)
    seen: set = set()
    total = 0
    for autograd_node in capture.autograd.nodes:
        if autograd_node.forward_node not in readers:
            continue
        for saved in autograd_node.saved:
            key = saved.storage if saved.storage is not None else ("tensor", saved.index)
            if saved.parameter or key in seen or saved.shape != tuple(meta.shape) or saved.dtype != meta.dtype:
                continue
            seen.add(key)
            total += saved.storage_nbytes
    return total
