"""The kernel audit: does the step on meta allocate and keep what the CPU's kernels allocate and keep?

For a model's training step, every distinct aten call it makes (forward, loss and backward, with its inputs'
shapes, strides and dtypes) is replayed once on CPU, under PyTorch's memory profiler, and once on meta, under
graphlint's kernel models (graphlint.memory.registry's tables). For each call it compares

- what the kernel allocates beyond its outputs while it runs (the profiler's rise inside the op, less the
  outputs): a workspace, a scratchpad, a contiguous copy of a strided input; on meta, what graphlint's models
  allocate for it;
- what the op returns (an LSTM's workspace, empty from its meta function) and what autograd keeps for backward
  beyond the op's inputs and outputs.

A difference above the tolerance is a finding naming the op: the step on meta does not see that memory and
graphlint has no model for it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from graphlint.capture.loss import choose_loss
from graphlint.memory.kernels import CpuKernelMemory, modeled_scratch, quiet_profile, rises
from graphlint.memory.modes import StandIns
from graphlint.memory.step import kept_by

# a difference smaller than this many bytes, or than this share of the op's inputs and outputs, is noise
# (allocator rounding, the profiler's own small allocations)
MIN_BYTES = 64 * 1024
SHARE = 0.05


@dataclass
class Finding:
    op: str
    what: str  # "allocates" (inside the kernel), "returns" (its outputs) or "keeps" (for backward)
    cpu_bytes: int
    meta_bytes: int
    shapes: str

    def __str__(self) -> str:
        what = {"allocates": "allocates beyond its outputs", "returns": "returns", "keeps": "keeps for backward "
                "beyond its inputs and outputs"}[self.what]
        return (f"{self.op} ({self.shapes}) {what} {self.cpu_bytes} bytes on CPU, {self.meta_bytes} on meta with "
                f"graphlint's models")


@dataclass(frozen=True)
class _Spec:
    """A tensor argument as the call saw it."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    grad: bool

    def make(self, device: str) -> torch.Tensor:
        span = 1 + sum((size - 1) * stride for size, stride in zip(self.shape, self.stride, strict=True)
                       if size > 0)
        base = torch.zeros(span if all(self.shape) else 0, dtype=self.dtype, device=device)
        tensor = base.as_strided(self.shape, self.stride)
        if self.grad and self.dtype.is_floating_point:
            tensor = tensor.detach().requires_grad_(True)
        return tensor


class _Recorder(TorchDispatchMode):
    """Every distinct aten call of a step: the op and its arguments, tensors replaced by their specs."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[tuple, tuple] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "aten" and torch.Tag.view_copy not in func.tags and not _is_view(func):
            specs = torch.utils._pytree.tree_map(_spec, (args, kwargs))
            key = (func, repr(specs))
            self.calls.setdefault(key, (func, specs))
        return func(*args, **kwargs)


def _is_view(func) -> bool:
    return any(a.alias_info is not None and not a.alias_info.is_write for a in func._schema.returns) or \
        func.__name__.startswith(("detach", "empty", "zeros", "ones", "randn", "rand", "full", "scalar_tensor",
                                  "lift_fresh", "_to_copy", "copy_"))


def _spec(value):
    if isinstance(value, torch.Tensor) and value.layout == torch.strided:
        return _Spec(tuple(value.shape), tuple(value.stride()), value.dtype, value.requires_grad)
    return value


def record_calls(model: torch.nn.Module, args: tuple, kwargs: dict, loss_fn: Callable | None) -> list[tuple]:
    """The distinct aten calls of the model's forward, loss and backward on CPU."""
    recorder = _Recorder()
    with recorder:
        loss = choose_loss(model(*args, **kwargs), loss_fn)
        if loss is not None:
            loss.backward()
    return list(recorder.calls.values())


