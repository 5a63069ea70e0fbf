"""Code shapes met in real repositories' own test suites under `pytest --graphlint` (docs/real-repositories.md),
written by hand in those repositories' style: each finding there was judged by reading the code and checked in
plain PyTorch, and each false one became a test here."""

from __future__ import annotations

import torch

from conftest import findings_of, line_of, lint_file, write

# EfficientNet-PyTorch's memory-efficient Swish: x * sigmoid(x) inside a custom autograd.Function, whose forward
# autograd does not record; it keeps only its input for backward, as F.silu does.
SWISH_FUNCTION = '''
import torch
from torch import nn


class SwishImplementation(torch.autograd.Function):
    @staticmethod
    def forward(ctx, i):
        result = i * torch.sigmoid(i)
        ctx.save_for_backward(i)
        return result

    @staticmethod
    def backward(ctx, grad_output):
        i = ctx.saved_tensors[0]
        sigmoid_i = torch.sigmoid(i)
        return grad_output * (sigmoid_i * (1 + i * (1 - sigmoid_i)))


class MemoryEfficientSwish(nn.Module):
    def forward(self, x):
        return SwishImplementation.apply(x)


class Swish(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(x)


def make_efficient():
    model = nn.Sequential(nn.Linear(16, 32), MemoryEfficientSwish(), nn.Linear(32, 16))
    return model, (torch.randn(4, 16),)


def make_plain():
    model = nn.Sequential(nn.Linear(16, 32), Swish(), nn.Linear(32, 16))
    return model, (torch.randn(4, 16),)
'''


def _saved_for_backward(function, x: torch.Tensor) -> int:
    count = 0

    def pack(tensor):
        nonlocal count
        count += 1
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        function(x)
    return count


def test_swish_in_a_custom_autograd_function_is_reported_without_claiming_it_keeps_more(tmp_path):
    path = write(tmp_path, "efficientnet_utils.py", SWISH_FUNCTION)
    line = line_of(path, "result = i * torch.sigmoid(i)")

    [finding] = findings_of(lint_file(path, "make_efficient"), "GL107")
    assert finding.location.line == line
    assert "one kernel" in finding.message and "saves less" not in finding.message, finding.message
    assert finding.saves_bytes == 0

    # Checked in plain PyTorch: the custom Function keeps one tensor for backward, as F.silu does; a module
    # that writes x * sigmoid(x) with autograd recording keeps more, and there the claim stays.
    import importlib.util

    spec = importlib.util.spec_from_file_location("plain_efficientnet_utils", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    x = torch.randn(4, 32, requires_grad=True)
    assert _saved_for_backward(module.SwishImplementation.apply, x) == 1
    assert _saved_for_backward(torch.nn.functional.silu, x) == 1
    assert _saved_for_backward(module.Swish(), x) > 1

    [plain] = findings_of(lint_file(path, "make_plain"), "GL107")
    assert "saves less for backward" in plain.message and plain.saves_bytes > 0
