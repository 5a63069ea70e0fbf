"""`--format github`: GitHub Actions workflow commands, which show as annotations on the pull request.

    ::warning file=models/gpt.py,line=29,endLine=29,col=17,endColumn=39,title=GL101 unfused-attention::message

GitHub shows at most 10 annotations of each level (error, warning, notice) per step and 50 per job, and drops
the rest without a word. Past 10 of a level, the rest are printed as plain log lines and a last notice says how
many were not shown as annotations and where every finding is (`--format markdown`, the job summary of
graphlint's action, SARIF). The summary line follows them. In GitHub Actions, paths are relative to the
repository's checkout (`$GITHUB_WORKSPACE`), as GitHub places annotations, whatever the working directory.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from graphlint.files import display_path, writable
from graphlint.report.paths import relative_to
from graphlint.report.text import summary
from graphlint.results import Report

_COMMAND = {"error": "error", "warning": "warning", "note": "notice"}
LIMIT = 10  # annotations of one level that GitHub shows per step


def escape_message(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_message(text).replace(":", "%3A").replace(",", "%2C")


def render_github(report: Report, environ: Mapping[str, str] | None = None) -> str:
    workspace = (os.environ if environ is None else environ).get("GITHUB_WORKSPACE")
    commands: list[tuple[str, str, str]] = []  # (level, workflow command, the same as a plain log line)
    for finding in report.findings:
        loc = finding.location
        path = relative_to(loc.path, workspace) if workspace else display_path(loc.path)
        if Path(path).is_absolute():  # outside the checkout: a library, shown as the text format shows it
            path = display_path(loc.path)
        properties = {
            "file": path,
            "line": loc.line,
            "endLine": loc.end_line,
            "col": loc.column,
            "endColumn": loc.end_column,
            "title": f"{finding.rule_id} {finding.rule_name}",
        }
        fields = ",".join(f"{key}={escape_property(str(value))}" for key, value in properties.items())
        message = finding.message + (" (suppressed)" if finding.suppressed else "")
        level = _COMMAND[finding.severity.value]
        commands.append((level, f"::{level} {fields}::{escape_message(message)}",
                         f"{path}:{loc.line}:{loc.column}: {finding.rule_id} {' '.join(message.split())}"))
    for result in report.results:
        for note in result.notes:
            text = f"{result.target}: {note}"
            commands.append(("notice", f"::notice title=graphlint::{escape_message(text)}", f"graphlint: note: {text}"))
        for error in result.errors:
            text = f"{error.target}: {error.message}"
            commands.append(("error", f"::error title=graphlint::{escape_message(text)}", f"graphlint: error: {text}"))
    counts = {level: sum(1 for c in commands if c[0] == level) for level in ("error", "warning", "notice")}
    # The last notice must itself be one of the notices shown.
    shown = {level: count if count <= LIMIT else LIMIT - (level == "notice") for level, count in counts.items()}
    lines, seen = [], dict.fromkeys(counts, 0)
    for level, command, plain in commands:
        seen[level] += 1
        lines.append(command if seen[level] <= shown[level] else plain)
    hidden = {level: counts[level] - shown[level] for level in counts if counts[level] > shown[level]}
    if hidden:
        title = escape_property(f"graphlint: {sum(hidden.values())} not shown as annotations")
        lines.append(f"::notice title={title}::{escape_message(overflow_notice(hidden, len(report.findings)))}")
    lines.append(summary(report))
    return writable("\n".join(lines) + "\n")


def overflow_notice(hidden: dict[str, int], findings: int) -> str:
    """What the annotations leave out, and where to find everything."""
    parts = " and ".join(f"{count} {level}{'' if count == 1 else 's'}" for level, count in hidden.items())
    verb = "is" if sum(hidden.values()) == 1 else "are"
    return (f"GitHub shows at most {LIMIT} annotations of each level per step; {parts} {verb} only in this step's "
            f"log. All {findings} finding{'' if findings == 1 else 's'} are listed in the job summary of "
            "graphlint's action (--format markdown) and in its SARIF for code scanning (--format sarif).")
