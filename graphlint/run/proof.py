"""The proof's child process: build a target from one source tree, run it once in float64, and either save
what it computed (the original tree) or compare with what the original computed (the rewritten tree). A model
that cannot run in float64 (one that mixes dtypes on purpose: a float32 buffer it multiplies with) runs in its
own dtypes, compared at the tolerance of the least precise, and the verdict says so. Both then run the edge
cases of graphlint.run.edge_cases (a fully masked row, a sequence of length one) that the original can run, and
must agree there too, except where the original gives NaN.

    python -m graphlint.run.proof save TARGET BASE RECORD "" [PYTHONPATH...]
    python -m graphlint.run.proof compare TARGET BASE RECORD VERDICT [PYTHONPATH...]

Each tree runs in its own process, so nothing of one tree's modules leaks into the other. The rewritten
model loads the original's state dict with strict=True: a fix must not break existing checkpoints. The
verdict is a JSON object {"ok": bool, "reason": str, "note": str, "runs": bool, "differs": bool} (runs: the
rewritten model built and ran wherever the original did, whether or not it computed the same; differs: it ran
and computed different outputs or gradients, a fix known to be wrong that nothing may write).
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import torch

from graphlint.capture.device import load_target
from graphlint.capture.isolation import seed_everything
from graphlint.capture.loss import choose_loss, floating_tensors
from graphlint.capture.patches import compiled_code_eager
from graphlint.errors import one_line
from graphlint.run import edge_cases
from graphlint.target import TargetSpec, normalize_factory_result, search_path

# float64 leaves room only for rounding differences between equivalent formulations.
RTOL, ATOL = 1e-7, 1e-9
# Where the model itself computes part of its forward in a lower precision (`softmax(dtype=torch.float32)`
# in a float64 run), results can only agree to that precision: a hundred of its epsilons.
_LOWER = (torch.float32, torch.bfloat16, torch.float16)


class _LowestPrecision(torch.overrides.TorchFunctionMode):
    """Notes the least precise floating dtype any torch function returned while the forward ran."""

    def __init__(self) -> None:
        super().__init__()
        self.lowest: torch.dtype = torch.float64

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for tensor in floating_tensors(result):
            if tensor.dtype in _LOWER and torch.finfo(tensor.dtype).eps > torch.finfo(self.lowest).eps:
                self.lowest = tensor.dtype
        return result


def tolerances(lowest: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) for outputs and gradients when part of the model ran in `lowest`."""
    if lowest == torch.float64:
        return RTOL, ATOL
    eps = torch.finfo(lowest).eps
    return 100 * eps, 100 * eps


