"""What the language server shows, made from a report: diagnostics per file, quick fixes, rule documentation.

Pure functions of graphlint's plain results (graphlint.results) to lsprotocol's types; nothing here talks to a
client or runs a lint. Positions are 0-based lines and 0-based columns in the unit the client and server agreed
on (UTF-16 code units unless the client asked for another), converted from graphlint's 1-based code-point
columns with graphlint.report.columns.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from lsprotocol import types
from pygls.uris import from_fs_path

from graphlint.errors import single_line
from graphlint.report.columns import SourceColumns
from graphlint.results import SAFE, UNSAFE, Edit, Finding, Location, Report, RuleInfo, Severity, TargetError

SOURCE = "graphlint"
SEVERITIES = {
    Severity.ERROR: types.DiagnosticSeverity.Error,
    Severity.WARNING: types.DiagnosticSeverity.Warning,
    Severity.NOTE: types.DiagnosticSeverity.Information,
}

@dataclass(frozen=True)
class Shown:
    """One diagnostic as published, with the finding it shows (None for a target that could not be linted)."""

    diagnostic: types.Diagnostic
    finding: Finding | None = None
    rule: RuleInfo | None = None


def uri_of(path: str) -> str:
    return from_fs_path(path) or path


def shown_by_file(report: Report, target_files: dict[str, str], columns: SourceColumns) -> dict[str, list[Shown]]:
    """Every file's diagnostics for the report's findings (suppressed and baselined ones left out, as in the text
    output) and for the targets that could not be linted, where the failure has a place (see `error_place`).
    `target_files` maps each target to its file, where it names one."""
    rules = {rule.id: rule for rule in report.rules}
    files: dict[str, list[Shown]] = {}
    for finding in report.findings:
        if finding.suppressed:  # only with show_suppressed, which the server never sets
            continue
        rule = rules.get(finding.rule_id)
        level = report.level_of(rule) if rule is not None else finding.severity
        files.setdefault(finding.location.path, []).append(
            Shown(finding_diagnostic(finding, rule, level, columns), finding, rule))
    for result in report.results:
        for error in result.errors:
            placed = error_place(error, target_files.get(result.target))
            if placed is not None:
                path, line = placed
                files.setdefault(path, []).append(Shown(error_diagnostic(error, path, line, columns)))
    return files


def finding_diagnostic(finding: Finding, rule: RuleInfo | None, level: Severity,
                       columns: SourceColumns) -> types.Diagnostic:
    related = [
        types.DiagnosticRelatedInformation(
            location=types.Location(uri=uri_of(r.location.path), range=lsp_range(r.location, columns)),
            message=r.message,
        )
        for r in finding.related
    ]
    return types.Diagnostic(
        range=lsp_range(finding.location, columns),
        message=finding.message,
        severity=SEVERITIES[level],
        code=finding.rule_id,
        code_description=types.CodeDescription(href=rule.help_uri) if rule is not None else None,
        source=SOURCE,
        related_information=related or None,
        data={"fingerprint": finding.fingerprint},
    )


def error_place(error: TargetError, target_file: str | None) -> tuple[str, int] | None:
    """(file, line) where a target's failure belongs: where it happened (a syntax error, the line that raised),
    else the first line of the target's file; None for a target without a file that exists."""
    if error.path is not None and error.line is not None and os.path.isfile(error.path):
        return error.path, error.line
    if target_file is not None and os.path.isfile(target_file):
        return target_file, 1
    return None


def error_diagnostic(error: TargetError, path: str, line: int, columns: SourceColumns) -> types.Diagnostic:
    """A target that could not be linted, shown on a whole line of the file where it failed."""
    end = columns.convert(path, line, columns.line_length(path, line) + 1) - 1
    return types.Diagnostic(
        range=types.Range(start=types.Position(line=line - 1, character=0),
                          end=types.Position(line=line - 1, character=max(end, 0))),
        message=failure_message(error),
        severity=types.DiagnosticSeverity.Error,
        source=SOURCE,
    )


def failure_message(error: TargetError) -> str:
    return single_line(f"graphlint could not lint {error.target}: {error.message}")


def lsp_range(location: Location, columns: SourceColumns) -> types.Range:
    return types.Range(
        start=_position(location.path, location.line, location.column, columns),
        end=_position(location.path, location.end_line, location.end_column, columns),
    )


def _position(path: str, line: int, column: int, columns: SourceColumns) -> types.Position:
    return types.Position(line=max(line - 1, 0), character=max(columns.convert(path, line, column) - 1, 0))


def quick_fix(shown: Shown, columns: SourceColumns, unsafe_verdict: str | None = None) -> types.CodeAction | None:
    """The rule's rewrite of a finding as a quick fix, or None when it offers none. A safe fix is offered as the
    rule wrote it (`--fix` proves it before writing); an unsafe one only where `--unsafe-fixes` would write it
    (`unsafe_verdict` is its proof's: "" when it may be written, None while not yet proven), titled with why it
    is unsafe and never the preferred fix."""
    finding = shown.finding
    if finding is None or finding.fix is None or finding.fix.applicability not in (SAFE, UNSAFE):
        return None
    safe = finding.fix.applicability == SAFE
    if not safe and unsafe_verdict != "":
        return None
    changes: dict[str, list[types.TextEdit]] = {}
    for edit in finding.fix.edits:
        changes.setdefault(uri_of(edit.path), []).append(text_edit(edit, columns))
    what, _, why = finding.fix.message.partition("; ")
    return types.CodeAction(
        title=f"Fix {finding.rule_id}: {finding.fix.message}" if safe else
        f"Fix {finding.rule_id} (unsafe: {why or 'declared by the rule'}): {what}",
        kind=types.CodeActionKind.QuickFix,
        diagnostics=[shown.diagnostic],
        edit=types.WorkspaceEdit(changes=changes),
        is_preferred=safe,
    )


def text_edit(edit: Edit, columns: SourceColumns) -> types.TextEdit:
    return types.TextEdit(
        range=types.Range(start=_position(edit.path, edit.line, edit.column, columns),
                          end=_position(edit.path, edit.end_line, edit.end_column, columns)),
        new_text=edit.text,
    )


def rule_hover(rule: RuleInfo, where: types.Range, markdown: bool = True) -> types.Hover:
    """The rule's documentation page, as `graphlint rule` prints it (markdown where the client shows it)."""
    return types.Hover(
        contents=types.MarkupContent(kind=types.MarkupKind.Markdown if markdown else types.MarkupKind.PlainText,
                                     value=rule.docs_markdown if markdown else rule.docs_text),
        range=where,
    )


def contains(outer: types.Range, position: types.Position) -> bool:
    start, end = outer.start, outer.end
    return (start.line, start.character) <= (position.line, position.character) <= (end.line, end.character)


def overlaps(a: types.Range, b: types.Range) -> bool:
    return (a.start.line, a.start.character) <= (b.end.line, b.end.character) and \
        (b.start.line, b.start.character) <= (a.end.line, a.end.character)
