"""What a run produces: findings placed at source spans, per target, for the reporters.

Everything here is plain data (paths, numbers, strings): reporters are functions of these objects and never
see torch.

The wire format: a `TargetResult` goes into the result cache as `to_wire(result)`, a JSON-ready dict that
mirrors the dataclasses field by field (enums as their values, tuples as lists); `from_wire` rebuilds it.
(From a child process to the run it travels as itself, inside the typed messages of graphlint.run.wire.)
"""

from __future__ import annotations

import dataclasses
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
class Edit:
    """Replace the text of one span of a file: 1-based lines and code-point columns, end column exclusive."""

    path: str  # absolute path
    line: int
    column: int
    end_line: int
    end_column: int
    text: str


# A fix's applicability, declared by the rule that offers it (as ruff does): a safe fix is applied by `--fix`
# once proven on the model; an unsafe one changes something by design (the state dict, what is returned) and
# only `--unsafe-fixes` applies it; a display-only one is shown, never applied.
SAFE, UNSAFE, DISPLAY_ONLY = "safe", "unsafe", "display-only"


@dataclass(frozen=True)
class Fix:
    """A rewrite that removes a finding: what it does in words, the edits to the user's files, and its
    declared applicability (SAFE, UNSAFE or DISPLAY_ONLY)."""

    message: str
    edits: tuple[Edit, ...]
    applicability: str = SAFE


@dataclass(frozen=True)
class Cost:
    """What a finding costs in one training step on a named device (graphlint.costs): the seconds of the ops at
    its lines, what its fix would save (None where the saving is not modelled), and the step they are part of."""

    seconds: float  # the ops at the finding's lines, every occurrence, forward, backward and recomputation
    saves: float | None  # what the rule's fix would save per step; None: not modelled for this rule
    step_seconds: float  # the whole step on that device
    device: str  # the device's label
    batch: int | None = None  # the step's batch size, when the inputs have one


@dataclass(frozen=True)
class Finding:
    """One problem at one source location; `occurrences` counts how often the capture met it there.

    `suppressed` (by a `# graphlint: ignore` comment) and `baselined` (listed in the baseline file) findings
    are kept so that `--show-suppressed` and the counts in the summary can use them. `fingerprint` is
    graphlint's own identity of the finding, stable when unrelated edits move its line; `line_hash` is
    GitHub's `primaryLocationLineHash` of its line. `fix` is the rewrite the rule offers (graphlint.fix
    proves it on the model before `--fix` writes it).
    """

    rule_id: str
    rule_name: str
    severity: Severity
    message: str
    location: Location
    related: tuple[Related, ...] = ()
    occurrences: int = 1
    targets: tuple[str, ...] = ()
    suppressed: bool = False
    baselined: bool = False
    fingerprint: str = ""
    line_hash: str = ""
    fix: Fix | None = None  # the rewrite the rule offers, still to be proven on the model
    no_fix: str = ""  # why a rule that fixes such findings could not rewrite this one
    saves_bytes: int = 0  # activation memory its fix would keep less for backward, over every occurrence
    cost: Cost | None = None  # its time per step on a device the user named (check --gpu); None: none named

    def sort_key(self) -> tuple:
        loc = self.location
        return (loc.path, loc.line, loc.column, self.rule_id, self.message)


@dataclass(frozen=True)
class RuleInfo:
    """What reporters need to know about a rule, as plain data (a cached run has no rule classes)."""

    id: str
    name: str
    severity: Severity
    summary: str
    description: str  # the first paragraph of "what it flags"
    tags: tuple[str, ...]
    precision: str
    default_enabled: bool
    help_uri: str
    docs_text: str
    docs_markdown: str

    @classmethod
    def of(cls, rule) -> RuleInfo:
        """The info of a `graphlint.rule.Rule` class."""
        return cls(
            id=rule.id, name=rule.name, severity=rule.severity, summary=rule.summary,
            description=" ".join(rule.what.strip().split("\n\n")[0].split()), tags=tuple(rule.tags),
            precision=rule.precision, default_enabled=rule.default_enabled, help_uri=rule.help_uri(),
            docs_text=rule.docs_text(), docs_markdown=rule.docs_markdown(),
        )


@dataclass(frozen=True)
class TargetError:
    """Why a target could not be linted, in one line, with the fix where there is one; where it happened (the
    file and line that raised, or that does not parse) when that is known, and the stage it reached."""

    target: str
    message: str
    path: str | None = None  # absolute
    line: int | None = None
    stage: str | None = None  # graphlint.stages


