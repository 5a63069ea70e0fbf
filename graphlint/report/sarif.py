"""SARIF 2.1.0 for GitHub code scanning and IDE problem panels, built with sarif-om.

sarif-om's usual serializer drops every value equal to its default, so `level: "warning"` would vanish and a
result would inherit its rule's level; this module serializes the attrs classes itself and keeps levels
explicit. Columns are UTF-16 code units (`run.columnKind`), as GitHub and VS Code expect. `%SRCROOT%` is the
project root, or in CI the repository's checkout that holds it (graphlint.report.paths).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import quote

import attr
import sarif_om as sarif

import graphlint
from graphlint.files import writable
from graphlint.report.columns import SourceColumns
from graphlint.report.paths import source_root
from graphlint.results import Edit, Fix, Finding, Location, Report, RuleInfo

SCHEMA_URI = "https://json.schemastore.org/sarif-2.1.0.json"
INFORMATION_URI = "https://pypi.org/project/torch-graphlint/"
SRCROOT = "%SRCROOT%"
AUTOMATION_ID = "graphlint/"  # GitHub code scanning's category for these results
_ALWAYS_WRITTEN = {"level"}  # written even when equal to sarif-om's default


def render_sarif(report: Report) -> str:
    log = _to_json(build_log(report))
    ordered = {"$schema": log.pop("$schema"), "version": log.pop("version"), **log}  # the usual reading order
    return writable(json.dumps(ordered, indent=2, ensure_ascii=False) + "\n")


def build_log(report: Report) -> sarif.SarifLog:
    rules = list(report.rules)
    index = {rule.id: i for i, rule in enumerate(rules)}
    columns = SourceColumns("utf-16")
    root = Path(source_root(report.project_root, os.environ))  # GitHub reads paths from the repository root
    results = [_result(f, index, columns, root, report.baseline is not None) for f in report.findings]
    notifications = [
        sarif.Notification(level="error", message=sarif.Message(text=f"{e.target}: {e.message}"))
        for e in report.errors
    ] + [
        sarif.Notification(level="note", message=sarif.Message(text=f"{r.target}: {note}"))
        for r in report.results for note in r.notes
    ] + [  # graphlint's own bugs after detection: a warning about the tool, not about the user's code
        sarif.Notification(level="warning", message=sarif.Message(
            text=f"{r.target}: graphlint's own code failed after detection ({failure}); please report it"))
        for r in report.results for failure in r.failures
    ]
    run = sarif.Run(
        tool=sarif.Tool(driver=sarif.ToolComponent(
            name="graphlint",
            version=graphlint.__version__,
            semantic_version=graphlint.__version__,
            information_uri=INFORMATION_URI,
            rules=[_rule(rule, report.level_of(rule).value) for rule in rules],
        )),
        automation_details=sarif.RunAutomationDetails(id=AUTOMATION_ID),
        results=results,
        column_kind="utf16CodeUnits",
        invocations=[sarif.Invocation(
            execution_successful=not report.errors,
            tool_execution_notifications=notifications or None,
        )],
    )
    return sarif.SarifLog(version="2.1.0", schema_uri=SCHEMA_URI, runs=[run])


def _rule(rule: RuleInfo, level: str) -> sarif.ReportingDescriptor:
    return sarif.ReportingDescriptor(
        id=rule.id,
        name=rule.name,
        short_description=sarif.MultiformatMessageString(text=rule.summary[:1024]),
        full_description=sarif.MultiformatMessageString(text=rule.description[:1024]),
        help=sarif.MultiformatMessageString(text=rule.docs_text, markdown=rule.docs_markdown),
        help_uri=rule.help_uri,
        default_configuration=sarif.ReportingConfiguration(level=level),
        properties={"tags": list(rule.tags), "precision": rule.precision},
    )


def _result(finding: Finding, index: dict[str, int], columns: SourceColumns, root: Path,
            against_baseline: bool) -> sarif.Result:
    related = [
        sarif.Location(id=i, physical_location=_physical(r.location, columns, root), message=sarif.Message(text=r.message))
        for i, r in enumerate(finding.related, start=1)
    ]
    fingerprints = {"graphlint/v1": finding.fingerprint}
    if finding.line_hash:
        fingerprints["primaryLocationLineHash"] = finding.line_hash
    return sarif.Result(
        rule_id=finding.rule_id,
        rule_index=index.get(finding.rule_id, -1),
        level=finding.severity.value,
        message=sarif.Message(text=finding.message),
        locations=[sarif.Location(physical_location=_physical(finding.location, columns, root))],
        related_locations=related or None,
        partial_fingerprints=fingerprints,
        suppressions=[sarif.Suppression(kind="inSource")] if finding.suppressed else None,
        baseline_state="new" if against_baseline else None,
        occurrence_count=finding.occurrences,
        fixes=[_fix(finding.fix, columns, root)] if finding.fix is not None else None,
        properties={"targets": list(finding.targets),
                    **({"savesBytes": finding.saves_bytes} if finding.saves_bytes else {}),
                    **(_cost(finding.cost) if finding.cost is not None else {})},
    )


def _cost(cost) -> dict:
    """A priced finding's properties (check --gpu): seconds per step, what the fix saves (absent: not modelled)."""
    return {"timePerStep": cost.seconds, **({"fixSaves": cost.saves} if cost.saves is not None else {}),
            "stepSeconds": cost.step_seconds, "costDevice": cost.device,
            **({"costBatch": cost.batch} if cost.batch is not None else {})}