def audit_calls(calls: list[tuple]) -> list[Finding]:
    """Replay each call on CPU (under the profiler) and on meta (under graphlint's models) and compare."""
    from torch.profiler import record_function

    findings = []
    measured = []
    with _disable_current_modes():
        prepared = [(func, _materialize(specs, "cpu")) for func, specs in calls]
        for func, (args, kwargs) in prepared:  # once before measuring: first calls set up buffers they keep
            try:
                func(*args, **kwargs)
            except Exception:
                continue
        with quiet_profile(record_shapes=True, with_stack=True) as prof:
            torch.zeros(1)  # the tensors alive before are on the timeline from its first event: one before the calls
            for index, (func, (args, kwargs)) in enumerate(prepared):
                with record_function(f"graphlint-audit:{index}"):
                    try:
                        out = func(*args, **kwargs)
                    except Exception:  # a call that zeros for inputs cannot replay (an index out of a range)
                        out = None
                measured.append((func, args, kwargs, out))
        rose = rises(prof, [f"graphlint-audit:{index}" for index in range(len(prepared))])
        for (func, args, kwargs, out), rise, (_, specs) in zip(measured, rose, calls, strict=True):
            if out is None:
                continue
            inputs = _storages((args, kwargs))
            made = _new_bytes(out, inputs)
            sides = _new_bytes([kept_by(t.grad_fn) for t in _tensors(out) if t.grad_fn is not None],
                               inputs | _storages(out))
            meta_args, meta_kwargs = _materialize(specs, "meta")
            try:
                with StandIns("cpu", below_autocast=False), CpuKernelMemory():
                    meta_out = func(*meta_args, **meta_kwargs)
            except Exception:  # no meta function: the step on meta could not run it either
                continue
            meta_inputs = _storages((meta_args, meta_kwargs))
            meta_made = _new_bytes(meta_out, meta_inputs)
            meta_sides = _new_bytes([kept_by(t.grad_fn) for t in _tensors(meta_out) if t.grad_fn is not None],
                                    meta_inputs | _storages(meta_out))
            scale = sum(_bytes(t) for t in _tensors((args, kwargs, out)))
            shapes = ", ".join("x".join(map(str, s.shape)) for s in torch.utils._pytree.tree_leaves(specs)
                               if isinstance(s, _Spec))
            scratch = max(0, rise - made)
            modeled = modeled_scratch(func, meta_args)
            if _differ(scratch, modeled, scale):
                findings.append(Finding(func.__name__, "allocates", scratch, modeled, shapes))
            if _differ(made, meta_made, scale):
                findings.append(Finding(func.__name__, "returns", made, meta_made, shapes))
            if _differ(sides, meta_sides, scale):
                findings.append(Finding(func.__name__, "keeps", sides, meta_sides, shapes))
    return findings


def audit(model: torch.nn.Module, args: tuple, kwargs: dict, loss_fn: Callable | None) -> list[Finding]:
    """The findings of the audit over every aten call of the model's step (the model and inputs on CPU)."""
    return audit_calls(record_calls(model, args, kwargs, loss_fn))


def _differ(cpu: int, meta: int, scale: int) -> bool:
    return abs(cpu - meta) > max(MIN_BYTES, SHARE * scale)


def _materialize(specs, device: str):
    return torch.utils._pytree.tree_map(lambda v: v.make(device) if isinstance(v, _Spec) else v, specs)


def _tensors(value) -> list[torch.Tensor]:
    return [t for t in torch.utils._pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


def _bytes(tensor: torch.Tensor) -> int:
    try:
        return tensor.untyped_storage().nbytes()
    except Exception:
        return 0


def _storages(value) -> set[int]:
    keys = set()
    for tensor in _tensors(value):
        try:
            keys.add(tensor.untyped_storage().data_ptr() if tensor.device.type != "meta" else id(
                tensor.untyped_storage()))
        except Exception:
            continue
    return keys


def _new_bytes(value, known: set[int]) -> int:
    total, seen = 0, set(known)
    for tensor in _tensors(value):
        try:
            storage = tensor.untyped_storage()
            key = storage.data_ptr() if tensor.device.type != "meta" else id(storage)
        except Exception:
            continue
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total
