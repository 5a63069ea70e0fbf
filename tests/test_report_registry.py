"""The output formats come from one registry (graphlint.report.FORMATS): the command line offers exactly its
names, and every writer in it renders a real report."""

from __future__ import annotations

import argparse

from graphlint.cli import _parser
from graphlint.report import FORMATS
from graphlint.results import Finding, Location, Report, Severity, TargetError, TargetResult


def _format_choices() -> tuple[str, ...]:
    commands = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    check = commands.choices["check"]
    return tuple(next(a for a in check._actions if "--format" in a.option_strings).choices)


def test_the_command_line_offers_exactly_the_registered_formats():
    assert _format_choices() == tuple(FORMATS)
    for name in FORMATS:
        assert _parser().parse_args(["check", "--format", name]).format == name


def test_every_registered_writer_renders_a_report_with_a_finding_and_an_error(tmp_path):
    path = str(tmp_path / "model.py")
    (tmp_path / "model.py").write_text("x = 1\n", encoding="utf-8")
    finding = Finding(rule_id="GL101", rule_name="unfused-attention", severity=Severity.WARNING,
                      message="hand-written attention", location=Location(path, 1, 1, 1, 6), targets=("model.py:make",))
    result = TargetResult(target="model.py:make", findings=[finding])
    failed = TargetResult(target="other.py:make", errors=[TargetError("other.py:make", "cannot import it")])
    report = Report(results=[result, failed], project_root=str(tmp_path))
    for name, write in FORMATS.items():
        rendered = write(report)
        assert isinstance(rendered, str) and rendered.strip(), name
        assert name == "junit" or "model.py" in rendered, name  # JUnit names the target, not the file
