"""Prove fixes on the model before they are written.

The target's first-party files are copied twice into a scratch folder, keeping their paths relative to the
project root; one copy gets the edits. A child of the warm parent builds the original and saves its state
dict, inputs, float64 outputs and parameter gradients; a second builds the rewritten copy, loads that state
dict strictly and compares (graphlint.run.proof). Then a third lints the rewritten copy, as `graphlint
check` would, and the fixed findings must be gone. The three are jobs of the session that asks for the proof
(a `Prover`: graphlint.session.Session), run by its runner as it runs its lint jobs, so the fix layer never
imports the session or starts a process; they are forked from the parent that linted the targets, so none of
them imports torch again; nothing of either copy is ever imported into this process.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from graphlint.config import Config
from graphlint.errors import GraphlintError, one_line, single_line
from graphlint.files import is_graphlint_file
from graphlint.rewrite.edits import EditConflict, apply_edits, compiles
from graphlint.project import Project
from graphlint.results import Edit, Finding, Report, TargetResult
from graphlint.run.wire import ProofJob
from graphlint.target import TargetSpec

CHILD_TIMEOUT = 600.0



class Prover(Protocol):
    """What a proof asks of the session that runs it: its jobs, each in a child of the session's runner."""

    def run_proof(self, job: ProofJob, timeout: float) -> str | None:
        """Run one side of the proof: None, or why the model could not be run."""

    def relint(self, target: str, project: Project, config: Config, base: Path, timeout: float) -> Report:
        """The report of linting one target in `base` as `graphlint check --no-cache --show-suppressed` would."""


@dataclass(frozen=True)
class Verdict:
    """Whether the fixes compute the same thing; when not, what differed, in one line."""

    ok: bool
    reason: str = ""
    note: str = ""  # how it was proven, when not as usual (in the model's own dtype)
    runs: bool = False  # the rewritten model built and ran where the original did (true when ok)
    differs: bool = False  # it ran and computed different outputs or gradients: known to be wrong

    def __post_init__(self) -> None:
        if self.ok:
            object.__setattr__(self, "runs", True)
            object.__setattr__(self, "differs", False)


def read_text(path: str) -> tuple[str, str]:
    """A source file's text and the encoding to write it back in (PEP 263 cookie, else UTF-8)."""
    import io
    import tokenize

    data = Path(path).read_bytes()
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    return data.decode(encoding), encoding


def rewritten_files(edits: list[Edit]) -> dict[str, str] | str:
    """Each edited file's new text, or why the edits cannot be applied (overlap, or the file would not compile)."""
    by_file: dict[str, list[Edit]] = {}
    for edit in edits:
        by_file.setdefault(edit.path, []).append(edit)
    texts = {}
    for path, file_edits in by_file.items():
        try:
            text = apply_edits(read_text(path)[0], file_edits)
        except (OSError, UnicodeDecodeError, SyntaxError) as error:
            return f"cannot read {path}: {one_line(error)}"
        except EditConflict as error:
            return str(error)
        problem = compiles(text, path)
        if problem is not None:
            return f"the rewritten file would not compile ({problem})"
        texts[path] = text
    return texts


