"""GL203 on parameters that get gradients only at a longer sequence than the recorded one (a layer a chunked
encoder uses from its second chunk on, recorded at 32 below its chunk of 64): graphlint runs the step again at
four times the sequence and says at which length the finding holds, instead of "remove them". Checked against
a plain backward at both lengths; the re-run leaves the model, its buffers and the user's state untouched."""

from __future__ import annotations

import copy
import importlib.util

import torch

from conftest import findings_of, line_of, lint_file, write
from graphlint.capture.longer import gradients_at_longer_sequence
from graphlint.target import Target

MODEL = '''
import torch
from torch import nn


class ChunkedEncoder(nn.Module):
    """Runs the sequence in chunks; a memory of the earlier chunks feeds each later one."""

    def __init__(self, dim=16, chunk=64):
        super().__init__()
        self.chunk = chunk
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.BatchNorm1d(dim)
        self.carry = nn.Linear(dim, dim)  # carry
        self.spare = nn.Linear(dim, dim)  # spare
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        print("step", self.calls)
        outs, memory = [], None
        for start in range(0, x.shape[1], self.chunk):
            h = self.proj(x[:, start:start + self.chunk])
            if memory is not None:
                h = h + self.carry(memory)[:, None]
            memory = self.norm(h.mean(1))
            outs.append(h)
        return torch.cat(outs, 1)


def make(length=32):
    return ChunkedEncoder(), (torch.randn(2, length, 16),)
'''


def _module(path):
    spec = importlib.util.spec_from_file_location("chunked_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_parameters_used_at_a_longer_sequence_say_both_lengths(tmp_path):
    path = write(tmp_path, "model.py", MODEL)
    report = lint_file(path)
    assert report.errors == []
    by_line = {f.location.line: f.message for f in findings_of(report, "GL203")}
    assert set(by_line) == {line_of(path, "self.norm ="), line_of(path, "# carry"), line_of(path, "# spare")}
    # The norm only feeds the memory, which the first chunk leaves unused: the same two lengths.
    assert "at sequence 128 gradients do reach them" in by_line[line_of(path, "self.norm =")]
    carry = by_line[line_of(path, "# carry")]
    assert "this holds at the recorded sequence 32 only: at sequence 128 gradients do reach them" in carry
    assert "keep them if training sees sequences longer than 32" in carry
    spare = by_line[line_of(path, "# spare")]  # unused at any length: the plain advice
    assert "recorded sequence" not in spare and spare.endswith("remove them, or freeze them with requires_grad_(False).")
    assert "so no gradient reaches them (at sequence 32, and also at 128); remove them" in spare


def test_plain_pytorch_gives_carry_a_gradient_only_at_the_longer_sequence(tmp_path):
    module = _module(write(tmp_path, "model.py", MODEL))
    reached = {}
    for length in (32, 128):
        model, (x,) = module.make(length)
        model(x).sum().backward()
        reached[length] = {name for name, p in model.named_parameters() if p.grad is not None}
    assert "carry.weight" not in reached[32] and "carry.weight" in reached[128]
    assert "spare.weight" not in reached[128]


def test_the_longer_step_leaves_the_model_and_the_users_state_untouched(tmp_path, capsys):
    module = _module(write(tmp_path, "model.py", MODEL))
    model, (x,) = module.make()
    plain = copy.deepcopy(model)
    capsys.readouterr()
    rng = torch.get_rng_state()
    recorded, grown, reached = gradients_at_longer_sequence(Target(model, (x,), {}))
    assert (recorded, grown) == (32, 128)
    assert {"carry.weight", "carry.bias", "norm.weight", "norm.bias", "proj.weight"} <= reached
    assert not reached & {"spare.weight", "spare.bias"}
    assert capsys.readouterr().out == ""  # the longer step's print is not shown
    assert torch.equal(torch.get_rng_state(), rng)
    assert model.calls == 0 and all(p.grad is None for p in model.parameters())  # it ran on a copy
    for name, buffer in plain.state_dict().items():
        assert torch.equal(model.state_dict()[name], buffer), name
