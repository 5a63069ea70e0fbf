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
from graphlint.ops import tensor_meta


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
