"""The real `graphlint` command in a subprocess, on real files: output, exit codes and bad input."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from conftest import WITHOUT_COMPILE, REPO, line_of, run_graphlint, validate_sarif, write

pytestmark = pytest.mark.cli  # CI runs these against the installed wheel too

EXAMPLE = REPO / "examples" / "attention" / "model.py"
CLEAN = '''
import torch
from torch import nn


def make():
    return nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 2)), (torch.randn(4, 8),)
'''
ATTENTION = '''
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x):
        print("the forward prints to stdout")
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v


def make():
    return Attention(), (torch.randn(2, 8, 16),)
'''

FIXABLE = "[*] 1 with a fix (graphlint check --fix proves and applies it)"


def test_the_shipped_example_reports_gl101_at_the_softmax_line():
    result = run_graphlint("check", "examples/attention/model.py:make_model", cwd=REPO)
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    softmax_line = line_of(EXAMPLE, "F.softmax(scores")
    assert re.fullmatch(rf"examples/attention/model\.py:{softmax_line}:\d+: GL101 Hand-written softmax attention .*"
                        r"blocks\.0\.attn … blocks\.3\.attn \(4 occurrences\).*", lines[0])
    assert lines[-1] == f"Found 1 finding in 1 target; {FIXABLE}."  # the SDPA rewrite
    assert "Traceback" not in result.stderr


@pytest.mark.proof
def test_the_shipped_example_fix_is_proven_from_the_checkout():
    # From a checkout graphlint's own package lies inside the project being linted; the proof must not count it
    # as an original file the rewritten copy imported.
    before = EXAMPLE.read_bytes()
    result = run_graphlint("check", "--diff", "examples/attention/model.py:make_model", cwd=REPO)
    assert result.returncode == 1, result.stderr
    assert "fix not applied" not in result.stderr
    assert result.stderr.strip().endswith("graphlint: 1 fix would be applied")
    assert "scaled_dot_product_attention(" in result.stdout
    assert EXAMPLE.read_bytes() == before


def test_the_console_script_and_python_m_are_the_same_command():
    script = Path(sys.executable).parent / "graphlint"
    import subprocess

    via_script = subprocess.run([str(script), "--version"], capture_output=True, text=True)
    via_module = run_graphlint("--version", cwd=REPO)
    assert via_script.returncode == via_module.returncode == 0
    assert via_script.stdout == via_module.stdout and via_module.stdout.startswith("graphlint ")


def test_the_command_runs_the_graphlint_under_test():
    """CI runs these tests a second time against the installed wheel (GRAPHLINT_INSTALLED=1); then the command
    must import that install, never the source tree beside it."""
    import os
    import subprocess

    probe = "import graphlint, graphlint.rules; print(graphlint.__file__); print(graphlint.rules.__file__)"
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    package, rules = (Path(line) for line in result.stdout.splitlines())
    if os.environ.get("GRAPHLINT_INSTALLED"):
        assert "site-packages" in package.parts and package != REPO / "graphlint" / "__init__.py"
        assert package.parent == rules.parent.parent  # graphlint/rules/ inside the installed package
    else:
        assert package == REPO / "graphlint" / "__init__.py" and rules == REPO / "rules" / "__init__.py"


def test_a_clean_model_exits_zero(project_dir):
    write(project_dir, "clean.py", CLEAN)
    result = run_graphlint("check", "clean.py:make", cwd=project_dir)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "No findings in 1 target.\n"


def test_bad_targets_are_one_line_each_and_the_good_target_is_still_reported_in_sarif_on_stdout(project_dir):
    write(project_dir, "model.py", ATTENTION)
    write(project_dir, "raises.py", "def make():\n    raise ValueError('no weights here')\n")
    write(project_dir, "broken.py", "def make(:\n    pass\n")
    write(project_dir, "shape.py", "import torch\n\n\ndef make():\n    return torch.nn.Linear(2, 2), torch.ones(2)\n")
    targets = ["model.py:make", "missing.py:make", "model.py", "raises.py:make", "broken.py:make",
               "model.py:nothing", "shape.py:make"]
    # SARIF on stdout and, from the same run, in a file (--report); the good target's forward prints, and stdout
    # stays SARIF all the same.
    result = run_graphlint("check", *targets, "--format", "sarif", "--report", "sarif=out.sarif", cwd=project_dir)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "the forward prints to stdout" in result.stderr
    assert json.loads(result.stdout) == json.loads((project_dir / "out.sarif").read_text())
    errors = [line for line in result.stderr.splitlines() if line.startswith("graphlint: error: ")]
    assert len(errors) == 6
    expected = {
        "missing.py:make": "does not exist",
        "model.py:": "has no ':NAME'",
        "raises.py:make": "the factory raised ValueError: no weights here (at raises.py:2)",
        "broken.py:make": "syntax error at",
        "model.py:nothing": "has no 'nothing'",
        "shape.py:make": "args is a Tensor, not a tuple (write (x,) for a single input)",
    }
    for target, text in expected.items():
        assert any(target in line and text in line for line in errors), (target, errors)
    log = json.loads((project_dir / "out.sarif").read_text())
    validate_sarif(log)
    # The attention (GL101) and, with the torch.compile rules on by default, the forward's print (GL301).
    assert [r["ruleId"] for r in log["runs"][0]["results"]] == ["GL301", "GL101"]
    invocation = log["runs"][0]["invocations"][0]
    assert invocation["executionSuccessful"] is False
    assert len([n for n in invocation["toolExecutionNotifications"] if n["level"] == "error"]) == 6


def test_targets_come_from_pyproject_also_from_a_subfolder(tmp_path):
    write(tmp_path, "pyproject.toml", '[tool.graphlint]\ntargets = ["models/model.py:make", "models/clean.py:make"]\n')
    write(tmp_path, "models/model.py", ATTENTION)
    write(tmp_path, "models/clean.py", CLEAN)
    (tmp_path / "docs").mkdir()
    result = run_graphlint("check", cwd=tmp_path / "docs")
    assert result.returncode == 1, result.stderr
    assert result.stdout.splitlines()[-1] == f"Found 2 findings in 2 targets; {FIXABLE}."  # GL101, and GL301's print
    assert all("models/model.py:" in line for line in result.stdout.splitlines()[:-1])


def test_a_target_file_can_import_its_siblings_and_a_module_target_works(project_dir):
    write(project_dir, "pkg/__init__.py", "")
    write(project_dir, "pkg/layers.py", ATTENTION.replace("def make():", "def unused():"))
    write(project_dir, "pkg/entry.py", "import torch\nfrom layers import Attention\n\n\n"
                                       "def make():\n    return Attention(), (torch.randn(2, 8, 16),)\n")
    write(project_dir, "pkg/factories.py", "import torch\nfrom pkg.layers import Attention\n\n\n"
                                           "def make():\n    return Attention(), (torch.randn(2, 8, 16),)\n")
    # Both in one run: an error of either would be a line on stderr and exit 2; each one's findings are the sibling's.
    result = run_graphlint("check", *WITHOUT_COMPILE, "pkg/entry.py:make", "pkg.factories:make", "--format", "json",
                           cwd=project_dir)
    assert result.returncode == 1, result.stderr
    findings = json.loads(result.stdout)["findings"]
    for target in ("pkg/entry.py:make", "pkg.factories:make"):
        assert {f["location"]["path"] for f in findings if target in f["targets"]} == {"pkg/layers.py"}, findings


@pytest.mark.parametrize(
    ("pyproject", "message"),
    [
        ("[tool.graphlint\ntargets = 1\n", "invalid TOML"),
        ('[tool.graphlint]\ntarget = ["m.py:make"]\n', "unknown key tool.graphlint.target; the keys graphlint reads are"),
        ('[tool.graphlint]\ntargets = "m.py:make"\n', "targets must be a list of strings"),
        ('[tool.graphlint]\ndevice = "tpu"\n', "device must be one of auto, meta, cpu, cuda; got 'tpu'"),
    ],
)
def test_a_broken_pyproject_is_one_clear_line(tmp_path, pyproject, message):
    write(tmp_path, "pyproject.toml", pyproject)
    result = run_graphlint("check", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("graphlint: error: ") and "pyproject.toml" in line and message in line


def test_no_targets_anywhere_is_a_usage_error(project_dir):
    result = run_graphlint("check", cwd=project_dir)
    assert result.returncode == 2
    assert "no targets: pass TARGET" in result.stderr


def test_an_output_file_that_cannot_be_written_is_a_clear_error(project_dir):
    write(project_dir, "clean.py", CLEAN)
    result = run_graphlint("check", "clean.py:make", "--output", "no/such/folder/out.sarif", "--format", "sarif",
                           cwd=project_dir)
    assert result.returncode == 2
    assert "graphlint: error: cannot write no/such/folder/out.sarif" in result.stderr
    assert "Traceback" not in result.stderr


BRANCHY = '''
import torch
from torch import nn


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        if x.mean() > 0:
            return self.a(x)
        return x


def make():
    return Branchy(), (torch.ones(2, 4),)
'''


def test_a_cpu_rebuild_is_announced_as_a_note_and_the_branch_is_reported_once(project_dir):
    path = write(project_dir, "branchy.py", BRANCHY)
    result = run_graphlint("check", "branchy.py:make", cwd=project_dir)
    assert result.returncode == 1, result.stderr  # the branch stalls a GPU: GL103
    branch = line_of(path, "if x.mean() > 0")
    assert ("graphlint: note: branchy.py:make: captured on CPU because the forward needs real values "
            f"(a Python branch on a tensor value at branchy.py:{branch})") in result.stderr.splitlines()
    # Two consequences of the one branch: it stalls a GPU (GL103) and ends torch.compile's graph (GL301).
    stall, graph_break = [line for line in result.stdout.splitlines() if " GL" in line]
    assert stall.startswith(f"branchy.py:{branch}:") and " GL103 A Python branch on a tensor in " in stall
    assert graph_break.startswith(f"branchy.py:{branch}:") and ' GL301 ' in graph_break
    assert '"Data-dependent branching"' in graph_break


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_asking_for_cuda_without_cuda_is_a_clear_error(project_dir):
    write(project_dir, "clean.py", CLEAN)
    result = run_graphlint("check", "clean.py:make", "--device", "cuda", cwd=project_dir)
    assert result.returncode == 2
    assert result.stderr.strip() == ("graphlint: error: clean.py:make: --device cuda was asked for but CUDA is not "
                                     "available here; use --device cpu or meta")
