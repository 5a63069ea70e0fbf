"""What a device's kernels keep or allocate that their meta functions do not, for a step run on the meta device.

A meta function gives an op's outputs their shapes; it does not take the device kernel's path. Where the two
differ in memory, the step on meta is made to take the device's path here:

- **LSTM on CPU** runs oneDNN's kernel (`aten::mkldnn_rnn_layer`, one call per layer and direction), which
  returns a workspace that autograd keeps until backward; its meta function returns the workspace empty, and
  on meta `nn.LSTM` does not even take that path (it unrolls the cells). Here the step on meta calls the same
  ops as the CPU kernel, in its order, and the workspace gets the size the CPU kernel gives it, measured by
  running that kernel at four small sizes (it is bilinear in the sequence length and the batch, within 0.1%
  at the sizes models use).
- **GRU and RNN on CPU**, and an LSTM that oneDNN does not take (`torch.backends.mkldnn` switched off, a
  projection), run torch's generic loop with the input projection computed once for the whole sequence (a
  CPU-only branch); on meta it is computed step by step. Here the step on meta runs the CPU's loop.

For `--train-on cuda` the cuDNN RNN reserve space is not measured (no GPU here): see docs/memory.md.

Each model is one entry of graphlint.memory.registry's tables: the recurrent layers' stand-in below, the kernels'
scratch, outputs and CUDA workspaces at the end of this module.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from graphlint.memory.registry import KERNEL_MEMORY, kernel_model, register, stand_in

_LSTM = 2  # oneDNN's mode number for an LSTM (aten::mkldnn_rnn_layer's `mode`)


_GENERIC: dict = {torch._VF.gru: "gru", torch._VF.rnn_tanh: "tanh", torch._VF.rnn_relu: "relu"}


@stand_in(torch._VF.lstm, *_GENERIC, train_on=("cpu",), native=True)
def _recurrent_layer(func, train_on, args, kwargs):
    """Recurrent layers on the meta device, as CPU's kernels run them (see the module's docstring)."""
    if len(args) != 9 or not _on_meta(args[0]) or not args[0].is_floating_point():
        return None
    if func is torch._VF.lstm:
        # oneDNN's kernel where torch's use_mkldnn picks it (its switch on, no projection), else aten's loop
        return _onednn_lstm(*args) if _onednn_lstm_applies(*args) else _generic_rnn("lstm", *args)
    return _generic_rnn(_GENERIC[func], *args)


def _on_meta(value) -> bool:
    # a fake tensor (a sharded step under FakeTensorMode) runs the same meta functions as a meta one
    return isinstance(value, torch.Tensor) and (value.device.type == "meta" or isinstance(value, FakeTensor))


# What CUDA's kernels allocate for themselves, which the step (on meta or CPU) cannot see (KernelMemoryModel.cuda).
CUDNN_WORKSPACE = "cuDNN's convolution workspace (its size follows the algorithm cuDNN picks)"
CUBLAS_WORKSPACE = "cuBLAS's workspace (allocated once per stream and kept; CUBLAS_WORKSPACE_CONFIG sets it)"
ATTENTION_WORKSPACE = "the fused attention kernels' workspace"
_CUDA_RECURRENT = ("LSTM", "GRU", "RNN")


def cuda_workspace_note(ops: set, module_types: set[str]) -> str | None:
    """For a step meant for CUDA: the kernels of the step (`ops`, the aten ops it ran) that allocate memory of their
    own on a GPU (KERNEL_MEMORY's `cuda`, in the table's order), which graphlint does not count (no GPU runs the
    step), said as one note; None when the step has none."""
    names = {op._opname for op in ops}
    seen = []
    for op, model in KERNEL_MEMORY.items():
        if model.cuda is not None and model.cuda not in seen and (op in ops or op in names):
            seen.append(model.cuda)
    if any(kind in module_types for kind in _CUDA_RECURRENT):
        seen.insert(0, "cuDNN's reserve space of the recurrent layers, which autograd keeps until backward")
    if not seen:
        return None
    return ("not counted: what CUDA's kernels allocate for themselves, " + "; ".join(seen)
            + " (graphlint runs no GPU; --train-on cpu counts the CPU kernels' own memory)")


def _on_cpu(value) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.layout == torch.strided


def _onednn_lstm_applies(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    # torch's use_mkldnn: float32 input, or bfloat16/half where this CPU's oneDNN supports them, no projections
    # (hx's cell state has the hidden size), and oneDNN built in
    return (_onednn_dtype(input.dtype) and input.dim() == 3 and input.numel() > 0
            and torch.backends.mkldnn.is_available() and torch._C._get_mkldnn_enabled()
            and hx[0].shape[-1] == hx[1].shape[-1])


def _onednn_dtype(dtype: torch.dtype) -> bool:
    # checked with the profiler (mkldnn_rnn_layer): bf16 goes to oneDNN where the CPU supports it, half likewise
    if dtype == torch.bfloat16:
        return torch.ops.mkldnn._is_mkldnn_bf16_supported()
    if dtype == torch.float16:
        return torch.ops.mkldnn._is_mkldnn_fp16_supported()
    return dtype == torch.float32


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
    CPU size (the meta function returns it empty). On the meta device and on CPU alike: a CPU kernel's own
    allocations happen below the dispatcher, where no tracker sees them (a step that could not run on meta runs
    the real kernels, which allocate the same scratch unseen). `unmodelled`: what it could not count, for notes."""

    def __init__(self) -> None:
        super().__init__()
        self.unmodelled: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # a step on meta can pass a host scalar beside its meta tensors: the kernel is the meta tensor's
        first = next((a for a in args[:2] if _on_meta(a)), None)
        if first is None:
            first = next((a for a in args[:2] if _on_cpu(a)), None)
        if first is None:
            return func(*args, **kwargs)
        _probe_failed[0] = False
        model = kernel_model(func)
        size = model.scratch(func, args) if model is not None and model.scratch is not None else 0
        missed = model.unmodelled(func, args) if model is not None and model.unmodelled is not None else None
        if _probe_failed[0]:
            missed = f"the scratch of {func.__name__}, whose kernel graphlint's probe could not run at the call's sizes"
        if missed:
            self.unmodelled.add(missed)
        scratch = torch.empty(size, dtype=torch.uint8, device=first.device) if size else None
        out = func(*args, **kwargs)
        del scratch
        if model is not None and model.outputs is not None and _on_meta(first):
            out = model.outputs(func, args, out)
        return out


