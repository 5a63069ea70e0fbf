"""torch.distributions' argument validation is a host sync wherever it runs: also in a mixture-of-experts gate
whose noisy top-k helper builds `Normal(mean, std)` and calls `.cdf`, with a `nonzero()` dispatch after it
that sends the capture to the CPU."""

from __future__ import annotations

import pytest
import torch

from conftest import findings_of, line_of, lint_file, write

MOE = """import torch
import torch.nn as nn
from torch.distributions.normal import Normal


class Dispatcher:
    def __init__(self, gates):
        self.gates = gates
        experts, order = torch.nonzero(gates).sort(0)
        _, self.expert_index = experts.split(1, dim=1)
        self.batch_index = torch.nonzero(gates)[order[:, 1], 0]
        self.sizes = (gates > 0).sum(0).tolist()
        self.nonzero_gates = torch.gather(gates[self.batch_index.flatten()], 1, self.expert_index)

    def dispatch(self, x):
        return torch.split(x[self.batch_index].squeeze(1), self.sizes, dim=0)

    def combine(self, outs):
        stitched = torch.cat(outs, 0) * self.nonzero_gates
        zeros = torch.zeros(self.gates.size(0), outs[-1].size(1), device=stitched.device)
        return zeros.index_add(0, self.batch_index, stitched)


class MoE(nn.Module):
    def __init__(self, dim=16, experts=4, k=2):
        super().__init__()
        self.k = k
        self.experts = nn.ModuleList(nn.Linear(dim, dim) for _ in range(experts))
        self.w_gate = nn.Parameter(torch.zeros(dim, experts))
        self.w_noise = nn.Parameter(torch.zeros(dim, experts))
        self.softplus = nn.Softplus()
        self.register_buffer("mean", torch.tensor([0.0]))
        self.register_buffer("std", torch.tensor([1.0]))

    def _prob_in_top_k(self, clean, noisy, noise_stddev, top):
        batch, m = clean.size(0), top.size(1)
        flat = top.flatten()
        pos_in = torch.arange(batch, device=clean.device) * m + self.k
        thr_in = torch.gather(flat, 0, pos_in).unsqueeze(1)
        is_in = torch.gt(noisy, thr_in)
        thr_out = torch.gather(flat, 0, pos_in - 1).unsqueeze(1)
        normal = Normal(self.mean, self.std)
        p_in = normal.cdf((clean - thr_in) / noise_stddev)
        p_out = normal.cdf((clean - thr_out) / noise_stddev)
        return torch.where(is_in, p_in, p_out)

    def gating(self, x, train):
        clean = x @ self.w_gate
        if train:
            noise_stddev = self.softplus(x @ self.w_noise) + 1e-2
            noisy = clean + torch.randn_like(clean) * noise_stddev
            logits = noisy
        else:
            logits = clean
        top, idx = logits.topk(self.k + 1, dim=1)
        gates = torch.zeros_like(logits).scatter(1, idx[:, :self.k], top[:, :self.k].softmax(1))
        if train:
            load = self._prob_in_top_k(clean, noisy, noise_stddev, top).sum(0)
        else:
            load = (gates > 0).sum(0)
        return gates, load

    def forward(self, x):
        gates, load = self.gating(x, self.training)
        importance = gates.sum(0)
        loss = importance.var() / (importance.mean() ** 2 + 1e-10) + load.float().var()
        d = Dispatcher(gates)
        inputs = d.dispatch(x)
        return d.combine([self.experts[i](inputs[i]) for i in range(len(self.experts))]).sum() + loss


def make():
    return MoE(), (torch.randn(8, 16),)
"""


def test_distribution_validation_in_a_noisy_top_k_gate_is_reported(tmp_path):
    path = write(tmp_path, "moe.py", MOE)
    report = lint_file(path)
    assert report.errors == []
    syncs = {(f.location.line, f.message.split(" in ")[0]) for f in findings_of(report, "GL103")}
    assert (line_of(path, "normal = Normal("), "torch's Normal.__init__()") in syncs
    assert (line_of(path, "p_in = normal.cdf("), "torch's Normal.cdf()") in syncs
    assert (line_of(path, "p_out = normal.cdf("), "torch's Normal.cdf()") in syncs
    assert line_of(path, "experts, order = torch.nonzero(gates)") in {line for line, _ in syncs}


def test_the_validation_really_reads_values_on_the_host_in_plain_pytorch():
    reads = []
    original = torch.Tensor.__bool__

    def counting(self):
        reads.append(1)
        return original(self)

    torch.Tensor.__bool__ = counting
    try:
        normal = torch.distributions.Normal(torch.zeros(1), torch.ones(1))
        normal.cdf(torch.randn(4, 3))
        validated = len(reads)
        reads.clear()
        quiet = torch.distributions.Normal(torch.zeros(1), torch.ones(1), validate_args=False)
        quiet.cdf(torch.randn(4, 3))
    finally:
        torch.Tensor.__bool__ = original
    assert validated > 0 and reads == []


@pytest.mark.compile
def test_the_torch_compile_rules_do_not_switch_the_validation_off(tmp_path):
    """The first torch.compile in a process switches torch.distributions' argument checks off for the whole
    process; graphlint's warm parent compiles once for GL301/GL302, and its children must still see the checks."""
    path = write(tmp_path, "moe.py", MOE)
    report = lint_file(path, extend_select=("GL3",))
    assert report.errors == []
    messages = [f.message for f in findings_of(report, "GL103")]
    assert any(m.startswith("torch's Normal.__init__()") for m in messages)
    assert any(m.startswith("torch's Normal.cdf()") for m in messages)
    assert torch.distributions.Distribution._validate_args is __debug__  # and this process keeps its own
