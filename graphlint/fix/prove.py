"""Prove fixes on the model before they are written.

The target's first-party files are copied twice into a scratch folder, keeping their paths relative to the
project root; one copy gets the edits. A child process builds the original and saves its state dict, inputs,
float64 outputs and parameter gradients; a second builds the rewritten copy, loads that state dict strictly
and compares (graphlint.fix.model_run). Then the real `graphlint check` lints the rewritten copy, and the
fixed findings must be gone. Nothing of either copy is ever imported into this process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from graphlint.errors import one_line
from graphlint.fix.edits import EditConflict, apply_edits, compiles
from graphlint.project import Project
from graphlint.results import Edit, Finding, TargetResult
from graphlint.target import TargetSpec

CHILD_TIMEOUT = 600.0


@dataclass(frozen=True)
class Verdict:
    """Whether the fixes compute the same thing; when not, what differed, in one line."""

    ok: bool
    reason: str = ""


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


def prove(result: TargetResult, fixed: list[Finding], project: Project, base: Path, original: list[Finding]) -> Verdict:
    """Whether applying every fix of `fixed` to the target `result` keeps its outputs and gradients and removes
    those findings; `original` are the target's findings before (to count what is left)."""
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
        for mode, tree, extra in (("save", "original", []), ("compare", "rewritten", [str(verdict)])):
            where = trees[tree] / mapped_base
            failed = _child(["-m", "graphlint.fix.model_run", mode, target, str(where), str(record), *extra], where)
            if failed:
                return Verdict(False, f"the {tree} model could not be run ({failed})")
        answer = json.loads(verdict.read_text(encoding="utf-8"))
        if not answer["ok"]:
            return Verdict(False, answer["reason"])
        return _gone(trees["rewritten"], trees["rewritten"] / mapped_base, target, fixed, original, project)


def _gone(tree: Path, where: Path, target: str, fixed: list[Finding], original: list[Finding],
          project: Project) -> Verdict:
    """Whether linting the rewritten tree finds fewer of each fixed rule in each file, by the number fixed."""
    rules = sorted({f.rule_id for f in fixed})
    command = ["-m", "graphlint", "check", "--format", "json", "--no-cache", "--fail-on", "never",
               "--show-suppressed", "--select", ",".join(rules), target]
    completed = _run(command, where)
    if completed.returncode != 0:
        return Verdict(False, f"the rewritten target could not be linted ({_last_line(completed.stderr)})")
    after = Counter((f["rule"], f["location"]["path"]) for f in json.loads(completed.stdout)["findings"])
    before = Counter((f.rule_id, project.relative(f.location.path)) for f in original if f.rule_id in rules)
    removed = Counter((f.rule_id, project.relative(f.location.path)) for f in fixed)
    for key, count in removed.items():
        if after[key] > before[key] - count:
            return Verdict(False, f"{key[0]} is still reported in {key[1]} after the rewrite")
    return Verdict(True)


def _target_text(spec: TargetSpec, root: Path) -> str:
    return spec.relocated(spec.file.name if spec.file is not None else spec.module)


def _inside(path: Path, root: Path) -> Path | None:
    try:
        return path.resolve().relative_to(root)
    except ValueError:
        return None


def _run(arguments: list[str], cwd: Path) -> subprocess.CompletedProcess:
    # PYTHONSAFEPATH: the scratch folder is the working directory, and its files must not shadow the modules
    # graphlint imports (the child puts the target's folder on sys.path itself, as a capture does).
    return subprocess.run([sys.executable, *arguments], cwd=cwd, capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT,
                          env={**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONSAFEPATH": "1"})


def _child(arguments: list[str], cwd: Path) -> str | None:
    """None when the child succeeded, else its last line of stderr."""
    try:
        completed = _run(arguments, cwd)
    except subprocess.TimeoutExpired:
        return f"no answer in {CHILD_TIMEOUT:.0f} s"
    return None if completed.returncode == 0 else _last_line(completed.stderr)


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"
