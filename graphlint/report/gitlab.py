"""`--format gitlab`: a GitLab Code Quality report (the Code Climate issue subset GitLab reads), for a job's
`artifacts: reports: codequality:`; GitLab shows the findings in merge requests.

Each finding is one object with `description`, `check_name`, `fingerprint` (unique per finding),
`severity` (info, minor, major, critical or blocker) and `location` (`path` relative to the project root,
which should be the repository root, and `lines.begin`).
"""

from __future__ import annotations

import hashlib
import json

from graphlint.files import path_in_project, writable
from graphlint.results import Report

# graphlint's three levels on GitLab's five: a note informs, a warning is a real cost, an error breaks training.
_SEVERITY = {"note": "info", "warning": "major", "error": "critical"}
_CATEGORY = {"performance": "Performance", "correctness": "Bug Risk"}


def render_gitlab(report: Report) -> str:
    tags = {rule.id: rule.tags for rule in report.rules}
    issues = []
    for finding in report.findings:
        if finding.suppressed:
            continue  # --show-suppressed is for people reading the report; GitLab would count them as open
        location = finding.location
        categories = sorted({_CATEGORY[t] for t in tags.get(finding.rule_id, ()) if t in _CATEGORY}) or ["Style"]
        issues.append({
            "type": "issue",
            "check_name": f"{finding.rule_id} {finding.rule_name}",
            "description": f"{finding.rule_id} {finding.message}",
            "categories": categories,
            "severity": _SEVERITY[finding.severity.value],
            # GitLab compares fingerprints between the base and the merge request: graphlint's own key survives
            # moved code; the hash keeps it short and opaque.
            "fingerprint": hashlib.md5(f"{finding.fingerprint}\0{finding.rule_id}".encode(),
                                       usedforsecurity=False).hexdigest(),
            "location": {
                "path": path_in_project(location.path, report.project_root),
                "lines": {"begin": location.line, "end": location.end_line},
            },
        })
    return writable(json.dumps(issues, indent=2, ensure_ascii=False) + "\n")
