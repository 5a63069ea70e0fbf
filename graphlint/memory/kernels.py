"""What a device's kernels keep or allocate that their meta functions do not, for a step run on the meta device.

A meta function gives an op's outputs their shapes; it does not take the device kernel's path. Where the two
differ in memory, the step on meta is made to take the device's path here:

- **LSTM on CPU** runs oneDNN's kernel (`aten::mkldnn_rnn_layer`, one call per layer and direction), which
  returns a workspace that autograd keeps until backward; its meta function returns the workspace empty, and
  on meta `nn.LSTM` does not even take that path (it unrolls the cells). Here the step on meta calls the same
  ops as the CPU kernel, in its order, and the workspace gets the size the CPU kernel gives it, measured by
  running that kernel at four small sizes (it is bilinear in the sequence length and the batch, within 0.1%
  at the sizes models use).
- **GRU and RNN on CPU** run torch's generic loop with the input projection computed once for the whole
  sequence (a CPU-only branch); on meta it is computed step by step. Here the step on meta runs the CPU's loop.

For `--train-on cuda` the cuDNN RNN reserve space is not measured (no GPU here): see docs/memory.md.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

_LSTM = 2  # oneDNN's mode number for an LSTM (aten::mkldnn_rnn_layer's `mode`)


class CpuKernelsOnMeta(TorchFunctionMode):
    """Recurrent layers on the meta device, as CPU's kernels run them (see the module's docstring)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch._VF.lstm and len(args) == 9 and _on_meta(args[0]) and _onednn_lstm_applies(*args):
            return _onednn_lstm(*args)
        if func in _GENERIC and len(args) == 9 and _on_meta(args[0]) and args[0].is_floating_point():
            return _generic_rnn(_GENERIC[func], *args)
        return func(*args, **kwargs)


def _on_meta(value) -> bool:
    # a fake tensor (a sharded step under FakeTensorMode) runs the same meta functions as a meta one
    return isinstance(value, torch.Tensor) and (value.device.type == "meta" or isinstance(value, FakeTensor))


