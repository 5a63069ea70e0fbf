"""The proof's child process: build a target from one source tree, run it once in float64, and either save
what it computed (the original tree) or compare with what the original computed (the rewritten tree). A model
that cannot run in float64 (one that mixes dtypes on purpose: a float32 buffer it multiplies with) runs in its
own dtypes, compared at the tolerance of the least precise, and the verdict says so.

    python -m graphlint.fix.model_run save TARGET BASE RECORD "" [PYTHONPATH...]
    python -m graphlint.fix.model_run compare TARGET BASE RECORD VERDICT [PYTHONPATH...]

Each tree runs in its own process, so nothing of one tree's modules leaks into the other. The rewritten
model loads the original's state dict with strict=True: a fix must not break existing checkpoints. The
verdict is a JSON object {"ok": bool, "reason": str, "note": str}.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import torch

from graphlint.capture.isolation import seed_everything
from graphlint.capture.loss import choose_loss, floating_tensors
from graphlint.errors import one_line
from graphlint.target import TargetSpec, load_factory, normalize_factory_result, search_path

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
    made = normalize_factory_result(load_factory(spec, pythonpath).factory())
    model = made.model
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    args, kwargs = made.args, dict(made.kwargs or {})
    if record is not None:
        _load_strictly(model, record["state"])
        args, kwargs = record["args"], record["kwargs"]
    model = (model.double() if in_double else model).eval()
    seed_everything(1)
    with _LowestPrecision() as precision:
        output = model(*_double(args), **_double(kwargs)) if in_double else model(*args, **kwargs)
    outputs = [t.detach().clone() for t in floating_tensors(output)]
    backward_error = None
    try:
        loss = choose_loss(output, made.loss)
        if loss is not None:
            loss.backward()
    except RuntimeError as error:
        backward_error = one_line(error).split(". Hint:")[0]
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    lowest = min([precision.lowest, *(t.dtype for t in outputs)], key=lambda dtype: -torch.finfo(dtype).eps)
    return {"state": state, "args": args, "kwargs": kwargs, "outputs": outputs, "grads": grads,
            "backward_error": backward_error, "lowest": str(lowest).removeprefix("torch."), "in_double": in_double}


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


def _differences(original: dict, rewritten: dict) -> str | None:
    """What the rewritten model computes differently, or None."""
    lowest = max((getattr(torch, record["lowest"]) for record in (original, rewritten)),
                 key=lambda dtype: torch.finfo(dtype).eps)
    rtol, atol = tolerances(lowest)
    within = "" if lowest == torch.float64 else f" (compared at {str(lowest).removeprefix('torch.')} precision, " \
                                                  "which part of the model computes in)"
    if len(original["outputs"]) != len(rewritten["outputs"]):
        return f"{len(rewritten['outputs'])} output tensors instead of {len(original['outputs'])}"
    for index, (a, b) in enumerate(zip(original["outputs"], rewritten["outputs"], strict=True)):
        if a.shape != b.shape:
            return f"output {index} has shape {tuple(b.shape)} instead of {tuple(a.shape)}"
        if not torch.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True):
            return f"output {index} differs by up to {(a - b).abs().nan_to_num().max().item():.3g}{within}"
    if original["backward_error"] is not None:
        # The original cannot be differentiated (GL201): the same outputs suffice here. If the backward still
        # fails, another write that is left unfixed breaks it; the re-lint shows the fixed ones are gone.
        return None
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
        try:
            rewritten = _run(target, Path(base), original, original["in_double"], pythonpath)
            reason = _differences(original, rewritten)
        except StateDictChanged as error:
            reason = str(error)
        except Exception as error:  # the rewritten code fails to build, load the checkpoint or run
            reason = f"the rewritten model fails: {one_line(error)}"
        Path(verdict_path).write_text(json.dumps({"ok": reason is None, "reason": reason or "", "note": note}),
                                      encoding="utf-8")
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
