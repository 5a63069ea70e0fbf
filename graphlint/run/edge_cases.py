"""Inputs a proof runs besides the factory's: the edge cases a rewrite of masks and sequences touches, which a
factory's random inputs almost never hold. A boolean mask argument with one row all False, and one with it all
True (which of the two masks every key depends on the model's polarity), and every input cut to a sequence of
length one. A variant the original model cannot run is skipped with a note. Runs in the proof's child
(graphlint.run.proof), which has torch imported already."""

from __future__ import annotations

from typing import Any

import torch

# At most this many boolean tensors are forced, two variants each: the proof must stay a few runs long.
MAX_MASKS = 2


def _tensors(args: tuple, kwargs: dict) -> list[tuple[str, torch.Tensor]]:
    """(where, tensor) of the forward's tensor arguments, positional ones named by index."""
    found = [(f"argument {index}", value) for index, value in enumerate(args) if isinstance(value, torch.Tensor)]
    return found + [(f"`{key}`", value) for key, value in kwargs.items() if isinstance(value, torch.Tensor)]


def _replaced(args: tuple, kwargs: dict, change) -> tuple[tuple, dict]:
    """The arguments with each tensor `t` replaced by `change(where, t)`."""
    new_args = tuple(change(f"argument {i}", v) if isinstance(v, torch.Tensor) else v for i, v in enumerate(args))
    new_kwargs = {k: change(f"`{k}`", v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    return new_args, new_kwargs


def variants(args: Any, kwargs: dict) -> tuple[list[tuple[str, tuple, dict]], list[str]]:
    """(name, args, kwargs) of each edge case to run, and notes on those that cannot be made."""
    args, kwargs = tuple(args) if isinstance(args, (tuple, list)) else (args,), dict(kwargs or {})
    found, notes = [], []
    masks = [where for where, t in _tensors(args, kwargs) if t.dtype == torch.bool and t.dim() >= 1 and t.numel()]
    for where in masks[:MAX_MASKS]:
        for value in (False, True):
            def force(name, tensor, where=where, value=value):
                if name != where:
                    return tensor
                forced = tensor.clone()
                forced[(0,) * (tensor.dim() - 1)] = value  # the first row, every key
                return forced
            found.append((f"{where} with its first row all {value}", *_replaced(args, kwargs, force)))
    length = _sequence_length(args, kwargs)
    if length is None:
        notes.append("proven without a sequence of length one: no input has a sequence dimension to cut")
    elif length > 1:
        batch = _batch_size(args, kwargs)

        def cut(name, tensor):
            # Every dimension of the sequence's length; the first too unless it may be the batch (a (T, T) mask).
            for dim in range(0 if length != batch else 1, tensor.dim()):
                if tensor.shape[dim] == length:
                    tensor = tensor.narrow(dim, 0, 1)
            return tensor.clone()
        found.append(("a sequence of length one", *_replaced(args, kwargs, cut)))
    return found, notes


def _sequence_length(args: tuple, kwargs: dict) -> int | None:
    """The length of the sequence dimension, as the first input of two or more dimensions lays it out:
    (batch, sequence, ...) or, with four, (batch, heads, sequence, head dim)."""
    for _, tensor in _tensors(args, kwargs):
        if tensor.dim() >= 2:
            return int(tensor.shape[2 if tensor.dim() == 4 else 1])
    return None


def _batch_size(args: tuple, kwargs: dict) -> int | None:
    for _, tensor in _tensors(args, kwargs):
        if tensor.dim() >= 2:
            return int(tensor.shape[0])
    return None