def modeled_scratch(func, args) -> int:
    """Bytes a CPU kernel allocates beyond its outputs while it runs, as graphlint models it (KERNEL_MEMORY's
    `scratch`; 0 for a kernel it has no model of)."""
    model = kernel_model(func)
    return model.scratch(func, args) if model is not None and model.scratch is not None else 0


def _onednn_lstm_scratch(func, args) -> int:
    """oneDNN's LSTM layer, forward or backward: measured (onednn_lstm_memory)."""
    steps, batch, inputs = args[0].shape
    return onednn_lstm_memory(inputs, args[2].shape[-1], args[0].dtype).line(
        "forward" if func is _FORWARD else "backward", steps, batch)


def _onednn_lstm_workspace(func, args, out):
    """In training the forward makes a workspace, which its meta function returns empty."""
    if not (args[15] and torch.is_grad_enabled()):
        return out
    steps, batch, inputs = args[0].shape
    size = onednn_lstm_memory(inputs, args[2].shape[-1], args[0].dtype).line("workspace", steps, batch)
    return (*out[:3], torch.empty(size, dtype=torch.uint8, device=out[3].device))


def _large_low_precision_product(func, args) -> str | None:
    matrices = _BLAS[func]
    if args[matrices[0]].dtype in (torch.bfloat16, torch.float16):
        if args[matrices[0]].numel() * args[matrices[1]].shape[-1] > SMALL_PRODUCT:
            return ("oneDNN's packing buffers of bfloat16 or half matrix products larger than 2^31 multiply-adds "
                    "(not measured: it would take the kernel's own time)")
    return None


