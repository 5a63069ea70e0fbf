"""What a run produces: findings placed at source spans, per target, for the reporters.

Everything here is plain data (paths, numbers, strings): reporters are functions of these objects and never
see torch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Severity(str, enum.Enum):
    """A finding's level; the values are SARIF's `level` names."""

    NOTE = "note"
    WARNING = "warning"
    ERROR = "error"

    @property
    def rank(self) -> int:
        return {"note": 0, "warning": 1, "error": 2}[self.value]


@dataclass(frozen=True)
class Location:
    """A span in a source file. Lines and columns are 1-based and count Unicode code points; the end column
    is the column just after the last character (as in SARIF)."""

    path: str  # absolute path
    line: int
    column: int
    end_line: int
    end_column: int
    first_party: bool = True


@dataclass(frozen=True)
class Related:
    """Another place that belongs to a finding: a step of the same pattern, or the library line behind it."""

    location: Location
    message: str


@dataclass(frozen=True)
class Finding:
    """One problem at one source location; `occurrences` counts how often the capture met it there."""

    rule_id: str
    rule_name: str
    severity: Severity
    message: str
    location: Location
    related: tuple[Related, ...] = ()
    occurrences: int = 1
    target: str = ""

    def sort_key(self) -> tuple:
        loc = self.location
        return (loc.path, loc.line, loc.column, self.rule_id, self.message)


@dataclass(frozen=True)
class TargetError:
    """Why a target could not be linted, in one line, with the fix where there is one."""

    target: str
    message: str


@dataclass
class TargetResult:
    """The outcome of linting one target."""

    target: str
    findings: list[Finding] = field(default_factory=list)
    errors: list[TargetError] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    device: str | None = None  # where the capture ran: meta, cpu or cuda


@dataclass
class Report:
    """The outcome of one run over several targets."""

    results: list[TargetResult] = field(default_factory=list)
    project_root: str = "."
    rules: tuple = ()  # the rule classes that ran, for reporters that describe them

    @property
    def findings(self) -> list[Finding]:
        return sorted((f for r in self.results for f in r.findings), key=Finding.sort_key)

    @property
    def errors(self) -> list[TargetError]:
        return [e for r in self.results for e in r.errors]

    def __iter__(self):
        return iter(self.findings)

    def __len__(self) -> int:
        return len(self.findings)
