"""The per-rank memory of one steady-state training step under FSDP2 (`fully_shard`) or DDP, on a laptop.

FSDP2: the target is built on meta, wrapped by torch's own `fully_shard` (every repeated block, as users write it
per transformer block, or the classes the user names, then the root) on a fake process group of N ranks (backend
"fake": collectives return at once and move nothing), materialised under FakeTensorMode (FSDP refuses meta
parameters in forward; fake tensors have sizes and no memory), and run through the same step as the single-GPU
estimate, under a tracker that also sees FSDP's storage resizes (the unsharded parameters are freed by resizing
their storage to 0 and allocated again by resizing it back). What FSDP allocates is read from where it allocates
it: the all-gather buffers, the unsharded parameters, the reduce-scatter buffers, the sharded gradients. FSDP2
pads every shard to the same size, so every rank holds the same bytes of parameters and gradients; the optimizer's
state follows the unpadded shard, so rank 0 holds that of parameters whose first dimension is smaller than the ranks
(a (1, D) token): the step is run as rank 0, the largest.

DDP: the step of the whole model (every rank holds all of it) plus DDP's gradient buckets, sized by DDP's own
bucket assignment (`bucket_cap_mb`, 25 MiB by default, over the trainable parameters in reverse order, as the
reducer builds them); with DDP's default `gradient_as_bucket_view=False` the buckets are copies beside `.grad`,
alive for the whole run.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections import defaultdict
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from graphlint.memory.estimate import repeated_children
from graphlint.memory.request import Distribution, Request
from graphlint.memory.step import Block, StepTrace, Tracker, closure_tensors_replaced

# Where FSDP2 allocates, by the function of torch.distributed.fsdp._fully_shard that made the block.
_FSDP_ROLES = {
    "foreach_all_gather": "all-gather buffer",
    "all_gather_copy_in_meta": "all-gather buffer",
    "all_gather_copy_in_cuda": "all-gather buffer",
    "foreach_all_gather_copy_out": "unsharded parameter",
    "alloc_all_gather_outputs": "unsharded parameter",
    "init_unsharded_param": "unsharded parameter",
    "foreach_reduce": "reduce-scatter buffer",
    "foreach_reduce_scatter_copy_in": "reduce-scatter buffer",
}
_FSDP_FOLDER = "_fully_shard"


class FsdpTracker(Tracker):
    """The step's tracker for a model whose parameters are DTensors: their local shards are what a rank holds;
    FSDP's storage resizes end a block and begin another; blocks made inside FSDP say what they are for."""

    def __init__(self, model, device) -> None:
        super().__init__(model, device)
        self._resize = None

    def __enter__(self):
        original = torch.UntypedStorage.resize_
        tracker = self

        def resize_(storage, size):
            result = original(storage, size)
            tracker._resized(storage, int(size))
            return result

        self._resize = original
        torch.UntypedStorage.resize_ = resize_
        return super().__enter__()

    def __exit__(self, *exc):
        torch.UntypedStorage.resize_ = self._resize
        return super().__exit__(*exc)

    def track(self, tensor, phase, module, op, made=None):
        if is_traceable_wrapper_subclass(tensor):  # a DTensor: the rank holds its local tensor
            names, _ = tensor.__tensor_flatten__()
            block = None
            for name in names:
                inner = getattr(tensor, name, None)
                if isinstance(inner, torch.Tensor):
                    block = self.track(inner, phase, module, op, made) or block
            return block
        fresh = self.block_of(tensor) is None
        block = super().track(tensor, phase, module, op, made)
        if block is not None and fresh:
            role = _fsdp_role()
            if role:
                self.roles[id(block)] = role
        return block

    def finish(self, trainable) -> None:
        # A sharded gradient is a DTensor: the rank's part of it is its local tensor.
        local = [_Local(getattr(p.grad, "_local_tensor", p.grad)) for p in trainable]
        super().finish(local)
        for block in self.blocks:
            if block.kind == "gradient" and id(block) not in self.roles:
                self.roles[id(block)] = "sharded gradient"
            elif block.kind == "parameter" and id(block) not in self.roles:
                self.roles[id(block)] = "sharded parameter"
            elif block.kind == "optimizer state":
                self.roles[id(block)] = "sharded optimizer state"

    def _resized(self, storage, size: int) -> None:
        old = self.end_block(storage)
        if size > 0:
            block = self.new_block(storage, size, "resize_", old.dtype if old is not None else torch.uint8)
            self.roles[id(block)] = self.roles.get(id(old), "") if old is not None else "unsharded parameter"


