"""Each distinct op call of a step, timed on this machine's CPU: made again at its own sizes on tensors of the
step's layouts, alone, with autograd off, and cached per machine.

A roofline prices an op by its FLOPs and bytes at rates measured on a few kernels (graphlint.timing.devices); on
a CPU, kernels of the same FLOPs and bytes differ by an order of magnitude (a Bernoulli draw, a log-softmax's
exponentials, a depthwise convolution, a boolean reduction), so `graphlint time --cpu` times each call instead,
as torch's runtime estimator does on a GPU, and keeps the roofline for the calls it cannot make again. What a
step pays beyond the kernel (the dispatcher, autograd's bookkeeping, the Python around each op) is the fixed cost
the micro-step measures (CpuPeaks.launch); `floor`, the time of the cheapest call made the same way, is taken off
each call's time so that it is not paid twice.

A replay is invisible to the target: its tensors are its own, filled from its own generator; torch's global random
state (a dropout's draw consumes it), the denormal mode and the thread count are as they were before.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import time
from collections.abc import Iterable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils._pytree import tree_map

from graphlint.timing.calls import OpCall, TensorLayout
from graphlint.timing.devices import (cache_folder, call_seconds, cpu_label, stalled_threads, torch_threads,
                                      waiting_note)
from graphlint.timing.record import OpRecord

REPLAY_VERSION = 5  # what a cached time means; a cache of another version is measured again
BUDGET_SECONDS = 30.0  # the most time one step's replays take (calls past it keep the roofline's price)
LARGEST_CALL = 1 << 30  # bytes of arguments and outputs one replay may hold
POOL = 16 << 20  # bytes of arguments a replay turns over: more than a core's nearest caches hold
MAX_COPIES = 32
CACHE_ENTRIES = 50_000  # a cache file keeps the latest this many calls


@dataclass
class CallTimes:
    """Seconds of each replayed call (by OpCall.key), and what the replays did not time."""

    seconds: dict[str, float] = field(default_factory=dict)
    floor: float = 0.0  # a no-op-sized call's seconds, made the same way
    measured: int = 0  # calls timed in this run (the others came from the cache)
    failed: int = 0  # calls the CPU refused (they keep the roofline's price)
    skipped: int = 0  # calls past the budget or over LARGEST_CALL
    stalled: tuple[int, int, float, float] | None = None  # calls not timed, threads, a product's seconds on them, on one

    def notes(self) -> list[str]:
        notes = []
        if self.stalled:
            calls, threads, many, one = self.stalled
            notes.append(f"{calls} op call(s) were not timed: "
                         + waiting_note(threads, "", (many, one),
                                        "so they are priced by the roofline and nothing was cached"))
        if self.failed:
            notes.append(f"{self.failed} op call(s) could not be made again on this CPU and are priced by the "
                         "roofline")
        if self.skipped:
            notes.append(f"{self.skipped} op call(s) were not timed (over {BUDGET_SECONDS:.0f} s of timing in all, "
                         f"or over {LARGEST_CALL >> 30} GiB of tensors) and are priced by the roofline")
        return notes


def timed_records(records: list[OpRecord], threads: int, folder: Path | None = None,
                  budget: float = BUDGET_SECONDS) -> tuple[list[OpRecord], CallTimes]:
    """The records with each timed call's kernel seconds (its time less the cheapest call's: OpRecord.timed), and
    what the timing did (see time_calls)."""
    times = time_calls((r.call for r in records if r.call is not None), threads, folder, budget)
    timed = []
    for record in records:
        seconds = times.seconds.get(record.call.key) if record.call is not None else None
        timed.append(record if seconds is None else dataclasses.replace(record, timed=max(seconds - times.floor, 0.0)))
    return timed, times


def time_calls(calls: Iterable[OpCall], threads: int, folder: Path | None = None,
               budget: float = BUDGET_SECONDS) -> CallTimes:
    """Time each distinct call on this CPU with `threads` threads, reading and adding to the cache in `folder`
    (default: graphlint's cache folder's `op-times`), spending at most `budget` seconds on new measurements."""
    path = (folder or cache_folder().parent / "op-times") / f"{_machine_key(threads)}.json"
    cached = _read(path)
    result = CallTimes()
    distinct = {call.key: call for call in calls}
    fresh: dict[str, float | None] = {}
    with _quiet_state(threads):
        clock = time.thread_time if threads == 1 else time.perf_counter
        result.floor = _floor(cached)
        deadline = time.perf_counter() + budget
        new = [key for key in distinct if key not in cached]
        stalled = stalled_threads(threads) if new else None
        if stalled is not None:
            result.stalled = (len(new), threads, *stalled)
        for key, call in distinct.items():
            if key in cached:
                if cached[key] is None:
                    result.failed += 1
                else:
                    result.seconds[key] = cached[key]
                continue
            if stalled is not None:
                continue
            if time.perf_counter() > deadline or call.footprint() > LARGEST_CALL:
                result.skipped += 1
                continue
            seconds = _time_one(call, clock)
            fresh[key] = seconds
            result.measured += 1
            if seconds is None:
                result.failed += 1
            else:
                result.seconds[key] = seconds
        stalled = stalled_threads(threads) if fresh else None
    if stalled is not None:  # the threads waited by the end: what was measured may be the wait, so none of it counts
        result.stalled = (len(fresh), threads, *stalled)
        for key in fresh:
            result.seconds.pop(key, None)
        result.failed -= sum(seconds is None for seconds in fresh.values())
        result.measured = 0
        fresh = {}
    if fresh:
        _write(path, {**cached, **fresh, "floor": result.floor})
    return result


def _machine_key(threads: int) -> str:
    text = f"{cpu_label()}|{torch.__version__}|{threads}|{REPLAY_VERSION}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _read(path: Path) -> dict:
    """The cached times: seconds, or None for a call the CPU refused; an entry of another shape is left out (a file
    written by hand, or cut short), and its call timed again."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {key: value for key, value in data.items()
            if value is None or (isinstance(value, float | int) and not isinstance(value, bool) and value >= 0)}


