"""Real torch.distributed runs on CPU: `world` processes started as torchrun starts them (one per rank, spawned),
joined by the gloo backend over a file store, each running a function of its rank.

    run_ranks(world, function, *args) -> [what function(rank, world, *args) returned on rank 0, 1, ...]

The function must be importable by name (a module-level function): spawned processes import it again.
"""

from __future__ import annotations

import os
import tempfile
import traceback

import torch
import torch.multiprocessing as mp


def _rank_main(rank: int, world: int, store: str, function, args: tuple, results) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)  # one core per rank at most, as the machine running them is small and shared
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        results.put((rank, "ok", function(rank, world, *args)))
    except BaseException as error:  # the rank's error is the result some callers want (DDP's refusal)
        results.put((rank, "error", f"{type(error).__name__}: {error}\n{traceback.format_exc(limit=2)}"))
    finally:
        dist.destroy_process_group()


def run_ranks(world: int, function, *args, timeout: float = 300) -> list[tuple[str, object]]:
    """Run `function(rank, world, *args)` on `world` gloo ranks; per rank ("ok", its result) or ("error", text)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    context = mp.get_context("spawn")
    results = context.Queue()
    with tempfile.TemporaryDirectory() as folder:
        store = os.path.join(folder, "store")
        processes = [context.Process(target=_rank_main, args=(rank, world, store, function, args, results))
                     for rank in range(world)]
        for process in processes:
            process.start()
        try:
            gathered = dict((rank, (status, value)) for rank, status, value in
                            (results.get(timeout=timeout) for _ in processes))
        finally:
            for process in processes:
                process.join(timeout=30)
                if process.is_alive():
                    process.kill()
    return [gathered[rank] for rank in range(world)]


def load_factory(path: str, name: str):
    """The factory `name` of the model file at `path`, imported as graphlint imports a target's file."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_target_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def ddp_two_steps(rank: int, world: int, path: str, name: str) -> str:
    """Two plain training steps of the target under DistributedDataParallel (its defaults: no
    find_unused_parameters), with graphlint's default loss; "two steps" when both finish."""
    from torch.nn.parallel import DistributedDataParallel

    from graphlint.capture.loss import choose_loss
    from graphlint.target import normalize_factory_result

    torch.manual_seed(rank)
    made = normalize_factory_result(load_factory(path, name)())
    model = DistributedDataParallel(made.model)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    for _ in range(2):
        optimizer.zero_grad(set_to_none=True)
        choose_loss(model(*made.args, **made.kwargs), made.loss).backward()
        optimizer.step()
    return "two steps"
