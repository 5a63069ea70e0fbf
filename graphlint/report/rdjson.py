"""`--format rdjson` and `--format rdjsonl`: reviewdog's Diagnostic Format, for review comments on pull and
merge requests (`reviewdog -f=rdjson`), with graphlint's fixes as one-click suggested changes.

rdjson is one `DiagnosticResult` object; rdjsonl is one `Diagnostic` object a line. Paths are relative to
the repository's checkout in CI, else to the project root (graphlint.report.paths); lines are 1-based and
columns count UTF-8 bytes, end exclusive, as reviewdog's schema says.

A finding's fix becomes exactly one suggestion that replaces whole lines, every line the fix edits and the
finding's own lines: reviewdog places the review comment on the first suggestion's lines, GitHub refuses a
suggestion whose lines differ from its comment's, and a line-wise suggestion needs no column arithmetic on
the reviewer's side. Such a range has no columns (reviewdog's line-wise form), and its text is the new text
of those lines without the last line break. Fixes whose line ranges overlap in one file are offered as one
suggestion, on the first of their findings, so that accepting every suggestion gives what `--fix` writes.
This module suggests every fix the report carries: the command keeps only the proven ones
(`keep_fixes`) unless `--unsafe-fixes`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Collection, Mapping

from graphlint.files import read_source, split_lines, writable
from graphlint.rewrite.edits import EditConflict, apply_edits
from graphlint.report.columns import SourceColumns
from graphlint.report.paths import relative_to, source_root
from graphlint.report.sarif import INFORMATION_URI
from graphlint.results import Edit, Finding, Location, Report

SOURCE = {"name": "graphlint", "url": INFORMATION_URI}
_SEVERITY = {"error": "ERROR", "warning": "WARNING", "note": "INFO"}
_LINE_END = re.compile(r"\r\n|\r|\n")  # the line ends Python counts
_FINAL_LINE_END = re.compile(r"(\r\n|\r|\n)\Z")


def render_rdjson(report: Report, environ: Mapping[str, str] | None = None) -> str:
    document = {"source": SOURCE, "diagnostics": diagnostics(report, environ)}
    return writable(json.dumps(document, indent=2, ensure_ascii=False) + "\n")


def render_rdjsonl(report: Report, environ: Mapping[str, str] | None = None) -> str:
    return writable("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in diagnostics(report, environ)))


def keep_fixes(report: Report, kept: Collection[Finding]) -> Report:
    """A copy of `report` in which only the findings in `kept` still carry their fix (the proven ones)."""
    return dataclasses.replace(report, merged=[f if f in kept else dataclasses.replace(f, fix=None)
                                               for f in report.all_findings])


def diagnostics(report: Report, environ: Mapping[str, str] | None = None) -> list[dict]:
    """One rdf `Diagnostic` per finding, suppressed findings left out, in the report's order."""
    root = source_root(report.project_root, os.environ if environ is None else environ)
    columns = SourceColumns("utf-8")
    docs = {rule.id: rule.help_uri for rule in report.rules}
    findings = [f for f in report.findings if not f.suppressed]
    suggested = suggestions(findings)
    out = []
    for finding in findings:
        diagnostic = {
            "message": finding.message,
            "location": _location(finding.location, columns, root),
            "severity": _SEVERITY[finding.severity.value],
            "source": SOURCE,
            "code": {"value": finding.rule_id, **({"url": docs[finding.rule_id]} if finding.rule_id in docs else {})},
        }
        if finding.related:
            diagnostic["related_locations"] = [{"message": r.message, "location": _location(r.location, columns, root)}
                                               for r in finding.related]
        if finding in suggested:
            first, last, text = suggested[finding]
            diagnostic["suggestions"] = [{"range": {"start": {"line": first}, "end": {"line": last}}, "text": text}]
        out.append(diagnostic)
    return out


def _location(location: Location, columns: SourceColumns, root: str) -> dict:
    path = location.path
    return {
        "path": relative_to(path, root),
        "range": {
            "start": {"line": location.line, "column": columns.convert(path, location.line, location.column)},
            "end": {"line": location.end_line, "column": columns.convert(path, location.end_line, location.end_column)},
        },
    }


def suggestions(findings: list[Finding]) -> dict[Finding, tuple[int, int, str]]:
    """Each suggestible finding's line-wise suggestion: (first line, last line, new text of those lines)."""
    by_file: dict[str, list[Finding]] = {}
    for finding in findings:
        fix = finding.fix
        if fix is None or not fix.edits or not finding.location.first_party:
            continue
        if all(edit.path == finding.location.path for edit in fix.edits):  # a suggestion edits its comment's file
            by_file.setdefault(finding.location.path, []).append(finding)
    out = {}
    for path, mine in by_file.items():
        text = read_source(path)
        if text is None:
            continue
        # Groups of findings whose lines overlap, each group one suggestion on its first finding.
        groups: list[tuple[int, int, list[Finding]]] = []
        for first, last, finding in sorted(((*_lines(f), f) for f in mine), key=lambda item: item[:2]):
            if groups and first <= groups[-1][1]:
                groups[-1] = (groups[-1][0], max(last, groups[-1][1]), groups[-1][2] + [finding])
            else:
                groups.append((first, last, [finding]))
        for first, last, group in groups:
            made = _suggestion(text, first, last, [e for f in group for e in f.fix.edits])
            if made is not None:
                lead = min(group, key=findings.index)  # the comment that carries it: the group's first in the report
                out[lead] = made
    return out


def _lines(finding: Finding) -> tuple[int, int]:
    """The lines a finding and its fix touch."""
    spans = [(finding.location.line, finding.location.end_line, finding.location.end_column)]
    spans += [(e.line, e.end_line, e.end_column) for e in finding.fix.edits]
    return min(s[0] for s in spans), max(_last_line(*s) for s in spans)


def _last_line(line: int, end_line: int, end_column: int) -> int:
    # A span that ends at the start of a line ends with the line break of the line before.
    return end_line - 1 if end_column == 1 and end_line > line else end_line


def _suggestion(text: str, first: int, last: int, edits: list[Edit]) -> tuple[int, int, str] | None:
    """Lines `first`..`last` (widened when needed) and their text once `edits` are applied."""
    try:
        fixed = apply_edits(text, edits)
    except EditConflict:
        return None
    starts = [0] + [m.end() for m in _LINE_END.finditer(text)]
    count = len(split_lines(text))
    while last <= count:
        start = starts[first - 1]
        end = starts[last] if last < len(starts) else len(text)
        middle = fixed[start:len(fixed) - (len(text) - end)]
        line_end = _FINAL_LINE_END.search(text[start:end])
        if not line_end or middle == "":
            return first, last, middle  # the file's last line (no line break), or the lines deleted
        if middle.endswith(line_end.group()) and middle != line_end.group():
            return first, last, middle[: -len(line_end.group())]
        # The fix removed the last line break, or leaves one empty line, which a line-wise suggestion cannot
        # tell from deleting the lines: take the next line in too.
        last += 1
    return None
