"""Which scalar the autograd capture differentiates: `Target.loss(output)`, else the output's `.loss`, else a sum."""

from __future__ import annotations

import dataclasses
import functools
import types
from typing import Any
from collections.abc import Callable

import torch

from graphlint.errors import TargetFailure, call_user_code, one_line, raised_by_graphlint


def choose_loss(output: Any, loss_fn: Callable | None) -> torch.Tensor | None:
    """The loss for the backward pass, or None when the output carries nothing to differentiate."""
    if loss_fn is not None:
        try:
            loss = call_user_code(loss_fn, output)
        except Exception as error:
            if raised_by_graphlint(error):
                raise
            raise TargetFailure(f"the target's loss function raised {one_line(error)}") from error
        if not isinstance(loss, torch.Tensor):
            raise TargetFailure(f"the target's loss function returned {type(loss).__name__}; return a scalar tensor")
        if loss.numel() != 1:
            raise TargetFailure(
                f"the target's loss function returned a tensor of shape {tuple(loss.shape)}; "
                "return a scalar (reduce it with .mean() or .sum())"
            )
        return _scalar(loss)
    own_loss = getattr(output, "loss", None)
    if isinstance(own_loss, torch.Tensor) and own_loss.numel() == 1:
        return _scalar(own_loss)  # Hugging Face outputs carry their loss when labels are given
    # A function the forward returns (a closure adding a branch's output back, a partial) is called by the
    # caller later, so the tensors it holds reach the caller's loss as returned tensors do.
    parts = [t.float().sum() for t in floating_tensors(output, through_functions=True) if t.requires_grad]
    if not parts:
        return None
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total


def _scalar(loss: torch.Tensor) -> torch.Tensor:
    # A reshape would add a node to the autograd graph that the user's code never made.
    return loss if loss.dim() == 0 else loss.reshape(())


def floating_tensors(value: Any, _seen: set[int] | None = None, through_functions: bool = False) -> list[torch.Tensor]:
    """Every floating-point tensor inside an output: tensors, tuples, lists, dicts, dataclasses, ModelOutputs;
    with `through_functions`, also those a returned function holds (closure cells, a partial's arguments), but
    never a module's own (a bound method's `self`)."""
    seen = _seen if _seen is not None else set()
    if id(value) in seen:
        return []
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() else []
    if isinstance(value, dict):
        items = list(value.values())
    elif isinstance(value, (tuple, list)):
        items = list(value)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = [getattr(value, f.name, None) for f in dataclasses.fields(value)]
    elif through_functions and isinstance(value, functools.partial):
        items = [value.func, *value.args, *value.keywords.values()]
    elif through_functions and isinstance(value, types.MethodType):
        items = [value.__func__]
    elif through_functions and isinstance(value, types.FunctionType):
        items = [_cell_contents(cell) for cell in value.__closure__ or ()]
    else:
        return []
    found = []
    for item in items:
        found.extend(floating_tensors(item, seen, through_functions))
    return found


def _cell_contents(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # a cell not yet filled (a name the function assigns later)
        return None
