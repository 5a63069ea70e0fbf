"""One steady-state training step, run under an allocation tracker: every storage the step creates, when it is
freed, what it is (parameter, gradient, optimizer state, input, activation, temporary) and where it was made.

The step is the one a training loop runs once its optimizer has state: `zero_grad(set_to_none=True)`, forward,
loss, backward, `optimizer.step()`, with the output and the loss still referenced until the step ends (as the
loop's variables keep them). It runs for real, on the meta device for models that do not fit, so the order of
frees is the autograd engine's own: saved tensors go as each backward node runs, gradients arrive as they are
made, and the optimizer's temporaries are those of torch.optim's implementation.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch._prims_common
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from graphlint.capture.loss import choose_loss
from graphlint.capture.patches import compiled_code_eager
from graphlint.memory.kernels import CpuKernelMemory, cuda_workspace_note
from graphlint.memory.modes import StandIns, call_inside
from graphlint.memory.registry import stand_in
from graphlint.memory.request import Request

AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}  # Request.autocast -> the dtype


@dataclass(eq=False)
class Block:
    """One storage the step held: its size, what it is, and the events (positions in the step) that made and
    freed it; `freed` is None when it outlives the step."""

    nbytes: int
    made: int  # -1: alive before the step began (parameters, optimizer state, inputs)
    phase: str  # the phase that made it ("" for those alive before the step)
    module: str  # the module whose forward was running ("" for none or the model itself)
    op: str  # the aten op that made it, or the autograd node running when backward made it
    dtype: torch.dtype
    shape: tuple[int, ...]
    kind: str = "temporary"
    freed: int | None = None
    saved_by: list[str] = field(default_factory=list)  # names of the autograd nodes that kept it for backward


@dataclass
class StepTrace:
    """Everything the tracker saw in one step; `events` is how many allocations and frees it numbered."""

    blocks: list[Block]
    events: int
    phase_starts: dict[str, int]  # phase -> the first event of that phase
    optimizer: str
    device: str
    trainable: int  # parameters that receive a gradient
    loss_found: bool
    module_types: dict[str, str] = field(default_factory=dict)  # module path -> its class's name
    module_inputs: dict[str, int] = field(default_factory=dict)  # module path -> bytes of its first call's inputs
    roles: dict[int, str] = field(default_factory=dict)  # id(block) -> what distribution makes of it (FSDP, DDP)
    # devices whose torch.autocast regions the forward entered and torch switched off here (no CUDA on this machine)
    unseen_autocast: list[str] = field(default_factory=list)
    # What the estimate rests on that graphlint could not see, each said as one sentence for the report's notes.
    notes: list[str] = field(default_factory=list)
    # What a distributed step made of the model (graphlint.memory.distributed): the blocks FSDP sharded
    # ("wrapped"), the trainable parameters DDP's step gave no gradient ("no_gradient").
    distributed: dict = field(default_factory=dict)


@contextlib.contextmanager
def closure_tensors_replaced(function, replace: Callable[[torch.Tensor], torch.Tensor]):
    """Each tensor a loss function closes over (its labels, as `lambda out: F.cross_entropy(out, labels)` holds
    them) replaced by `replace(tensor)` for the step; the cells get their tensors back after it, since a loss
    function can outlive the factory call (a module-level one)."""
    cells = [cell for cell in (getattr(function, "__closure__", None) or ())
             if isinstance(_cell_contents(cell), torch.Tensor)]
    before = [cell.cell_contents for cell in cells]
    try:
        for cell in cells:
            cell.cell_contents = replace(cell.cell_contents)
        yield
    finally:
        for cell, value in zip(cells, before, strict=True):
            cell.cell_contents = value


def _cell_contents(cell):
    try:
        return cell.cell_contents
    except ValueError:  # a cell not filled yet
        return None


def run_step(model: torch.nn.Module, args: tuple, kwargs: dict, loss_fn: Callable | None,
             request: Request | None = None, tracker_class: type[Tracker] | None = None,
             stepped: Callable[[torch.Tensor], torch.Tensor] | None = None,
             observer: contextlib.AbstractContextManager | None = None) -> StepTrace:
    """Run the steady-state step on the model's device as `request` asks (default: `Request()`) and return what
    it allocated and freed: its optimizer, with the kernels torch would choose on its `train_on`; with its
    `autocast`, the forward and the loss run as under `torch.autocast("cuda", dtype=...)`; with `release_output`,
    the loop keeps only the loss, the model's output going once the loss is made (a loss function that returns
    only the loss, as Hugging Face's Trainer calls it); its device and sizes are the caller's
    (graphlint.memory.measure). `tracker_class`, a `Tracker` subclass (graphlint.memory.distributed's, for
    sharded models); `stepped`, the tensor the optimizer updates for a parameter, or for a gradient the tensor it reads
    (graphlint.memory.distributed's: a sharded parameter's local shard), else the parameters themselves;
    `observer`, a context entered around the measured step only, innermost (graphlint.timing's op recorder)."""
    request = request or Request()
    optimizer, train_on = request.optimizer, request.train_on
    autocast = AUTOCAST.get(request.autocast)
    trainable = [p for p in model.parameters() if p.requires_grad]
    updated = [stepped(p) for p in trainable] if stepped is not None else trainable
    optim = make_optimizer(optimizer, updated, foreach=train_on == "cuda")
    if optim is not None and trainable:
        # The first step creates the state (Adam's two moments, SGD's momentum); the measured step is the next.
        for p in updated:
            p.grad = torch.zeros_like(p)
        optim.step()
    for p in (*trainable, *updated):
        p.grad = None  # zero_grad(set_to_none=True)
    device = trainable[0].device if trainable else next(
        (t.device for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)),
        torch.device("cpu"))
    tracker = (tracker_class or Tracker)(model, device)
    for name, tensor in (*model.named_parameters(), *model.named_buffers()):
        tracker.existing(tensor, "parameter", name.rpartition(".")[0])
    if optim is not None:
        for state in optim.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    tracker.existing(value, "optimizer state", "")
    for tensor in (*torch.utils._pytree.tree_leaves((args, kwargs)), *_closure_tensors(loss_fn)):
        if isinstance(tensor, torch.Tensor):
            tracker.existing(tensor, "input", "")
    # the calls the meta device would run otherwise than train_on's kernels (graphlint.memory.registry), on either
    # side of the model's own torch.autocast(train_on) regions, which meta ignores
    below, above = (StandIns(train_on, place) if StandIns.needed(train_on, place) else contextlib.nullcontext()
                    for place in (True, False))
    regions = _Autocast(None, train_on)
    # inside the tracker, so that the kernels' own allocations are tracked
    memory = CpuKernelMemory() if train_on == "cpu" else contextlib.nullcontext()
    forced = _Autocast(autocast, "cuda") if autocast is not None else None
    unseen: list[str] = []
    with (compiled_code_eager(), below, regions, above, tracker, memory,
          forced or _cuda_autocast_watched(train_on, unseen), observer or contextlib.nullcontext()):
        tracker.phase("forward")
        output = model(*args, **kwargs)
        tracker.phase("loss")
        loss = choose_loss(output, loss_fn)
        if forced is not None:
            forced.end_forward()
        if request.release_output:
            output = None
        if loss is not None:
            tracker.name_keepers(loss)
            tracker.phase("backward")
            loss.backward()
        if optim is not None:
            tracker.phase("optimizer step")
            if stepped is not None:  # the gradients backward left on the parameters, as the optimizer reads them
                for p, target in zip(trainable, updated, strict=True):
                    target.grad = None if p.grad is None else stepped(p.grad)
            optim.step()
        del output, loss  # the end of the loop's body
    tracker.finish(trainable)
    for p in (*trainable, *updated):
        p.grad = None
    again = getattr(observer, "forward_again", None)
    if again is not None:  # an observer that times the forward's host side runs it again, untracked
        again(lambda: _forward_only(model, args, kwargs, loss_fn))
    trace = StepTrace(tracker.blocks, tracker.clock, tracker.starts, optimizer, device.type,
                     sum(1 for b in tracker.blocks if b.kind == "gradient"), tracker.loss_found,
                     {name: type(module).__name__ for name, module in model.named_modules()}, tracker.inputs,
                     tracker.roles, sorted(set(unseen)))
    trace.notes = _unseen(tracker, memory, train_on, set(trace.module_types.values()))
    return trace


