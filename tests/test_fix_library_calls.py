"""The fixes that put the library call where a formula was written by hand (GL106, GL107, GL204), proven on
each rule's BAD examples, and GL105's `bias=False`, which changes the state dict and so is never proven."""

from __future__ import annotations

import pytest

from conftest import findings_of, fix_plan, lint_file, write
from graphlint.engine import load_rules

pytestmark = pytest.mark.proof

CASES = [(rule, example) for rule in load_rules() if rule.id in ("GL105", "GL106", "GL107", "GL204")
         for example in rule.bad_examples if example.fixed]


@pytest.mark.parametrize("case", CASES, ids=[f"{r.id}-{e.title[:40]}" for r, e in CASES])
def test_the_examples_fixes_are_proven_on_the_model_except_a_removed_bias(tmp_path, case):
    rule, example = case
    write(tmp_path, "pyproject.toml", '[project]\nname = "user-project"\nversion = "0"\n')
    path = write(tmp_path, "example.py", example.code)
    report = lint_file(path, device="cpu", extend_select=(rule.id,))
    fixable = [f for f in findings_of(report, rule.id) if f.fix is not None]
    assert fixable
    plan = fix_plan(report, tmp_path)
    if rule.id == "GL105":
        # The bias leaves the state dict: the fix is unsafe by declaration, never proven, applied only when unsafe.
        assert all(f.fix.applicability == "unsafe" for f in fixable)
        assert plan.applied == [] and {f for f, _ in plan.refused} == set(fixable)
        assert all(reason.startswith("declared unsafe: ") and "state dict" in reason for _, reason in plan.refused)
        unsafe = fix_plan(report, tmp_path, unsafe=True)
        assert set(unsafe.applied) == set(fixable) and unsafe.texts[str(path)] == example.fixed_code
    else:
        assert plan.refused == [] and set(plan.applied) == set(fixable)
        assert plan.texts[str(path)] == example.fixed_code


FORMULAS = '''
import torch
from torch import nn


class Heads(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        z = self.fc(x)
        weights = torch.exp(z) / torch.exp(z).sum(-1, keepdim=True)
        return torch.log(torch.sigmoid(z)) + torch.log(1 - torch.sigmoid(z + 1)) + weights


def make():
    return Heads(), (torch.randn(4, 8),)
'''


def test_the_sigmoid_logs_and_the_exponential_softmax_are_rewritten_and_proven(tmp_path):
    write(tmp_path, "pyproject.toml", '[project]\nname = "user-project"\nversion = "0"\n')
    path = write(tmp_path, "model.py", FORMULAS)
    report = lint_file(path, device="cpu", extend_select=("GL107", "GL204"))
    plan = fix_plan(report, tmp_path)
    assert plan.refused == [] and len(plan.applied) == 3
    fixed = plan.texts[str(path)]
    assert "        weights = torch.softmax(z, -1)\n" in fixed
    # The file imports `from torch import nn`: its own name for torch.nn.functional is `nn.functional`.
    assert "        return nn.functional.logsigmoid(z) + nn.functional.logsigmoid(-(z + 1)) + weights\n" in fixed
