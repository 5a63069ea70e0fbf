"""`--format json`: a stable shape for bots and scripts, documented in docs/json-format.md.

The shape changes only with `version`. Paths are relative to the project root (forward slashes) when the
file is inside it, absolute otherwise; lines and columns are 1-based and count code points.
"""

from __future__ import annotations

import json

import graphlint
from graphlint.files import path_in_project, writable
from graphlint.results import Cost, Fix, Location, Report

VERSION = 1


def render_json(report: Report) -> str:
    root = report.project_root
    document = {
        "version": VERSION,
        "tool": {"name": "graphlint", "version": graphlint.__version__},
        "findings": [
            {
                "rule": f.rule_id,
                "name": f.rule_name,
                "severity": f.severity.value,
                "message": f.message,
                "location": _location(f.location, root),
                "related": [{"message": r.message, "location": _location(r.location, root)} for r in f.related],
                "occurrences": f.occurrences,
                "targets": list(f.targets),
                "fingerprint": f.fingerprint,
                "suppressed": f.suppressed,
                "fix": _fix(f.fix, root) if f.fix is not None else None,
                "no_fix": f.no_fix or None,
                "saves_bytes": f.saves_bytes or None,
                **({"cost": _cost(f.cost)} if f.cost is not None else {}),  # only when a device was named
            }
            for f in report.findings
        ],
        "errors": [{"target": e.target, "message": e.message} for e in report.errors],
        "notes": [{"target": r.target, "message": n} for r in report.results for n in r.notes],
        # graphlint's own bugs after detection: every finding is above, some without a fix or exact span
        "internal_failures": [{"target": r.target, "message": f} for r in report.results for f in r.failures],
        "summary": _summary(report),
    }
    return writable(json.dumps(document, indent=2, ensure_ascii=False) + "\n")


def _location(location: Location, root: str) -> dict:
    return {"path": path_in_project(location.path, root), "line": location.line, "column": location.column,
            "end_line": location.end_line, "end_column": location.end_column}


def _fix(fix: Fix, root: str) -> dict:
    return {"message": fix.message, "applicability": fix.applicability,
            "edits": [{**_location(Location(e.path, e.line, e.column, e.end_line, e.end_column), root), "text": e.text}
                      for e in fix.edits]}


def _cost(cost: Cost) -> dict:
    return {"time_per_step": cost.seconds, "fix_saves": cost.saves, "step_seconds": cost.step_seconds,
            "device": cost.device, "batch": cost.batch}


def _summary(report: Report) -> dict:
    suppressed, baselined = report.hidden()
    return {
        "targets": len(report.results),
        "failed_targets": sum(1 for r in report.results if r.errors),
        "findings": len(report.findings),
        "failing": len(report.failing),
        "hidden_suppressed": suppressed,
        "hidden_baselined": baselined,
    }