def _forward_only(model: torch.nn.Module, args: tuple, kwargs: dict, loss_fn: Callable | None) -> None:
    """The step's forward and loss once more, with no stand-in, autocast or tracker: every torch function mode but
    a `torch.device` context (the capture's, which puts the tensors the forward makes without a device where the
    step put them) is taken off for the run, since each adds its own Python to every call, which a step on the
    CPU does not pay. A forward that cannot run so raises, and its observer does without."""
    from torch.utils._device import DeviceContext

    popped = [torch._C._pop_torch_function_stack() for _ in range(torch._C._len_torch_function_stack())]
    try:
        for mode in reversed(popped):
            if isinstance(mode, DeviceContext):
                torch._C._push_on_torch_function_stack(mode)
        with compiled_code_eager():
            choose_loss(model(*args, **kwargs), loss_fn)
    finally:
        while torch._C._len_torch_function_stack():
            torch._C._pop_torch_function_stack()
        for mode in reversed(popped):
            torch._C._push_on_torch_function_stack(mode)


def _unseen(tracker: Tracker, memory, train_on: str, module_types: set[str]) -> list[str]:
    """Notes on what the step made or needs that the tracker could not count."""
    notes = []
    if tracker.unseen_layouts:
        notes.append("not counted: the step's tensors of layouts with no single storage for graphlint to follow ("
                     + ", ".join(sorted(tracker.unseen_layouts)) + ")")
    if isinstance(memory, CpuKernelMemory):
        notes.extend(f"not counted: {what}" for what in sorted(memory.unmodelled))
    if train_on == "cuda":
        note = cuda_workspace_note(tracker.ops, module_types)
        if note:
            notes.append(note)
    return notes


