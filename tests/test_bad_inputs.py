"""Every kind of bad input gets one clear line, exit code 2, and the other targets are still linted and reported.

The targets below run together in one real `graphlint check`, with a target that has a finding among them,
so each case also checks that the others survive it.
"""

from __future__ import annotations

import json
import re
import os
import sys
import textwrap

import pytest

from conftest import WITHOUT_COMPILE, line_of, run_graphlint, validate_sarif, write
from test_cli import ATTENTION

MODEL = "import torch\nfrom torch import nn\n\n\n"
FILES = {
    "good.py": ATTENTION,
    "raises.py": "def make():\n    raise ValueError('no weights here')\n",
    "library_raises.py": "import libcst\n\n\ndef make():\n    return libcst.parse_expression('1 +')\n",
    "broken.py": "def make(:\n    pass\n",
    "missing_dependency.py": "import not_a_real_package_xyz\n\n\ndef make():\n    pass\n",
    "constant.py": "make = 3\n",
    "not_a_module.py": "def make():\n    return 'a model', ()\n",
    "args_not_tuple.py": MODEL + "def make():\n    return nn.Linear(2, 2), torch.ones(2)\n",
    "returns_list.py": MODEL + "def make():\n    return [nn.Linear(2, 2)]\n",
    "forward_raises.py": MODEL + "def make():\n    return nn.Linear(8, 4), (torch.randn(2, 4),)\n",
    "loss_not_scalar.py": MODEL + "import graphlint\n\n\ndef make():\n"
                          "    return graphlint.Target(nn.Linear(4, 4), (torch.randn(2, 4),), loss=lambda out: out)\n",
}

# target -> what its one error line must say
ERRORS = {
    "missing.py:make": "missing.py:make: file missing.py does not exist; check the path before ':'",
    "good.py": "good.py: target 'good.py' has no ':NAME'; write path/to/file.py:NAME or package.module:NAME",
    "broken.py:make": "broken.py:make: cannot import broken.py: syntax error at broken.py:1:",
    "missing_dependency.py:make": "missing_dependency.py:make: cannot import missing_dependency.py: No module named "
                                  "'not_a_real_package_xyz'; graphlint imported it from its folder .; if "
                                  "not_a_real_package_xyz is this project's code, add the folder that holds it with "
                                  "pythonpath = [\"DIR\"] in [tool.graphlint] of pyproject.toml (or --pythonpath DIR), "
                                  "else install it in this environment",
    "good.py:nothing": "good.py:nothing: good.py has no 'nothing'; define a function nothing() that returns (model, args)",
    "constant.py:make": "constant.py:make: constant.py: 'make' is an int, not a function; make it a function",
    "raises.py:make": "raises.py:make: the factory raised ValueError: no weights here (at raises.py:2)",
    # Raised inside an installed library: the project's line that called it first, then the library's.
    "library_raises.py:make": "library_raises.py:make: the factory raised ParserSyntaxError: Syntax Error @ 1:1. "
                              "(at library_raises.py:5, in ",
    "not_a_module.py:make": "not_a_module.py:make: the factory's model is a str, not a torch.nn.Module",
    "args_not_tuple.py:make": "args_not_tuple.py:make: the factory's args is a Tensor, not a tuple "
                              "(write (x,) for a single input)",
    "returns_list.py:make": "returns_list.py:make: the factory returned a list; return (model, args), "
                            "(model, args, kwargs) or graphlint.Target(model, args, kwargs, loss)",
    "forward_raises.py:make": "forward_raises.py:make: the forward raised RuntimeError: mat1 and mat2 shapes cannot "
                              "be multiplied (2x4 and 8x4)",
    "loss_not_scalar.py:make": "loss_not_scalar.py:make: the target's loss function returned a tensor of shape "
                               "(2, 4); return a scalar (reduce it with .mean() or .sum())",
}


@pytest.fixture(scope="module")
def bad_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bad-inputs")
    write(folder, "pyproject.toml", '[project]\nname = "p"\nversion = "0"\n')
    for name, source in FILES.items():
        write(folder, name, source)
    targets = ["good.py:make", *ERRORS]
    # One run writes the three reports: text on stdout, SARIF and JSON in files (--report), as CI would.
    text = run_graphlint("check", *targets, "--no-cache", "--report", "sarif=out.sarif", "--report", "json=out.json",
                         cwd=folder)
    return folder, text