def _double(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.double() if value.is_floating_point() else value
    if isinstance(value, (tuple, list)):
        return type(value)(_double(v) for v in value)
    if isinstance(value, dict):
        return {k: _double(v) for k, v in value.items()}
    return value


def _run(target: str, base: Path, record: dict | None, in_double: bool = True,
         pythonpath: tuple[Path, ...] = ()) -> dict:
    spec = TargetSpec.parse(target, base)
    first, last = search_path(spec, pythonpath)  # for the whole process: the forward may import lazily
    sys.path[:0] = [str(folder) for folder in first]
    sys.path.extend(str(folder) for folder in last)
    seed_everything(0)  # both sides build, and draw in Python, alike
    made = normalize_factory_result(load_target(spec, pythonpath).factory())
    model = made.model
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    args, kwargs = made.args, dict(made.kwargs or {})
    if record is not None:
        _load_strictly(model, record["state"])
        args, kwargs = record["args"], record["kwargs"]
    model = (model.double() if in_double else model).eval()
    result = _forward(model, args, kwargs, made.loss, in_double)
    result.update({"state": state, "args": args, "kwargs": kwargs, "in_double": in_double})
    if record is None:  # the original: which edge cases it runs, and what it computes on them
        try:
            cases, result["edge_notes"] = edge_cases.variants(args, kwargs)
        except Exception as error:  # graphlint's own fault: the factory's inputs still prove the fix
            cases, result["edge_notes"] = [], [f"proven without edge cases: graphlint could not make them "
                                               f"({one_line(error)})"]
        result["edges"] = []
        for name, edge_args, edge_kwargs in cases:
            try:
                ran = _forward(model, edge_args, edge_kwargs, made.loss, in_double)
            except Exception as error:  # the model does not take such an input: nothing to compare
                result["edge_notes"].append(f"proven without {name}: the original fails on it ({one_line(error)})")
                continue
            result["edges"].append({**ran, "name": name, "args": edge_args, "kwargs": edge_kwargs})
    else:
        result["edges"] = []
        for edge in record.get("edges", []):
            try:
                ran = _forward(model, edge["args"], edge["kwargs"], made.loss, in_double)
            except Exception as error:
                raise EdgeCaseFails(f"the rewritten model fails on {edge['name']}: {one_line(error)}") from None
            result["edges"].append({**ran, "name": edge["name"]})
    return result


def _forward(model: torch.nn.Module, args: Any, kwargs: dict, loss_of: Any, in_double: bool) -> dict:
    """One forward and backward of the built model: its outputs and parameter gradients."""
    model.zero_grad(set_to_none=True)
    seed_everything(1)
    with compiled_code_eager(), _LowestPrecision() as precision:
        output = model(*_double(args), **_double(kwargs)) if in_double else model(*args, **kwargs)
    outputs = [t.detach().clone() for t in floating_tensors(output)]
    backward_error = None
    try:
        loss = choose_loss(output, loss_of)
        if loss is not None:
            with compiled_code_eager():
                loss.backward()
    except RuntimeError as error:
        backward_error = one_line(error).split(". Hint:")[0]
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    lowest = min([precision.lowest, *(t.dtype for t in outputs)], key=lambda dtype: -torch.finfo(dtype).eps)
    return {"outputs": outputs, "grads": grads, "backward_error": backward_error,
            "lowest": str(lowest).removeprefix("torch.")}


class EdgeCaseFails(Exception):
    """The rewritten model cannot run an edge case the original ran."""


def _save(target: str, base: Path, pythonpath: tuple[Path, ...]) -> dict:
    """The original's record: in float64, else (a model that cannot run in float64) in its own dtypes."""
    try:
        return _run(target, base, None, pythonpath=pythonpath)
    except Exception as error:  # the model's own code mixes dtypes, or calls what has no float64 kernel
        record = _run(target, base, None, in_double=False, pythonpath=pythonpath)
        record["float64_error"] = one_line(error)
        return record


class StateDictChanged(Exception):
    """The rewritten model's parameters and buffers are not the original's: checkpoints would not load."""


def _load_strictly(model: torch.nn.Module, state: dict) -> None:
    try:
        incompatible = model.load_state_dict(state, strict=False)
    except RuntimeError as error:  # a reshaped entry
        raise StateDictChanged(f"the state dict changes ({one_line(error).split(':', 1)[-1].strip()}), so existing "
                               "checkpoints would not load") from None
    changes = [f"{', '.join(keys[:3])} {what}" for keys, what in ((incompatible.missing_keys, "added"),
                                                                   (incompatible.unexpected_keys, "removed")) if keys]
    if changes:
        raise StateDictChanged(f"the state dict changes ({'; '.join(changes)}), so existing checkpoints would "
                               "not load strictly")


def _differences(original: dict, rewritten: dict, edge: bool = False, in_double: bool = True) -> str | None:
    """What the rewritten model computes differently, or None, saying the dtype the models ran in (float64, or
    with `in_double` False their own). On an edge case (`edge`), what the original leaves undefined (a NaN
    output, NaN gradients) may be anything: a fused call gives a fully masked row zeros where the hand-written
    softmax gave NaN."""
    lowest = max((getattr(torch, record["lowest"]) for record in (original, rewritten)),
                 key=lambda dtype: torch.finfo(dtype).eps)
    rtol, atol = tolerances(lowest)
    ran = " in float64" if in_double else f" in the model's own dtypes ({str(lowest).removeprefix('torch.')})"
    within = ran if lowest == torch.float64 or not in_double else \
        f"{ran} (compared at {str(lowest).removeprefix('torch.')} precision, which part of the model computes in)"
    if len(original["outputs"]) != len(rewritten["outputs"]):
        return f"{len(rewritten['outputs'])} output tensors instead of {len(original['outputs'])}"
    for index, (a, b) in enumerate(zip(original["outputs"], rewritten["outputs"], strict=True)):
        if a.shape != b.shape:
            return f"output {index} has shape {tuple(b.shape)} instead of {tuple(a.shape)}"
        if edge:
            defined = ~a.isnan()
            a, b = a[defined], b[defined]
        if not torch.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True):
            return f"output {index} differs by up to {(a - b).abs().nan_to_num().max().item():.3g}{within}"
    if original["backward_error"] is not None:
        # The original cannot be differentiated (GL201): the same outputs suffice here. If the backward still
        # fails, another write that is left unfixed breaks it; the re-lint shows the fixed ones are gone.
        return None
    if edge and any(g.isnan().any() for g in original["grads"].values()):
        return None  # the original's gradients are undefined there: its outputs agreeing is all there is
    if rewritten["backward_error"] is not None:
        return f"the backward pass fails: {rewritten['backward_error']}"
    if original["grads"].keys() != rewritten["grads"].keys():
        changed = sorted(original["grads"].keys() ^ rewritten["grads"].keys())
        return f"parameters {', '.join(changed[:3])} gain or lose a gradient"
    for name, a in original["grads"].items():
        b = rewritten["grads"][name]
        if not torch.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True):
            return f"the gradient of {name} differs by up to {(a - b).abs().nan_to_num().max().item():.3g}{within}"
    return None


def main(argv: list[str]) -> int:
    mode, target, base, record_path, verdict_path = argv[:5]
    pythonpath = tuple(Path(folder) for folder in argv[5:])
    with contextlib.redirect_stdout(sys.stderr):  # the user's prints
        if mode == "save":
            torch.save(_save(target, Path(base), pythonpath), record_path)
            return 0
        original = torch.load(record_path, weights_only=False)
        note = "" if original["in_double"] else (
            f"proven in {original['lowest']} at its tolerance, since the model cannot run in float64 "
            f"({original['float64_error']})")
        runs = True  # whether the rewritten model builds and runs forward and backward wherever the original does
        differs = False  # whether it computed something else
        try:
            rewritten = _run(target, Path(base), original, original["in_double"], pythonpath)
            reason = _differences(original, rewritten, in_double=original["in_double"])
            for before, after in zip(original["edges"], rewritten["edges"], strict=True):
                if reason is None and (edge := _differences(before, after, True, original["in_double"])) is not None:
                    reason = f"on an input the factory's do not cover ({before['name']}), {edge}"
            runs = rewritten["backward_error"] is None or original["backward_error"] is not None
            differs = runs and reason is not None
            note = "; ".join(filter(None, [note, *original["edge_notes"]]))
        except StateDictChanged as error:  # it runs; its checkpoints would not load
            reason = str(error)
        except EdgeCaseFails as error:
            reason, runs = str(error), False
        except Exception as error:  # the rewritten code fails to build, load the checkpoint or run
            reason, runs = f"the rewritten model fails: {one_line(error)}", False
        Path(verdict_path).write_text(json.dumps({"ok": reason is None, "reason": reason or "", "note": note,
                                                  "runs": runs, "differs": differs}), encoding="utf-8")
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
