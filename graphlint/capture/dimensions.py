"""A model's batch and sequence dimensions, in one place: where they are in the inputs, how large, and which input
tensors carry them. The memory step's `--batch`/`--seq` (graphlint.memory.measure), the graph report's `--vary`
(graphlint.graph) and the torch.compile analysis's grown calls (GL302, graphlint.capture.compile) read them here.

The batch is dimension 0 of the leading input (the first tensor, positional arguments first, then keyword
arguments); the sequence is dimension 1 of the first input that has one: token ids (B, T), codebook ids
(B, T, K) or embeddings (B, T, C), never images (B, C, H, W) or features (B, F), of an input whose dimension 0
is the batch; audio features (B, C, L) that the model's first Conv1d reads as C channels have it in dimension 2
(the memory step, which has the model, knows). Another input carries the batch
when its dimension 0 has the batch's size, and the sequence in every dimension past 0 of the sequence's size (a
(B, T, T) mask in both); anything else, a rotary table (T, D/2) beside (B, T, D) or a graph's `edge_index`
(2, E), is left as it is.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

DIMENSIONS = {"batch": 0, "seq": 1}


def input_tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors among the inputs, positional arguments first, in order, then keyword arguments."""
    return [t for t in torch.utils._pytree.tree_leaves((list(args), kwargs)) if isinstance(t, torch.Tensor)]


def has_sequence(tensor: torch.Tensor) -> bool:
    """Ids (B, T), (B, T, K) and embeddings (B, T, C) have a sequence dimension; images (B, C, H, W) and features
    (B, F) have none."""
    if tensor.is_floating_point():
        return tensor.dim() == 3
    return tensor.dim() >= 2


def sizes(args: tuple, kwargs: dict, model: torch.nn.Module | None = None) -> dict[str, int]:
    """The batch and sequence sizes of these inputs, those that they have ("batch", "seq" as keys). The sequence
    comes from an input that carries the batch in dimension 0 (a (tables, indices) stack of embedding-bag ids does
    not); with the `model`, a (B, C, L) input whose C is the channels of the model's first Conv1d (mel bins) has
    its sequence in dimension 2."""
    tensors = input_tensors(args, kwargs)
    found = {}
    first = next((t for t in tensors if t.dim() > 0), None)
    if first is not None and first.shape[0]:
        found["batch"] = first.shape[0]
    for tensor in tensors:
        if tensor.dim() < 2 or not has_sequence(tensor):
            continue
        if "batch" in found and tensor.shape[0] != found["batch"]:
            continue
        dim = 2 if model is not None and channels_first(tensor, model) else 1
        if tensor.shape[dim]:
            found["seq"] = tensor.shape[dim]
        break
    return found


def channels_first(tensor: torch.Tensor, model: torch.nn.Module) -> bool:
    """Whether a floating (B, C, L) input is channels first: its C is the input channels of the model's first
    Conv1d (and not also its length)."""
    if not tensor.is_floating_point() or tensor.dim() != 3 or tensor.shape[1] == tensor.shape[2]:
        return False
    conv = next((m for m in model.modules() if isinstance(m, torch.nn.Conv1d)), None)
    return conv is not None and conv.in_channels == tensor.shape[1]


def carried(tensor: torch.Tensor, name: str, size: int) -> list[int]:
    """The dimensions of `tensor` that carry the batch or sequence (`name`) of this size."""
    if name == "batch":
        return [0] if tensor.dim() > 0 and tensor.shape[0] == size else []
    return [dim for dim in range(1, tensor.dim()) if tensor.shape[dim] == size]


Grow = Callable[[torch.Tensor, int, int, int], torch.Tensor]  # (tensor, dim, old length, new length) -> tensor


def resized_tensor(value, found: dict[str, int], wanted: dict[str, int], grow: Grow | None = None):
    """`value` with the dimensions that carry each `found` size given the `wanted` one (anything not a tensor as
    it is). `grow` makes one dimension longer or shorter; by default its rows repeat cyclically (ids stay valid
    ids, masks stay masks)."""
    if not isinstance(value, torch.Tensor):
        return value
    grow = grow or repeat_rows
    new = value
    for name, size in wanted.items():
        if name in found:
            for dim in carried(value, name, found[name]):
                new = grow(new, dim, found[name], size)
    return new


def resized(args: tuple, kwargs: dict, found: dict[str, int], wanted: dict[str, int],
            grow: Grow | None = None) -> tuple[tuple, dict]:
    """The inputs, each tensor `resized_tensor`; one tensor given twice (`model(ids, labels=ids)`) stays one
    tensor (dynamo guards on the inputs' aliasing)."""
    done: dict[int, object] = {}

    def one(value):
        if id(value) not in done:
            done[id(value)] = (value, resized_tensor(value, found, wanted, grow))
        return done[id(value)][1]

    return (tuple(torch.utils._pytree.tree_map(one, list(args))), torch.utils._pytree.tree_map(one, kwargs))


def repeat_rows(tensor: torch.Tensor, dim: int, old: int, new: int) -> torch.Tensor:
    """`tensor` with dimension `dim` of length `new`, its rows repeated cyclically from the first."""
    return tensor.index_select(dim, torch.arange(new, device=tensor.device) % old)


def repeat_first_row(tensor: torch.Tensor, dim: int, old: int, new: int) -> torch.Tensor:
    """`tensor` with dimension `dim` made `new - old` longer by repeating its first row."""
    return torch.cat([tensor] + [tensor.narrow(dim, 0, 1)] * (new - old), dim=dim)
