"""Policy: what the findings of all targets amount to under the project's configuration.

After every target is linted: one finding per rule and location across targets, per-rule severities,
per-file ignores, suppression comments (and GL901 for the unused ones), fingerprints, and the baseline.
"""

from __future__ import annotations

import fnmatch
import os
from collections import Counter
from dataclasses import replace

from graphlint.baseline import mark_baselined
from graphlint.config import Config
from graphlint.files import read_source, split_lines
from graphlint.fingerprint import finding_key, github_line_hashes, number_duplicates
from graphlint.locate import Locator
from graphlint.results import Finding, Location, Report, Severity
from graphlint.suppress import apply_suppressions, suppressions_in


def apply_policy(report: Report, config: Config, locator: Locator, baseline: Counter | None = None) -> None:
    """Fill in `report.merged` and `report.severities` from the per-target findings."""
    ran = {rule.id for rule in report.rules}
    report.severities = {code: Severity(level) for code, level in config.severity.items()}
    findings = _merge_across_targets(f for result in report.results for f in result.findings)
    findings = [replace(f, severity=report.severities.get(f.rule_id, f.severity)) for f in findings]
    findings = [f for f in findings if not _ignored_for_file(f, config, locator)]
    files = {file for result in report.results if not result.errors for file in result.files}
    files |= {f.location.path for f in findings}
    suppressions = [s for path in sorted(files) for s in suppressions_in(path, locator.spans)]
    findings = apply_suppressions(findings, suppressions)
    unused_rule = next((rule for rule in report.rules if rule.id == "GL901"), None)
    if unused_rule is not None:
        findings += _unused_suppressions(unused_rule, suppressions, ran - {"GL901"}, locator, report)
    findings = _fingerprinted(sorted(findings, key=Finding.sort_key), locator)
    if baseline is not None:
        findings = mark_baselined(findings, baseline)
    report.merged = findings


def _merge_across_targets(findings) -> list[Finding]:
    """Two targets that run the same code report the same finding once, naming both targets."""
    merged: dict[tuple, Finding] = {}
    for finding in findings:
        key = (finding.rule_id, finding.location)
        if key in merged:
            known = merged[key]
            merged[key] = replace(known, targets=known.targets + tuple(t for t in finding.targets
                                                                       if t not in known.targets))
        else:
            merged[key] = finding
    return list(merged.values())


def _ignored_for_file(finding: Finding, config: Config, locator: Locator) -> bool:
    path = finding.location.path
    relative = locator.project.relative(path) or path
    for pattern, codes in config.per_file_ignores.items():
        if fnmatch.fnmatch(relative, pattern) or fnmatch.fnmatch(os.path.basename(path), pattern):
            if any(code.upper() == "ALL" or finding.rule_id.startswith(code.upper()) for code in codes):
                return True
    return False


def _unused_suppressions(rule, suppressions, judged: set[str], locator: Locator, report: Report) -> list[Finding]:
    found = []
    for suppression in suppressions:
        unused = suppression.unused_codes(judged)
        if not unused:
            continue
        what = "This suppression" if unused == ("*",) else f"The suppression of {', '.join(unused)}"
        found.append(Finding(
            rule_id=rule.id,
            rule_name=rule.name,
            severity=report.severities.get(rule.id, rule.severity),
            message=f"{what} hides no finding of this run; remove it.",
            location=Location(suppression.path, suppression.line, suppression.column, suppression.line,
                              suppression.end_column, first_party=locator.project.is_first_party(suppression.path)),
            targets=tuple(result.target for result in report.results if suppression.path in result.files),
        ))
    return found


def _fingerprinted(findings: list[Finding], locator: Locator) -> list[Finding]:
    texts: dict[str, list[str]] = {}
    hashes: dict[str, list[str]] = {}
    keys = []
    for finding in findings:
        path = finding.location.path
        if path not in texts:
            source = read_source(path) or ""
            texts[path], hashes[path] = split_lines(source), github_line_hashes(source)
        lines = texts[path]
        line_text = lines[finding.location.line - 1] if finding.location.line <= len(lines) else ""
        keys.append(finding_key(finding.rule_id, locator.project.relative(path) or path, line_text))
    numbered = number_duplicates(keys)
    return [
        replace(f, fingerprint=key, line_hash=_at(hashes[f.location.path], f.location.line))
        for f, key in zip(findings, numbered, strict=True)
    ]


def _at(hashes: list[str], line: int) -> str:
    return hashes[line - 1] if 0 < line <= len(hashes) else ""
