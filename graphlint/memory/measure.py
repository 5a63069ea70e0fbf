"""A target's training step, measured: build it under the build policy (graphlint.capture.build: on meta first,
on CPU when the step needs real values),
resize its inputs when asked (`--batch`, `--seq`), run the step under the allocation tracker, and read the peak.

The largest batch that fits a device comes from the step at three batch sizes, 2, 3 and the target's own (its
step, run for the report, is one of the three unless it is at 2 or 3, or makes other blocks than theirs: batch 1
often takes other paths, squeezed dimensions, broadcasts; then 4): when the three runs make the same blocks in the
same order and every block's size is linear in the batch, the peak at any larger batch is read from those lines
without running the step again; otherwise the step runs at each batch the search tries.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from graphlint.capture import dimensions
from graphlint.capture.build import NeedsRealValues, build, meta_then_cpu
from graphlint.capture.device import load_target
from graphlint.capture.isolation import preserved_global_state
from graphlint.errors import TargetFailure, call_user_code, one_line, raised_at
from graphlint.memory.estimate import MemoryEstimate, estimate
from graphlint.memory.request import Request
from graphlint.memory.step import StepTrace, closure_tensors_replaced, run_step
from graphlint.target import Target, TargetSpec, importable

FAILURE_CHARS = 240  # of the meta device's failure, in the note of a CPU run


def measure(text: str, base: Path, request: Request, pythonpath: tuple[Path, ...] | list[Path] = (),
            observer: contextlib.AbstractContextManager | None = None) -> MemoryEstimate:
    """The estimate for one target; a problem with the target or the request raises TargetFailure. `pythonpath`:
    the project's import folders (graphlint.project); `observer`, a context entered around the measured step only
    (graphlint.timing's op recorder)."""
    spec = TargetSpec.parse(text, base)
    with importable(spec, pythonpath), contextlib.redirect_stdout(sys.stderr):
        loaded = load_target(spec, pythonpath)
        (trace, sizes), device, meta_failure = meta_then_cpu(
            lambda on: _trace(loaded.factory, on, request, {}, observer), request.device,
            lambda failure: TargetFailure(f"cannot measure on the meta device: {failure}; "
                                          "use --device auto (the default) or --device cpu"))
        notes = [fallback_note(meta_failure, request.train_on)] if meta_failure is not None else []
        result = estimate(trace, text)
        result.output_held = not request.release_output
        result.notes = notes + trace.notes
        result.notes.extend(f"the forward enters torch.autocast(\"{kind}\") regions, which torch switches off on "
                            f"a machine without {kind.upper()}, so graphlint counts them in float32; --autocast bf16 "
                            f"or fp16 counts the forward as CUDA's autocast runs it" for kind in trace.unseen_autocast)
        if request.distribution is not None:
            from graphlint.memory.distributed import describe, notes as distribution_notes

            result.distributed = describe(trace, request.distribution)
            result.notes.extend(distribution_notes(trace, request.distribution))
        result.batch, result.seq = sizes.get("batch"), sizes.get("seq")
        if request.device_memory is not None:
            result.device_memory = request.device_memory
            if "batch" in sizes:
                result.largest_batch, how = largest_batch(loaded.factory, device, request, sizes, trace)
                if how:
                    result.notes.append(how)
            else:
                result.notes.append("no input has a batch dimension, so there is no largest batch to find")
    return result


def fallback_note(failure: NeedsRealValues, train_on: str) -> str:
    """The note of a step run on CPU because graphlint's run on the meta device failed: the limit is graphlint's
    (the meta device has no values, or a stand-in of graphlint's cannot run the call), never the model's."""
    why = str(failure)
    if len(why) > FAILURE_CHARS:  # torch's dispatcher errors list every backend: the first sentence says it
        why = why[:FAILURE_CHARS].rstrip() + "…)"
    note = (f"measured on CPU because {why}: the meta device, on which graphlint runs a step without its memory, "
            "cannot run this one, so the model was built and its step run for real, at the model's own size")
    if train_on == "cuda":
        note += "; on CPU the step takes the CPU's kernels where they differ from CUDA's (attention, recurrent layers)"
    return note


def step_estimate(made: Target, device: str, budget: int | None = None, optimizer: str = "adamw") -> MemoryEstimate:
    """The estimate for a target already built (the capture's model and inputs, on `device`), against `budget`."""
    with torch.device(device):
        trace = run_step(made.model, made.args, made.kwargs, made.loss, Request(optimizer=optimizer))
    result = estimate(trace)
    result.batch = resize_inputs(made, {}).get("batch")
    result.device_memory = budget
    return result


def largest_batch(factory: Callable, device: str, request: Request, sizes: dict[str, int],
                  own: StepTrace | None = None) -> tuple[int | None, str]:
    """The largest batch whose step fits `request.device_memory`, and how it was found (a note, or "").
    `own`: the target's step at its own size (`sizes`), which serves as one of the three batches when its blocks
    are those of the others."""
    budget = request.device_memory
    fixed = {"seq": sizes["seq"]} if sizes.get("seq") is not None else {}
    # The target's own step is the search's step at its batch: it is not run again (batch 1 below, say).
    traces: dict[int, StepTrace] = {sizes["batch"]: own} if own is not None else {}

    def search(batch: int) -> StepTrace:
        if batch not in traces:
            traces[batch] = _search_trace(factory, device, request, {**fixed, "batch": batch})
        return traces[batch]

    line = None
    if own is not None and sizes["batch"] not in (2, 3):
        line = _linear_peak({2: search(2), 3: search(3), sizes["batch"]: own})
    if line is None:
        line = _linear_peak({b: search(b) for b in (2, 3, 4)})
    if line is not None:
        if line(2) > budget:
            return (1 if estimate(search(1)).peak_bytes <= budget else 0), ""
        low, high = 2, 4
        while line(high) <= budget and high < 2**24:
            low, high = high, high * 2
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if line(middle) <= budget else (low, middle)
        return low, ""

    def peak(batch: int) -> int:
        trace = traces.get(batch) or _search_trace(factory, device, request, {**fixed, "batch": batch})
        return estimate(trace).peak_bytes

    if peak(1) > budget:
        return 0, ""
    low, high = 1, 2
    while peak(high) <= budget and high < 2**16:
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if peak(middle) <= budget else (low, middle)
    return low, ("the step's memory is not linear in the batch (the steps at batch 2, 3 and 4 differ in what they "
                 "allocate), so the largest batch was found by running the step at each size tried")


def _search_trace(factory: Callable, device: str, request: Request, sizes: dict[str, int]) -> StepTrace:
    """The step at one batch of the search, on the device the target's own step ran on: a failure there is the
    target's at that batch (its step ran at its own size), never a reason to change device."""
    try:
        return _trace(factory, device, request, sizes)[0]
    except NeedsRealValues as failure:
        raise TargetFailure(failure.at_size) from failure


def _linear_peak(traces: dict[int, StepTrace]) -> Callable[[int], int] | None:
    """When the three traces (batch 2, batch 3 and one other) allocate the same blocks at the same moments and
    each block's size is a line in the batch: the peak at any batch, read from those lines; None otherwise."""
    one, two = traces[2], traces[3]
    [(other, three)] = [(batch, trace) for batch, trace in traces.items() if batch not in (2, 3)]
    if not (len(one.blocks) == len(two.blocks) == len(three.blocks) and one.events == two.events == three.events):
        return None
    lines = []
    for a, b, c in zip(one.blocks, two.blocks, three.blocks, strict=True):
        if (a.made, a.freed, a.kind) != (b.made, b.freed, b.kind) or (a.made, a.freed, a.kind) != (c.made, c.freed, c.kind):
            return None
        slope = b.nbytes - a.nbytes
        if c.nbytes - a.nbytes != slope * (other - 2):
            return None
        lines.append((a, a.nbytes - 2 * slope, slope))

    def peak(batch: int) -> int:
        alive = 0
        deltas = []
        for block, intercept, slope in lines:
            size = intercept + slope * batch
            if block.made == -1:
                alive += size
            else:
                deltas.append((block.made, size))
            if block.freed is not None:
                deltas.append((block.freed, -size))
        best = alive
        for _, change in sorted(deltas, key=lambda d: d[0]):
            alive += change
            best = max(best, alive)
        return best

    return peak


def _trace(factory: Callable, device: str, request: Request, sizes: dict[str, int],
           observer: contextlib.AbstractContextManager | None = None) -> tuple[StepTrace, dict[str, int]]:
    """Build the target on `device` and run its step as `request` asks, inputs resized to `sizes` (else to the
    request's), `observer` around the step."""
    with preserved_global_state():
        if device != "meta":
            torch.manual_seed(0)
        made = build(factory, device)
        wanted = sizes or {name: value for name in dimensions.DIMENSIONS
                           if (value := getattr(request, name)) is not None}
        old = resize_inputs(made, {})
        used = resize_inputs(made, wanted)
        try:
            with torch.device(device), _closure_resized(made.loss, old, wanted):
                if request.distribution is not None:
                    from graphlint.memory.distributed import distributed_step

                    trace = call_user_code(distributed_step, made, request)
                else:
                    trace = call_user_code(run_step, made.model, made.args, made.kwargs, made.loss, request,
                                           observer=observer)
        except TargetFailure:
            raise
        except Exception as error:
            # Every op of the step passes through graphlint's tracker, so its frames are in every traceback:
            # an exception here is the model's (the tracker's own bugs show with --debug).
            resized = (" with the inputs resized to " + ", ".join(f"{k} {v}" for k, v in wanted.items())) \
                if wanted else ""
            failure = f"the training step{resized} raised {one_line(error)}{raised_at(error)}"
            if wanted:
                failure += ("; graphlint resizes the inputs and the tensors the loss function closes over, so labels "
                            "kept elsewhere (a global, an object's attribute, or flattened) keep their size: make "
                            "them in the loss from the output's shape, or pass them among the factory's inputs")
            if device == "meta":
                raise NeedsRealValues(meta_failure(error), failure) from error
            raise TargetFailure(failure) from error
    return trace, used


def meta_failure(error: BaseException) -> str:
    """Why the step could not run on the meta device, for the note of the CPU run that follows. A checkpoint whose
    recomputation differs from its forward there differs because of the meta device or graphlint's stand-ins for
    the kernels it lacks (on CPU it recomputes as it ran): torch's message, which suspects the model's code of
    nondeterminism, is not repeated."""
    from torch.utils.checkpoint import CheckpointError

    if isinstance(error, CheckpointError):
        return ("graphlint's run of the step on the meta device recomputed a checkpointed region differently from "
                "its forward (a limit of graphlint's meta-device run, not of the model's code)")
    return f"the step failed on the meta device ({one_line(error)})"


def resize_inputs(made: Target, sizes: dict[str, int]) -> dict[str, int]:
    """Give the inputs the batch and sequence sizes asked for (graphlint.capture.dimensions says which inputs
    carry them); the sizes in use (asked for or found)."""
    found = dimensions.sizes(made.args, made.kwargs, made.model)
    for name in sizes:
        if name not in found:
            what = ("a batch dimension (dimension 0)" if name == "batch"
                    else "a sequence dimension (dimension 1 of token ids or of (batch, seq, features) inputs)")
            raise TargetFailure(f"--{name} does not apply: no input tensor of the target has {what}")
    if not sizes:
        return found
    made.args = tuple(torch.utils._pytree.tree_map(lambda value: dimensions.resized_tensor(value, found, sizes), list(made.args)))
    made.kwargs = torch.utils._pytree.tree_map(lambda value: dimensions.resized_tensor(value, found, sizes), made.kwargs)
    return {**found, **sizes}


def _closure_resized(loss, old: dict[str, int], sizes: dict[str, int]):
    """The tensors the loss function closes over (its labels) resized as the inputs are, for the step."""
    if not sizes:
        return contextlib.nullcontext()
    return closure_tensors_replaced(loss, lambda tensor: dimensions.resized_tensor(tensor, old, sizes))