@contextlib.contextmanager
def _cuda_autocast_watched(train_on: str, seen: list[str]):
    """For a step meant for CUDA on a machine without it: notes in `seen` each `torch.autocast("cuda")` the model
    enters, which torch switches off here (it asks `amp_definitely_not_available`, watched, its answer unchanged),
    so that the report can say its regions ran in float32."""
    if train_on != "cuda" or torch.cuda.is_available():
        yield
        return
    import torch.cuda.amp.common as common

    original = common.amp_definitely_not_available

    def watched():
        seen.append("cuda")
        return original()

    common.amp_definitely_not_available = watched
    try:
        yield
    finally:
        common.amp_definitely_not_available = original


def _closure_tensors(function: Callable | None) -> list[torch.Tensor]:
    """Tensors a loss function closes over (its labels): inputs of the step like the model's own."""
    cells = getattr(function, "__closure__", None) or ()
    found = []
    for cell in cells:
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        found.extend(t for t in torch.utils._pytree.tree_leaves(value) if isinstance(t, torch.Tensor))
    return found


def make_optimizer(name: str, parameters: list[torch.nn.Parameter], foreach: bool | None) -> torch.optim.Optimizer | None:
    """The optimizer a step runs. foreach=True is what torch picks by default on CUDA: its temporaries (Adam's
    square roots of the second moments) are made for every parameter at once, which can set the peak; on CPU
    torch's default loops over the parameters one at a time (foreach=False, or None to let torch choose)."""
    if name == "none" or not parameters:
        return None
    if name == "adamw":
        return torch.optim.AdamW(parameters, lr=1e-3, foreach=foreach)
    if name == "adam":
        return torch.optim.Adam(parameters, lr=1e-3, foreach=foreach)
    if name == "sgd":
        return torch.optim.SGD(parameters, lr=1e-3, foreach=foreach)
    if name == "sgd-momentum":
        return torch.optim.SGD(parameters, lr=1e-3, momentum=0.9, foreach=foreach)
    raise ValueError(f"unknown optimizer {name!r}")


