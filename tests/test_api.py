"""`graphlint.lint(model, args, kwargs=None, loss=None)`: findings of one capture, with the model left as it was."""

from __future__ import annotations

import inspect

import torch
from torch import nn

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
    assert report.results[0].device == "cpu"


def test_lint_leaves_gradients_buffers_and_random_state_as_they_were():
    model = HandWrittenAttention()
    statistics = model.norm.running_mean.clone(), model.norm.num_batches_tracked.clone()
    x = torch.randn(2, 8, 16)
    random_state = torch.get_rng_state()
    graphlint.lint(model, (x,), loss=lambda out: out.mean())
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(model.norm.running_mean, statistics[0])
    assert torch.equal(model.norm.num_batches_tracked, statistics[1])
    assert torch.equal(torch.get_rng_state(), random_state)


def test_lint_of_a_model_without_problems_is_empty():
    report = graphlint.lint(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), torch.randn(3, 4))
    assert len(report) == 0 and report.errors == []
