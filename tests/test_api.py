"""`graphlint.lint(model, args, kwargs=None, loss=None)`: findings of one capture, with the model left as it was."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import graphlint


class HandWrittenAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.norm = nn.BatchNorm1d(8)

    def forward(self, x, scale=0.25):
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        probs = torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1)  # the softmax
        return torch.nn.functional.dropout(probs, 0.5) @ v


SOFTMAX_LINE = inspect.getsourcelines(HandWrittenAttention)[1] + next(
    i for i, line in enumerate(inspect.getsource(HandWrittenAttention).splitlines()) if "# the softmax" in line
)


def test_lint_returns_the_findings_of_one_capture():
    report = graphlint.lint(HandWrittenAttention(), (torch.randn(2, 8, 16),), {"scale": 0.5})
    [finding] = list(report)
    assert isinstance(finding, graphlint.Finding)
    assert finding.rule_id == "GL101" and finding.severity is graphlint.Severity.WARNING
    assert finding.location.path == __file__ and finding.location.line == SOFTMAX_LINE
    assert report.results[0].device == "meta"  # a meta copy: nothing allocated


class WritesItsWeights(torch.nn.Module):
    """A forward that changes its own parameter and needs real values (a data-dependent branch)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.norm = nn.BatchNorm1d(4)

    def forward(self, x):
        with torch.no_grad():
            self.fc.weight.mul_(0.5)
        y = self.norm(self.fc(x))
        return y * 2 if y.sum() > 0 else y


class ReentrantCheckpoint(nn.Module):
    """Its backward is a real `.backward()` (torch.autograd.grad cannot run a reentrant checkpoint)."""

    def __init__(self):
        super().__init__()
        self.attention = HandWrittenAttention()

    def forward(self, x):
        return checkpoint(self.attention, x, use_reentrant=True)


@pytest.mark.parametrize("model_type", [HandWrittenAttention, WritesItsWeights, ReentrantCheckpoint])
@pytest.mark.parametrize("device", ["auto", "model"])
def test_lint_leaves_the_model_gradients_buffers_and_random_state_as_they_were(model_type, device):
    model = model_type()
    x = torch.randn(3, 4) if model_type is WritesItsWeights else torch.randn(2, 8, 16, requires_grad=True)
    model(x).sum().backward()  # the user's own gradients, which lint must not touch
    before = {name: t.detach().clone() for name, t in [*model.named_parameters(), *model.named_buffers()]}
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    x_grad = None if x.grad is None else x.grad.clone()
    random_state = torch.get_rng_state()
    report = graphlint.lint(model, (x,), loss=lambda out: out.mean(), device=device)
    assert report.errors == []
    after = dict([*model.named_parameters(), *model.named_buffers()])
    changed = [name for name, value in before.items() if not torch.equal(after[name].detach(), value)]
    if device == "model" and model_type is WritesItsWeights:
        assert changed == ["fc.weight"]  # the forward itself wrote to it, on the model it was given
    else:
        assert changed == []
    assert all(torch.equal(p.grad, grads[name]) for name, p in model.named_parameters())
    assert x.grad is None or torch.equal(x.grad, x_grad)
    assert torch.equal(torch.get_rng_state(), random_state)


def test_a_forward_that_needs_real_values_runs_on_a_full_copy_and_says_so():
    report = graphlint.lint(WritesItsWeights(), torch.randn(3, 4))
    assert report.results[0].device == "cpu"
    assert report.results[0].notes[0].startswith("captured on a full copy of the model: the forward needs real values")


def test_lint_of_a_model_without_problems_is_empty():
    report = graphlint.lint(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), torch.randn(3, 4))
    assert len(report) == 0 and report.errors == []