class Tracker(TorchDispatchMode):
    """Numbers every allocation and free; a free is seen when the storage's Python object is finalized, which
    torch does when the last reference to the storage, Python's or C++'s, goes.

    A step whose tensors are held otherwise (graphlint.memory.distributed's FSDP tracker: DTensors, storages
    resized in place) passes a subclass to `run_step`; its extension points: `track` (what a tensor made or found
    is: override it to look inside a wrapper tensor), `block_of`, `end_block` and `new_block` (a storage whose
    memory goes and comes back while the object lives), `finish` (name the blocks once the step is over), and
    `roles` (id(block) -> what the subclass makes of it, carried into the trace)."""

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        super().__init__()
        self.device = device  # the step's device; tensors elsewhere (Adam's step counts on the host) are not its
        self.blocks: list[Block] = []
        self.clock = 0
        self.starts: dict[str, int] = {}
        self.current = ""
        self.loss_found = False
        self.closed = False
        self._known: dict[int, Block] = {}  # id of a live storage object -> its block
        self._modules: list[str] = []
        self.inputs: dict[str, int] = {}
        self._names = {id(m): name for name, m in model.named_modules()}
        self._hooks: list = []
        self.ops: set = set()  # the aten ops (OpOverloads) the step ran
        self.unseen_layouts: set[str] = set()  # layouts of tensors the step made that have no storage to follow
        self._finished_node = None  # the backward node whose outputs the engine is adding into input buffers
        self._accumulated: list[tuple[Block, Block]] = []  # (the buffer's gradient, the sum made beside it)
        self.roles: dict[int, str] = {}  # id(block) -> what a subclass makes of it (FSDP's roles, DDP's buckets)

    def __enter__(self):
        self._hooks = [
            torch.nn.modules.module.register_module_forward_pre_hook(self._entered),
            torch.nn.modules.module.register_module_forward_hook(self._left, always_call=True),
        ]
        return super().__enter__()

    def __exit__(self, *exc):
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        return super().__exit__(*exc)

    def phase(self, name: str) -> None:
        self.current = name
        self.starts[name] = self.clock

    def _entered(self, module, inputs) -> None:
        path = self._names.get(id(module), "")
        self._modules.append(path)
        if path not in self.inputs:
            self.inputs[path] = sum(t.untyped_storage().nbytes() for t in torch.utils._pytree.tree_leaves(inputs)
                                    if isinstance(t, torch.Tensor) and t.layout == torch.strided)

    def _left(self, module, _inputs, _output) -> None:
        if self._modules:
            self._modules.pop()

    def name_keepers(self, loss: torch.Tensor) -> None:
        """Name, on each block autograd kept, the nodes that keep it (read before backward frees them). What a
        node keeps is read as it was packed, never unpacked: an unpack runs the saved-tensor hooks, and inside
        a non-reentrant checkpoint that recomputes the region and keeps the recomputed tensors until backward."""
        self.loss_found = True
        seen, stack = set(), [loss.grad_fn]
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            for tensor in kept_by(node):
                block = self.block_of(tensor)
                if block is not None:
                    block.saved_by.append(node.name())
            if node.name() != "torch::autograd::AccumulateGrad":
                try:
                    self._hooks.append(node.register_hook(functools.partial(self._node_done, node)))
                except (RuntimeError, TypeError):  # a node that takes no hooks: its sums stay as the tracker saw them
                    pass
            stack.extend(next_node for next_node, _ in node.next_functions)

    def _node_done(self, node, _grad_inputs, _grad_outputs) -> None:
        # After a node's post hooks the engine adds its outputs into the input buffers of the nodes they go to;
        # until the next node runs, an add under this node is that accumulation (InputBuffer::accumulate).
        self._finished_node = node

    def existing(self, tensor: torch.Tensor, kind: str, module: str) -> None:
        block = self.track(tensor, "", module, "", made=-1)
        if block is not None and block.made == -1:
            block.kind = kind

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        op = func.__name__
        self.ops.add(func)
        node = None
        if self.current == "backward":
            node = torch._C._current_autograd_node()
            if node is not None:
                op = node.name()
        module = self._modules[-1] if self._modules and self.current in ("forward", "loss") else ""
        for tensor in torch.utils._pytree.tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                self.track(tensor, self.current, module, op)
        if func is _ADD and node is not None and node is self._finished_node and _accumulates_in_place(args, out):
            old, total = self.block_of(args[0]), self.block_of(out)
            if old is not None and total is not None and old is not total:
                self._accumulated.append((old, total))
        return out

    def block_of(self, tensor: torch.Tensor) -> Block | None:
        """The block of the tensor's storage, None when the tracker has none for it."""
        try:
            return self._known.get(id(tensor.untyped_storage()))
        except Exception:
            return None

    def track(self, tensor: torch.Tensor, phase: str, module: str, op: str, made: int | None = None) -> Block | None:
        """The tensor's block, made now (or at `made`) unless its storage has one; None for a tensor of another
        device or with no single storage."""
        if tensor.device != self.device:
            return None
        try:
            storage = tensor.untyped_storage()
        except Exception:  # sparse or nested tensors: no single storage to follow
            self.unseen_layouts.add("nested" if tensor.is_nested else str(tensor.layout).removeprefix("torch."))
            return None
        key = id(storage)
        block = self._known.get(key)
        if block is not None:
            return block
        block = Block(storage.nbytes(), self.clock if made is None else made, phase, module, op,
                      tensor.dtype, tuple(tensor.shape))
        if made is None:
            self.clock += 1
        self._known[key] = block
        self.blocks.append(block)
        weakref.finalize(storage, self._freed, key, block)
        return block

    def end_block(self, storage) -> Block | None:
        """The storage's memory went while its object lives on (a resize to 0): its block is freed now."""
        old = self._known.pop(id(storage), None)
        if old is not None and old.freed is None:
            old.freed = self.clock
            self.clock += 1
        return old

    def new_block(self, storage, nbytes: int, op: str, dtype: torch.dtype) -> Block:
        """The storage has memory again (a resize up): a new block of `nbytes`, made now, in the running phase and
        module."""
        key = id(storage)
        block = Block(nbytes, self.clock, self.current, self._modules[-1] if self._modules else "", op, dtype,
                      (nbytes,))
        self.clock += 1
        self._known[key] = block
        self.blocks.append(block)
        weakref.finalize(storage, self._freed, key, block)
        return block

    def _freed(self, key: int, block: Block) -> None:
        if self.closed:
            return  # after the step: the gradients dropped by the next zero_grad, the tracker's own clean-up
        if block.freed is not None:  # ended already (end_block)
            return
        if self._known.get(key) is block:
            del self._known[key]
        block.freed = self.clock
        self.clock += 1

    def finish(self, trainable: list[torch.Tensor]) -> None:
        """Name what each block was, now that the step is over."""
        self.closed = True
        grads = set()
        for p in trainable:
            if p.grad is not None:
                grads.add(id(p.grad.untyped_storage()))
        backward = self.starts.get("backward", self.clock)
        for key, block in list(self._known.items()):
            if key in grads:
                block.kind = "gradient"
        for block in self.blocks:
            if block.made == -1 or block.kind == "gradient":
                continue
            if block.phase in ("forward", "loss") and (block.freed is None or block.freed >= backward):
                block.kind = "activation"
        self._accumulate_in_place()

    def _accumulate_in_place(self) -> None:
        """The engine adds a gradient into an input buffer in place when the buffer holds the last reference to
        its tensor, but not while a dispatch mode (this tracker) is active or on meta tensors
        (ATen's isTensorSubclassLike): there each sum was a new tensor beside the old one, freed at once. Here each
        such sum becomes the old buffer itself, alive until the sum's end, as the real kernels run it."""
        merged: dict[int, Block] = {}
        dropped = set()
        for old, total in self._accumulated:
            old = merged.get(id(old), old)
            if old.freed != total.made + 1:  # another reference kept the buffer: the engine adds out of place
                continue
            old.freed = total.freed
            if total.kind == "gradient":
                old.kind = "gradient"
            merged[id(total)] = old
            dropped.add(id(total))
        if dropped:
            self.blocks = [b for b in self.blocks if id(b) not in dropped]


