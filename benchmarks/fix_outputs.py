"""What the fix layer makes of every model the project has at hand, saved so that two versions can be diffed.

    python benchmarks/fix_outputs.py OUT            # then, on the other version: ... OTHER; diff -r OUT OTHER

The models: every rule's example models (linted with that rule selected and the example's settings), the
example project under examples/, and each whole model file written as a string in the fix tests (those that
define `make()`). For each group, the real command runs twice over all its models in a scratch project:
`--format json` (every finding's fix edits, or why there is none) and `--diff --unsafe-fixes` (the rewritten
files, and each proof's verdict on stderr). A refactor of the fix layer must leave OUT byte for byte the same.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIX_RULES = "GL101,GL105,GL106,GL107,GL201,GL204"  # the rules that offer fixes
# Test modules whose model strings exercise the fixers.
TEST_FILES = ("test_fix*.py", "test_gl101*.py", "test_gl105*.py", "test_gl106*.py", "test_gl201*.py",
              "test_several_problems.py", "test_kernel_rules.py", "test_nothing_lost.py", "test_process_layer.py",
              "test_rule_roles.py")


def model_strings(path: Path) -> list[str]:
    """The module's string constants (and `A + B` of them, and textwrap.dedent of one) that define `make()`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    named: dict[str, str] = {}

    def value(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return named.get(node.id)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = value(node.left), value(node.right)
            return left + right if left is not None and right is not None else None
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "dedent" and node.args:
            inner = value(node.args[0])
            return textwrap.dedent(inner) if inner is not None else None
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            found = value(node.value)
            if found is not None:
                named[node.targets[0].id] = found
    strings = [value(node) for node in ast.walk(tree) if isinstance(node, (ast.Constant, ast.BinOp, ast.Call))]
    return list(dict.fromkeys(textwrap.dedent(s).lstrip() for s in strings if s and "def make(" in s))


def groups() -> list[tuple[str, list[str], dict[str, str]]]:
    """(group name, command-line options, {file name: source}), the targets being each file's `make`."""
    sys.path.insert(0, str(REPO))
    from graphlint.engine import load_rules

    found: dict[tuple[str, tuple[str, ...]], dict[str, str]] = {}
    for rule in load_rules():  # one group per rule (and settings), one file per example
        for kind, examples in (("bad", rule.bad_examples), ("good", rule.good_examples)):
            for number, example in enumerate(examples):
                options = ("--select", rule.id)
                budget = dict(example.settings).get("memory_budget")
                if budget is not None:
                    options += ("--memory-budget", str(budget))
                found.setdefault((rule.id, options), {})[f"{kind}{number}.py"] = example.code
    named = [(rule_id + "".join(options[2:]), list(options), files) for (rule_id, options), files in found.items()]
    tests = {}
    for pattern in TEST_FILES:
        for path in sorted((REPO / "tests").glob(pattern)):
            for number, source in enumerate(model_strings(path)):
                tests[f"{path.stem}_{number}.py"] = source
    named.append(("tests", ["--select", FIX_RULES, "--jobs", "2"], tests))
    named.append(("examples", ["--select", FIX_RULES],
                  {"model.py": (REPO / "examples" / "attention" / "model.py").read_text(encoding="utf-8")}))
    return named


def run(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "graphlint", "check", "--no-cache", "--fail-on", "never"]
    for name, options, files in groups():
        with tempfile.TemporaryDirectory(prefix="graphlint-fix-outputs-") as scratch:
            root = Path(scratch)
            (root / "pyproject.toml").write_text('[project]\nname = "cases"\nversion = "0"\n', encoding="utf-8")
            for file, source in files.items():
                (root / file).write_text(source, encoding="utf-8")
            target = "make_model" if name == "examples" else "make"
            targets = [f"{file}:{target}" for file in sorted(files)]
            for mode, extra in (("json", ["--format", "json"]), ("diff", ["--diff", "--unsafe-fixes"])):
                done = subprocess.run([*command, *options, *extra, *targets], cwd=root, capture_output=True,
                                      text=True, timeout=3600)
                stdout, stderr = (text.replace(scratch, "<cases>") for text in (done.stdout, done.stderr))
                # torch's profiler (GL108's examples run it) logs a time and a process id on stderr
                stderr = "".join(line for line in stderr.splitlines(keepends=True) if not line.startswith("USDT:"))
                if mode == "json" and stdout.startswith("{"):  # else the command failed: its output is kept
                    report = json.loads(stdout)
                    stdout = json.dumps({"findings": report["findings"], "errors": report["errors"],
                                         "internal_failures": report["internal_failures"]}, indent=1, sort_keys=True)
                (out / f"{name}.{mode}").write_text(f"exit {done.returncode}\n{stdout}\n--- stderr\n{stderr}",
                                                    encoding="utf-8")
        print(name, len(files), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder to write one file per group and mode into")
    run(parser.parse_args().out)