def _write(path: Path, data: dict) -> None:
    if len(data) > CACHE_ENTRIES:  # oldest first: dicts keep insertion order, and fresh entries come last
        data = dict(list(data.items())[-CACHE_ENTRIES:])
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(data))
        os.replace(partial, path)
    except OSError:
        pass  # a read-only home: timed again next time


@contextmanager
def _quiet_state(threads: int):
    """torch's global state as a replay needs it, and as it was afterwards: no autograd, `threads` threads,
    denormals flushed (an in-place op made again hundreds of times on its own output drifts into them, which the
    step never does), the global random state untouched."""
    previous_threads = torch.get_num_threads()
    flushing = _flushes_denormals()
    random_state = torch.random.get_rng_state()
    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)
    try:
        with torch.no_grad():
            yield
    finally:
        torch.set_flush_denormal(flushing)
        torch.random.set_rng_state(random_state)
        torch.set_num_threads(previous_threads)


def _flushes_denormals() -> bool:
    """Whether the CPU flushes denormals now (torch can set the mode but not say it)."""
    tiny = torch.tensor([1e-39], dtype=torch.float32)
    return bool((tiny * 1.0).item() == 0.0)


_generator = None


def _tensor(layout: TensorLayout) -> torch.Tensor:
    """A CPU tensor of `layout`: floating point values in [0.5, 1.5) (positive, so that a square root, a log or a
    division by it computes what the step's does, with no NaN paths), integers and booleans zero (a valid index
    into any dimension)."""
    global _generator
    if _generator is None:
        _generator = torch.Generator().manual_seed(0)
    size = max(layout.storage, 1)
    if layout.dtype.is_floating_point or layout.dtype.is_complex:
        base = torch.empty(size).uniform_(0.5, 1.5, generator=_generator).to(layout.dtype)
    else:
        base = torch.zeros(size, dtype=layout.dtype)
    return base.as_strided(layout.shape, layout.stride, layout.offset)


def _materialise(value):
    return _tensor(value) if isinstance(value, TensorLayout) else value


def _time_one(call: OpCall, clock) -> float | None:
    """The median seconds of the call, made again in batches of about a millisecond; None when the CPU refuses it.

    In a step, an op mostly reads what other ops wrote a while before; made again on the same tensors, it would
    find them in the core's nearest caches. So the call turns over enough copies of its arguments to fill POOL
    bytes (more than those caches hold). Its output is freed at once, and the next call's output takes the same
    memory, as a step's allocations mostly take memory its earlier ones freed."""
    copies = max(1, min(MAX_COPIES, POOL // max(call.nbytes(), 1)))
    try:
        with torch_threads(1):  # filling the copies is not timed; one thread spares the others' wake-ups
            sets = [(tree_map(_materialise, call.args), tree_map(_materialise, call.kwargs)) for _ in range(copies)]
    except Exception:  # a layout the CPU cannot allocate
        return None
    turn = itertools.cycle(sets)

    def run():
        args, kwargs = next(turn)
        call.op(*args, **kwargs)

    try:
        return call_seconds(run, clock, budget=0.0, median=True)  # five batches of about a millisecond
    except Exception:  # arguments the kernel refuses with other values, an op the CPU has no kernel for
        return None


def _floor(cached: dict) -> float:
    """The seconds of a call of the smallest kernel made as replays make theirs (through the op's overload, from
    Python), from the cache when it holds it."""
    value = cached.get("floor")
    if value is not None:
        return float(value)
    one = torch.ones(4)
    with torch_threads(1):  # the dispatcher's cost, as devices' fixed costs: a second thread only adds waits
        return call_seconds(lambda: torch.ops.aten.add.Tensor(one, one), time.thread_time, budget=0.0, median=True)
