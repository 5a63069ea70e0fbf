"""The one place to add what a kernel does with memory that the step on the meta device cannot see.

Two tables, each consulted by the step (graphlint.memory.step) and the kernel audit (graphlint.memory.audit):

- `KERNEL_MEMORY`, keyed by aten op (an `OpOverload`, or an op's name for all its overloads): what the device's
  kernel allocates or returns beyond what its meta function does (`KernelMemoryModel`). Added with `register`,
  whose decorated function is the kernel's scratch on CPU.
- `STAND_INS`, keyed by the Python function a model calls (`torch._VF.lstm`, `F.scaled_dot_product_attention`):
  a call that on the meta device would take another path than the device's kernels (an unrolled loop, an
  unfused attention), run on meta as the device runs it. Added with `stand_in`.

Adding a kernel is adding one entry: the modules that hold the models (graphlint.memory.kernels, and
graphlint.memory.step for attention) register them when they are imported. Torch is not imported here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch._ops import OpOverload


@dataclass(frozen=True)
class KernelMemoryModel:
    """What one aten kernel does with memory beyond its meta function's outputs.

    `scratch(func, args)`: bytes the CPU kernel allocates beyond its outputs while it runs (allocated before the
    op and freed after it in the step); `unmodelled(func, args)`: what of its own memory is not counted, said
    for a note, or None; `outputs(func, args, out)`: on meta, the outputs as the device's kernel returns them (a
    workspace the meta function returns empty), or None to keep them; `cuda`: what the CUDA kernel allocates for
    itself, which no step here can see, for the note of a step meant for CUDA."""

    scratch: Callable[[Any, tuple], int] | None = None
    unmodelled: Callable[[Any, tuple], str | None] | None = None
    outputs: Callable[[Any, tuple, Any], Any] | None = None
    cuda: str | None = None


KERNEL_MEMORY: dict[OpOverload | str, KernelMemoryModel] = {}


def register(*ops: OpOverload | str, unmodelled=None, outputs=None, cuda: str | None = None):
    """A decorator: the function (or None, for a model with no scratch) is the scratch of each of `ops`, with the
    model's other parts given here."""
    def add(scratch):
        for op in ops:
            KERNEL_MEMORY[op] = KernelMemoryModel(scratch, unmodelled, outputs, cuda)
        return scratch
    return add


def kernel_model(func) -> KernelMemoryModel | None:
    """The model of this aten op: its overload's entry, else its name's."""
    found = KERNEL_MEMORY.get(func)
    if found is None:
        found = KERNEL_MEMORY.get(getattr(func, "_opname", None))
    return found


@dataclass(frozen=True)
class StandIn:
    """A call run on the meta device as a device's kernels run it.

    `run(func, train_on, args, kwargs)` returns the call's result, or None to leave the call as it is (not on meta,
    shapes the kernel does not take); `train_on`: the devices whose kernels it stands in for (`--train-on`);
    `below_autocast`: whether the model's own autocast regions cast the call's arguments before it (attention,
    whose kernel gets the cast tensors), else it runs above them, so that the calls it makes (a recurrent
    layer's products) are cast as the model's own are; `native`: the device's kernel issues the ops the stand-in
    makes from a loop of its own in C++, with no Python between them (aten's recurrent layers), which a step's
    timing prices so (`in_native_loop`)."""

    run: Callable[[Callable, str, tuple, dict], Any]
    train_on: tuple[str, ...] = ("cuda", "cpu")
    below_autocast: bool = False
    native: bool = False


STAND_INS: dict[Callable, StandIn] = {}


def stand_in(*functions: Callable, train_on: tuple[str, ...] = ("cuda", "cpu"), below_autocast: bool = False,
             native: bool = False):
    """A decorator: the function is the stand-in for calls of each of `functions` (see StandIn)."""
    def add(run):
        for function in functions:
            STAND_INS[function] = StandIn(run, train_on, below_autocast, native)
        return run
    return add


_native_depth = [0]  # how many `native` stand-ins are running now (one thread runs the step)


class native_loop:  # noqa: N801 (used as a context manager, named as one)
    """Entered around a `native` stand-in's run: the ops made inside are issued, on the device, from C++."""

    def __enter__(self):
        _native_depth[0] += 1

    def __exit__(self, *exc):
        _native_depth[0] -= 1


def in_native_loop() -> bool:
    """Whether the op being made now stands for one a kernel's own C++ loop issues (see StandIn.native)."""
    return _native_depth[0] > 0
