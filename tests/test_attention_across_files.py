"""GL101 on attention written in a helper of another file than the model's: rewritten in that file when it is
the project's (and proven), said why not when it is outside the project. The real command, on a two-file project
in a temporary folder."""

from __future__ import annotations

import json

import pytest

from conftest import run_graphlint, write

PYPROJECT = '[project]\nname = "user-project"\nversion = "0"\n'

HELPER = '''
    import math

    import torch.nn.functional as F


    def attend(q, k, v):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        probs = F.softmax(scores, dim=-1)
        return probs @ v
'''

MODEL = '''
    import torch
    from torch import nn

    from {module} import attend


    class Attention(nn.Module):
        def __init__(self, dim=16):
            super().__init__()
            self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)

        def forward(self, x):
            return attend(self.q(x), self.k(x), self.v(x))


    def make():
        return Attention(), (torch.randn(2, 6, 16),)
'''


@pytest.mark.proof
@pytest.mark.cli
def test_attention_in_a_helper_of_another_file_of_the_project_is_rewritten_there(tmp_path):
    write(tmp_path, "pyproject.toml", PYPROJECT)
    write(tmp_path, "pkg/__init__.py", "")
    ops = write(tmp_path, "pkg/ops.py", HELPER)
    model = write(tmp_path, "pkg/model.py", MODEL.format(module=".ops"))
    before = model.read_text(encoding="utf-8")
    fixed = run_graphlint("check", "--select", "GL101", "--fix", "pkg/model.py:make", cwd=tmp_path)
    assert "fixed 1 finding in 1 file" in fixed.stderr, fixed.stdout + fixed.stderr
    rewritten = ops.read_text(encoding="utf-8")
    assert "    return F.scaled_dot_product_attention(q, k, v)\n" in rewritten and "softmax" not in rewritten
    assert model.read_text(encoding="utf-8") == before  # the caller stays as it is
    again = run_graphlint("check", "--select", "GL101", "pkg/model.py:make", cwd=tmp_path)
    assert again.returncode == 0 and "GL101" not in again.stdout, again.stdout


@pytest.mark.cli
def test_attention_in_a_helper_outside_the_project_is_left_alone_with_the_reason(tmp_path):
    project = tmp_path / "app"
    write(project, "pyproject.toml", PYPROJECT + '\n[tool.graphlint]\npythonpath = ["../shared"]\n')
    write(tmp_path, "shared/ops.py", HELPER)
    write(project, "model.py", MODEL.format(module="ops"))
    result = run_graphlint("check", "--select", "GL101", "--format", "json", "model.py:make", cwd=project)
    [finding] = json.loads(result.stdout)["findings"]
    assert finding["location"]["path"] == "model.py" and finding["fix"] is None
    assert finding["no_fix"] == ("`attend` runs the attention in a file outside the project; graphlint rewrites "
                                 "only the project's own files")
