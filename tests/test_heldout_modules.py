"""The held-out model modules of benchmarks/heldout/ (benchmarks/fix_share.py measures graphlint on them) stay
runnable: each imports, its factory builds, and forward and backward run in plain PyTorch on CPU; a module that
declares `BACKWARD_FAILS = True` carries an in-place write on a saved tensor, and its backward must fail with
PyTorch's own error. Nothing of graphlint runs here."""

from __future__ import annotations

import ast
import importlib.util

import pytest
import torch

from conftest import REPO

HELDOUT = REPO / "benchmarks" / "heldout"
MODULES = sorted(p for p in HELDOUT.glob("*.py") if not p.name.startswith("_"))


def _load(path):
    spec = importlib.util.spec_from_file_location(f"heldout_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _floats(value):
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() else []
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _floats(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _floats(item)]
    return []


def test_the_set_has_enough_styles():
    repositories = {_load_constants(p)["REPOSITORY"] for p in MODULES}
    assert len(MODULES) >= 12 and len(repositories) >= 10


def _load_constants(path):
    constants = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            try:
                constants[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return constants


@pytest.mark.parametrize("path", MODULES, ids=[p.stem for p in MODULES])
def test_module_builds_and_runs_forward_and_backward(path):
    constants = _load_constants(path)
    assert {"STYLE", "REPOSITORY", "BACKWARD_FAILS"} <= constants.keys(), "fix_share.py reads these constants"
    if constants.get("FUSED"):
        assert "scaled_dot_product_attention(" in path.read_text(encoding="utf-8")
    module = _load(path)
    made = module.make_model()
    model, args = made[0], made[1]
    kwargs = made[2] if len(made) > 2 else {}
    torch.manual_seed(0)
    outputs = _floats(model(*args, **kwargs))
    assert outputs and all(torch.isfinite(t).all() for t in outputs)
    loss = sum(t.float().sum() for t in outputs)
    if constants["BACKWARD_FAILS"]:
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()
        return
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert any(g is not None for g in grads), "no parameter got a gradient"
    assert all(torch.isfinite(g).all() for g in grads if g is not None)
