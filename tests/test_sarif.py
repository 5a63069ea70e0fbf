"""SARIF output: valid against the official 2.1.0 schema and explicit where consumers need it to be."""

from __future__ import annotations

import json

import pytest

from conftest import line_of, lint_file, validate_sarif, write
from graphlint.session import check
from graphlint.project import Project
from graphlint.report.sarif import render_sarif

ATTENTION = '''
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        label = "naïve 😀 attention"; probs = (q @ k.transpose(-2, -1)).softmax(-1)
        return probs @ v


def make():
    return Attention(), (torch.randn(2, 8, 16),)
'''


@pytest.fixture
def attention(tmp_path):
    path = write(tmp_path, "model.py", ATTENTION)
    report = lint_file(path)
    return path, report, json.loads(render_sarif(report))


def test_sarif_is_valid_against_the_official_schema(attention):
    _, _, log = attention
    validate_sarif(log)
    assert log["version"] == "2.1.0"
    assert log["runs"][0]["columnKind"] == "utf16CodeUnits"


def test_results_carry_rule_level_message_and_locations(attention):
    path, report, log = attention
    run = log["runs"][0]
    [result] = run["results"]
    assert result["ruleId"] == "GL101"
    assert run["tool"]["driver"]["rules"][result["ruleIndex"]]["id"] == "GL101"
    assert result["level"] == "warning"  # explicit, not left to the rule's default
    assert result["message"]["text"] == report.findings[0].message
    physical = result["locations"][0]["physicalLocation"]
    assert physical["artifactLocation"] == {"uri": "model.py", "uriBaseId": "%SRCROOT%"}
    assert physical["region"]["startLine"] == line_of(path, "softmax(-1)")
    related = result["relatedLocations"]
    assert [r["id"] for r in related] == list(range(1, len(related) + 1))
    assert {r["message"]["text"] for r in related} >= {"attention scores: matmul", "probabilities times values: matmul"}


def test_rules_carry_their_metadata_with_an_explicit_level(attention):
    rules = {r["id"]: r for r in attention[2]["runs"][0]["tool"]["driver"]["rules"]}
    assert {"GL101", "GL102", "GL201", "GL202", "GL203"} <= set(rules)
    rule = rules["GL101"]
    assert rule["name"] == "unfused-attention"
    assert rule["defaultConfiguration"] == {"level": "warning"}
    assert rule["shortDescription"]["text"] and rule["fullDescription"]["text"]
    assert "## Why it matters" in rule["help"]["markdown"]
    assert "performance" in rule["properties"]["tags"]
    assert rules["GL203"]["defaultConfiguration"] == {"level": "note"}


def test_columns_are_utf16_code_units_after_non_ascii_text(attention):
    path, report, log = attention
    finding = report.findings[0]
    line = path.read_text(encoding="utf-8").splitlines()[finding.location.line - 1]
    assert line[finding.location.column - 1 : finding.location.end_column - 1] == ".softmax(-1)"
    region = log["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"]
    # The emoji is one code point but two UTF-16 code units; "ï" is one of each.
    assert region["startColumn"] == finding.location.column + 1
    assert region["endColumn"] == finding.location.end_column + 1


def test_a_failed_target_is_recorded_in_invocations(tmp_path):
    good = write(tmp_path, "model.py", ATTENTION)
    project = Project(root=tmp_path, first_party_folders=[tmp_path])
    report = check([f"{good}:make", f"{tmp_path / 'missing.py'}:make"], project)
    log = json.loads(render_sarif(report))
    validate_sarif(log)
    invocation = log["runs"][0]["invocations"][0]
    assert invocation["executionSuccessful"] is False
    [notification] = invocation["toolExecutionNotifications"]
    assert notification["level"] == "error"
    assert "missing.py" in notification["message"]["text"] and "does not exist" in notification["message"]["text"]
    assert len(log["runs"][0]["results"]) == 1  # the good target is still reported


def test_a_clean_run_has_an_empty_results_list(tmp_path):
    path = write(tmp_path, "clean.py", "import torch\n\n\ndef make():\n    return torch.nn.Linear(4, 4), (torch.randn(2, 4),)\n")
    log = json.loads(render_sarif(lint_file(path)))
    validate_sarif(log)
    assert log["runs"][0]["results"] == []
    assert log["runs"][0]["invocations"][0]["executionSuccessful"] is True


def test_paths_with_spaces_and_accents_are_percent_encoded_uris(tmp_path):
    path = write(tmp_path / "my models" / "é", "model.py", ATTENTION)
    project = Project(root=tmp_path, first_party_folders=[tmp_path])
    log = json.loads(render_sarif(check([f"{path}:make"], project)))
    validate_sarif(log)
    uri = log["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
    assert uri == "my%20models/%C3%A9/model.py"
