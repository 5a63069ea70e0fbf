"""A model with every kind of problem at once: each is reported, at its line, in text and in SARIF."""

from __future__ import annotations

import json

from conftest import line_of, lint_file, run_graphlint, validate_sarif, write
from graphlint.rule import Example

MESSY = Example(source='''
    import torch
    import torch.nn.functional as F
    from torch import nn


    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(16, 48)
            self.mlp = nn.Sequential(nn.Linear(16, 16), nn.Sigmoid(), nn.Dropout(0.1, inplace=True))  # expect: GL201

        def forward(self, x, mask):
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            scores = q @ k.transpose(-2, -1) + mask.to(x.dtype)  # expect: GL102
            x = x + F.softmax(scores, dim=-1) @ v  # expect: GL101
            return x + self.mlp(x)


    class Messy(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(8, 16)
            self.layers = nn.ModuleList(Layer() for _ in range(3))
            self.probe = nn.Linear(16, 1)
            self.unused = nn.Linear(16, 16)  # expect: GL203

        def forward(self, x, mask):
            x = self.embed(x).detach()  # expect: GL202
            for layer in self.layers:
                x = layer(x, mask)
            return x + torch.tensor(self.probe(x).mean().item())  # expect: GL202


    def make():
        return Messy(), (torch.randn(2, 6, 8), torch.ones(6, 6, dtype=torch.bool))
''')

RULES = ("GL101", "GL102", "GL201", "GL202", "GL203")


def expected() -> set[tuple[str, int]]:
    return {(rule, line) for rule in RULES for line in MESSY.expected_lines(rule)}


def test_every_problem_is_reported_at_its_line(tmp_path):
    report = lint_file(write(tmp_path, "messy.py", MESSY.code))
    assert report.errors == []
    assert {(f.rule_id, f.location.line) for f in report.findings} == expected()
    by_rule = {f.rule_id: f for f in report.findings}
    assert by_rule["GL101"].occurrences == by_rule["GL102"].occurrences == by_rule["GL201"].occurrences == 3
    assert all(f.related for f in report.findings if f.rule_id in ("GL101", "GL201"))


def test_the_command_reports_them_all_in_text_and_sarif(project_dir):
    path = write(project_dir, "messy.py", MESSY.code)
    text = run_graphlint("check", "messy.py:make", cwd=project_dir)
    assert text.returncode == 1, text.stderr
    lines = text.stdout.splitlines()
    reported = {(line.split(" ")[1], int(line.split(":")[1])) for line in lines[:-1]}
    # The command runs the torch.compile rules too (on by default): the `.item()` ends dynamo's graph.
    graph_break = ("GL301", line_of(path, ".item()"))
    assert reported == expected() | {graph_break}
    fixable = "[*] 2 with a fix (graphlint check --fix proves and applies it)"  # the inplace Dropout, the attention
    assert lines[-1] == f"Found {len(expected()) + 1} findings in 1 target; {fixable}."

    sarif = run_graphlint("check", "messy.py:make", "--format", "sarif", cwd=project_dir)
    log = json.loads(sarif.stdout)
    validate_sarif(log)
    results = log["runs"][0]["results"]
    assert {(r["ruleId"], r["locations"][0]["physicalLocation"]["region"]["startLine"]) for r in results} == \
        expected() | {graph_break}
    levels = {r["ruleId"]: r["level"] for r in results}
    assert levels == {"GL101": "warning", "GL102": "warning", "GL201": "error", "GL202": "error", "GL203": "note",
                      "GL301": "warning"}
    inplace = next(r for r in results if r["ruleId"] == "GL201")
    assert inplace["relatedLocations"][0]["message"]["text"] == "sigmoid saved its output for backward"
