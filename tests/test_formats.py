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
    assert lines[-1] == "Found 6 findings in 1 target; [*] 2 with a fix (graphlint check --fix proves and applies it)."


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
    assert set(document) == {"version", "tool", "findings", "errors", "notes", "internal_failures", "summary"}
    finding = document["findings"][0]
    assert set(finding) == {"rule", "name", "severity", "message", "location", "related", "occurrences", "targets",
                            "fingerprint", "suppressed", "fix", "no_fix", "saves_bytes"}
    fixes = [f["fix"] for f in document["findings"] if f["fix"] is not None]
    assert fixes and all(set(f) == {"message", "applicability", "edits"} for f in fixes)
    assert all(set(e) == {"path", "line", "column", "end_line", "end_column", "text"} for f in fixes for e in f["edits"])
    assert set(finding["location"]) == {"path", "line", "column", "end_line", "end_column"}
    assert finding["location"]["path"] == "messy.py"
    assert document["summary"] == {"targets": 1, "failed_targets": 0, "findings": 6, "failing": 5,
                                   "hidden_suppressed": 0, "hidden_baselined": 0}
    documented = (REPO / "docs" / "json-format.md").read_text()
    for key in [*document, *finding, *document["summary"]]:
        assert f"`{key}`" in documented, f"{key} is not documented in docs/json-format.md"


GITLAB_SEVERITIES = {"info", "minor", "major", "critical", "blocker"}


def test_gitlab_code_quality_has_the_fields_gitlab_reads(tmp_path):
    report = lint_file(write(tmp_path, "messy.py", MESSY.code))
    issues = json.loads(FORMATS["gitlab"](report))
    assert len(issues) == len(report.findings) == 6
    for issue, finding in zip(issues, report.findings, strict=True):
        assert issue["check_name"].startswith(finding.rule_id + " ")
        assert issue["description"] == f"{finding.rule_id} {finding.message}"
        assert issue["severity"] in GITLAB_SEVERITIES
        assert issue["location"]["path"] == "messy.py"
        assert issue["location"]["lines"]["begin"] == finding.location.line
        assert re.fullmatch(r"[0-9a-f]{32}", issue["fingerprint"])
    assert len({issue["fingerprint"] for issue in issues}) == len(issues)  # GitLab needs them unique
    by_level = {f.severity.value: i["severity"] for f, i in zip(report.findings, issues, strict=True)}
    assert by_level == {"note": "info", "warning": "major", "error": "critical"}


def test_gitlab_fingerprints_survive_moving_the_code(tmp_path):
    first = json.loads(FORMATS["gitlab"](lint_file(write(tmp_path / "a", "messy.py", MESSY.code))))
    three_lines_down = "# moved\n# down\n# three lines\n" + MESSY.code
    moved = json.loads(FORMATS["gitlab"](lint_file(write(tmp_path / "b", "messy.py", three_lines_down))))
    assert [i["fingerprint"] for i in first] == [i["fingerprint"] for i in moved]
    assert [i["location"]["lines"]["begin"] + 3 for i in first] == [i["location"]["lines"]["begin"] for i in moved]


def _junit(report):
    import xml.etree.ElementTree as ElementTree

    return ElementTree.fromstring(FORMATS["junit"](report).encode("utf-8"))


def test_junit_has_a_test_case_per_target_and_a_failure_per_finding(tmp_path):
    from conftest import check_targets

    write(tmp_path, "messy.py", MESSY.code)
    write(tmp_path, "clean.py", "import torch\n\n\ndef make():\n    return torch.nn.Linear(4, 4), (torch.randn(2, 4),)\n")
    write(tmp_path, "broken.py", "def make():\n    raise ValueError('no data\\x01here')\n")
    report = check_targets(tmp_path, ["messy.py:make", "clean.py:make", "broken.py:make"])
    suites = _junit(report)
    [suite] = suites.findall("testsuite")
    cases = {case.get("name"): case for case in suite.findall("testcase")}
    assert list(cases) == [r.target for r in report.results]
    messy, clean, broken = cases.values()
    failures = messy.findall("failure")
    assert [f.get("type") for f in failures] == [f.rule_id for f in report.failing]
    assert all(f.get("message").startswith(f.get("type") + " ") for f in failures)
    below = [f for f in report.findings if f not in report.failing]  # the GL203 note
    assert below and all(f.rule_id in messy.find("system-out").text for f in below)
    assert not list(clean)  # a clean target passes
    [error] = broken.findall("error")
    assert "the factory raised ValueError: no data?here" in error.get("message")  # XML cannot hold \x01
    assert suite.get("tests") == "3" and suite.get("failures") == str(len(failures)) and suite.get("errors") == "1"
