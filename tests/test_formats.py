"""--format github (workflow commands) and --format json (the documented stable shape)."""

from __future__ import annotations

import json
import re

from conftest import REPO, lint_file, write
from graphlint.report import FORMATS
from graphlint.report.github import escape_message, escape_property
from graphlint.results import Finding, Location, Report, Severity, TargetResult
from test_several_problems import MESSY


def test_workflow_command_escaping_follows_github():
    assert escape_message("50% done\r\nnext: a, b") == "50%25 done%0D%0Anext: a, b"
    assert escape_property("dir: a,b%\n") == "dir%3A a%2Cb%25%0A"


def test_github_annotations_carry_file_span_title_and_level(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report = lint_file(write(tmp_path, "messy.py", MESSY.code))
    lines = FORMATS["github"](report).splitlines()
    annotations = [line for line in lines if line.startswith("::") and " file=" in line]
    assert len(annotations) == len(report.findings) == 6
    assert "::notice title=graphlint::" in lines[-2] and "captured on CPU" in lines[-2]
    pattern = re.compile(r"::(error|warning|notice) file=messy\.py,line=(\d+),endLine=(\d+),col=(\d+),"
                         r"endColumn=(\d+),title=(GL\d{3}) [a-z-]+::(.+)")
    levels = {"error": "error", "warning": "warning", "note": "notice"}
    for finding, line in zip(report.findings, annotations, strict=True):
        match = pattern.fullmatch(line)
        assert match, line
        level, start, end, column, end_column, rule, message = match.groups()
        assert (level, rule) == (levels[finding.severity.value], finding.rule_id)
        loc = finding.location
        assert (int(start), int(end), int(column), int(end_column)) == (loc.line, loc.end_line, loc.column, loc.end_column)
        assert message == escape_message(finding.message)
    assert lines[-1] == "Found 6 findings in 1 target."


def test_github_annotations_escape_paths_and_messages():
    location = Location("/work/a,b: c/model.py", 3, 5, 3, 9)
    finding = Finding("GL101", "unfused-attention", Severity.WARNING, "100% sure\nsecond line", location)
    report = Report(results=[TargetResult("t", findings=[finding])])
    [annotation] = [line for line in FORMATS["github"](report).splitlines() if line.startswith("::")]
    assert annotation == ("::warning file=/work/a%2Cb%3A c/model.py,line=3,endLine=3,col=5,endColumn=9,"
                          "title=GL101 unfused-attention::100%25 sure%0Asecond line")


def test_json_has_the_documented_shape(tmp_path):
    report = lint_file(write(tmp_path, "messy.py", MESSY.code))
    document = json.loads(FORMATS["json"](report))
    assert document["version"] == 1
    assert document["tool"]["name"] == "graphlint"
    assert set(document) == {"version", "tool", "findings", "errors", "notes", "summary"}
    finding = document["findings"][0]
    assert set(finding) == {"rule", "name", "severity", "message", "location", "related", "occurrences", "targets",
                            "fingerprint", "suppressed"}
    assert set(finding["location"]) == {"path", "line", "column", "end_line", "end_column"}
    assert finding["location"]["path"] == "messy.py"
    assert document["summary"] == {"targets": 1, "failed_targets": 0, "findings": 6, "failing": 5,
                                   "hidden_suppressed": 0, "hidden_baselined": 0}
    documented = (REPO / "docs" / "json-format.md").read_text()
    for key in [*document, *finding, *document["summary"]]:
        assert f"`{key}`" in documented, f"{key} is not documented in docs/json-format.md"