_ADD = torch.ops.aten.add.Tensor


def _accumulates_in_place(args, out) -> bool:
    """Whether the engine's sum of two gradients would be made in place on a plain device tensor (its
    can_accumulate_inplace, less the reference counts, which the tracker reads from the frees that follow): grad
    mode off, a dense strided buffer of the sum's own shape and dtype, no scaled second operand."""
    if torch.is_grad_enabled() or len(args) != 2 or not all(isinstance(a, torch.Tensor) for a in args):
        return False
    old, new = args
    return (old.layout == torch.strided and new.layout == torch.strided and not old.is_nested
            and not old._is_zerotensor() and old.shape == out.shape and old.dtype == out.dtype
            and torch._prims_common.is_non_overlapping_and_dense_or_false(old))


F = torch.nn.functional
# CUDA autocast's policies, at the level of the calls a model makes: these run in the lower precision...
_LOWER = {
    F.linear, F.bilinear, torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.Tensor.__rmatmul__,
    torch.mm, torch.Tensor.mm, torch.bmm, torch.Tensor.bmm, torch.addmm, torch.Tensor.addmm, torch.baddbmm,
    torch.Tensor.baddbmm, torch.addbmm, torch.addmv, torch.mv, torch.chain_matmul, F.conv1d, F.conv2d, F.conv3d,
    F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d, F.scaled_dot_product_attention, F.prelu,
    F.multi_head_attention_forward,
}
# ...and these in float32.
_FLOAT32 = {
    F.softmax, torch.softmax, torch.Tensor.softmax, F.log_softmax, torch.log_softmax, torch.Tensor.log_softmax,
    F.layer_norm, F.group_norm, F.cross_entropy, F.nll_loss, F.mse_loss, F.l1_loss, F.smooth_l1_loss,
    F.binary_cross_entropy_with_logits, F.kl_div, F.softplus, torch.exp, torch.Tensor.exp, torch.log,
    torch.Tensor.log, torch.pow, torch.Tensor.pow, torch.rsqrt, torch.Tensor.rsqrt, torch.cumsum,
    torch.Tensor.cumsum, torch.norm, torch.Tensor.norm,
} | ({F.rms_norm} if hasattr(F, "rms_norm") else set())


