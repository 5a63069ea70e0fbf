"""An op call as the step made it, kept so that it can be made again on another device: the op, and its arguments
with each tensor replaced by its layout (shape, strides, dtype, offset into a storage of a given size).

The recorder keeps one for each op that runs a kernel (graphlint.timing.record.OpRecorder with `calls=True`);
graphlint.timing.replay times them on this machine's CPU. Nothing here holds a tensor of the step: the step's
tensors are on the meta device, and its memory is the user's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_map


@dataclass(frozen=True, slots=True)
class TensorLayout:
    """A tensor argument, by what a kernel's speed depends on (not its values)."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    offset: int
    storage: int  # elements of the storage the tensor views (at least what shape, strides and offset reach)

    @classmethod
    def of(cls, tensor: torch.Tensor) -> TensorLayout:
        shape, stride = tuple(int(n) for n in tensor.shape), tuple(int(n) for n in tensor.stride())
        offset = int(tensor.storage_offset())
        reach = offset + 1 + sum((n - 1) * s for n, s in zip(shape, stride, strict=True)) if all(shape) else 0
        try:
            held = tensor.untyped_storage().nbytes() // tensor.element_size()
        except Exception:  # no single storage: as dense as its shape
            held = 0
        return cls(shape, stride, tensor.dtype, offset, max(reach, held))

    def nbytes(self) -> int:
        return self.storage * self.dtype.itemsize

    def key(self) -> str:
        return f"T({self.shape},{self.stride},{str(self.dtype).removeprefix('torch.')},{self.offset},{self.storage})"


@dataclass(frozen=True, slots=True)
class OpCall:
    """One op with its arguments' layouts; `key` names the call for a cache (equal keys: the same kernel at the
    same sizes)."""

    op: torch._ops.OpOverload
    args: tuple
    kwargs: dict
    key: str
    written: int = 0  # bytes of its outputs, which a replay allocates too (a `zeros` of a large shape has no input)

    def nbytes(self) -> int:
        """Bytes of the argument tensors a replay allocates."""
        return sum(leaf.nbytes() for leaf in _leaves((self.args, self.kwargs)) if isinstance(leaf, TensorLayout))

    def footprint(self) -> int:
        """Bytes one replay holds at once: its arguments and its outputs."""
        return self.nbytes() + self.written


def call_of(func, args: tuple, kwargs: dict, written: int = 0) -> OpCall | None:
    """The call `func(*args, **kwargs)` by layouts, or None when an argument cannot be made again (a tensor of a
    layout without strides, an opaque object)."""
    try:
        args, kwargs = tree_map(_layout, args), tree_map(_layout, kwargs)
    except _NotReplayable:
        return None
    return OpCall(func, args, kwargs, f"{func}|{_key(args)}|{_key(kwargs)}", written)


class _NotReplayable(Exception):
    pass


_PLAIN = (bool, int, float, str, type(None), torch.dtype, torch.memory_format, torch.layout)


def _layout(value):
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided or value.is_quantized or value.is_nested:
            raise _NotReplayable
        return TensorLayout.of(value)
    if isinstance(value, torch.device):
        return torch.device("cpu")  # the step's meta device; a replay runs on the CPU
    if isinstance(value, _PLAIN) or isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
        return value
    raise _NotReplayable  # a generator, a script object: a replay could not say what the step ran


def _key(value) -> str:
    if isinstance(value, TensorLayout):
        return value.key()
    if isinstance(value, tuple | list):
        return "(" + ",".join(_key(v) for v in value) + ")"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_key(v)}" for k, v in sorted(value.items())) + "}"
    return repr(value)


def _leaves(value):
    if isinstance(value, tuple | list):
        for item in value:
            yield from _leaves(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
    else:
        yield value