def _blas_scratch(func, args) -> int:
    """A BLAS matrix product copies an input whose last two dimensions are neither row- nor column-major (a
    stride-0 gradient from `sum()`'s backward, a sliced view) into a contiguous buffer first; in bfloat16 or half,
    oneDNN packs its operands (measured)."""
    matrices = _BLAS[func]
    if args[matrices[0]].dtype in (torch.bfloat16, torch.float16):
        return _low_precision_product(func, args, matrices)
    return sum(_copied(args[i]) for i in matrices if i < len(args) and isinstance(args[i], torch.Tensor))


SMALL_PRODUCT = 2**31  # multiply-adds: a low-precision product up to this size is measured (well under a second)


def _low_precision_product(func, args, matrices) -> int:
    """A bfloat16 or half matrix product on CPU goes to oneDNN, which packs its operands into blocked buffers (and
    accumulates in float32) whose size depends on its blocking, not a formula: measured at the call's own
    shapes, dtype and layout. A larger product is not measured (it would take the real kernel's time)."""
    first, second = args[matrices[0]], args[matrices[1]]
    work = first.numel() * second.shape[-1]
    if work > SMALL_PRODUCT:
        return 0
    return _measured_scratch(func, _call_key(args, ((), ()), 0))


def contiguous_copies(*positions: int):
    """The scratch of a kernel that makes a contiguous copy of the arguments at `positions` that are not
    contiguous."""
    def scratch(func, args) -> int:
        return sum(a.numel() * a.element_size() for i in positions if isinstance(a := args[i], torch.Tensor)
                   and not a.is_contiguous())
    return scratch


SMALL_BATCH = 8  # a larger call is measured at batches 4 and 8...
SMALL_CALL = 64 * 2**20  # ...unless its tensors take at most this many bytes: then at its own size


def probed(tensors: tuple[int, ...], lists: tuple[int, ...] = ()):
    """The scratch of a kernel whose CPU implementation (oneDNN, im2col) holds buffers that depend on its
    algorithm, or of a composite kernel that decomposes below the tracker (its intermediates are invisible to it
    on any device): measured (probed_scratch). `tensors`, `lists`: the positions of its batched tensors, and of
    its integer lists whose first element is the batch."""
    def scratch(func, args) -> int:
        return probed_scratch(func, args, (tensors, lists))
    return scratch


