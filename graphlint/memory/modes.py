"""The step's torch-function modes, kept active where torch would otherwise switch them off.

torch takes a torch-function mode off its stack while the mode handles a call, so a mode that passes the call on
with `func(*args)` sees none of the calls made inside it: the `scaled_dot_product_attention` inside
`F.multi_head_attention_forward`, and, since `Tensor.backward` is itself such a call, everything backward runs,
the regions a non-reentrant checkpoint recomputes among them. `call_inside` passes a call on with the mode back
on the stack.
"""

from __future__ import annotations

import inspect

import torch
from torch.overrides import TorchFunctionMode


def call_inside(mode: TorchFunctionMode, func, types, args, kwargs):
    """`func(*args, **kwargs)` with `mode` active for the calls `func` makes. Only a Python function can make
    such calls (an aten op or a C method runs no Python); a method of Tensor written in Python that calls its
    C version (`Tensor.unflatten`) would come back to the mode as itself, so it is called plainly, except
    `backward`, whose C side never does."""
    if inspect.isfunction(func) and (func is torch.Tensor.backward or getattr(torch.Tensor, func.__name__, None)
                                     is not func):
        with mode:
            return torch.overrides.redispatch_function(func, types, args, kwargs)
    return func(*args, **kwargs)
