"""Every finding lands in the file that produced it, even when other files hold the same code at the same lines.

Python's code objects compare equal across files (equality ignores the file name), so anything keyed by code
objects must use their identity: copies of one module in several files (vendored layers, generated variants)
are each reported in their own file.
"""

from __future__ import annotations

from conftest import findings_of, line_of, lint_file, write

ATTENTION = '''
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.spare = nn.Linear(16, 16)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-2, -1) / 4.0
        return scores.softmax(-1) @ v
'''

COPIES = ("attn_a", "attn_b", "attn_c")

MODEL = f'''
import torch
from torch import nn
import {", ".join(COPIES)}


def make():
    return nn.Sequential({", ".join(f"{name}.Attention()" for name in COPIES)}), (torch.randn(2, 5, 16),)
'''


def test_identical_modules_in_several_files_are_reported_in_each_file(tmp_path):
    copies = [write(tmp_path, f"{name}.py", ATTENTION) for name in COPIES]
    model = write(tmp_path, "model.py", MODEL)
    assert len({path.read_text() for path in copies}) == 1  # the same code at the same lines
    report = lint_file(model, extend_select=("GL203",))
    assert report.errors == []
    for rule_id, fragment in (("GL101", "scores.softmax(-1) @ v"), ("GL203", "self.spare = ")):
        findings = findings_of(report, rule_id)
        assert sorted(f.location.path for f in findings) == sorted(str(path) for path in copies)
        for finding, index in zip(sorted(findings, key=lambda f: f.location.path), range(len(COPIES)), strict=True):
            assert finding.location.line == line_of(copies[index], fragment)
            assert finding.occurrences == 1
            assert f"{index}" in finding.message  # the module path of the copy in that file