def probed_scratch(func, args, batched: tuple[tuple[int, ...], tuple[int, ...]]) -> int:
    """The scratch of a CPU kernel at this call's batch (dimension 0 of its `batched` arguments, see probed):
    measured at that batch when the call is small, else at batches 4 and 8 and extended along the line through
    them, as convolutions' buffers grow with the batch."""
    batch = args[0].shape[0] if isinstance(args[0], torch.Tensor) and args[0].dim() else 0
    size = sum(a.numel() * a.element_size() for a in torch.utils._pytree.tree_leaves(args)
               if isinstance(a, torch.Tensor))
    if batch <= SMALL_BATCH or size <= SMALL_CALL:
        return _measured_scratch(func, _call_key(args, batched, batch))
    low, high = (_measured_scratch(func, _call_key(args, batched, b)) for b in (SMALL_BATCH // 2, SMALL_BATCH))
    return max(0, high + (high - low) * (batch - SMALL_BATCH) // (SMALL_BATCH // 2))


def _call_key(args, batched: tuple[tuple[int, ...], tuple[int, ...]], size: int) -> tuple:
    """The call's arguments as hashable specs (a tensor's shape, dtype and the order of its strides, which
    decides whether a kernel copies it), the batch of the batched ones replaced by `size`."""
    tensors, lists = batched

    def spec(value, index):
        if isinstance(value, torch.Tensor):
            shape = tuple(value.shape)
            if index in tensors and shape:
                shape = (size, *shape[1:])
            order = tuple(sorted(range(value.dim()), key=lambda d: (-value.stride(d), d)))
            dense, step = True, 1
            for d in reversed(order):
                dense = dense and (value.shape[d] == 1 or value.stride(d) == step)
                step *= value.shape[d]
            # a view with gaps (a slice of a concatenation's gradient) keeps its own strides
            return ("tensor", shape, value.dtype, order, None if dense else tuple(value.stride()))
        if isinstance(value, (list, tuple)) and index in lists and value:
            return ("ints", (size, *value[1:]))
        if isinstance(value, list):
            return ("list", tuple(spec(v, -1) for v in value))
        return value
    return tuple(spec(a, i) for i, a in enumerate(args))


_probe_failed = [False]  # set when a probe could not run the kernel at a call's sizes (read per call)
_threads: list[int | None] = [None]  # the threads the probes run with (None: this process's); see probe_threads


@contextlib.contextmanager
def probe_threads(count: int | None):
    """Kernels measured as `count` threads run them: oneDNN's packing buffers are per thread (a bfloat16 product's
    scratch at 2 threads is 1.1 to 2 times that at 1)."""
    before = _threads[0]
    _threads[0] = count
    try:
        yield
    finally:
        _threads[0] = before


def _measured_scratch(func, key: tuple) -> int:
    measured = _measured_at(func, key, _threads[0] or torch.get_num_threads())
    if measured < 0:
        _probe_failed[0] = True
    return max(0, measured)


@functools.lru_cache(maxsize=1024)
def _measured_at(func, key: tuple, threads: int) -> int:
    """Bytes the CPU kernel allocates beyond its outputs while it runs with `threads` threads, under PyTorch's
    memory profiler; the process's thread count is given back after."""
    previous = torch.get_num_threads()
    if threads != previous:
        torch.set_num_threads(threads)
    try:
        return _measure(func, key)
    finally:
        if threads != previous:
            torch.set_num_threads(previous)


def _measure(func, key: tuple) -> int:
    from torch.profiler import record_function

    def make(value):
        if isinstance(value, tuple) and value and value[0] == "tensor":
            _, shape, dtype, order, strides = value
            if strides is not None:
                span = 1 + sum((n - 1) * st for n, st in zip(shape, strides, strict=True) if n > 0)
                return torch.zeros(span, dtype=dtype, device="cpu").as_strided(shape, strides)
            laid_out = torch.zeros([shape[d] for d in order], dtype=dtype, device="cpu")
            return laid_out.permute([order.index(d) for d in range(len(order))])  # the strides' order, as called
        if isinstance(value, tuple) and value and value[0] == "ints":
            return list(value[1])
        if isinstance(value, tuple) and value and value[0] == "list":
            return [make(v) for v in value[1]]
        return value

    with _disable_current_modes():
        args = [make(v) for v in key]
        try:
            func(*args)  # once before measuring: a first call sets up buffers it keeps
            with quiet_profile() as prof:
                with record_function("graphlint-probe"):
                    out = func(*args)
        except Exception:  # a call the probe cannot make at these sizes: nothing is modeled, and a note says so
            return -1
        made = sum(t.untyped_storage().nbytes() for t in torch.utils._pytree.tree_leaves(out)
                   if isinstance(t, torch.Tensor))
        return max(0, rises(prof, ["graphlint-probe"])[0] - made)


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
_ATEN = torch.ops.aten

# The kernel-memory models, one entry per kernel (graphlint.memory.registry), in the order the CUDA note names them.
register(_ATEN.convolution.default, cuda=CUDNN_WORKSPACE)(probed((0,)))
register(_ATEN.convolution_backward.default, cuda=CUDNN_WORKSPACE)(probed((0, 1)))
register(*_BLAS, unmodelled=_large_low_precision_product, cuda=CUBLAS_WORKSPACE)(_blas_scratch)
register(_FORWARD, outputs=_onednn_lstm_workspace)(_onednn_lstm_scratch)
register(_BACKWARD)(_onednn_lstm_scratch)
register(_ATEN.native_batch_norm_backward.default)(probed((0, 1)))
register(_ATEN.native_layer_norm_backward.default)(probed((0, 1)))
register(_ATEN._safe_softmax.default)(probed((0,)))
register(_ATEN.binary_cross_entropy_with_logits.default)(probed((0, 1)))
register(_ATEN.upsample_nearest2d.default)(probed((0,)))
register(_ATEN.upsample_nearest2d_backward.default)(probed((0,), (2,)))
register(_ATEN.embedding_dense_backward.default)(contiguous_copies(0))
# the fused attention: on CUDA a workspace; the CPU's has per-thread blocks, and in backward a copy of a gradient
# laid out otherwise
register(_ATEN._scaled_dot_product_efficient_attention.default, cuda=ATTENTION_WORKSPACE)(None)
register(_ATEN._scaled_dot_product_flash_attention_for_cpu.default, cuda=ATTENTION_WORKSPACE)(probed((0, 1, 2)))
register(_ATEN._scaled_dot_product_flash_attention_for_cpu_backward.default)(probed((0, 1, 2, 3, 4, 5)))


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
def onednn_lstm_memory(inputs: int, hidden: int, dtype: torch.dtype = torch.float32) -> _Lines:
    """oneDNN's LSTM on this CPU, for one layer and direction of `inputs` features and `hidden` units: the
    workspace its forward returns, and the scratch its forward and backward hold above their outputs while
    they run (the allocations PyTorch's profiler records inside the op), each measured at four small sizes."""
    measured: dict[str, dict[tuple[int, int], int]] = {"workspace": {}, "forward": {}, "backward": {}}
    with _disable_current_modes():
        _probe(8, 8, inputs, hidden, dtype)  # once before measuring: a first call sets up buffers it keeps
        for steps in (8, 16):
            for batch in (8, 16):
                workspace, forward, backward = _probe(steps, batch, inputs, hidden, dtype)
                measured["workspace"][steps, batch] = workspace
                measured["forward"][steps, batch] = forward
                measured["backward"][steps, batch] = backward
    return _Lines(measured)


def _probe(steps: int, batch: int, inputs: int, hidden: int, dtype: torch.dtype) -> tuple[int, int, int]:
    from torch.profiler import record_function

    def zeros(*shape, grad=False):
        return torch.zeros(*shape, device="cpu", dtype=dtype, requires_grad=grad)

    x, w_ih, w_hh = zeros(steps, batch, inputs, grad=True), zeros(4 * hidden, inputs, grad=True), zeros(
        4 * hidden, hidden, grad=True)
    b_ih, b_hh, h, c = zeros(4 * hidden, grad=True), zeros(4 * hidden, grad=True), zeros(batch, hidden), zeros(
        batch, hidden)
    with quiet_profile() as prof:
        with record_function("graphlint-forward"):
            out = _FORWARD(x, w_ih, w_hh, b_ih, b_hh, h, c, False, [], _LSTM, hidden, 1, True, False, False, True)
        with record_function("graphlint-backward"):
            grads = _BACKWARD(x, w_ih, w_hh, b_ih, b_hh, h, c, out[0], out[1], out[2], torch.ones_like(out[0]), None,
                              None, False, _LSTM, hidden, 1, True, True, False, [], False, out[3])
    forward, backward = rises(prof, ["graphlint-forward", "graphlint-backward"])
    workspace = out[3].untyped_storage().nbytes()
    made = sum(t.untyped_storage().nbytes() for t in out[:3]) + workspace
    made_back = sum(t.untyped_storage().nbytes() for t in grads if isinstance(t, torch.Tensor))
    return workspace, max(0, forward - made), max(0, backward - made_back)


@contextlib.contextmanager
def quiet_profile(**options):
    """PyTorch's profiler recording CPU memory, for graphlint's probes of kernels, with the process's native
    stderr sent nowhere while it runs: Kineto writes `USDT ... profiler_start` and `profiler_stop` lines there. A
    probe runs kernels only, never the user's code, so none of the user's output is hidden."""
    from torch.profiler import ProfilerActivity, profile

    with _native_stderr_discarded(), profile(activities=[ProfilerActivity.CPU], profile_memory=True,
                                             **options) as prof:
        yield prof


@contextlib.contextmanager
def _native_stderr_discarded():
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no file descriptor 2 to borrow: leave it as it is
        yield
        return
    quiet = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(quiet, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(quiet)


def rises(prof, names: list[str]) -> list[int]:
    """For each record_function range named in `names`, how far the bytes allocated on CPU rose above their
    level at its start while it ran (the profiler's allocation events; no stacks needed)."""
    from torch._C._profiler import _EventType

    allocations, ranges = [], {}

    def walk(nodes):
        for node in nodes:
            if node.tag == _EventType.Allocation:
                if str(node.extra_fields.device) == "cpu":
                    allocations.append((node.start_time_ns, node.extra_fields.alloc_size))
            else:
                try:
                    name = node.name
                except UnicodeDecodeError:  # torch sometimes returns an undecodable name for an event not ours
                    name = ""
                if name in names:
                    ranges[name] = (node.start_time_ns, node.end_time_ns)
            walk(node.children)

    walk(prof.profiler.kineto_results.experimental_event_tree())
    allocations.sort()
    results = []
    for name in names:
        start, end = ranges.get(name, (0, -1))
        alive = peak = base = 0
        for time, change in allocations:
            if time > end:
                break
            alive += change
            if time < start:
                base = peak = alive
            else:
                peak = max(peak, alive)
        results.append(max(0, peak - base))
    return results


def _generic_rnn(mode, input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    """aten's generic RNN loop as it runs on CPU (_rnn_impl with FullLayer): the input projection of each layer
    and direction is one matmul over the whole sequence, then the cells step through time. An LSTM's hidden state
    is the pair (h, c), and with a projection (h narrower than c) each layer has a fifth weight, w_hr."""
    x = input.transpose(0, 1) if batch_first else input
    directions = 2 if bidirectional else 1
    lstm = mode == "lstm"
    projected_lstm = lstm and hx[0].shape[-1] != hx[1].shape[-1]
    per = (4 if has_biases else 2) + (1 if projected_lstm else 0)
    hiddens = list(zip(hx[0].unbind(0), hx[1].unbind(0), strict=True)) if lstm else hx.unbind(0)
    hy = []
    for layer in range(num_layers):
        outputs = []
        for direction in range(directions):
            index = layer * directions + direction
            weights = params[index * per:(index + 1) * per]
            w_ih, w_hh = weights[0], weights[1]
            b_ih, b_hh = (weights[2], weights[3]) if has_biases else (None, None)
            w_hr = weights[-1] if projected_lstm else None
            projected = F.linear(x, w_ih, b_ih).unbind(0)
            h = hiddens[index]
            steps = []
            for t in (reversed(range(len(projected))) if direction == 1 else range(len(projected))):
                h = _lstm_cell(projected[t], h, w_hh, b_hh, w_hr) if lstm else _cell(mode, projected[t], h, w_hh, b_hh)
                steps.append(h[0] if lstm else h)
            if direction == 1:
                steps.reverse()
            outputs.append(torch.stack(steps))
            hy.append(h)
        x = torch.cat(outputs, -1) if directions == 2 else outputs[0]
        if dropout > 0 and train and layer < num_layers - 1:
            x = F.dropout(x, dropout, True)
    if lstm:  # aten's make_tuple(outputs, stack(hy), stack(cy)) evaluates its arguments last to first
        cy = torch.stack([c for _, c in hy])
        hy = torch.stack([h for h, _ in hy])
        return (x.transpose(0, 1) if batch_first else x), hy, cy
    hy = torch.stack(hy)
    return (x.transpose_(0, 1) if batch_first else x), hy


def _lstm_cell(projected, hidden, w_hh, b_hh, w_hr):
    """One step of aten's LSTMCell with the input already projected (its CPU path; CUDA fuses the gates)."""
    hx, cx = hidden
    gates = F.linear(hx, w_hh, b_hh).add_(projected)
    ingate, forgetgate, cellgate, outgate = gates.unsafe_chunk(4, 1)
    ingate, forgetgate, cellgate, outgate = ingate.sigmoid_(), forgetgate.sigmoid_(), cellgate.tanh_(), outgate.sigmoid_()
    cy = (forgetgate * cx).add_(ingate * cellgate)
    hy = outgate * cy.tanh()
    return (hy.matmul(w_hr.t()) if w_hr is not None else hy), cy


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
