"""`# graphlint: ignore[...]` comments: where they apply, what they hide, and GL901 for the unused ones."""

from __future__ import annotations

import dataclasses
import json

import pytest

from conftest import WITHOUT_COMPILE, findings_of, line_of, lint_file, run_graphlint, validate_sarif, write
from graphlint.config import Config
from graphlint.policy import apply_policy
from graphlint.project import Project
from graphlint.results import Report, RuleInfo, TargetResult
from graphlint.tags import UNUSED_SUPPRESSION_TAG
from graphlint.rules.gl901_unused_suppression import UnusedSuppression

MODEL = '''
# {file_comment}
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.spare = nn.Linear(16, 16)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        {above}
        probs = torch.softmax(q @ k.transpose(-2, -1), dim=-1)  {trailing}
        return probs @ v


def make():
    return Attention(), (torch.randn(2, 8, 16),)
'''


def model(trailing: str = "", above: str = "pass", file_comment: str = "a model") -> str:
    return MODEL.replace("{trailing}", trailing).replace("{above}", above).replace("{file_comment}", file_comment)


SUPPRESSING = {
    "on the line": {"trailing": "# graphlint: ignore[GL101]"},
    "alone on the line above": {"above": "# graphlint: ignore[GL101]"},
    "among several codes": {"trailing": "# graphlint: ignore[GL203, GL101]"},
    "every rule": {"trailing": "# graphlint: ignore"},
    "after another tool's comment": {"trailing": "# type: ignore  # graphlint: ignore[GL101]"},
    "for the whole file": {"file_comment": "graphlint: ignore-file[GL101]"},
}

NOT_SUPPRESSING = {
    "another rule's code": {"trailing": "# graphlint: ignore[GL102]"},
    "inside a string": {"trailing": "; note = '# graphlint: ignore[GL101]'"},
    "two lines above": {"above": "# graphlint: ignore[GL101]\n        x = x"},
}


@pytest.mark.parametrize("settings", SUPPRESSING.values(), ids=SUPPRESSING.keys())
def test_a_suppression_hides_the_finding(settings, tmp_path):
    report = lint_file(write(tmp_path, "model.py", model(**settings)))
    assert findings_of(report, "GL101") == []
    assert [f.rule_id for f in report.all_findings if f.suppressed] == ["GL101"]
    assert report.hidden() == (1, 0)


@pytest.mark.parametrize("settings", NOT_SUPPRESSING.values(), ids=NOT_SUPPRESSING.keys())
def test_a_comment_that_does_not_cover_the_finding_leaves_it(settings, tmp_path):
    report = lint_file(write(tmp_path, "model.py", model(**settings)))
    assert len(findings_of(report, "GL101")) == 1


def test_a_file_wide_bare_suppression_hides_every_rule(tmp_path):
    report = lint_file(write(tmp_path, "model.py", model(file_comment="graphlint: ignore-file")))
    assert report.findings == []
    assert sorted(f.rule_id for f in report.all_findings) == ["GL101", "GL203"]


def test_suppressed_findings_leave_every_format_unless_asked_for(tmp_path):
    from graphlint.report import FORMATS

    source = model(trailing="# graphlint: ignore[GL101]").replace("self.spare = nn.Linear(16, 16)", "pass")
    report = lint_file(write(tmp_path, "model.py", source))
    assert report.failing == []
    assert FORMATS["text"](report) == "No findings in 1 target (1 suppressed not shown).\n"
    assert json.loads(FORMATS["json"](report))["findings"] == []
    assert json.loads(FORMATS["sarif"](report))["runs"][0]["results"] == []
    assert not [line for line in FORMATS["github"](report).splitlines() if line.startswith("::")]

    report.show_suppressed = True
    assert report.failing == []  # shown, but a suppressed finding never fails the run
    assert FORMATS["text"](report).splitlines()[0].endswith("(suppressed)")
    log = json.loads(FORMATS["sarif"](report))
    validate_sarif(log)
    assert log["runs"][0]["results"][0]["suppressions"] == [{"kind": "inSource"}]
    assert json.loads(FORMATS["json"](report))["findings"][0]["suppressed"] is True


def test_show_suppressed_on_the_command_line(project_dir):
    write(project_dir, "model.py", model(trailing="# graphlint: ignore[GL101]").replace(
        "self.spare = nn.Linear(16, 16)", "pass"))
    hidden = run_graphlint("check", *WITHOUT_COMPILE, "model.py:make", cwd=project_dir)
    shown = run_graphlint("check", *WITHOUT_COMPILE, "model.py:make", "--show-suppressed", cwd=project_dir)
    assert hidden.returncode == shown.returncode == 0
    assert "GL101" not in hidden.stdout and "GL101" in shown.stdout


def test_unused_suppressions_are_gl901_when_selected(tmp_path):
    path = write(tmp_path, "model.py", model(trailing="# graphlint: ignore[GL101]",
                                             above="x = x  # graphlint: ignore[GL102]"))
    assert findings_of(lint_file(path), "GL901") == []  # off by default
    [unused] = findings_of(lint_file(path, extend_select=("GL901",)), "GL901")
    assert unused.location.line == line_of(path, "ignore[GL102]")
    assert unused.message == "The suppression of GL102 hides no finding of this run; remove it."
    text = path.read_text().splitlines()[unused.location.line - 1]
    assert text[unused.location.column - 1 : unused.location.end_column - 1] == "# graphlint: ignore[GL102]"


def test_suppressions_of_rules_that_did_not_run_are_not_judged(tmp_path):
    path = write(tmp_path, "model.py", model(trailing="# graphlint: ignore[GL101]",
                                             above="x = x  # graphlint: ignore[GL102]"))
    report = lint_file(path, select=("GL101", "GL901"))
    assert findings_of(report, "GL901") == []


def test_the_rule_tagged_for_unused_suppressions_reports_them_whatever_its_id(tmp_path):
    """The policy stage finds that rule by its tag (graphlint.tags), so a plugin's rule could take GL901's role."""
    path = write(tmp_path, "model.py", "x = 1  # graphlint: ignore[GL101]\n")
    gl901 = RuleInfo.of(UnusedSuppression)
    other = dataclasses.replace(gl901, id="GLX901", name="team-unused-suppression")
    untagged = dataclasses.replace(gl901, tags=tuple(t for t in gl901.tags if t != UNUSED_SUPPRESSION_TAG))
    gl101 = dataclasses.replace(gl901, id="GL101", name="unfused-attention", tags=())

    def unused(role: RuleInfo) -> list[tuple[str, int]]:
        report = Report(results=[TargetResult("model.py:make", files=(str(path),))], project_root=str(tmp_path),
                        rules=(gl101, role))
        apply_policy(report, Config(), Project(root=tmp_path))
        return [(f.rule_id, f.location.line) for f in report.findings]

    assert unused(gl901) == [("GL901", 1)]
    assert unused(other) == [("GLX901", 1)]
    assert unused(untagged) == []