def _fix(fix: Fix, columns: SourceColumns, root: Path) -> sarif.Fix:
    """The rule's rewrite, one artifactChange per file; offered as is, before graphlint proved it (--fix does)."""
    by_file: dict[str, list[Edit]] = {}
    for edit in fix.edits:
        by_file.setdefault(edit.path, []).append(edit)
    changes = [
        sarif.ArtifactChange(
            artifact_location=_physical(Location(path, 1, 1, 1, 1), columns, root).artifact_location,
            replacements=[
                sarif.Replacement(
                    deleted_region=sarif.Region(
                        start_line=e.line, start_column=columns.convert(path, e.line, e.column),
                        end_line=e.end_line, end_column=columns.convert(path, e.end_line, e.end_column),
                    ),
                    inserted_content=sarif.ArtifactContent(text=e.text),
                )
                for e in edits
            ],
        )
        for path, edits in by_file.items()
    ]
    return sarif.Fix(description=sarif.Message(text=fix.message), artifact_changes=changes,
                     properties={"applicability": fix.applicability})


def _physical(location: Location, columns: SourceColumns, root: Path) -> sarif.PhysicalLocation:
    path = Path(location.path)
    try:
        artifact = sarif.ArtifactLocation(uri=quote(path.relative_to(root).as_posix()), uri_base_id=SRCROOT)
    except ValueError:  # outside the project (a library): an absolute file URI
        artifact = sarif.ArtifactLocation(uri=path.as_uri())
    return sarif.PhysicalLocation(
        artifact_location=artifact,
        region=sarif.Region(
            start_line=location.line,
            start_column=columns.convert(location.path, location.line, location.column),
            end_line=location.end_line,
            end_column=columns.convert(location.path, location.end_line, location.end_column),
        ),
    )


def _to_json(value):
    """sarif-om objects as SARIF JSON: camelCase names, None left out, defaults left out except levels."""
    if attr.has(type(value)):
        out = {}
        for field in attr.fields(type(value)):
            item = getattr(value, field.name)
            if item is None:
                continue
            default = field.default
            if isinstance(default, attr.Factory):
                default = default.factory()
            if item == default and field.name not in _ALWAYS_WRITTEN:
                continue
            out[field.metadata.get("schema_property_name", field.name)] = _to_json(item)
        return out
    if isinstance(value, (list, tuple, set)):
        return [_to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_json(v) for k, v in value.items()}
    return value
