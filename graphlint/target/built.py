"""What a target's factory returns, checked and made one shape: the model, its inputs, the loss and further calls
(`Target`, `normalize_factory_result`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable

from graphlint.errors import TargetFailure


@dataclass
class Target:
    """What a factory may return: the model, its positional and keyword inputs, optionally the loss (a callable
    on the model's output) for the backward pass, and `calls`: more inputs the model will really be called with,
    as `(args, kwargs)` pairs (or `(args,)`), which the torch.compile analysis (GL302) runs after the first."""

    model: Any
    args: tuple = ()
    kwargs: dict | None = None
    loss: Callable | None = None
    calls: list = field(default_factory=list)


def normalize_factory_result(result: Any) -> Target:
    """Accept `(model, args)`, `(model, args, kwargs)` or a `Target`; anything else is a clear error."""
    import torch  # here, not at the top: parsing target names must not need torch
    if isinstance(result, Target):
        made = result
    elif isinstance(result, tuple) and len(result) in (2, 3):
        made = Target(*result)
    else:
        raise TargetFailure(
            f"the factory returned {describe_value(result)}; return (model, args), (model, args, kwargs) "
            "or graphlint.Target(model, args, kwargs, loss), or the model alone with --input specs or an "
            "example_inputs() method"
        )
    if not isinstance(made.model, torch.nn.Module):
        raise TargetFailure(f"the factory's model is {describe_value(made.model)}, not a torch.nn.Module")
    if isinstance(made.args, list):
        made.args = tuple(made.args)
    if not isinstance(made.args, tuple):
        hint = " (write (x,) for a single input)" if isinstance(made.args, torch.Tensor) else ""
        raise TargetFailure(f"the factory's args is {describe_value(made.args)}, not a tuple{hint}")
    if made.kwargs is None:
        made.kwargs = {}
    if not isinstance(made.kwargs, dict):
        raise TargetFailure(f"the factory's kwargs is {describe_value(made.kwargs)}, not a dict")
    if made.loss is not None and not callable(made.loss):
        raise TargetFailure(f"the target's loss is {describe_value(made.loss)}, not a callable on the model's output")
    if not isinstance(made.calls, (list, tuple)):
        raise TargetFailure(f"the target's calls is {describe_value(made.calls)}, not a list of (args, kwargs) pairs")
    made.calls = [_call(call, index) for index, call in enumerate(made.calls)]
    return made


def _call(call: Any, index: int) -> tuple[tuple, dict]:
    """One entry of `Target.calls` as (args, kwargs), or a clear error."""
    if isinstance(call, list):
        call = tuple(call)
    if isinstance(call, tuple) and len(call) in (1, 2) and isinstance(call[0], (tuple, list)) \
            and (len(call) == 1 or isinstance(call[1], dict)):
        return tuple(call[0]), dict(call[1]) if len(call) == 2 else {}
    raise TargetFailure(f"the target's calls[{index}] is {describe_value(call)}; write each call as (args, kwargs) "
                        "or (args,), with args a tuple and kwargs a dict")


def describe_value(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, tuple):
        return f"a tuple of {len(value)}"
    name = type(value).__name__
    return f"{'an' if name[0].lower() in 'aeiou' else 'a'} {name}"
