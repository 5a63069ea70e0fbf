"""Policy: what the findings of all targets amount to under the project's configuration.

After every target is linted: one finding per rule and location across targets, per-rule severities,
per-file ignores, suppression comments (and, for the unused ones, the rule tagged UNUSED_SUPPRESSION_TAG: GL901),
fingerprints, and the baseline.
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
from graphlint.project import Project
from graphlint.results import Finding, Location, Report, Severity
from graphlint.tags import UNUSED_SUPPRESSION_TAG


def apply_policy(report: Report, config: Config, project: Project, baseline: Counter | None = None,
                 spans=None) -> None:
    """Fill in `report.merged` and `report.severities` from the per-target findings. `spans` is the run's
    `SourceSpans` when it has one (files already parsed); without it, files are parsed only if needed."""
    ran = {rule.id for rule in report.rules}
    sources = _Sources()
    report.severities = {code: Severity(level) for code, level in config.severity.items()}
    findings = _merge_across_targets(f for result in report.results for f in result.findings)
    findings = [replace(f, severity=report.severities.get(f.rule_id, f.severity)) for f in findings]
    findings = [f for f in findings if not _ignored_for_file(f, config, project)]
    unused_rule = next((rule for rule in report.rules if UNUSED_SUPPRESSION_TAG in rule.tags), None)
    files = {f.location.path for f in findings}
    if unused_rule is not None:
        files |= {file for result in report.results if not result.errors for file in result.files}
    suppressions = _suppressions(sorted(files), spans, sources)
    if suppressions:
        from graphlint.suppress import apply_suppressions

        findings = apply_suppressions(findings, suppressions)
    if unused_rule is not None:
        findings += _unused_suppressions(unused_rule, suppressions, ran - {unused_rule.id}, project, report)
    findings = _fingerprinted(sorted(findings, key=Finding.sort_key), project, sources)
    if baseline is not None:
        findings = mark_baselined(findings, baseline)
    report.merged = findings


class _Sources(dict):
    """Each file's text, read once per run."""

    def __missing__(self, path: str) -> str:
        text = self[path] = read_source(path) or ""
        return text


def _suppressions(paths: list[str], spans, sources: _Sources) -> list:
    """The suppression comments of these files; libcst parses only files that mention `graphlint:`."""
    candidates = [path for path in paths if "graphlint:" in sources[path]]
    if not candidates:
        return []
    from graphlint.suppress import suppressions_in

    if spans is None:
        from graphlint.locate.spans import SourceSpans

        spans = SourceSpans()
    return [s for path in candidates for s in suppressions_in(path, spans)]


def _merge_across_targets(findings) -> list[Finding]:
    """Two targets that run the same code report the same finding once, naming both targets; its cost is the one
    of the target where it costs the most time per step (what `--sort cost` ranks and a user pays at worst)."""
    merged: dict[tuple, Finding] = {}
    for finding in findings:
        key = (finding.rule_id, finding.location)
        if key in merged:
            known = merged[key]
            costliest = known.cost
            if finding.cost is not None and (costliest is None or finding.cost.seconds > costliest.seconds):
                costliest = finding.cost
            merged[key] = replace(known, targets=known.targets + tuple(t for t in finding.targets
                                                                       if t not in known.targets), cost=costliest)
        else:
            merged[key] = finding
    return list(merged.values())


def _ignored_for_file(finding: Finding, config: Config, project: Project) -> bool:
    path = finding.location.path
    relative = project.relative(path) or path
    for pattern, codes in config.per_file_ignores.items():
        if fnmatch.fnmatch(relative, pattern) or fnmatch.fnmatch(os.path.basename(path), pattern):
            if any(code.upper() == "ALL" or finding.rule_id.startswith(code.upper()) for code in codes):
                return True
    return False


def _unused_suppressions(rule, suppressions, judged: set[str], project: Project, report: Report) -> list[Finding]:
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
                              suppression.end_column, first_party=project.is_first_party(suppression.path)),
            targets=tuple(result.target for result in report.results if suppression.path in result.files),
        ))
    return found


def _fingerprinted(findings: list[Finding], project: Project, sources: _Sources) -> list[Finding]:
    texts: dict[str, list[str]] = {}
    hashes: dict[str, list[str]] = {}
    keys = []
    for finding in findings:
        path = finding.location.path
        if path not in texts:
            texts[path], hashes[path] = split_lines(sources[path]), github_line_hashes(sources[path])
        lines = texts[path]
        line_text = lines[finding.location.line - 1] if finding.location.line <= len(lines) else ""
        keys.append(finding_key(finding.rule_id, project.relative(path) or path, line_text))
    numbered = number_duplicates(keys)
    return [
        replace(f, fingerprint=key, line_hash=_at(hashes[f.location.path], f.location.line))
        for f, key in zip(findings, numbered, strict=True)
    ]


def _at(hashes: list[str], line: int) -> str:
    return hashes[line - 1] if 0 < line <= len(hashes) else ""