# CPU autocast's policies (aten's AutocastCPU kernels), checked against torch.autocast("cpu") on CPU tensors in
# tests/test_memory_standins.py: matrix products and convolutions run in the lower precision; softmax, the norms
# and the pointwise ops do not change dtype, unlike CUDA's...
_CPU_LOWER = {
    F.linear, torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.Tensor.__rmatmul__, torch.mm,
    torch.Tensor.mm, torch.bmm, torch.Tensor.bmm, torch.addmm, torch.Tensor.addmm, torch.baddbmm, torch.Tensor.baddbmm,
    torch.addbmm, torch.linalg.multi_dot, torch.chain_matmul, torch.einsum, F.conv1d, F.conv2d, F.conv3d,
    F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d, F.scaled_dot_product_attention, F.prelu,
}
# ...and the losses and a few reductions in float32.
_CPU_FLOAT32 = {
    F.cross_entropy, F.nll_loss, F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss, F.binary_cross_entropy,
    F.binary_cross_entropy_with_logits, F.kl_div, F.cosine_embedding_loss, F.margin_ranking_loss,
    F.hinge_embedding_loss, F.soft_margin_loss, F.multilabel_margin_loss, F.multi_margin_loss, F.triplet_margin_loss,
    F.poisson_nll_loss, torch.prod, torch.Tensor.prod, torch.cdist, F.avg_pool3d,
}
POLICIES = {"cuda": (_LOWER, _FLOAT32), "cpu": (_CPU_LOWER, _CPU_FLOAT32)}