@dataclass
class _Local:
    grad: torch.Tensor | None


def _fsdp_role() -> str:
    frame = sys._getframe(2)
    while frame is not None:
        if _FSDP_FOLDER in frame.f_code.co_filename:
            role = _FSDP_ROLES.get(frame.f_code.co_name)
            if role:
                return role
        frame = frame.f_back
    return ""


@contextlib.contextmanager
def fake_world(world: int):
    """A fake process group of `world` ranks (this process is rank 0), with torch's fake collectives for fake
    tensors; the process's default group is left as it was."""
    import torch.distributed as dist
    import torch.distributed._tools.fake_collectives  # noqa: F401 - collectives on fake tensors
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("a process group is initialized in this process already")
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def blocks_to_shard(model: torch.nn.Module, wrap: tuple[str, ...]) -> list[str]:
    """The module paths fully_shard is applied to before the root: the modules of the classes in `wrap`, or by
    default every repeated block (numbered children of one class, two or more: a transformer's layers), the
    outermost ones only."""
    types = {name: type(module).__name__ for name, module in model.named_modules()}
    if wrap:
        missing = [kind for kind in wrap if kind not in types.values()]
        if missing:
            from graphlint.errors import TargetFailure

            known = ", ".join(sorted(set(types.values())))
            raise TargetFailure(f"--fsdp-wrap names {missing[0]}, which is the class of no module of the model; "
                                f"its classes are {known}")
        chosen = [name for name, kind in types.items() if name and kind in wrap]
    else:
        chosen = sorted({p for parent in types for p in repeated_children(types, parent)})
    outermost = [p for p in chosen if not any(p.startswith(q + ".") for q in chosen if q != p)]
    return [name for name in types if name in outermost]  # in module order


def shard(model: torch.nn.Module, distribution: Distribution) -> list[str]:
    """Apply torch's fully_shard to the chosen blocks, then to the root, on the default (fake) process group; the
    module paths of the blocks."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh("cpu", (distribution.world,))
    options = {"mesh": mesh}
    if distribution.reshard_after_forward is not None:  # passed only when asked, as FSDP2 treats it
        options["reshard_after_forward"] = distribution.reshard_after_forward
    if distribution.mixed_precision == "bf16":
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    modules = dict(model.named_modules())
    wrapped = blocks_to_shard(model, distribution.wrap)
    for name in wrapped:
        fully_shard(modules[name], **options)
    fully_shard(model, **options)
    return wrapped


def ddp_buckets(parameters: list[torch.nn.Parameter], bucket_cap_mb: float) -> list[int]:
    """The bytes of each of DDP's gradient buckets, as its reducer assigns them (its own function, with the first
    bucket's smaller cap and the parameters in reverse order)."""
    import torch.distributed as dist

    trainable = [p for p in parameters if p.requires_grad]
    if not trainable:
        return []
    cap = int(bucket_cap_mb * 1024 * 1024)
    first = getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", 1024 * 1024)
    order, _ = dist._compute_bucket_assignment_by_size(trainable[::-1], [first, cap], [False] * len(trainable))
    sizes = []
    for bucket in order:
        sizes.append(sum(trainable[::-1][i].numel() * trainable[::-1][i].element_size() for i in bucket))
    return sizes


def by_role(blocks: list[Block], roles: dict[int, str], event: int) -> dict[str, int]:
    """Bytes alive at `event` by what distribution makes of them: FSDP's roles, else the block's kind."""
    alive: dict[str, int] = defaultdict(int)
    for block in blocks:
        if block.made <= event and (block.freed is None or block.freed > event):
            alive[roles.get(id(block)) or block.kind] += block.nbytes
    return dict(sorted(alive.items(), key=lambda item: -item[1]))


def distributed_step(made, request: Request) -> StepTrace:
    """The step of one rank under `request.distribution`: `made` (built on meta, inputs resized) sharded by FSDP2
    on a fake process group and run under FakeTensorMode, or run whole with DDP's buckets beside it. What the
    distribution made of the model (the blocks sharded, the parameters without a gradient) is the trace's
    `distributed`."""
    from graphlint.memory.kernels import probe_threads

    with probe_threads(rank_threads()):
        return _distributed_step(made, request)


