"""Reporters: functions of a Report that return text in one output format.

`FORMATS` is the one registry of output formats, by the name `--format` takes: adding a format is one line
here. A writer's module is imported the first time it writes, so that the command line can list the names
without importing every writer's dependencies (SARIF's object model, XML).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from graphlint.results import Report


def _writer(module: str, function: str) -> Callable[[Report], str]:
    def write(report: Report) -> str:
        return getattr(importlib.import_module(module), function)(report)

    write.__qualname__ = write.__name__ = function
    return write


FORMATS: dict[str, Callable[[Report], str]] = {
    "text": _writer("graphlint.report.text", "render_text"),
    "json": _writer("graphlint.report.json", "render_json"),
    "sarif": _writer("graphlint.report.sarif", "render_sarif"),
    "github": _writer("graphlint.report.github", "render_github"),
    "gitlab": _writer("graphlint.report.gitlab", "render_gitlab"),
    "junit": _writer("graphlint.report.junit", "render_junit"),
    "rdjson": _writer("graphlint.report.rdjson", "render_rdjson"),
    "rdjsonl": _writer("graphlint.report.rdjson", "render_rdjsonl"),
    "markdown": _writer("graphlint.report.markdown", "render_markdown"),
}
# The formats of `graphlint graph` (graphlint.report.graph) and `graphlint memory` (graphlint.report.memory).
GRAPH_FORMATS = ("text", "json", "dot", "svg")
MEMORY_FORMATS = ("text", "json")
SUGGESTING = ("rdjson", "rdjsonl")  # formats that carry fixes as suggestions: the command proves them first
