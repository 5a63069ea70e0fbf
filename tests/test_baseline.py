"""Baselines: only new findings fail the run, and moving code does not invalidate the baseline."""

from __future__ import annotations

import json

from conftest import run_graphlint, write
from test_several_problems import MESSY

NEW_PROBLEM = '''

class Extra(torch.nn.Module):
    def forward(self, x):
        y = torch.sigmoid(x)
        y.mul_(2)
        return y
'''


def test_a_baseline_keeps_old_findings_from_failing_and_catches_new_ones(project_dir):
    path = write(project_dir, "messy.py", MESSY.code)
    written = run_graphlint("check", "messy.py:make", "--write-baseline", "baseline.json", cwd=project_dir)
    assert written.returncode == 0, written.stderr
    assert "wrote 7 findings to the baseline baseline.json" in written.stderr
    entries = json.loads((project_dir / "baseline.json").read_text())
    assert entries["version"] == 1
    assert {e["rule"] for e in entries["findings"]} == {"GL101", "GL102", "GL201", "GL202", "GL203", "GL301"}
    assert all(e["path"] == "messy.py" for e in entries["findings"])

    clean = run_graphlint("check", "messy.py:make", "--baseline", "baseline.json", cwd=project_dir)
    assert clean.returncode == 0, clean.stdout
    assert clean.stdout == "No findings in 1 target (7 in the baseline not shown).\n"

    # Lines inserted above everything move every finding; the baseline still matches them.
    path.write_text("# a new header\n# spanning lines\n\n" + MESSY.code)
    moved = run_graphlint("check", "messy.py:make", "--baseline", "baseline.json", cwd=project_dir)
    assert moved.returncode == 0, moved.stdout

    # A new problem is reported, and only it.
    source = path.read_text().replace("        return x + torch.tensor(", "        x = Extra()(x)\n"
                                                                          "        return x + torch.tensor(")
    path.write_text(source + NEW_PROBLEM)
    new = run_graphlint("check", "messy.py:make", "--baseline", "baseline.json", "--format", "sarif", cwd=project_dir)
    assert new.returncode == 1
    results = json.loads(new.stdout)["runs"][0]["results"]
    assert [(r["ruleId"], r["baselineState"]) for r in results] == [("GL201", "new")]


def test_a_missing_or_broken_baseline_is_one_clear_error(project_dir):
    write(project_dir, "messy.py", MESSY.code)
    missing = run_graphlint("check", "messy.py:make", "--baseline", "nope.json", cwd=project_dir)
    assert missing.returncode == 2
    assert missing.stderr.strip() == ("graphlint: error: baseline nope.json does not exist; "
                                      "create it with --write-baseline nope.json")
    write(project_dir, "broken.json", "{ not json")
    broken = run_graphlint("check", "messy.py:make", "--baseline", "broken.json", cwd=project_dir)
    assert broken.returncode == 2 and "baseline broken.json cannot be read" in broken.stderr
    assert "Traceback" not in broken.stderr
