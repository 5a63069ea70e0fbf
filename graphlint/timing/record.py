"""Every aten op of one training step, as the step's dispatcher sees it: its FLOPs, the bytes it reads and writes,
its dtype, the phase it ran in, whether it recomputes a checkpointed forward, and the user's source line.

FLOPs come from torch.utils.flop_counter's own registry, applied as FlopCounterMode applies it (an op it has no
formula for and that decomposes is counted by its parts), so that a step's total equals FlopCounterMode's. One
addition: the CPU flash-attention kernel (`_scaled_dot_product_flash_attention_for_cpu` and its backward), which
the registry leaves out, is counted by the registry's own attention formulas, as its CUDA kernels are.

Bytes are storage traffic: what an op reads from its tensor inputs and writes to its outputs, each tensor counted
at most once per op and at most its storage's size (an expanded or broadcast input is read once). Views, aliases
and uninitialised allocations move no bytes; an argument an op only overwrites (`copy_`'s destination, an `out=`)
is written, not read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import io
import os
import random
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from graphlint.files import is_hidden_file
from graphlint.memory.registry import in_native_loop
from graphlint.timing.calls import OpCall, call_of

aten = torch.ops.aten
# Autograd's next sequence number; a torch without it places backward ops at no line
_sequence_nr = getattr(torch._C._autograd, "_get_sequence_nr", None)

# The CPU attention kernels, under the formulas of their CUDA siblings (registered already shape-wrapped).
CPU_ATTENTION = {
    aten._scaled_dot_product_flash_attention_for_cpu: flop_registry[aten._scaled_dot_product_flash_attention],
    aten._scaled_dot_product_flash_attention_for_cpu_backward:
        flop_registry[aten._scaled_dot_product_flash_attention_backward],
}
# The registry FlopCounterMode uses, plus those.
FLOP_FORMULAS = {**flop_registry, **CPU_ATTENTION}


def _rnn_work(input: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, passes: int) -> tuple[int, int]:
    """(FLOPs, FLOPs of one time step's hidden product) of a recurrent layer: every token meets both gate
    matrices (gates x hidden rows of input width and of hidden width), one multiply-add each, `passes` times
    (1 forward; 2 backward: the gradient of the inputs and of the weights)."""
    tokens = input.numel() // max(input.shape[-1], 1)
    flops = 2 * tokens * (w_ih.numel() + w_hh.numel()) * passes
    batch = input.shape[1] if input.dim() == 3 else 1  # the layer is given time-major input, batch_first or not
    return flops, 2 * batch * w_hh.numel()


# Ops whose arithmetic torch.utils.flop_counter does not count: their work, for pricing only (the step's `flops`
# stays FlopCounterMode's). Each takes the op's arguments and gives (FLOPs, FLOPs of the product it is made of).
WORK_FORMULAS = {
    aten.mkldnn_rnn_layer: lambda *a, **k: _rnn_work(a[0], a[1], a[2], 1),
    aten.mkldnn_rnn_layer_backward: lambda *a, **k: _rnn_work(a[0], a[1], a[2], 2),
}
# What FlopCounterMode passes by without counting or decomposing (metadata queries).
_PASSED = {aten.sym_is_contiguous.default, aten.is_contiguous.default, aten.is_contiguous.memory_format,
           aten.is_strides_like_format.default, aten.is_non_overlapping_and_dense.default, aten.size.default,
           aten.sym_size.default, aten.stride.default, aten.sym_stride.default, aten.storage_offset.default,
           aten.sym_storage_offset.default, aten.numel.default, aten.sym_numel.default, aten.dim.default,
           torch.ops.prim.layout.default}


def _passed(func) -> bool:
    """Metadata queries, and the profiler's markers (`torch.optim`'s step opens a record_function before its hooks
    run), which run no kernel."""
    return func in _PASSED or func.namespace == "profiler"


_RECORD = object()


def _unrecorded(mode: TorchDispatchMode, func, args: tuple, kwargs: dict):
    """The result of an op that is not recorded itself, made here, or _RECORD: what `_passed` names, and, as
    FlopCounterMode does, an op without a FLOP formula that decomposes, which is counted by its parts (run under
    `mode` again). The recorder and the host probe share it, so that they see the same ops."""
    if _passed(func):
        return func(*args, **kwargs)
    if func._overloadpacket not in FLOP_FORMULAS and _decomposes(func):
        with mode:
            decomposed = func.decompose(*args, **kwargs)
        if decomposed is not NotImplemented:
            return decomposed
    return _RECORD


# Ops that allocate without writing, or only relabel a storage: no kernel moves bytes.
_NO_TRAFFIC = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "_unsafe_view", "detach",
               "alias", "lift_fresh", "resize_", "set_", "_local_scalar_dense", "_to_copy_meta"}
# Ops that read only their inputs' shapes.
_NO_READ = {"zeros_like", "ones_like", "full_like", "rand_like", "randn_like", "new_zeros", "new_ones", "new_full",
            "zeros", "ones", "full", "scalar_tensor", "arange"}
# In-place ops whose destination's old values are never read.
_OVERWRITES = {"copy_", "fill_", "zero_", "normal_", "uniform_", "bernoulli_", "random_", "exponential_",
               "_foreach_copy_", "_foreach_zero_", "index_put_", "masked_fill_"}


@dataclass(frozen=True, slots=True)
class OpRecord:
    """One aten op of the step. `kind`: "matmul", "conv" or "attention" for the ops with a FLOP formula (or a
    work estimate: a recurrent layer is "matmul"),
    "memory" for the others that run a kernel, "view" for those that move no bytes."""

    op: str  # the overload's name, "aten.mm.default"
    flops: int
    read: int  # bytes
    written: int  # bytes
    dtype: str  # "float32", "bfloat16"...
    phase: str  # one of graphlint.timing.phases.PHASES
    recompute: bool  # a checkpointed forward op run again during backward
    file: str | None  # the user's source line the op belongs to; None when none does (the optimizer's loops)
    line: int | None
    kind: str
    # Arithmetic FlopCounterMode leaves out (oneDNN's LSTM), priced but not in `flops`; and the FLOPs of the
    # products it is made of (what sets its efficiency: an LSTM's per-step hidden product, not the whole sequence).
    work_flops: int = 0
    work_grain: int = 0
    # The call by its arguments' layouts, to be made again on this CPU (graphlint.timing.replay); kept only when
    # the recorder is asked to (`calls=True`), for ops that move bytes or compute
    call: OpCall | None = field(default=None, compare=False, repr=False)
    # the kernel's seconds on this machine's CPU, its call timed there (graphlint.timing.replay), else None
    timed: float | None = None
    # issued by a kernel's own loop in C++ on the device (a recurrent layer's steps), not from Python; in backward,
    # the gradient of such an op
    native: bool = False
    # the seconds of Python and dispatch between the op before it and this op in the forward, on meta under
    # HostProbe (this machine's, not yet scaled to a CPU step's: CpuPeaks.host_scale); None if unprobed
    host: float | None = None

    @property
    def bytes(self) -> int:
        return self.read + self.written


class OpRecorder(TorchDispatchMode):
    """Records each op of the step it is entered around (graphlint.memory.step.run_step's `observer`). The phase
    is read from the step itself: backward from the first op run by an autograd node, the optimizer from torch's
    global optimizer-step hook (registered only while the recorder is entered); a backward op with grad mode on is
    a checkpoint's recomputation. A backward op's line is its forward op's, linked by autograd's sequence number.
    With `calls`, each record of an op that runs a kernel keeps its call by layouts (graphlint.timing.calls)."""

    def __init__(self, calls: bool = False) -> None:
        super().__init__()
        self.calls = calls
        self.records: list[OpRecord] = []
        self._phase = "forward"
        self._lines: dict[int, tuple[str, int]] = {}  # autograd sequence number -> the forward op's line
        self._native: set[int] = set()  # sequence numbers of the nodes a native loop's forward ops made
        self._visible: dict[int, tuple[object, str | None]] = {}  # id(code) -> (code, its file if the user's)
        self._boundary = None
        self._hook = None
        self._depth = 0
        self.parameters = 0  # tensors the step's optimizer updates (what a loop's zero_grad walks)
        # the host probe's forward (see forward_again): its ops' names and each one's gap
        self.host: tuple[list[str], list[float]] | None = None

    def __enter__(self):
        if self._depth == 0:  # not the re-entry of a decomposition below
            self.records = []  # a step retried on another device starts again
            self.parameters = 0
            self._phase = "forward"
            self._lines = {}
            self._native = set()
            self._boundary = sys._getframe(1)
            self._hook = register_optimizer_step_pre_hook(self._optimizer_step)
        self._depth += 1
        return super().__enter__()

    def __exit__(self, *exc):
        self._depth -= 1
        if self._depth == 0:
            self._hook.remove()
            self._hook = None
            self._boundary = None
        return super().__exit__(*exc)

    def forward_again(self, forward) -> None:
        """Given a function that runs the step's forward and loss once more as the step ran them, time the Python
        and dispatch between its ops (HostProbe), when the records are to be timed on this CPU (`calls`)."""
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        if self.calls and not distributed:  # a rank's forward again would wait on collectives the others skip
            self.host = probe_host(forward)

    def with_host(self) -> list[OpRecord]:
        """The records, each forward op with its probed host seconds (OpRecord.host), the probe's ops matched to
        the step's by name, in order (_aligned)."""
        if not self.host:
            return self.records
        names, gaps = self.host
        forward = [index for index, record in enumerate(self.records) if record.phase == "forward"]
        if not forward or any(self.records[index].native for index in forward):
            # the probe ran without the step's stand-ins: a recurrent layer's loop is meta's own there, whose ops
            # are neither the step's nor matched to them, and the step's forward is priced per op
            return self.records
        shares = _aligned(names, gaps, [self.records[index].op for index in forward])
        records = list(self.records)
        for index, share in zip(forward, shares, strict=True):
            if share is not None:
                records[index] = dataclasses.replace(records[index], host=share)
        return records

    def _optimizer_step(self, optimizer, _args, _kwargs) -> None:
        self._phase = "optimizer"
        self.parameters += sum(len(group["params"]) for group in optimizer.param_groups)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        unrecorded = _unrecorded(self, func, args, kwargs)
        if unrecorded is not _RECORD:
            return unrecorded
        if self._phase == "forward" and torch._C._current_autograd_node() is not None:
            self._phase = "backward"
        phase = self._phase
        sequence = _sequence_nr() if phase == "forward" and _sequence_nr is not None else None
        out = func(*args, **kwargs)
        formula = FLOP_FORMULAS.get(func._overloadpacket)
        flops = int(formula(*args, **kwargs, out_val=out)) if formula is not None else 0
        work = WORK_FORMULAS.get(func._overloadpacket)
        work_flops, work_grain = work(*args, **kwargs) if work is not None and not flops else (0, 0)
        recompute = phase == "backward" and torch.is_grad_enabled()
        where = None
        native = in_native_loop()
        if phase == "backward" and not recompute:
            # a backward op belongs to the forward op whose node runs it; the stack holds only the call of backward
            node = torch._C._current_autograd_node()
            if node is not None:
                where = self._lines.get(node._sequence_nr())
                native = node._sequence_nr() in self._native
        if where is None:
            where = self._user_line()
        if phase == "forward" and sequence is not None:
            # the autograd node this op made (if any) took the number before the one now current
            if where is not None:
                self._lines.setdefault(sequence - 1, where)
            if native:
                self._native.add(sequence - 1)
        name = func.__name__.split(".")[0]
        moves = not (func.is_view or name in _NO_TRAFFIC)
        read, written = _traffic(func, name, args, kwargs, out) if moves else (0, 0)
        if flops or work_flops:
            kind = "attention" if "attention" in name else "conv" if "conv" in name else "matmul"
        else:
            kind = "memory" if read or written else "view"
        call = call_of(func, args, kwargs, written) if self.calls and kind != "view" else None
        self.records.append(OpRecord(str(func), flops, read, written, _dtype(args, kwargs, out), phase, recompute,
                                     where[0] if where else None, where[1] if where else None, kind,
                                     work_flops, work_grain, call, None, native))
        return out

    def _user_line(self) -> tuple[str, int] | None:
        """The innermost frame of the user's (or an installed library's) code below the step's own frame."""
        frame = sys._getframe(2)
        boundary = self._boundary
        while frame is not None and frame is not boundary:
            code = frame.f_code
            entry = self._visible.get(id(code))
            if entry is None:
                name = code.co_filename
                entry = self._visible[id(code)] = (code, None if is_hidden_file(name) else os.path.abspath(name))
            if entry[1] is not None:
                return entry[1], frame.f_lineno
            frame = frame.f_back
        return None


class HostProbe(TorchDispatchMode):
    """Times what a forward spends outside its ops' kernels: for each op the recorder would record (the same ops
    passed by and decomposed), the seconds since the op before it returned, which is the model's Python (and its
    library's), the arguments' parsing, autograd's bookkeeping and the dispatch to this mode; the time after the
    last op is its. On meta the kernels cost what meta kernels cost, not what the CPU's do, and are left out; the
    gaps hold this mode's own round trip through Python too, and are scaled to a CPU step's seconds by the same
    measure of a micro-step (CpuPeaks.host_scale)."""

    def __init__(self) -> None:
        super().__init__()
        self.gaps: list[float] = []
        self.names: list[str] = []
        self._pending = 0.0
        self._last = 0.0
        self._depth = 0

    def __enter__(self):
        if self._depth == 0:  # not the re-entry of a decomposition below
            self._last = time.perf_counter()
        self._depth += 1
        return super().__enter__()

    def __exit__(self, *exc):
        self._depth -= 1
        if self._depth == 0 and self.gaps:
            self.gaps[-1] += self._pending + time.perf_counter() - self._last
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        now = time.perf_counter()
        self._pending += now - self._last
        self._last = now  # a decomposition's ops below are timed from here
        kwargs = kwargs or {}
        try:
            unrecorded = _unrecorded(self, func, args, kwargs)
            if unrecorded is not _RECORD:
                return unrecorded
            self.gaps.append(self._pending)
            self.names.append(str(func))
            self._pending = 0.0
            return func(*args, **kwargs)
        finally:
            self._last = time.perf_counter()


HOST_PROBES = 3  # forwards probed; the median gap of each op
SLOW_PROBE = 1.0  # seconds of one probed forward past which it is not run again


def probe_host(forward) -> tuple[list[str], list[float]] | None:
    """The ops of `forward` and the median over HOST_PROBES runs (one, if a run takes over SLOW_PROBE seconds) of
    each one's gap (HostProbe), or None when a run raised or the runs saw different ops. Invisible to the model's
    code: what it prints and warns is dropped, torch's and Python's random states are restored, and grad mode is
    the caller's."""
    runs = []
    cpu_rng, python_rng = torch.get_rng_state(), random.getstate()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(HOST_PROBES):
                probe = HostProbe()
                started = time.perf_counter()
                with probe:
                    forward()
                runs.append(probe)
                if time.perf_counter() - started > SLOW_PROBE:
                    break  # this slow, it runs real kernels (a step meta could not run): probed once
    except Exception:  # a forward that cannot run so is priced per op (CpuPeaks.launch)
        return None
    finally:
        torch.set_rng_state(cpu_rng)
        random.setstate(python_rng)
    if not runs or any(run.names != runs[0].names for run in runs):
        return None
    return runs[0].names, [statistics.median(column) for column in zip(*(run.gaps for run in runs), strict=True)]


ALIGNED_OPS = 10_000  # longer forwards share their probed seconds evenly instead of matching op by op


def _aligned(names: list[str], gaps: list[float], ops: list[str]) -> list[float | None]:
    """The probe's gaps given to the step's ops (`ops`, their names), matched in order by name. Where the two
    differ: ops only the probe ran carry their gaps to the step's next op; where the probe ran more ops than the
    step (meta's decomposition of what the step ran as one stand-in kernel, issued from C++ inside one call), the
    step's ops there take as many of the probe's gaps, the first holding the Python before the call, and the rest,
    the probe's own round trips, are dropped; an op only the step ran (an autocast cast, backward's seed) that
    nothing was carried to is not probed (None)."""
    if len(names) > ALIGNED_OPS or len(ops) > ALIGNED_OPS:
        return [sum(gaps) / len(ops)] * len(ops)
    shares: list[float | None] = [None] * len(ops)
    carried = 0.0
    for tag, start, end, first, last in difflib.SequenceMatcher(None, names, ops, autojunk=False).get_opcodes():
        if tag == "equal":
            for offset in range(end - start):
                shares[first + offset] = carried + gaps[start + offset]
                carried = 0.0
            continue
        if last == first:  # the probe's alone
            carried += sum(gaps[start:end])
            continue
        if end - start > last - first:
            end = start + (last - first)
        spent = carried + sum(gaps[start:end])
        carried = 0.0
        if spent or end > start:
            for index in range(first, last):
                shares[index] = spent / (last - first)
    if carried:
        shares[-1] = (shares[-1] or 0.0) + carried
    return shares


def flop_counter_mapping() -> dict:
    """`CPU_ATTENTION` as FlopCounterMode's `custom_mapping` takes it (marked raw: the formulas are wrapped
    already), so that FlopCounterMode counts what this recorder counts."""

    def raw(formula):
        def counted(*args, **kwargs):
            return formula(*args, **kwargs)

        counted._get_raw = True
        return counted

    return {op: raw(formula) for op, formula in CPU_ATTENTION.items()}


_decomposable: dict = {}


def _decomposes(func) -> bool:
    """Whether the op has a composite implementation (what `OpOverload.decompose` runs), asked once per op."""
    found = _decomposable.get(func)
    if found is None:
        found = _decomposable[func] = torch._C._dispatch_has_kernel_for_dispatch_key(
            func.name(), torch._C.DispatchKey.CompositeImplicitAutograd)
    return found


def _footprint(tensor: torch.Tensor) -> int:
    size = tensor.numel() * tensor.element_size()
    try:
        return min(size, tensor.untyped_storage().nbytes())
    except Exception:  # no single storage (sparse, nested): its elements
        return size


def _storage_key(tensor: torch.Tensor):
    try:
        return tensor.untyped_storage()._cdata
    except Exception:
        return id(tensor)


def _traffic(func, name: str, args: tuple, kwargs: dict, out) -> tuple[int, int]:
    """Bytes the op reads from its tensor arguments and writes to its outputs."""
    overwritten = set()
    schema = func._schema.arguments
    for index, argument in enumerate(schema):
        info = argument.alias_info
        if info is None or not info.is_write:
            continue
        if not (name in _OVERWRITES or argument.kwarg_only):
            continue  # add_, mul_: the destination is read too
        value = args[index] if index < len(args) and not argument.kwarg_only else kwargs.get(argument.name)
        for tensor in torch.utils._pytree.tree_leaves(value):
            if isinstance(tensor, torch.Tensor):
                overwritten.add(id(tensor))
    read, seen = 0, set()
    for tensor in () if name in _NO_READ else torch.utils._pytree.tree_leaves((args, kwargs)):
        if isinstance(tensor, torch.Tensor) and id(tensor) not in overwritten:
            key = _storage_key(tensor)
            if key not in seen:
                seen.add(key)
                read += _footprint(tensor)
    written, seen = 0, set()
    for tensor in torch.utils._pytree.tree_leaves(out):
        if isinstance(tensor, torch.Tensor):
            key = _storage_key(tensor)
            if key not in seen:
                seen.add(key)
                written += _footprint(tensor)
    return read, written


def _dtype(args: tuple, kwargs: dict, out) -> str:
    """The dtype the op computes in: its first floating-point input's, else its first output's."""
    first = None
    for tensor in torch.utils._pytree.tree_leaves((args, kwargs, out)):
        if isinstance(tensor, torch.Tensor):
            if tensor.is_floating_point():
                return str(tensor.dtype).removeprefix("torch.")
            if first is None:
                first = tensor
    return str(first.dtype).removeprefix("torch.") if first is not None else ""
