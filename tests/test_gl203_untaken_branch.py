"""GL203 on parameters that the source uses only under a Python flag of the model (a graph transformer's global
attention switched on after warm-up epochs): the finding names the flag and the branch the capture did not
take; parameters with no such use keep the plain advice. Checked against a plain backward with the flag on."""

from __future__ import annotations

import importlib.util
import re

import torch

from conftest import findings_of, line_of, lint_file, write

MODEL = '''
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.local = nn.Linear(dim, dim)
        self.global_attn = nn.Linear(dim, dim)
        self.aux = nn.Linear(dim, 3)
        self.gain = nn.Parameter(torch.ones(dim))
        self.use_global = False  # switched on after warm-up epochs

    def forward(self, x):
        h = self.local(x)
        if self.use_global:
            h = h + self.global_attn(h) * self.gain
        return h


def make():
    return Block(), (torch.randn(4, 8),)
'''


def _gradients(path, use_global: bool) -> set[str]:
    spec = importlib.util.spec_from_file_location("flagged_block", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model, args = module.make()
    model.use_global = use_global
    model(*args).sum().backward()
    return {name for name, p in model.named_parameters() if p.grad is not None}


def test_gl203_names_the_flag_under_which_the_source_uses_the_parameters(tmp_path):
    path = write(tmp_path, "block.py", MODEL)
    # Plain PyTorch: with the flag on, global_attn and gain get gradients; aux never does.
    assert _gradients(path, True) == {"local.weight", "local.bias", "global_attn.weight", "global_attn.bias", "gain"}
    assert _gradients(path, False) == {"local.weight", "local.bias"}
    found = {f.location.line: f.message for f in findings_of(lint_file(path, select=("GL203",)), "GL203")}
    line = line_of(path, "if self.use_global")
    flag = re.compile(rf"only under `if self\.use_global` \(\S*block\.py:{line}\), a branch this capture did not take")
    assert set(found) == {line_of(path, "self.global_attn ="), line_of(path, "self.aux ="), line_of(path, "self.gain =")}
    assert flag.search(found[line_of(path, "self.global_attn =")]) and flag.search(found[line_of(path, "self.gain =")])
    assert "only under" not in found[line_of(path, "self.aux =")]
    assert found[line_of(path, "self.aux =")].endswith("remove them, or freeze them with requires_grad_(False).")


def test_a_parameter_also_used_outside_the_branch_keeps_the_plain_message(tmp_path):
    path = write(tmp_path, "block.py", MODEL.replace(
        "        return h\n", "        return h\n\n    def extra(self, h):\n        return self.aux(h)\n"))
    found = {f.location.line: f.message for f in findings_of(lint_file(path, select=("GL203",)), "GL203")}
    assert "only under" not in found[line_of(path, "self.aux =")]
    assert torch.is_grad_enabled()


NESTED = '''
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.q = nn.Linear(dim, dim)

    def forward(self, x):
        return self.q(x).softmax(-1)


class GraphLayer(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.local = nn.Linear(dim, dim)
        self.global_block = Attention(dim)
        self._global = False

    def forward(self, x):
        x = self.local(x)
        return x + self.global_block(x) if self._global else x


def make():
    return GraphLayer(), (torch.randn(4, 8),)
'''


def test_a_flag_of_an_outer_module_is_named_for_the_layers_it_holds(tmp_path):
    path = write(tmp_path, "graph_layer.py", NESTED)
    (finding,) = findings_of(lint_file(path, select=("GL203",)), "GL203")
    assert "global_block.q.weight" in finding.message
    assert "only under `if self._global` (" in finding.message
    assert f"graph_layer.py:{line_of(path, 'if self._global else x')})" in finding.message
