"""Rules name their fixers lazily (graphlint.rule.FixerAt): loading the rules imports no fixer, and a run with
nothing to locate never imports libcst, in the command's process or in any child it starts."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

from conftest import REPO, write
from graphlint.rule import FixerAt
from test_cli import ATTENTION, CLEAN

# Runs the command with an import hook, inherited by forked children, that notes each process importing libcst.
WATCHING_LIBCST = """
import os, sys

class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "libcst":
            with open(os.environ["GRAPHLINT_TEST_LIBCST"], "a") as noted:
                noted.write(f"{os.getpid()}\\n")
        return None

sys.meta_path.insert(0, Watch())
from graphlint.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _fixers_named_in_rules() -> list[str]:
    named = []
    for path in sorted((REPO / "rules").glob("gl*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "FixerAt"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                named.append(node.args[0].value)
    return named


def test_every_fixer_a_rule_names_can_be_imported():
    named = _fixers_named_in_rules()
    assert {"GL101", "GL105", "GL106", "GL107", "GL201", "GL204"} <= {
        path.stem[:5].upper() for path in (REPO / "rules").glob("gl*.py") if "FixerAt(" in path.read_text("utf-8")}
    assert [where for where in named if not callable(FixerAt(where).function)] == []


def test_a_fixer_at_passes_its_keywords_beside_the_site():
    fixer = FixerAt("textwrap:indent", prefix="> ")
    assert fixer("two\nlines\n") == "> two\n> lines\n"
    with pytest.raises(ValueError, match="package.module:function"):
        FixerAt("graphlint.errors.one_line")


@pytest.mark.cli
def test_loading_the_rules_imports_no_fixer_and_no_libcst():
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys; from graphlint.engine import load_rules; load_rules(); "
                               "print(sorted(m for m in sys.modules if m == 'libcst' "
                               "or m.startswith(('graphlint.fix', 'graphlint.rewrite'))))"],
        capture_output=True, text=True, timeout=300)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "[]"


@pytest.mark.cli
@pytest.mark.parametrize(("source", "exit_code", "imports_libcst"), [(CLEAN, 0, False), (ATTENTION, 1, True)],
                         ids=["no-finding", "a-finding-to-locate"])
def test_check_imports_libcst_only_to_locate_a_finding(project_dir, tmp_path, source, exit_code, imports_libcst):
    """The second case shows that the hook sees an import of libcst, in whichever process it happens."""
    write(project_dir, "model.py", source)
    noted = tmp_path / "libcst-imported.txt"
    done = subprocess.run([sys.executable, "-c", WATCHING_LIBCST, "check", "--no-cache", "model.py:make"],
                          cwd=project_dir, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "GRAPHLINT_TEST_LIBCST": str(noted)})
    assert done.returncode == exit_code, done.stdout + done.stderr
    assert noted.exists() is imports_libcst