class _Autocast(TorchFunctionMode):
    """torch.autocast where torch's own does nothing: on meta tensors (autocast casts only tensors of its own
    device, and a meta tensor is on none), or for a device the step does not run on. The calls of the device's
    lower-precision list get their float32 tensors cast to the dtype, those of its float32 list get
    lower-precision tensors cast up, and a leaf that needs a gradient (a parameter) is cast once and the copy
    reused until the region ends, as autocast caches it.

    With `dtype`, always (`--autocast`, CUDA's policy); with None, only inside the model's own
    `torch.autocast(device)` regions, with their dtype, and only on meta tensors (on CPU torch casts itself)."""

    def __init__(self, dtype: torch.dtype | None, device: str) -> None:
        super().__init__()
        self.dtype = dtype
        self.device = device
        self.lower, self.float32 = POLICIES.get(device, POLICIES["cuda"])
        self._cache: dict[int, torch.Tensor] = {}
        self._forward_ended = False

    def __exit__(self, *exc):
        self._cache.clear()  # autocast drops its cache when the region ends; what autograd kept stays
        return super().__exit__(*exc)

    def end_forward(self) -> None:
        """The `--autocast` region (forward and loss) is over; from here on only what a checkpoint recomputes
        in backward (with grad enabled, where backward's own formulas run without) runs under it, as
        torch.utils.checkpoint restores the forward's autocast for its recomputation."""
        self._cache.clear()
        self._forward_ended = True

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        dtype = self.dtype
        if dtype is not None and self._forward_ended and not torch.is_grad_enabled():
            return call_inside(self, func, types, args, kwargs)
        if dtype is None:
            if not torch.is_autocast_enabled(self.device):
                self._cache.clear()  # outside the model's regions: the last one has ended
                return call_inside(self, func, types, args, kwargs)
            if not any(isinstance(t, torch.Tensor) and t.device.type == "meta"
                       for t in torch.utils._pytree.tree_leaves((args, kwargs))):
                return call_inside(self, func, types, args, kwargs)
            dtype = torch.get_autocast_dtype(self.device)
        if func in self.lower:
            cast = functools.partial(self._lower, dtype)
        elif func in self.float32:
            cast = self._float32
        else:
            return call_inside(self, func, types, args, kwargs)
        args, kwargs = torch.utils._pytree.tree_map(cast, (args, kwargs))
        return func(*args, **kwargs)  # the calls inside a listed op are not cast again, as under autocast

    def _lower(self, dtype, value):
        if not isinstance(value, torch.Tensor) or value.dtype != torch.float32:
            return value
        # in backward (a checkpoint's recomputation, each its own region) nothing is kept across regions
        if (value.is_leaf and value.requires_grad and not value._is_view() and torch.is_autocast_cache_enabled()
                and not self._forward_ended and torch._C._current_autograd_node() is None):
            if id(value) not in self._cache:
                self._cache[id(value)] = value.to(dtype)
            return self._cache[id(value)]
        return value.to(dtype)

    def _float32(self, value):
        if isinstance(value, torch.Tensor) and value.dtype in (torch.float16, torch.bfloat16):
            return value.float()
        return value


@stand_in(torch.nn.functional.scaled_dot_product_attention, below_autocast=True)
def _fused_attention(func, train_on, args, kwargs):
    """On the meta device `F.scaled_dot_product_attention` has no fused kernel and runs as matmuls and a softmax
    that keep the B×H×T×T probabilities; a GPU (and a CPU) runs a fused kernel that keeps only its inputs, output
    and log-sum-exp. On meta the call goes to the fused kernel's own meta function, which keeps what that kernel
    keeps and returns its layout: for CUDA the memory-efficient kernel's; for a step meant for the CPU, the CPU's
    flash kernel wherever torch's CPU choice (asked of the CPU itself) takes it, else (dropout, for one) the
    unfused form, as on a real CPU. Its stand-in mode stays active inside the calls it passes on, so it sees the
    attention inside `nn.MultiheadAttention` and in what backward recomputes for a checkpoint."""
    if not (args and args[0].device.type == "meta"):
        return None
    if train_on == "cpu":
        return _cpu_flash_attention(*args, **kwargs)
    return _efficient_attention(*args, **kwargs)


_FLASH = 1  # torch.nn.attention.SDPBackend.FLASH_ATTENTION's value, as torch._fused_sdp_choice returns it