def _onednn_lstm_applies(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    # torch's use_mkldnn: float32 input (bfloat16 and half take it only on some CPUs), no projections
    # (hx's cell state has the hidden size), and oneDNN built in
    return (input.dtype == torch.float32 and input.dim() == 3 and input.numel() > 0
            and torch.backends.mkldnn.is_available() and torch._C._get_mkldnn_enabled()
            and hx[0].shape[-1] == hx[1].shape[-1])


def _onednn_lstm(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    """aten::lstm's oneDNN path on CPU (mkldnn_impl), op for op."""
    x = (input.transpose(0, 1) if batch_first else input).contiguous()
    h0, c0 = hx
    directions = 2 if bidirectional else 1
    per = 4 if has_biases else 2
    hidden = h0.shape[-1]
    hy, cy = [], []
    for layer in range(num_layers):
        outputs = []
        for direction in range(directions):
            index = layer * directions + direction
            weights = params[index * per:(index + 1) * per]
            h, c = h0[index], c0[index]
            if has_biases:
                b_ih, b_hh = weights[2], weights[3]
            else:
                b_ih = torch.zeros(4 * hidden, dtype=x.dtype, device=x.device)
                b_hh = torch.zeros(4 * hidden, dtype=x.dtype, device=x.device)
            out, h, c, _ = _FORWARD(x, weights[0], weights[1], b_ih, b_hh, h, c, direction == 1, [], _LSTM, hidden,
                                    num_layers, has_biases, bidirectional, False, train)
            outputs.append(out)
            hy.append(h)
            cy.append(c)
        x = torch.cat(outputs, -1) if directions == 2 else outputs[0]
        if dropout > 0 and train and layer < num_layers - 1:
            x = F.dropout(x, dropout, True)
    hy, cy = torch.stack(hy), torch.stack(cy)  # before the output's transpose, as aten orders them
    return (x.transpose(0, 1) if batch_first else x), hy, cy


class CpuKernelMemory(TorchDispatchMode):
    """Pushed inside the step's tracker, so that what it allocates is tracked: the scratch CPU kernels hold while
    they run (modeled_scratch), allocated before the op and freed after it, and oneDNN's LSTM workspace at its
    CPU size (the meta function returns it empty)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not args or not _on_meta(args[0]) and not (len(args) > 1 and _on_meta(args[1])):
            return func(*args, **kwargs)
        size = modeled_scratch(func, args)
        device = (args[0] if _on_meta(args[0]) else args[1]).device
        scratch = torch.empty(size, dtype=torch.uint8, device=device) if size else None
        out = func(*args, **kwargs)
        del scratch
        if func is _FORWARD and args[15] and torch.is_grad_enabled():  # train: the kernel makes a workspace
            steps, batch, inputs = args[0].shape
            size = onednn_lstm_memory(inputs, args[2].shape[-1]).line("workspace", steps, batch)
            out = (*out[:3], torch.empty(size, dtype=torch.uint8, device=out[3].device))
        return out


def modeled_scratch(func, args) -> int:
    """Bytes a CPU kernel allocates beyond its outputs while it runs, as graphlint models it: oneDNN's LSTM
    (measured, onednn_lstm_memory) and the BLAS matrix products, which copy an input whose last two dimensions
    are neither row- nor column-major (a stride-0 gradient from `sum()`'s backward, a sliced view) into a
    contiguous buffer first."""
    if func is _FORWARD or func is _BACKWARD:
        steps, batch, inputs = args[0].shape
        return onednn_lstm_memory(inputs, args[2].shape[-1]).line(
            "forward" if func is _FORWARD else "backward", steps, batch)
    matrices = _BLAS.get(func)
    if matrices is None:
        return 0
    return sum(_copied(args[i]) for i in matrices if i < len(args) and isinstance(args[i], torch.Tensor))


def _copied(matrix: torch.Tensor) -> int:
    """Bytes of the contiguous copy a BLAS call makes of `matrix` (0 when BLAS reads it as it is)."""
    if matrix.dim() < 2 or matrix.numel() == 0:
        return 0
    rows, cols = matrix.shape[-2:]
    row_stride, col_stride = matrix.stride()[-2:]
    if (col_stride == 1 or cols == 1) and row_stride >= max(1, cols):
        return 0
    if (row_stride == 1 or rows == 1) and col_stride >= max(1, rows):
        return 0
    return matrix.numel() * matrix.element_size()


_FORWARD = torch.ops.aten.mkldnn_rnn_layer.default
_BACKWARD = torch.ops.aten.mkldnn_rnn_layer_backward.default
# the matrix products whose CPU kernels go to BLAS, and the positions of their matrix arguments
_BLAS = {torch.ops.aten.mm.default: (0, 1), torch.ops.aten.addmm.default: (1, 2), torch.ops.aten.bmm.default: (0, 1),
         torch.ops.aten.baddbmm.default: (1, 2)}


class _Lines:
    """Byte counts of the form c0 + c1·T + c2·B + c3·T·B, fitted to the kernel's own at T, B in {8, 16}."""

    def __init__(self, measured: dict[str, dict[tuple[int, int], int]]) -> None:
        self.coefficients = {}
        for name, at in measured.items():
            c3 = (at[16, 16] - at[16, 8] - at[8, 16] + at[8, 8]) / 64
            c1 = (at[16, 8] - at[8, 8]) / 8 - 8 * c3
            c2 = (at[8, 16] - at[8, 8]) / 8 - 8 * c3
            self.coefficients[name] = (at[8, 8] - 8 * c1 - 8 * c2 - 64 * c3, c1, c2, c3)

    def line(self, name: str, steps: int, batch: int) -> int:
        c0, c1, c2, c3 = self.coefficients[name]
        return max(0, int(round(c0 + c1 * steps + c2 * batch + c3 * steps * batch)))


@functools.lru_cache(maxsize=256)
def onednn_lstm_memory(inputs: int, hidden: int) -> _Lines:
    """oneDNN's LSTM on this CPU, for one layer and direction of `inputs` features and `hidden` units: the
    workspace its forward returns, and the scratch its forward and backward hold above their outputs while
    they run (PyTorch's memory profiler's timeline inside the op), each measured at four small sizes."""
    measured: dict[str, dict[tuple[int, int], int]] = {"workspace": {}, "forward": {}, "backward": {}}
    with _disable_current_modes():
        _probe(8, 8, inputs, hidden)  # once before measuring: a first call sets up buffers it keeps
        for steps in (8, 16):
            for batch in (8, 16):
                workspace, forward, backward = _probe(steps, batch, inputs, hidden)
                measured["workspace"][steps, batch] = workspace
                measured["forward"][steps, batch] = forward
                measured["backward"][steps, batch] = backward
    return _Lines(measured)


def _probe(steps: int, batch: int, inputs: int, hidden: int) -> tuple[int, int, int]:
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import MemoryProfileTimeline

    def zeros(*shape, grad=False):
        return torch.zeros(*shape, device="cpu", dtype=torch.float32, requires_grad=grad)

    x, w_ih, w_hh = zeros(steps, batch, inputs, grad=True), zeros(4 * hidden, inputs, grad=True), zeros(
        4 * hidden, hidden, grad=True)
    b_ih, b_hh, h, c = zeros(4 * hidden, grad=True), zeros(4 * hidden, grad=True), zeros(batch, hidden), zeros(
        batch, hidden)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        out = _FORWARD(x, w_ih, w_hh, b_ih, b_hh, h, c, False, [], _LSTM, hidden, 1, True, False, False, True)
        grads = _BACKWARD(x, w_ih, w_hh, b_ih, b_hh, h, c, out[0], out[1], out[2], torch.ones_like(out[0]), None,
                          None, False, _LSTM, hidden, 1, True, True, False, [], False, out[3])
    workspace = out[3].untyped_storage().nbytes()
    made = sum(t.untyped_storage().nbytes() for t in out[:3]) + workspace
    made_back = sum(t.untyped_storage().nbytes() for t in grads if isinstance(t, torch.Tensor))
    return (workspace, max(0, _rise(prof, "aten::mkldnn_rnn_layer", MemoryProfileTimeline) - made),
            max(0, _rise(prof, "aten::mkldnn_rnn_layer_backward", MemoryProfileTimeline) - made_back))


def _rise(prof, name: str, timeline_class) -> int:
    """How far the bytes alive rose above their level at the op's start while the op ran."""
    event = next(e for e in prof.events() if e.name == name)
    offset = prof.profiler.kineto_results.trace_start_ns() / 1000
    start, end = event.time_range.start + offset, event.time_range.end + offset
    times, sizes = timeline_class(prof._memory_profile())._coalesce_timeline("cpu")
    totals = [sum(at) for at in sizes]
    before = [total for time, total in zip(times, totals, strict=True) if time < start]
    inside = [total for time, total in zip(times, totals, strict=True) if start <= time <= end]
    return max(inside, default=0) - (before[-1] if before else 0)


_GENERIC: dict = {torch._VF.gru: "gru", torch._VF.rnn_tanh: "tanh", torch._VF.rnn_relu: "relu"}


def _generic_rnn(mode, input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    """aten's generic RNN loop as it runs on CPU (_rnn_impl with FullLayer): the input projection of each layer
    and direction is one matmul over the whole sequence, then the cells step through time."""
    x = input.transpose(0, 1) if batch_first else input
    directions = 2 if bidirectional else 1
    per = 4 if has_biases else 2
    hiddens = hx.unbind(0)
    hy = []
    for layer in range(num_layers):
        outputs = []
        for direction in range(directions):
            index = layer * directions + direction
            weights = params[index * per:(index + 1) * per]
            w_ih, w_hh = weights[0], weights[1]
            b_ih, b_hh = (weights[2], weights[3]) if has_biases else (None, None)
            projected = F.linear(x, w_ih, b_ih).unbind(0)
            h = hiddens[index]
            steps = []
            for t in (reversed(range(len(projected))) if direction == 1 else range(len(projected))):
                h = _cell(mode, projected[t], h, w_hh, b_hh)
                steps.append(h)
            if direction == 1:
                steps.reverse()
            outputs.append(torch.stack(steps))
            hy.append(h)
        x = torch.cat(outputs, -1) if directions == 2 else outputs[0]
        if dropout > 0 and train and layer < num_layers - 1:
            x = F.dropout(x, dropout, True)
    hy = torch.stack(hy)
    return (x.transpose_(0, 1) if batch_first else x), hy


def _cell(mode, projected, hidden, w_hh, b_hh):
    """One step of aten's GRUCell / SimpleCell with the input already projected."""
    if mode == "gru":
        ir, iz, in_ = projected.unsafe_chunk(3, 1)
        hr, hz, hn = F.linear(hidden, w_hh, b_hh).unsafe_chunk(3, 1)
        reset = hr.add_(ir).sigmoid_()
        update = hz.add_(iz).sigmoid_()
        new = in_.add(hn.mul_(reset)).tanh_()
        return (hidden - new).mul_(update).add_(new)
    out = F.linear(hidden, w_hh, b_hh).add_(projected)
    return out.tanh() if mode == "tanh" else out.relu()
