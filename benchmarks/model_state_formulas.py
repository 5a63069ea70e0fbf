"""Other tools' per-GPU model-state figures, as their documentation states them, for the distributed truth table.

Both count parameters, gradients and Adam's state only, no activations and no collective buffers; the table shows
how far that lands from a rank's measured peak.
"""

from __future__ import annotations

from torch import nn


def _largest_layer(model: nn.Module) -> int:
    """The most parameters held directly by one module (DeepSpeed's "largest layer")."""
    return max((sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()), default=0)


def deepspeed_zero3(model: nn.Module, world: int) -> int:
    """DeepSpeed `estimate_zero3_model_states_mem_needs`, no offload, one node: 4 bytes for the largest layer's
    parameters (gathered whole) plus 18 bytes per parameter shared over the GPUs (deepspeed/runtime/zero/
    stage3.py and its docs page "Memory Requirements")."""
    total = sum(p.numel() for p in model.parameters())
    return 4 * _largest_layer(model) + int(18 * total / world)


def accelerate_training(model: nn.Module) -> int:
    """`accelerate estimate-memory`: the model's size in its dtype, and training with Adam about 4 times that,
    per GPU, whatever the world size (accelerate's docs, "Model memory estimator")."""
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    return 4 * size
