"""Rules name their fixers lazily (graphlint.rule.LazyFixer): loading the rules imports no fixer, and a run with
nothing to locate never imports libcst, in the command's process or in any child it starts; and locating a finding
that has no fix does not import libcst's matchers (about 0.2 s), which only rewriting needs; a text report does not
import SARIF's object model (about 0.05 s), which only the SARIF and rdjson formats need."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import WITHOUT_COMPILE, write
from graphlint.engine import load_rules
from graphlint.rule import LazyFixer
from test_cli import ATTENTION, CLEAN

# Runs the command with an import hook, inherited by forked children, that notes each import of libcst, of its
# matchers and of sarif_om, in whichever process.
WATCHING_LIBCST = """
import os, sys

class Watch:
    def find_spec(self, name, path=None, target=None):
        if name in ("libcst", "libcst.matchers", "sarif_om"):
            with open(os.environ["GRAPHLINT_TEST_LIBCST"], "a") as noted:
                noted.write(f"{name}\\n")
        return None

sys.meta_path.insert(0, Watch())
from graphlint.cli import main
sys.exit(main(sys.argv[1:]))
"""


# The rules whose findings --fix rewrites (benchmarks/fix_outputs.py lists the same).
FIXABLE = {"GL101", "GL105", "GL106", "GL107", "GL201", "GL204"}


def _fixers_of(rule) -> list[LazyFixer]:
    return [value for value in vars(sys.modules[rule.__module__]).values() if isinstance(value, LazyFixer)]


def test_every_rule_with_a_fix_names_fixers_that_import():
    """A fixer renamed or moved without its rule fails here, not when a user's finding is fixed."""
    named = {rule.id: _fixers_of(rule) for rule in load_rules() if rule.fixes}
    assert FIXABLE <= {rule_id for rule_id, fixers in named.items() if fixers}
    assert [repr(fixer) for fixers in named.values() for fixer in fixers if not callable(fixer.function)] == []


def test_a_fixer_whose_import_fails_fails_when_loaded_not_when_declared():
    @LazyFixer
    def missing():
        from textwrap import no_such_fixer  # type: ignore[attr-defined]

        return no_such_fixer

    with pytest.raises(ImportError, match="no_such_fixer"):
        missing("the site")


def test_a_lazy_fixer_passes_its_keywords_beside_the_site():
    @LazyFixer
    def indent():
        from textwrap import indent

        return indent

    fixer = indent.bound(prefix="> ")
    assert fixer("two\nlines\n") == "> two\n> lines\n"
    assert indent.keywords == {} and fixer.load is indent.load
    assert repr(fixer).endswith(".indent, prefix='> ')")


@pytest.mark.cli
def test_loading_the_rules_imports_no_fixer_and_no_libcst():
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys; from graphlint.engine import load_rules; load_rules(); "
                               "print(sorted(m for m in sys.modules if m == 'libcst' "
                               "or m.startswith(('graphlint.fix', 'graphlint.rewrite')) "
                               "or m.startswith('graphlint.rules.') and m.endswith('.fix')))"],
        capture_output=True, text=True, timeout=300)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "[]"


# A finding of a rule without a fix (GL104: a host tensor copied to the device in every forward).
HOST_TENSOR = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x) + torch.arange(8).to(x.device)


def make():
    return Net(), (torch.randn(2, 8),)
"""


@pytest.mark.cli
@pytest.mark.parametrize(("source", "rule", "imported"), [
    (CLEAN, None, set()), (HOST_TENSOR, "GL104", {"libcst"}), (ATTENTION, "GL101", {"libcst", "libcst.matchers"})],
    ids=["no-finding", "a-finding-without-a-fix", "a-finding-with-a-fix"])
def test_check_imports_libcst_only_to_locate_a_finding_and_its_matchers_only_for_a_fix(project_dir, tmp_path, source,
                                                                                       rule, imported):
    """The last case shows that the hook sees both imports, in whichever process they happen. No case, all text
    reports, imports sarif_om."""
    write(project_dir, "model.py", source)
    noted = tmp_path / "libcst-imported.txt"
    done = subprocess.run([sys.executable, "-c", WATCHING_LIBCST, "check", "--no-cache", *WITHOUT_COMPILE,
                           "model.py:make"], cwd=project_dir, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "GRAPHLINT_TEST_LIBCST": str(noted)})
    assert done.returncode == (rule is not None), done.stdout + done.stderr
    assert (rule or "No findings") in done.stdout and ("[*]" in done.stdout) is (rule == "GL101"), done.stdout
    assert set(noted.read_text().split() if noted.exists() else ()) == imported
