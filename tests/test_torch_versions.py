"""What keeps graphlint right on the torch versions users have: the global-state restore against the attribute
layouts of older torch releases, and models that use torch.func transforms (which refuse saved-tensor hooks)."""

from __future__ import annotations

import threading
import types

import pytest
import torch
import torch.utils._device

from conftest import backward_in_plain_pytorch, lint_file, write
from graphlint.capture.isolation import preserved_global_state


def _old_get_default_device():
    """torch.get_default_device as torch 2.4–2.9 wrote it: it trusts the attribute whenever it exists."""
    holder = torch._GLOBAL_DEVICE_CONTEXT
    if hasattr(holder, "device_context"):
        return holder.device_context.device
    return torch.device("cpu")


@pytest.fixture
def fresh_device_context(monkeypatch):
    """torch's global device context as a process that never called set_default_device has it."""
    holder = threading.local()
    monkeypatch.setattr(torch, "_GLOBAL_DEVICE_CONTEXT", holder)
    return holder


def test_an_absent_device_context_stays_absent(fresh_device_context):
    with preserved_global_state():
        pass
    assert not hasattr(fresh_device_context, "device_context")
    assert _old_get_default_device() == torch.device("cpu")


def test_a_default_device_set_inside_is_undone_to_absent(fresh_device_context):
    with preserved_global_state():
        torch.set_default_device("meta")
        assert torch.empty(1).device.type == "meta"
    assert not hasattr(fresh_device_context, "device_context")
    assert _old_get_default_device() == torch.device("cpu")
    assert torch.empty(1).device.type == "cpu"


def test_a_device_context_that_was_set_is_restored_as_it_was(fresh_device_context):
    fresh_device_context.device_context = None  # what set_default_device(None) leaves on every version
    with preserved_global_state():
        torch.set_default_device("meta")
    assert fresh_device_context.device_context is None
    assert torch.empty(1).device.type == "cpu"


def test_releases_without_the_holder_or_current_device_are_left_alone(monkeypatch):
    monkeypatch.delattr(torch, "_GLOBAL_DEVICE_CONTEXT")
    monkeypatch.delattr(torch.utils._device, "CURRENT_DEVICE")
    with preserved_global_state():
        pass
    assert not hasattr(torch, "_GLOBAL_DEVICE_CONTEXT")
    assert not hasattr(torch.utils._device, "CURRENT_DEVICE")


FUNCTORCH = '''
import torch
from torch import nn


class Physics(nn.Module):
    """A force field: the forward differentiates an energy with torch.func, as physics-informed models do."""

    def __init__(self):
        super().__init__()
        self.energy = nn.Linear(4, 1)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        force = torch.func.vmap(torch.func.grad(lambda p: self.energy(p).sum()))(x)
        mask = torch.func.vmap(lambda row: row > 0)(x)
        return self.head(force * mask)


def make():
    return Physics(), (torch.randn(3, 4),)
'''


@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_a_forward_that_uses_torch_func_transforms_is_captured(tmp_path, device):
    path = write(tmp_path, "physics.py", FUNCTORCH)
    disable = torch.autograd.graph.disable_saved_tensors_hooks
    report = lint_file(path, device=device)
    assert report.errors == []
    assert torch.autograd.graph.disable_saved_tensors_hooks is disable  # graphlint put torch back as it was
    # The force of a linear energy is its weight: the energy's bias never reaches the loss, in plain PyTorch too.
    model = backward_in_plain_pytorch(path)
    without_grad = [name for name, p in model.named_parameters() if p.grad is None]
    assert without_grad == ["energy.bias"]
    [unused] = report.findings
    assert unused.rule_id == "GL203" and "energy.bias" in unused.message and "head" not in unused.message


def test_graphlints_hooks_are_back_after_a_transform(tmp_path):
    """In-place writes after a torch.func call are still seen: the hooks stepped aside only for the transform."""
    path = write(tmp_path, "after.py", FUNCTORCH.replace(
        "        return self.head(force * mask)",
        "        h = torch.sigmoid(self.head(force * mask))\n        h.mul_(2)  # expect: GL201\n        return h"))
    report = lint_file(path)
    assert sorted(f.rule_id for f in report.findings) == ["GL201", "GL203"]
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        backward_in_plain_pytorch(path)


def test_the_hook_switch_is_restored_even_when_the_forward_raises(tmp_path):
    path = write(tmp_path, "raises.py", FUNCTORCH.replace("        return self.head(force * mask)",
                                                          "        raise ValueError('no')"))
    disable = torch.autograd.graph.disable_saved_tensors_hooks
    [error] = lint_file(path).errors
    assert "the forward raised ValueError: no" in error.message
    assert torch.autograd.graph.disable_saved_tensors_hooks is disable
    assert isinstance(disable, types.FunctionType)