@pytest.mark.parametrize("target", ERRORS, ids=ERRORS)
def test_a_bad_target_is_one_clear_line_and_the_others_still_run(bad_run, target):
    folder, text = bad_run
    assert text.returncode == 2
    lines = [line for line in text.stderr.splitlines() if line.startswith(f"graphlint: error: {target}: ")]
    assert len(lines) == 1, text.stderr
    assert lines[0].startswith(f"graphlint: error: {ERRORS[target]}")
    assert "Traceback" not in text.stderr
    # Still reported: the attention (GL101) and, with the torch.compile rules on by default, its print (GL301).
    assert [line.split(" ", 2)[:2] for line in text.stdout.splitlines()[:-1]] == [
        [f"good.py:{line_of(folder / 'good.py', 'print(')}:9:", "GL301"],
        [f"good.py:{line_of(folder / 'good.py', 'torch.softmax')}:16:", "GL101"]]
    assert text.stdout.splitlines()[-1] == (f"Found 2 findings in {len(ERRORS) + 1} targets; "
                                            f"{len(ERRORS)} targets could not be linted; [*] 1 with a fix "
                                            "(graphlint check --fix proves and applies it).")


def test_sarif_is_still_written_valid_with_every_failure_recorded(bad_run):
    folder, text = bad_run
    assert text.returncode == 2
    log = json.loads((folder / "out.sarif").read_text())
    validate_sarif(log)
    invocation = log["runs"][0]["invocations"][0]
    assert invocation["executionSuccessful"] is False
    errors = [n["message"]["text"] for n in invocation["toolExecutionNotifications"] if n["level"] == "error"]
    assert [e.split(":", 1)[0] for e in errors] == [t.split(":", 1)[0] for t in ERRORS]
    assert [r["ruleId"] for r in log["runs"][0]["results"]] == ["GL301", "GL101"]


def test_json_is_still_written_with_every_failure_recorded(bad_run):
    folder, text = bad_run
    assert text.returncode == 2
    report = json.loads((folder / "out.json").read_text())
    assert [e["target"] for e in report["errors"]] == list(ERRORS)
    assert [f["rule"] for f in report["findings"]] == ["GL301", "GL101"]
    assert report["summary"]["failed_targets"] == len(ERRORS)


SURVIVABLE = {
    "a backward that raises": ('''
        class Explodes(torch.autograd.Function):
            @staticmethod
            def forward(ctx, t):
                return t * 1

            @staticmethod
            def backward(ctx, grad):
                raise RuntimeError("custom backward is broken")


        def make():
            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(4, 4)

                def forward(self, x):
                    return Explodes.apply(self.fc(x))

            return Net(), (torch.randn(2, 4),)
    ''', "backward raised RuntimeError: custom backward is broken; rules ran on what was captured"),
    "a model without parameters": ('''
        def make():
            return nn.Softmax(dim=-1), (torch.randn(2, 4),)
    ''', "the output has no floating-point tensor that requires grad, so no backward pass was captured"),
    "an integer output": ('''
        class Counts(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 4)

            def forward(self, x):
                return int(self.fc(x).argmax())  # graphlint: ignore[GL103] (a Python number on purpose)


        def make():
            return Counts(), (torch.randn(2, 4),)
    ''', "the output has no floating-point tensor that requires grad"),
    "an output without floating-point tensors": ('''
        class Labels(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 4)

            def forward(self, x):
                return self.fc(x).argmax(-1)


        def make():
            return Labels(), (torch.randn(2, 4),)
    ''', "the output has no floating-point tensor that requires grad"),
}

OUTPUTS = {
    "a dict": "return {'logits': h, 'hidden': [h * 2]}",
    "a tuple": "return h, (h.sum(), torch.zeros(2, dtype=torch.long))",
    "a dataclass": "return Output(h, 3)",
    "a transformers ModelOutput": "return BaseModelOutput(last_hidden_state=h, hidden_states=(h,))",
}


def test_inputs_that_can_still_be_linted_are_linted_with_a_note(project_dir):
    # One run of the command over every case, each in a file of its own: the notes are per target.
    files = [f"model_{number}.py" for number in range(len(SURVIVABLE))]
    for file, (source, _note) in zip(files, SURVIVABLE.values(), strict=True):
        write(project_dir, file, MODEL + textwrap.dedent(source))
    result = run_graphlint("check", *(f"{file}:make" for file in files), "--no-cache", cwd=project_dir)
    # The only findings are torch.compile's (on by default), as plain dynamo sees these models: the exception the
    # custom backward raises ends its graph, and so does int() of a tensor.
    assert result.returncode == 1, result.stderr
    assert [line.split(" ")[1] for line in result.stdout.splitlines()[:-1]] == ["GL301", "GL301"], result.stdout
    assert {line.split(":")[0] for line in result.stdout.splitlines()[:-1]} == {files[0], files[2]}
    for file, (case, (_source, note)) in zip(files, SURVIVABLE.items(), strict=True):
        assert f"graphlint: note: {file}:make: {note}" in result.stderr, case
    assert "Traceback" not in result.stderr


