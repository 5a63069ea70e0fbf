"""The share of GL201 findings whose fix is proven, over GL201's rule examples and the test models that have one.

    python benchmarks/gl201_fix_share.py            # one line a finding, then the share
    python benchmarks/gl201_fix_share.py --refusals # only the findings left alone, grouped by reason

The models: GL201's BAD examples, the whole model files written as strings in the GL201 and fix tests, and the
cases of tests/test_gl201*.py built from their templates. All are linted in one run with only GL201 selected;
each finding is then fixed (proven as `--fix` proves it: outputs and gradients in float64, the rewritten copy
linted again) or carries a reason: the fixer's (`no fix: ...`) or the proof's (`refused: ...`).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TEST_FILES = ("test_gl201*.py", "test_fix*.py", "test_several_problems.py", "test_nothing_lost.py")


def models() -> dict[str, str]:
    """{file name: source} of every model."""
    sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "benchmarks")]
    from fix_outputs import model_strings
    from graphlint.engine import load_rules

    found = {}
    rule = next(r for r in load_rules() if r.id == "GL201")
    for number, example in enumerate(rule.bad_examples):
        found[f"example{number}.py"] = example.code
    for pattern in TEST_FILES:
        for path in sorted((REPO / "tests").glob(pattern)):
            for number, source in enumerate(model_strings(path)):
                if "{body}" not in source:
                    found[f"{path.stem}_{number}.py"] = source
    for path in sorted((REPO / "tests").glob("test_gl201*.py")):  # the cases built from a template
        module = importlib.import_module(path.stem)
        for table, value in vars(module).items():
            if table.isupper() and isinstance(value, dict) and hasattr(module, "model_source"):
                for number, case in enumerate(value.values()):
                    body = case[0] if isinstance(case, tuple) else case
                    if isinstance(body, str):
                        source = body if "def make(" in body else module.model_source(body)
                        found[f"{path.stem}_{table.lower()}_{number}.py"] = source
    return found


def measure() -> list[tuple[str, str, str]]:
    """(file:line, the written line, "fixed" or the reason there is none) for every GL201 finding."""
    from graphlint.config import Config
    from graphlint.project import Project
    from graphlint.session import Session

    with tempfile.TemporaryDirectory(prefix="graphlint-gl201-share-") as scratch:
        root = Path(scratch)
        (root / "pyproject.toml").write_text('[project]\nname = "cases"\nversion = "0"\n', encoding="utf-8")
        for name, source in models().items():
            (root / name).write_text(source, encoding="utf-8")
        project = Project(root=root, first_party_folders=[root])
        targets = [f"{p}:make" for p in sorted(root.glob("*.py"))]
        session = Session(targets, project, Config(select=("GL201",)))
        report = session.report(session.results(targets))
        plan = session.fixes(report, unsafe=False)
        refused = dict(plan.refused)
        rows = []
        for finding in report.findings:
            if finding.rule_id != "GL201":
                continue
            path = Path(finding.location.path)
            line = path.read_text(encoding="utf-8").splitlines()[finding.location.line - 1].strip()
            if finding.fix is None:
                verdict = f"no fix: {finding.no_fix}"
            elif finding in refused:
                verdict = f"refused: {refused[finding]}"
            else:
                verdict = "fixed"
            rows.append((f"{path.name}:{finding.location.line}", line, verdict))
        return sorted(rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--refusals", action="store_true", help="only the findings without a proven fix, by reason")
    arguments = parser.parse_args()
    rows = measure()
    if arguments.refusals:
        for reason, count in Counter(v for _, _, v in rows if v != "fixed").most_common():
            print(f"{count:3d}  {reason}")
            for where, line, _ in (r for r in rows if r[2] == reason):
                print(f"       {where}: {line}")
    else:
        for where, line, verdict in rows:
            print(f"{where}: {line}  ->  {verdict}")
    fixed = sum(v == "fixed" for _, _, v in rows)
    print(f"GL201 findings with a proven fix: {fixed} of {len(rows)} ({100 * fixed / max(len(rows), 1):.0f}%)")
