"""`graphlint check --fix`, `--diff` and `--unsafe-fixes`: fixes are proven on the model before they are
written, files are never damaged, and a wrong rewrite is refused."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from conftest import WITHOUT_COMPILE, findings_of, fix_plan, lint_file, run_graphlint, validate_sarif, write
from graphlint.fix.prove import rewritten_files
from graphlint.report.sarif import render_sarif
from graphlint.results import Edit, Fix, from_wire, to_wire

GATE = '''
import torch
from torch import nn


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)
        # the activation stack (comment kept)
        self.act = nn.Sequential(nn.Sigmoid(), nn.ReLU(inplace=True))

    def forward(self, x):
        gate = torch.sigmoid(self.proj(x))
        gate *= 2   # scale the gate
        probs = torch.softmax(self.proj(x), dim=-1)
        probs.data[:, 0] = 0
        return self.act(gate * probs)


def make():
    return Gate(), (torch.randn(4, 16),)
'''

FIXED_GATE = GATE.replace("nn.ReLU(inplace=True)", "nn.ReLU()").replace("gate *= 2", "gate = gate * 2")

HELPER = '''
def unused():
    return 1
'''

# The rewrite of `h.mul_(2)` to `h = h.mul(2)` runs, but the list no longer holds the written tensor: a different
# model, which only the proof sees (the fixer reads names bound to the tensor, not containers).
ALIASED = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        h = torch.sigmoid(self.proj(x))
        kept = [h]
        h.mul_(2)
        return kept[0] + h


def make():
    return Net(), (torch.randn(3, 8),)
'''

ATTENTION = '''
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x, mask):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-2, -1) / 4.0
        scores = scores.masked_fill(mask, float("-inf"))
        return scores.softmax(-1) @ v


def make():
    mask = torch.triu(torch.ones(8, 8, dtype=torch.bool), diagonal=1)
    return Attention(), (torch.randn(2, 8, 16), mask)
'''


def _project(tmp_path, **files):
    write(tmp_path, "pyproject.toml", '[project]\nname = "user-project"\nversion = "0"\n')
    return {name: write(tmp_path, f"{name}.py", source) for name, source in files.items()}


def _stamp(path):
    return path.read_bytes(), os.stat(path).st_mtime_ns


@pytest.mark.proof
@pytest.mark.cli
def test_diff_prints_the_proven_fixes_and_writes_nothing(tmp_path):
    files = _project(tmp_path, model=GATE)
    before = _stamp(files["model"])
    result = run_graphlint("check", *WITHOUT_COMPILE, "--diff", "model.py:make", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "-        self.act = nn.Sequential(nn.Sigmoid(), nn.ReLU(inplace=True))" in result.stdout
    assert "+        self.act = nn.Sequential(nn.Sigmoid(), nn.ReLU())" in result.stdout
    assert "+        gate = gate * 2   # scale the gate" in result.stdout
    assert "probs.data[:, 0]" not in result.stdout.replace(" probs.data[:, 0] = 0\n", "")  # context only, never changed
    assert _stamp(files["model"]) == before


@pytest.mark.proof
@pytest.mark.cli
def test_a_fix_is_proven_when_the_program_running_graphlint_lies_inside_the_project(tmp_path):
    # A virtual environment made in the checkout (`python -m venv .venv`) runs graphlint as .venv/bin/graphlint,
    # a script inside the project: it is the process's __main__, not a file the model imports.
    files = _project(tmp_path, model=GATE)
    launcher = write(tmp_path, ".venv/bin/graphlint", "import sys\nfrom graphlint.cli import main\nsys.exit(main())\n")
    result = subprocess.run([sys.executable, str(launcher), "check", "--diff", "model.py:make"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert result.returncode == 1, result.stderr
    assert "imported the original" not in result.stderr
    assert "+        self.act = nn.Sequential(nn.Sigmoid(), nn.ReLU())" in result.stdout
    assert files["model"].read_text(encoding="utf-8").count("inplace=True") == 1  # --diff writes nothing


@pytest.mark.proof
@pytest.mark.cli
def test_fix_writes_proven_fixes_keeps_the_rest_and_a_second_run_changes_nothing(tmp_path):
    files = _project(tmp_path, model="import helper\n" + GATE, helper=HELPER)  # an imported file with no fixes
    expected = files["model"].read_text(encoding="utf-8").replace(GATE.strip(), FIXED_GATE.strip())
    helper_before = _stamp(files["helper"])
    result = run_graphlint("check", *WITHOUT_COMPILE, "--fix", "model.py:make", cwd=tmp_path)
    assert files["model"].read_text(encoding="utf-8") == expected
    # What is left is reported: the write through .data, which autograd does not see (no fix keeps the gradients).
    assert result.returncode == 1
    assert [line.split(": ")[1].split()[0] for line in result.stdout.splitlines()[:-1]] == ["GL201"]
    assert ":18:" in result.stdout and "[*]" not in result.stdout
    assert "fixed 2 findings in 1 file" in result.stderr
    assert _stamp(files["helper"]) == helper_before
    fixed = _stamp(files["model"])
    again = run_graphlint("check", *WITHOUT_COMPILE, "--fix", "model.py:make", cwd=tmp_path)
    assert "fixed 0 findings in 0 files" in again.stderr
    assert _stamp(files["model"]) == fixed


@pytest.mark.proof
@pytest.mark.cli
def test_a_fix_that_changes_what_the_model_computes_is_never_written_even_when_unsafe(tmp_path):
    """A fix whose proof found different outputs is known to be wrong: neither flag writes it."""
    files = _project(tmp_path, model=ALIASED)
    before = _stamp(files["model"])
    for flags in ((), ("--unsafe-fixes",)):
        refused = run_graphlint("check", *WITHOUT_COMPILE, "--fix", *flags, "model.py:make", cwd=tmp_path)
        assert "GL201 fix not applied, even with --unsafe-fixes: output 0 differs" in refused.stderr, refused.stderr
        assert "applied anyway" not in refused.stderr
        assert _stamp(files["model"]) == before
        assert refused.returncode == 1


@pytest.mark.proof
@pytest.mark.cli
def test_suppressed_findings_are_not_fixed(tmp_path):
    source = GATE.replace("gate *= 2   # scale the gate", "gate *= 2  # graphlint: ignore[GL201]")
    _project(tmp_path, model=source)
    result = run_graphlint("check", *WITHOUT_COMPILE, "--diff", "model.py:make", cwd=tmp_path)
    assert "gate *= 2" not in result.stdout.replace("-        gate", "")
    assert "nn.ReLU()" in result.stdout


def _with_fix(report, text):
    """The GL101 finding with a rewrite of its masked_fill line into SDPA spelled by the test."""
    finding = findings_of(report, "GL101")[0]
    path = finding.location.path
    lines = open(path, encoding="utf-8").read().splitlines()
    first = next(i for i, line in enumerate(lines, 1) if "scores = q @ k" in line)
    last = next(i for i, line in enumerate(lines, 1) if "return scores.softmax" in line)
    edit = Edit(path, first, 9, last, len(lines[last - 1]) + 1, text)
    fixed = dataclasses.replace(finding, fix=Fix("to SDPA", (edit,)))
    report.merged = [fixed if f is finding else f for f in report.all_findings]
    return fixed


@pytest.mark.proof
@pytest.mark.parametrize("mask, proven", [("~mask", True), ("mask", False)], ids=["exact", "flipped-mask"])
def test_the_proof_accepts_an_exact_sdpa_rewrite_and_refuses_a_flipped_mask(tmp_path, mask, proven):
    """SDPA's boolean mask means "keep": `masked_fill(mask, -inf)` is `attn_mask=~mask`, and passing `mask`
    as is runs, but attends to exactly the other positions."""
    files = _project(tmp_path, model=ATTENTION)
    report = lint_file(files["model"], device="cpu")
    finding = _with_fix(report, "return torch.nn.functional.scaled_dot_product_attention("
                                f"q, k, v, attn_mask={mask}, scale=1 / 4.0)")
    plan = fix_plan(report, tmp_path)
    assert (finding in plan.applied) is proven
    if not proven:
        [(refused, reason)] = plan.refused
        assert refused == finding and reason.startswith("output 0 differs by up to ")


@pytest.mark.proof
@pytest.mark.parametrize("call, runs", [("attn_mask=mask, scale=1 / 4.0", True),
                                        ("attn_mask=mask, scale=1 / 4.0, no_such_argument=1", False)],
                         ids=["differs", "fails"])
def test_a_declared_unsafe_fix_is_proven_too_and_never_written_when_its_model_fails(tmp_path, call, runs):
    """--unsafe-fixes never writes an unsafe fix whose proof found different outputs (known to be wrong), nor one
    whose rewritten model fails to run; both are proven first, so the reason says which."""
    files = _project(tmp_path, model=ATTENTION)
    report = lint_file(files["model"], device="cpu")
    finding = _with_fix(report, f"return torch.nn.functional.scaled_dot_product_attention(q, k, v, {call})")
    finding = dataclasses.replace(finding, fix=dataclasses.replace(finding.fix, applicability="unsafe"))
    report.merged = [finding if f.rule_id == "GL101" else f for f in report.all_findings]
    plan = fix_plan(report, tmp_path, unsafe=True)
    [(refused, reason)] = plan.refused
    assert refused == finding and reason.startswith("declared unsafe: to SDPA; on the model: ")
    if runs:
        assert "output 0 differs by up to " in reason
        assert plan.applied == [] and plan.broken == [finding] and plan.texts == {}
    else:
        assert "the rewritten model fails: TypeError" in reason, reason
        assert plan.applied == [] and plan.broken == [finding] and plan.texts == {}


def test_fixes_survive_the_result_cache_and_the_worker_wire_format(tmp_path):
    files = _project(tmp_path, model=GATE)
    [result] = lint_file(files["model"]).results
    again = from_wire(json.loads(json.dumps(to_wire(result))))
    assert [f.fix for f in again.findings] == [f.fix for f in result.findings]
    assert sum(f.fix is not None for f in again.findings) == 2


def test_a_file_that_would_not_compile_is_never_written(tmp_path):
    path = write(tmp_path, "model.py", "x = 1\ny = 2\n")
    assert rewritten_files([Edit(str(path), 1, 1, 1, 6, "x = (")]).startswith("the rewritten file would not compile")
    assert rewritten_files([Edit(str(path), 1, 5, 1, 6, "3"), Edit(str(path), 2, 5, 2, 6, "4")]) == {
        str(path): "x = 3\ny = 4\n"}


def test_sarif_carries_the_fixes_and_stays_valid(tmp_path):
    # A character outside the BMP before the edit: SARIF columns count it as two UTF-16 code units.
    files = _project(tmp_path, model=GATE.replace("self.act =", 'self.tag = "😀"; self.act ='))
    report = lint_file(files["model"])
    assert [e.column for f in report.findings if f.fix for e in f.fix.edits][0] == 64  # code points
    log = json.loads(render_sarif(report))
    validate_sarif(log)
    fixes = [r["fixes"][0] for r in log["runs"][0]["results"] if "fixes" in r]
    assert len(fixes) == 2
    change = fixes[0]["artifactChanges"][0]
    assert change["artifactLocation"]["uri"] == "model.py"
    replacement = change["replacements"][0]
    assert replacement["insertedContent"]["text"] == "nn.ReLU()"
    assert replacement["deletedRegion"] == {"startLine": 10, "startColumn": 65, "endLine": 10, "endColumn": 86}