@dataclass
class TargetResult:
    """The outcome of linting one target."""

    target: str
    findings: list[Finding] = field(default_factory=list)
    errors: list[TargetError] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # graphlint's own failures after detection (a fix it could not build, a span it could not find): the
    # findings are all there; the run names graphlint as the culprit once
    failures: list[str] = field(default_factory=list)
    device: str | None = None  # where the capture ran: meta, cpu or cuda
    files: tuple[str, ...] = ()  # the project's own source files the capture ran
    inputs: tuple[str, ...] = ()  # the files the result depends on (ran or imported), tracked by content
    libraries: dict[str, str] = field(default_factory=dict)  # installed distributions it ran, with versions


@dataclass
class Report:
    """The outcome of one run over several targets.

    `findings` is what reporters show: one per rule and location across all targets, without baselined
    findings, and without suppressed ones unless `show_suppressed`. `failing` is what decides the exit code.
    """

    results: list[TargetResult] = field(default_factory=list)
    project_root: str = "."
    rules: tuple[RuleInfo, ...] = ()  # the rules that ran
    severities: dict[str, Severity] = field(default_factory=dict)  # each rule's level in this run
    merged: list[Finding] | None = None  # set by the policy stage: findings merged across targets
    show_suppressed: bool = False
    fail_on: str = "warning"
    baseline: str | None = None  # the baseline file compared against, if any

    @property
    def all_findings(self) -> list[Finding]:
        if self.merged is not None:
            return self.merged
        return sorted((f for r in self.results for f in r.findings), key=Finding.sort_key)

    @property
    def findings(self) -> list[Finding]:
        return [f for f in self.all_findings if not f.baselined and (self.show_suppressed or not f.suppressed)]

    @property
    def failing(self) -> list[Finding]:
        if self.fail_on == "never":
            return []
        threshold = Severity(self.fail_on).rank
        return [f for f in self.findings if not f.suppressed and f.severity.rank >= threshold]

    def hidden(self) -> tuple[int, int]:
        """(suppressed, baselined) findings that `findings` leaves out."""
        suppressed = 0 if self.show_suppressed else sum(1 for f in self.all_findings if f.suppressed and not f.baselined)
        return suppressed, sum(1 for f in self.all_findings if f.baselined)

    @property
    def errors(self) -> list[TargetError]:
        return [e for r in self.results for e in r.errors]

    def level_of(self, rule) -> Severity:
        return self.severities.get(rule.id, rule.severity)

    def __iter__(self):
        return iter(self.findings)

    def __len__(self) -> int:
        return len(self.findings)


def to_wire(result: TargetResult) -> dict:
    """A target's result as JSON-ready data (see the module docstring)."""
    return json_ready(dataclasses.asdict(result))


def json_ready(value):
    """Plain data with enums as their values and tuples as lists, as JSON would give it back."""
    if isinstance(value, dict):
        return {key: json_ready(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(item) for item in value]
    if isinstance(value, enum.Enum):
        return value.value
    return value


def from_wire(data: dict) -> TargetResult:
    """The `TargetResult` that `to_wire` made; KeyError, TypeError or ValueError when `data` is not one."""
    return TargetResult(**{
        **data,
        "findings": [finding_from_wire(f) for f in data["findings"]],
        "errors": [TargetError(**e) for e in data["errors"]],
        "notes": list(data["notes"]),
        "failures": list(data.get("failures", ())),
        "files": tuple(data["files"]),
        "inputs": tuple(data["inputs"]),
        "libraries": dict(data["libraries"]),
    })


def _location(data: dict) -> Location:
    return Location(**data)


def finding_from_wire(data: dict) -> Finding:
    """One finding of `to_wire`'s data."""
    return Finding(**{
        **data,
        "severity": Severity(data["severity"]),
        "location": _location(data["location"]),
        "related": tuple(Related(_location(r["location"]), r["message"]) for r in data["related"]),
        "targets": tuple(data["targets"]),
        "fix": None if data["fix"] is None else Fix(data["fix"]["message"],
                                                    tuple(Edit(**e) for e in data["fix"]["edits"]),
                                                    data["fix"].get("applicability", SAFE)),
        "cost": None if data.get("cost") is None else Cost(**data["cost"]),
    })
