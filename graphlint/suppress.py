"""Suppression comments: `# graphlint: ignore[GL101]` on the flagged line or alone on the line above,
`# graphlint: ignore` for every rule, and `# graphlint: ignore-file[GL203]` (or without codes) anywhere in a
file for the whole file. Comments are read with libcst, so text inside strings never counts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from graphlint.locate.spans import SourceSpans
from graphlint.results import Finding

_DIRECTIVE = re.compile(r"#\s*graphlint:\s*(?P<kind>ignore-file|ignore)\b(?:\[(?P<codes>[^\]]*)\])?")


@dataclass
class Suppression:
    path: str
    line: int
    column: int
    end_column: int
    codes: tuple[str, ...] | None  # None: every rule
    whole_file: bool
    alone_on_line: bool
    used: set[str] = field(default_factory=set)  # rule IDs it suppressed

    def covers(self, finding: Finding) -> bool:
        location = finding.location
        if location.path != self.path or (self.codes is not None and finding.rule_id not in self.codes):
            return False
        if self.whole_file:
            return True
        if self.alone_on_line:
            return self.line == location.line - 1
        return location.line <= self.line <= location.end_line

    def unused_codes(self, judged: set[str]) -> tuple[str, ...]:
        """Codes (of the rules that ran, `judged`) that suppressed nothing; ("*",) for an unused bare ignore."""
        if self.codes is None:
            return () if self.used or not judged else ("*",)
        return tuple(code for code in self.codes if code in judged and code not in self.used)


def suppressions_in(path: str, spans: SourceSpans) -> list[Suppression]:
    found = []
    for line, column, end_column, text, alone in spans.comments(path):
        match = _DIRECTIVE.search(text)
        if match is None:
            continue
        codes = match.group("codes")
        parsed = None if codes is None else tuple(c.strip().upper() for c in re.split(r"[,\s]+", codes) if c.strip())
        found.append(Suppression(path, line, column, end_column, parsed, match.group("kind") == "ignore-file", alone))
    return found


def apply_suppressions(findings: list[Finding], suppressions: list[Suppression]) -> list[Finding]:
    """The findings with `suppressed` set where a comment covers them; each comment records what it used."""
    by_path: dict[str, list[Suppression]] = {}
    for suppression in suppressions:
        by_path.setdefault(suppression.path, []).append(suppression)
    marked = []
    for finding in findings:
        covering = [s for s in by_path.get(finding.location.path, ()) if s.covers(finding)]
        for suppression in covering:
            suppression.used.add(finding.rule_id)
        marked.append(replace(finding, suppressed=True) if covering else finding)
    return marked
