"""`--fix`, `--diff` and `--unsafe-fixes`: which findings' fixes to apply, proving them per target, and
writing the files at the end.

Suppressed and baselined findings are never fixed. Each fix declares its applicability (graphlint.results):
a safe one is applied when the proof (graphlint.fix.prove) passed on every target whose finding it is; one that
could not be proven, and one declared unsafe, only with `--unsafe-fixes`; a display-only one never. Declared
unsafe fixes are proven too, each alone, so the report says whether they compute the same on the model; and no
fix whose rewritten model does not build or run, or whose proof found different outputs or gradients, is ever
written, `--unsafe-fixes` or not: such a fix is known to be wrong.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from graphlint.rewrite.edits import unified_diff
from graphlint.errors import UsageError, one_line
from graphlint.fix.prove import Prover, Verdict, prove, read_text, rewritten_files
from graphlint.project import Project
from graphlint.results import SAFE, UNSAFE, Finding, Report


@dataclass
class FixPlan:
    """What `--fix` does: the findings whose fixes are applied, those refused (with why), and the new texts."""

    applied: list[Finding] = field(default_factory=list)
    refused: list[tuple[Finding, str]] = field(default_factory=list)
    notes: list[tuple[Finding, str]] = field(default_factory=list)  # how an applied fix was proven, when unusual
    failures: list[str] = field(default_factory=list)  # graphlint's own failures while proving or applying
    texts: dict[str, str] = field(default_factory=dict)  # path -> the file's new text
    # refused even with --unsafe-fixes: the rewritten model fails, or its proof found different results
    broken: list[Finding] = field(default_factory=list)

    def diffs(self, project: Project) -> str:
        return "".join(unified_diff(read_text(path)[0], text, project.relative(path) or path)
                       for path, text in sorted(self.texts.items()))

    def write(self) -> list[str]:
        """Write the changed files; the paths written."""
        written = []
        for path, text in sorted(self.texts.items()):
            before, encoding = read_text(path)
            if text != before:
                try:
                    Path(path).write_bytes(text.encode(encoding))
                except OSError as error:
                    raise UsageError(f"cannot write the fixed {path}: {error.strerror or error}") from error
                written.append(path)
        return written


def _prove(result, fixes, project, base, original, prover: Prover, failures: list[str]) -> Verdict:
    try:
        return prove(result, fixes, project, base, original, prover)
    except Exception as error:  # a bug in graphlint: the fix is refused, the finding stays, the run goes on
        failures.append(f"proving a fix for {result.target}: {one_line(error)}")
        return Verdict(False, f"graphlint could not prove this fix: {one_line(error)}; please report it with --debug")


def fixable(report: Report) -> list[Finding]:
    """The findings whose fixes may be applied: offered, in first-party files, neither suppressed nor baselined."""
    return [f for f in report.all_findings if f.fix is not None and f.fix.applicability in (SAFE, UNSAFE)
            and not f.suppressed and not f.baselined and f.location.first_party]


def plan_fixes(report: Report, project: Project, base: Path, unsafe: bool, prover: Prover) -> FixPlan:
    """Prove each target's fixes (all together, else one by one, then the ones that passed together again), each
    proof's jobs run by `prover` (the session's runner: graphlint.session.Session)."""
    candidates = fixable(report)
    failures: list[str] = []

    def proved(result, fixes, original) -> Verdict:
        return _prove(result, fixes, project, base, original, prover, failures)

    declared = [f for f in candidates if f.fix.applicability == UNSAFE]
    failed: dict[Finding, str] = {}
    broken: set[Finding] = set()  # never written: the rewritten model does not build or run, or computes otherwise

    def refuse(finding: Finding, verdict: Verdict) -> None:
        failed.setdefault(finding, verdict.reason)
        if not verdict.runs or verdict.differs:
            broken.add(finding)

    notes: dict[Finding, str] = {}
    for result in report.results:
        mine = [f for f in candidates if result.target in f.targets and f not in failed and f not in declared]
        if not mine or result.errors:
            for finding in mine:
                refuse(finding, Verdict(False, "the target could not be linted"))
            continue
        original = [f for f in report.all_findings if result.target in f.targets]
        verdict = proved(result, mine, original)
        if verdict.ok:
            notes.update({f: verdict.note for f in mine if verdict.note})
            continue
        if len(mine) == 1:
            refuse(mine[0], verdict)
            continue
        passed = []
        for finding in mine:
            alone = proved(result, [finding], original)
            if alone.ok:
                passed.append(finding)
                if alone.note:
                    notes[finding] = alone.note
            else:
                refuse(finding, alone)
        together = proved(result, passed, original) if len(passed) > 1 else Verdict(True)
        if not together.ok:
            for finding in passed:
                refuse(finding, Verdict(False, f"fine alone, but not together with the target's other fixes "
                                               f"({together.reason})", runs=together.runs, differs=together.differs))
    for finding in declared:  # proven alone, on each of its targets, so the user knows what --unsafe-fixes writes
        verdicts = [proved(result, [finding], [f for f in report.all_findings if result.target in f.targets])
                    for result in report.results if result.target in finding.targets and not result.errors]
        verdicts = verdicts or [Verdict(False, "the target could not be linted")]
        worst = next((v for v in verdicts if not v.runs or v.differs), None) or \
            next((v for v in verdicts if not v.ok), None)
        declared_as = f"declared unsafe: {finding.fix.message}"
        if worst is None:
            failed[finding] = f"{declared_as}; proven on the model: the same outputs and gradients"
        else:
            refuse(finding, Verdict(False, f"{declared_as}; on the model: {worst.reason}", runs=worst.runs,
                                    differs=worst.differs))
    plan = FixPlan(failures=failures, broken=[f for f in candidates if f in broken])
    plan.notes = [(f, note) for f, note in notes.items() if f not in failed]
    for finding in candidates:
        if finding in failed:
            plan.refused.append((finding, failed[finding]))
        if finding not in failed or (unsafe and finding not in broken):
            plan.applied.append(finding)
    try:
        texts = rewritten_files([e for f in plan.applied for e in f.fix.edits])
        if isinstance(texts, str):  # the unsafe fixes of several targets collide: keep only the proven ones
            plan.applied = [f for f in plan.applied if f not in failed]
            texts = rewritten_files([e for f in plan.applied for e in f.fix.edits])
    except Exception as error:  # a bug in graphlint: nothing is written, every finding stays in the report
        failures.append(f"applying the fixes: {one_line(error)}")
        reason = f"graphlint could not apply this fix: {one_line(error)}; please report it with --debug"
        plan.refused = [(f, failed.get(f, reason)) for f in candidates]
        plan.applied, texts = [], {}
    plan.texts = texts if isinstance(texts, dict) else {}
    return plan