def _cpu_flash_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                         enable_gqa=False):
    """The CPU's fused kernel on meta tensors, where the CPU would choose it: torch's CPU choice is asked with
    tensors of one batch and two positions, of the call's heads, head size, dtypes and last-dimension layout (what
    the choice reads), so the user's switches (`sdpa_kernel`, `enable_flash_sdp`) count too."""
    def small(tensor):
        batch, heads, positions, size = tensor.shape
        shape = (1, heads, min(2, positions), size)
        if tensor.stride(-1) == 1:
            return torch.empty(shape, dtype=tensor.dtype, device="cpu")
        return torch.empty((*shape, 2), dtype=tensor.dtype, device="cpu")[..., 0]

    if any(not isinstance(t, torch.Tensor) or t.dim() != 4 for t in (query, key, value)):
        return None
    mask = None
    if attn_mask is not None:
        mask = torch.empty([1] * (attn_mask.dim() - 2) + [min(2, n) for n in attn_mask.shape[-2:]],
                           dtype=attn_mask.dtype, device="cpu")
    try:
        with torch._C.DisableTorchFunction():
            choice = torch._fused_sdp_choice(small(query), small(key), small(value), mask, dropout_p, is_causal,
                                             scale=scale, enable_gqa=enable_gqa)
    except Exception:  # arguments the CPU's choice refuses: the call runs as it is, and fails as it would
        return None
    if choice != _FLASH:
        return None
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        # As torch does before the kernel: a boolean mask becomes an additive one of the query's dtype.
        attn_mask = torch.where(attn_mask, torch.scalar_tensor(0.0, dtype=query.dtype, device=query.device),
                                torch.scalar_tensor(float("-inf"), dtype=query.dtype, device=query.device))
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]


def _efficient_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                         enable_gqa=False):
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return None
    bias = attn_mask
    if bias is not None and bias.dtype == torch.bool:
        # As torch does before that kernel: a boolean mask becomes an additive one of the query's dtype.
        bias = torch.zeros(bias.shape, dtype=query.dtype, device=query.device).masked_fill(~bias, float("-inf"))
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    groups = query.shape[-3] // key.shape[-3] if enable_gqa else 1
    if groups == 1:
        return _efficient(query, key, value, bias, needs_grad, dropout_p, is_causal, scale)
    # Grouped keys and values: the GPU kernels read them as they are and keep them so; the efficient kernel
    # wants one per head, so it gets expanded copies, and autograd keeps the grouped originals in their place.
    wide_key, wide_value = key.repeat_interleave(groups, dim=-3), value.repeat_interleave(groups, dim=-3)
    originals = {id(wide_key): key, id(wide_value): value}

    def pack(tensor):
        original = originals.get(id(tensor))
        return (original,) if original is not None else tensor

    def unpack(packed):
        return packed[0].repeat_interleave(groups, dim=-3) if isinstance(packed, tuple) else packed

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        return _efficient(query, wide_key, wide_value, bias, needs_grad, dropout_p, is_causal, scale)


def _efficient(query, key, value, bias, needs_grad, dropout_p, is_causal, scale):
    try:
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, bias, needs_grad, dropout_p, is_causal, scale=scale)[0]
    except Exception:  # shapes or dtypes the kernel does not take
        return None


_attribute_names: dict[type, tuple[str, ...]] = {}


def kept_by(node) -> list[torch.Tensor]:
    """The tensors an autograd node keeps for backward, as they were packed: a saved tensor without hooks is
    its own data; one packed by saved-tensor hooks (a checkpoint's holder, an offload to the host) keeps
    whatever tensors its packed value holds, read without calling its unpack hook."""
    found = []
    for attribute in _saved_attributes(node):
        try:
            value = getattr(node, attribute)
        except Exception:  # freed already, or not readable on this node type
            continue
        for saved in value if isinstance(value, (tuple, list)) else (value,):
            try:
                packed = saved.data  # torch._C._autograd.SavedTensor: the packed value, as it is
            except Exception:  # an undefined optional tensor, or a torch without the attribute
                continue
            found.extend(t for t in torch.utils._pytree.tree_leaves(packed) if isinstance(t, torch.Tensor))
    return found


def _saved_attributes(node) -> tuple[str, ...]:
    """The node's raw saved values (`_raw_saved_*`, and `_raw_saved_tensors` on custom autograd.Function
    nodes): SavedTensor objects, whose reading unpacks nothing."""
    names = _attribute_names.get(type(node))
    if names is None:
        names = tuple(a for a in dir(node) if a.startswith("_raw_saved_"))
        _attribute_names[type(node)] = names
    return names