def rank_threads() -> int:
    """The threads of one rank on CPU: torchrun sets OMP_NUM_THREADS to 1 for each process unless it is set."""
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "1")))
    except ValueError:
        return 1


def _distributed_step(made, request: Request) -> StepTrace:
    from graphlint.memory.step import run_step

    distribution = request.distribution
    if distribution.kind == "ddp":
        trace = run_step(made.model, made.args, made.kwargs, made.loss, request)
        trainable = [p for p in made.model.parameters() if p.requires_grad]
        trace.distributed["no_gradient"] = len(trainable) - trace.trainable
        for index, size in enumerate(ddp_buckets(trainable, distribution.bucket_cap_mb)):
            block = Block(size, -1, "", "", f"DDP bucket {index}", torch.uint8, (size,), kind="gradient")
            trace.blocks.append(block)
            trace.roles[id(block)] = "DDP gradient bucket"
        return trace
    from torch._subclasses.fake_tensor import FakeTensorMode

    with fake_world(distribution.world), torch.device("cpu"):
        wrapped = shard(made.model, distribution)
        with FakeTensorMode(allow_non_fake_inputs=True):
            made.model.to_empty(device="cpu")
            args, kwargs = torch.utils._pytree.tree_map(_fake, (made.args, made.kwargs))
            with closure_tensors_replaced(made.loss, _fake):  # its labels, fake like the inputs
                trace = run_step(made.model, args, kwargs, made.loss, request, tracker_class=FsdpTracker,
                                 stepped=local_shard)
    trace.distributed["wrapped"] = wrapped
    return trace


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """The rank's shard of a sharded parameter or gradient (a DTensor): what the optimizer updates on the rank.
    FSDP2 shards every parameter on one mesh dimension, so each op of the optimizer on the DTensors is that op on
    the local shards; stepping them directly allocates the same, without DTensor's sharding propagation, whose
    first foreach op over a large model's hundreds of parameters costs seconds (torch 2.13)."""
    return getattr(tensor, "_local_tensor", tensor)


def _fake(value):
    """A meta input as a fake CPU tensor of the same size (made inside FakeTensorMode)."""
    if isinstance(value, torch.Tensor) and value.device.type == "meta":
        return torch.empty(value.shape, dtype=value.dtype, device="cpu")
    return value


def describe(trace, distribution: Distribution) -> dict:
    """The distributed part of the report: the strategy, what was sharded, and the bytes alive at the peak by
    what distribution makes of them (sharded and unsharded parameters, FSDP's buffers, DDP's buckets)."""
    events: list[tuple[int, int]] = []
    base = 0
    for block in trace.blocks:
        if block.made == -1:
            base += block.nbytes
        else:
            events.append((block.made, block.nbytes))
        if block.freed is not None:
            events.append((block.freed, -block.nbytes))
    events.sort(key=lambda e: e[0])
    peak, at, alive = base, -1, base
    for event, change in events:
        alive += change
        if alive > peak:
            peak, at = alive, event
    roles = by_role(trace.blocks, trace.roles, at)
    info = {"strategy": distribution.kind, "world_size": distribution.world, "rank": 0,
            "at_peak_by_role": roles}
    if distribution.kind == "fsdp":
        info.update({"sharded_modules": list(trace.distributed["wrapped"]) + ["(root)"],
                     "reshard_after_forward": distribution.reshard_after_forward,
                     "mixed_precision": distribution.mixed_precision})
    else:
        info["bucket_cap_mb"] = distribution.bucket_cap_mb
        info["bucket_bytes"] = sum(b.nbytes for b in trace.blocks if trace.roles.get(id(b)) == "DDP gradient bucket")
        info["parameters_without_gradient"] = trace.distributed["no_gradient"]
    return info


def notes(trace: StepTrace, distribution: Distribution) -> list[str]:
    """What the reader of a distributed estimate should know."""
    no_gradient = trace.distributed.get("no_gradient", 0)
    if distribution.kind == "ddp" and no_gradient:
        return [f"{no_gradient} trainable parameters get no gradient in this step: "
                "DistributedDataParallel without find_unused_parameters=True fails at the second step "
                f"(graphlint check --ddp {distribution.world} names them at their lines, GL402)"]
    return []
