"""The step's torch-function modes, kept active where torch would otherwise switch them off.

torch takes a torch-function mode off its stack while the mode handles a call, so a mode that passes the call on
with `func(*args)` sees none of the calls made inside it: the `scaled_dot_product_attention` inside
`F.multi_head_attention_forward`, and, since `Tensor.backward` is itself such a call, everything backward runs,
the regions a non-reentrant checkpoint recomputes among them. `call_inside` passes a call on with the mode back
on the stack.
"""

from __future__ import annotations

import contextlib
import inspect

import torch
from torch.overrides import TorchFunctionMode

from graphlint.memory.registry import STAND_INS, native_loop


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


class StandIns(TorchFunctionMode):
    """The calls of graphlint.memory.registry's STAND_INS, run on the meta device as `train_on`'s kernels run them:
    those of the entries placed `below_autocast` or not (the step pushes one of each, on either side of the
    model's own autocast regions). The mode stays active in what it passes on (call_inside), so it sees the calls
    inside library functions and in backward (a checkpoint's recomputation)."""

    def __init__(self, train_on: str, below_autocast: bool) -> None:
        super().__init__()
        self.train_on = train_on
        self.below_autocast = below_autocast

    @staticmethod
    def needed(train_on: str, below_autocast: bool) -> bool:
        """Whether any stand-in applies to a step meant for `train_on` at that place."""
        return any(train_on in entry.train_on and entry.below_autocast == below_autocast
                   for entry in STAND_INS.values())

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        try:
            entry = STAND_INS.get(func)
        except TypeError:  # an unhashable callable: no stand-in is registered for it
            entry = None
        if entry is not None and entry.below_autocast == self.below_autocast and self.train_on in entry.train_on:
            # a native call's ops come from the device's C++ loop whether they are stood in for (on meta) or the
            # device's own kernel makes them (a step run on the CPU itself)
            with native_loop() if entry.native else contextlib.nullcontext():
                result = entry.run(func, self.train_on, args, kwargs)
                return result if result is not None else call_inside(self, func, types, args, kwargs)
        return call_inside(self, func, types, args, kwargs)