def prove(result: TargetResult, fixed: list[Finding], project: Project, base: Path, original: list[Finding],
          prover: Prover) -> Verdict:
    """Whether applying every fix of `fixed` to the target `result` keeps its outputs and gradients and removes
    those findings; `original` are the target's findings before (to count what is left). `prover` runs the
    proof's jobs."""
    texts = rewritten_files([e for f in fixed for e in f.fix.edits])
    if isinstance(texts, str):
        return Verdict(False, texts)
    root = project.root.resolve()
    spec = TargetSpec.parse(result.target, base)
    mapped_base = _inside(spec.file.parent if spec.file is not None else spec.search_root, root)
    if mapped_base is None:
        return Verdict(False, "the target lies outside the project root, so it cannot be rebuilt in isolation")
    with tempfile.TemporaryDirectory(prefix="graphlint-fix-") as scratch:
        trees = {}
        for name in ("original", "rewritten"):
            tree = Path(scratch) / name
            for path in result.inputs:
                relative = _inside(Path(path), root)
                if relative is not None and os.path.isfile(path):
                    (tree / relative).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(path, tree / relative)
            pyproject = root / "pyproject.toml"
            tree.mkdir(parents=True, exist_ok=True)
            (tree / "pyproject.toml").write_bytes(pyproject.read_bytes() if pyproject.is_file() else b"")
            trees[name] = tree
        for path, text in texts.items():
            relative = _inside(Path(path), root)
            if relative is None:
                return Verdict(False, f"{path} lies outside the project root")
            destination = trees["rewritten"] / relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            destination.write_text(text, encoding=read_text(path)[1], newline="")
        target = _target_text(spec, root)
        record, verdict = Path(scratch) / "original.pt", Path(scratch) / "verdict.json"
        for mode, tree, answer_to in (("save", "original", None), ("compare", "rewritten", str(verdict))):
            job = ProofJob(mode, target, str(trees[tree] / mapped_base), str(record), answer_to,
                           tuple(str(folder) for folder in _moved(project.pythonpath, root, trees[tree])))
            failed = prover.run_proof(job, CHILD_TIMEOUT)
            if failed:
                return Verdict(False, f"the {tree} model could not be run ({failed})")
        answer = json.loads(verdict.read_text(encoding="utf-8"))
        if not answer["ok"]:
            return Verdict(False, answer["reason"], runs=answer.get("runs", False), differs=answer.get("differs", False))
        gone = _gone(trees["rewritten"], mapped_base, target, fixed, original, project, prover,
                     _moved(project.pythonpath, root, trees["rewritten"]))
        return Verdict(gone.ok, gone.reason, answer.get("note", ""), runs=gone.runs)


def _gone(rewritten: Path, base: Path, target: str, fixed: list[Finding], original: list[Finding], project: Project,
          prover: Prover, pythonpath: list[Path]) -> Verdict:
    """Whether linting the rewritten tree finds fewer of each fixed rule in each file, by the number fixed."""
    where = rewritten / base
    rules = sorted({f.rule_id for f in fixed})
    try:  # what `graphlint check --no-cache --fail-on never --show-suppressed --select RULES` run there reports
        tree = Project.discover(where)
        tree.add_pythonpath(pythonpath)  # the command line's --pythonpath, moved into the tree as well
        tree.add_first_party(project.root)  # so that an original file the copy imports shows among its inputs
        config = tree.config.overridden(select=tuple(rules), fail_on="never")
        report = prover.relint(target, tree, config, where, CHILD_TIMEOUT)
    except GraphlintError as error:
        return Verdict(False, f"the rewritten target could not be linted (graphlint: error: {error})")
    if report.errors:
        error = report.errors[0]
        return Verdict(False, single_line(f"the rewritten target could not be linted (graphlint: error: "
                                          f"{error.target}: {error.message})"))
    root = project.root.resolve()
    # graphlint's own files lie in the project when graphlint lints its own examples from a checkout.
    leaked = [path for result in report.results for path in result.inputs
              if _inside(Path(path), root) is not None and _inside(Path(path), rewritten.resolve()) is None
              and not is_graphlint_file(path)]
    if leaked:  # findings there would be counted as outside the tree, and the proof would hold for nothing
        return Verdict(False, f"the rewritten copy imported the original {project.relative(leaked[0])}, not its copy")
    after = Counter((f.rule_id, tree.relative(f.location.path) or f.location.path) for f in report.findings)
    before = Counter((f.rule_id, project.relative(f.location.path)) for f in original if f.rule_id in rules)
    removed = Counter((f.rule_id, project.relative(f.location.path)) for f in fixed)
    for key, count in removed.items():
        if after[key] > before[key] - count:
            return Verdict(False, f"{key[0]} is still reported in {key[1]} after the rewrite", runs=True)
    return Verdict(True)


def _target_text(spec: TargetSpec, root: Path) -> str:
    return spec.relocated(spec.file.name if spec.file is not None else spec.module)


def _moved(folders: list[Path], root: Path, tree: Path) -> list[Path]:
    """Import folders with those inside the project moved into the tree: the copy must import the copy."""
    moved = []
    for folder in folders:
        relative = _inside(folder, root)
        moved.append(folder if relative is None else tree / relative)
    return moved


def _inside(path: Path, root: Path) -> Path | None:
    try:
        return path.resolve().relative_to(root)
    except ValueError:
        return None
