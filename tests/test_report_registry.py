"""The output formats come from one registry (graphlint.report.FORMATS): the command line offers exactly its
names, and every writer in it renders a real report."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from conftest import write as write_file
from graphlint.cli import _parser
from graphlint.report import FORMATS, GRAPH_FORMATS, MEMORY_FORMATS
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


MODEL = '''
import torch
from torch import nn


def make():
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 2)), (torch.randn(4, 8),)
'''


@pytest.mark.cli
@pytest.mark.parametrize("command, formats", [("graph", GRAPH_FORMATS[:3]), ("memory", MEMORY_FORMATS)])
def test_graph_and_memory_write_what_their_reporters_render(project_dir, monkeypatch, command, formats):
    """The command offers the report package's formats and writes, byte for byte, what its reporter renders
    from the session's answer (graphlint.report.graph, graphlint.report.memory)."""
    from graphlint.project import Project
    from graphlint.report.graph import render_graph
    from graphlint.report.memory import render_memory
    from graphlint.session import Options, Session

    write_file(project_dir, "model.py", MODEL)
    monkeypatch.chdir(project_dir)  # paths are shown from the working directory, as the command's are
    project = Project.discover(project_dir)
    session = Session(["model.py:make"], project, project.config, Options(), project_dir, lints=False)
    assert _choices("graph") == GRAPH_FORMATS and _choices("memory") == MEMORY_FORMATS
    try:
        if command == "graph":
            _, answer = session.graph("model.py:make")
        else:
            [(_, answer)] = session.memory(["model.py:make"])
    finally:
        session.runner.close()
    # The first format's run fills a fresh cache and the next are rendered from its entry, as a user's later runs are.
    cache = ["--cache-dir", str(project_dir / "fresh_cache")]
    for name in formats:
        done = subprocess.run([sys.executable, "-m", "graphlint", command, "model.py:make", "--format", name, *cache],
                              cwd=project_dir, capture_output=True, timeout=600)
        assert done.returncode == 0, done.stderr
        rendered = render_graph(answer, name) if command == "graph" else render_memory([answer], name).encode()
        assert done.stdout == rendered, name


def _choices(command: str) -> tuple[str, ...]:
    commands = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return tuple(next(a for a in commands.choices[command]._actions if "--format" in a.option_strings).choices)