@pytest.mark.transformers
@pytest.mark.parametrize("output", OUTPUTS.values(), ids=OUTPUTS.keys())
def test_structured_outputs_are_differentiated(tmp_path, output):
    from conftest import lint_file

    path = write(tmp_path, "model.py", MODEL + f'''
from dataclasses import dataclass

from transformers.modeling_outputs import BaseModelOutput


@dataclass
class Output:
    logits: torch.Tensor
    extra: int


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.unused = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        {output}


def make():
    return Net(), (torch.randn(2, 4),)
''')
    report = lint_file(path)
    assert report.errors == [] and report.results[0].notes == []
    # the backward reached fc through the output, and found the unused layer
    assert [f.rule_id for f in report.findings] == ["GL203"] and "unused.weight" in report.findings[0].message


def test_a_forward_that_never_returns_is_stopped_by_the_timeout(project_dir):
    write(project_dir, "good.py", ATTENTION)
    # The forward sleeps between its ops, so that the hang does not take a core from the tests beside it.
    write(project_dir, "hangs.py", MODEL + "class Hangs(nn.Module):\n    def forward(self, x):\n        while True:\n"
                                           "            x = x + 0\n            __import__('time').sleep(0.05)\n\n\n"
                                           "def make():\n    return Hangs(), (torch.ones(2),)\n")
    # --timeout bounds every target: the good one leaves out the torch.compile analysis (GL3), which is not what this
    # test is about and alone can take longer than the bound on a loaded machine
    result = run_graphlint("check", "hangs.py:make", "good.py:make", "--timeout", "5", "--ignore", "GL3", "--no-cache",
                           cwd=project_dir)
    assert result.returncode == 2
    assert "graphlint: error: hangs.py:make: did not finish within 5 s (--timeout)" in result.stderr
    assert result.stdout.startswith("good.py:")
    assert "Traceback" not in result.stderr


def test_a_source_file_that_is_not_utf8_is_located_in_its_own_encoding(tmp_path):
    from conftest import lint_file
    from graphlint.report.sarif import render_sarif

    source = ("# -*- coding: latin-1 -*-\n" + ATTENTION.lstrip()).replace(
        "        return torch.softmax(", "        café = 'déjà vu'; return torch.softmax(")
    path = tmp_path / "latin.py"
    path.write_bytes(source.encode("latin-1"))
    report = lint_file(path)
    [finding] = report.findings
    line = path.read_bytes().decode("latin-1").splitlines()[finding.location.line - 1]
    assert line[finding.location.column - 1 : finding.location.end_column - 1].startswith("torch.softmax(")
    validate_sarif(json.loads(render_sarif(report)))


def test_a_file_changed_on_disk_after_import_still_gets_spans_inside_it(tmp_path):
    from conftest import lint_file

    path = write(tmp_path, "shrinks.py", ATTENTION.replace(
        "def make():\n", "def make():\n    import pathlib\n    pathlib.Path(__file__).write_text('x = 1\\n')\n"))
    report = lint_file(path)
    [finding] = report.findings
    assert path.read_text() == "x = 1\n"
    assert (finding.location.line, finding.location.end_line) == (1, 1)
    assert 1 <= finding.location.column <= finding.location.end_column <= len("x = 1") + 1


def test_a_target_under_a_symlinked_folder_is_linted(project_dir):
    real = project_dir / "real-models"
    write(real, "model.py", ATTENTION)
    os.symlink(real, project_dir / "models", target_is_directory=True)
    result = run_graphlint("check", *WITHOUT_COMPILE, "models/model.py:make", "--no-cache", cwd=project_dir)
    assert result.returncode == 1, result.stderr
    assert "GL101" in result.stdout and "model.py:" in result.stdout


def test_an_error_inside_a_library_is_placed_at_the_projects_call_into_it(tmp_path, monkeypatch):
    """Where a failure is shown (the editor's diagnostic, the error's location) is the project's own line that
    called the library, not the library's file, which the user cannot change."""
    import importlib

    from graphlint.errors import raised_at, raised_where
    from graphlint.results import TargetError
    from graphlint.server.diagnostics import error_place

    path = write(tmp_path, "library_raises.py", FILES["library_raises.py"])
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("library_raises")
    with pytest.raises(Exception) as raised:
        module.make()
    assert raised_where(raised.value) == (str(path), 5)
    assert re.fullmatch(r" \(at \S*library_raises\.py:5, in \S*/libcst/\S+\.py:\d+\)", raised_at(raised.value))
    error = TargetError("library_raises.py:make", "the factory raised", *raised_where(raised.value))
    assert error_place(error, str(path)) == (str(path), 5)
    sys.modules.pop("library_raises", None)
