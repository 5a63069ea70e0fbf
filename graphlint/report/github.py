"""`--format github`: GitHub Actions workflow commands, which show as annotations on the pull request.

    ::warning file=models/gpt.py,line=29,endLine=29,col=17,endColumn=39,title=GL101 unfused-attention::message

GitHub shows at most 10 annotations of each kind per step (50 per job); the summary line follows them.
"""

from __future__ import annotations

from graphlint.files import display_path, writable
from graphlint.report.text import summary
from graphlint.results import Report

_COMMAND = {"error": "error", "warning": "warning", "note": "notice"}


def escape_message(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_message(text).replace(":", "%3A").replace(",", "%2C")


def render_github(report: Report) -> str:
    lines = []
    for finding in report.findings:
        loc = finding.location
        properties = {
            "file": display_path(loc.path),
            "line": loc.line,
            "endLine": loc.end_line,
            "col": loc.column,
            "endColumn": loc.end_column,
            "title": f"{finding.rule_id} {finding.rule_name}",
        }
        fields = ",".join(f"{key}={escape_property(str(value))}" for key, value in properties.items())
        suffix = " (suppressed)" if finding.suppressed else ""
        lines.append(f"::{_COMMAND[finding.severity.value]} {fields}::{escape_message(finding.message + suffix)}")
    for result in report.results:
        for note in result.notes:
            lines.append(f"::notice title=graphlint::{escape_message(f'{result.target}: {note}')}")
        for error in result.errors:
            lines.append(f"::error title=graphlint::{escape_message(f'{error.target}: {error.message}')}")
    lines.append(summary(report))
    return writable("\n".join(lines) + "\n")
