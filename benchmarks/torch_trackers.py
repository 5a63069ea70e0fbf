"""torch's own memory trackers on the distributed truth table's steps: `FSDPMemTracker` for the FSDP2 rows,
`MemTracker` for the DDP rows (both private, in torch.distributed._tools).

Each row runs in a fresh spawned process (a fake process group and the trackers' patches stay in it), as a user
estimating before launch would run them: the model built under FakeTensorMode, FSDP2's `fully_shard` per block and
on the root over torch's fake process group of N ranks (mesh made outside FakeTensorMode: DeviceMesh reads its rank
table's values), AdamW (for-loop), a first step for the optimizer's state, then one steady-state step inside the
tracker (`track_inputs` with the step's inputs), and the tracker's `get_tracker_snapshot("peak")` total for the
device. DDP cannot run on the fake process group (the reason, as torch raises it, is returned); `MemTracker` on the
unwrapped model (what every DDP rank holds, without DDP's buckets) is returned beside it.

    tracker_peak(factory, strategy, world, checkpoint, bf16) -> ("ok", bytes) or ("error", one line)
"""

from __future__ import annotations

import contextlib
import multiprocessing
import queue
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {text}"


def _step(model, made, optimizer):
    from graphlint.capture.loss import choose_loss

    def step():
        output = model(*made.args)
        loss = choose_loss(output, made.loss)
        loss.backward()
        optimizer.step()
        return output, loss

    return step


def _fsdp(factory, world: int, checkpoint: bool, bf16: bool) -> int:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh("cpu", (world,))
    options = {"mesh": mesh}
    if bf16:
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    with FakeTensorMode():
        torch.manual_seed(0)
        made = factory(checkpoint=checkpoint)
        for block in made.model.blocks:
            fully_shard(block, **options)
        fully_shard(made.model, **options)
        optimizer = torch.optim.AdamW(made.model.parameters(), lr=1e-3, foreach=False)
        step = _step(made.model, made, optimizer)
        step()
        optimizer.zero_grad(set_to_none=True)
        tracker = FSDPMemTracker(made.model, optimizer)
        tracker.track_inputs(made.args)
        with tracker:
            optimizer.zero_grad(set_to_none=True)
            held = step()  # noqa: F841 - output and loss held to the end of the step, as in the truth
        return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


def _plain(factory) -> int:
    """MemTracker on the unwrapped model's step, under FakeTensorMode."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    with FakeTensorMode():
        torch.manual_seed(0)
        made = factory()
        optimizer = torch.optim.AdamW(made.model.parameters(), lr=1e-3, foreach=False)
        step = _step(made.model, made, optimizer)
        step()
        optimizer.zero_grad(set_to_none=True)
        tracker = MemTracker()
        tracker.track_external(made.model, optimizer, *made.args)
        with tracker:
            optimizer.zero_grad(set_to_none=True)
            held = step()  # noqa: F841
        return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


def _ddp(factory) -> str:
    """DistributedDataParallel on the fake process group, one step: what torch raises, or "" if it runs."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    made = factory()
    try:
        model = DistributedDataParallel(made.model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
        _step(model, made, optimizer)()
    except Exception as error:  # the reason the row has no DDP figure
        return _one_line(error)
    return ""


def _child(factory_name, strategy, world, checkpoint, bf16, results) -> None:
    import torch.distributed as dist
    import torch.distributed._tools.fake_collectives  # noqa: F401 - collectives on fake tensors
    from torch.testing._internal.distributed.fake_pg import FakeStore

    sys.path.insert(0, str(HERE))
    import memory_distributed

    factory = getattr(memory_distributed, factory_name)
    try:
        dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
        if strategy == "fsdp":
            results.put(("ok", _fsdp(factory, world, checkpoint, bf16)))
        else:
            refused = _ddp(factory)
            results.put(("ok", _plain(factory)) if not refused else ("refused", (refused, _plain(factory))))
    except Exception as error:  # the tracker's own failure is the cell's content
        results.put(("error", _one_line(error)))
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def tracker_peak(factory_name: str, strategy: str, world: int, checkpoint: bool, bf16: bool,
                 timeout: float = 300):
    """The tracker's figure for one row, computed in a fresh process."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    process = context.Process(target=_child, args=(factory_name, strategy, world, checkpoint, bf16, results))
    process.start()
    try:
        waited = 0.0
        while True:  # a child that dies without answering (killed, or failed to start) ends the wait
            try:
                return results.get(timeout=1)
            except queue.Empty:
                waited += 1
                if not process.is_alive() or waited > timeout:
                    return "error", f"the tracker's process ended without an answer (exit code {process.exitcode})"
    finally:
        process.join(timeout=30)
        if process.is_alive():
            process.kill()
