"""Baselines: a file of today's findings, so that only new ones fail the run.

    graphlint check --write-baseline graphlint-baseline.json
    graphlint check --baseline graphlint-baseline.json

Entries are keyed by graphlint's fingerprint (rule, file, the flagged line's text, and which of identical
lines it is), not by line number, so moving code up or down does not invalidate them.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

from graphlint.errors import UsageError
from graphlint.results import Finding

VERSION = 1


def write_baseline(path: Path, findings: list[Finding], relative) -> None:
    entries = sorted(
        ({"rule": f.rule_id, "path": relative(f.location.path), "fingerprint": f.fingerprint, "message": f.message}
         for f in findings),
        key=lambda e: (e["path"], e["rule"], e["fingerprint"]),
    )
    text = json.dumps({"version": VERSION, "tool": "graphlint", "findings": entries}, indent=2, ensure_ascii=False)
    try:
        path.write_text(text + "\n", encoding="utf-8")
    except OSError as error:
        raise UsageError(f"cannot write the baseline {path}: {error.strerror or error}") from error


def read_baseline(path: Path) -> Counter:
    """The (rule, fingerprint) entries of a baseline file, with their counts."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise UsageError(f"baseline {path} does not exist; create it with --write-baseline {path}") from error
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UsageError(f"baseline {path} cannot be read ({error}); write it again with --write-baseline") from error
    if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("findings"), list):
        raise UsageError(f"baseline {path} is not a graphlint baseline (version {VERSION}); "
                         "write it again with --write-baseline")
    try:
        return Counter((entry["rule"], entry["fingerprint"]) for entry in data["findings"])
    except (TypeError, KeyError) as error:
        raise UsageError(f"baseline {path} has an entry without rule and fingerprint; "
                         "write it again with --write-baseline") from error


def mark_baselined(findings: list[Finding], entries: Counter) -> list[Finding]:
    remaining = Counter(entries)
    marked = []
    for finding in findings:
        key = (finding.rule_id, finding.fingerprint)
        if remaining[key] > 0:
            remaining[key] -= 1
            finding = replace(finding, baselined=True)
        marked.append(finding)
    return marked
