"""Rule documentation on the command line and in the generated reference, and the README's promises."""

from __future__ import annotations

import re

import pytest

from conftest import REPO, run_graphlint
from graphlint.config import tomllib
from graphlint.engine import load_rules
from graphlint.rule import RULES_REFERENCE_URL, rule_reference

README = (REPO / "README.md").read_text(encoding="utf-8")


def test_the_rule_reference_is_generated_from_the_rules():
    committed = (REPO / "docs" / "rules.md").read_text(encoding="utf-8")
    assert committed == rule_reference(load_rules()), "regenerate: graphlint rules --format markdown > docs/rules.md"


def test_every_rules_help_uri_points_at_its_heading_in_the_reference():
    reference = (REPO / "docs" / "rules.md").read_text(encoding="utf-8")
    headings = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in re.findall(r"^## (.+)$", reference, re.M)}
    for rule in load_rules():
        base, anchor = rule.help_uri().split("#")
        assert base == RULES_REFERENCE_URL and anchor in headings


def test_the_documentation_url_is_the_one_in_pyproject():
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["urls"]["Documentation"] == RULES_REFERENCE_URL


def test_the_readme_links_the_references_and_ci_runs_its_test_command():
    assert "docs/rules.md" in README and "docs/json-format.md" in README
    commands = re.findall(r"```bash\n(.*?)```", README, re.S)[0].strip().splitlines()
    assert len(commands) == 2  # set-up on a fresh machine in two commands
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert commands[1] in ci.splitlines()
    assert "pip install -c constraints.txt" in commands[0] and "pip install --quiet -c constraints.txt" in ci


@pytest.mark.cli
def test_graphlint_rules_lists_every_rule_with_its_severity():
    result = run_graphlint("rules", cwd=REPO)
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines] == [rule.id for rule in load_rules()]
    assert lines[0].split()[1:3] == ["unfused-attention", "warning"]
    assert lines[-1].endswith("(opt-in)")


@pytest.mark.cli
def test_graphlint_rule_prints_the_docs_and_the_example_models():
    result = run_graphlint("rule", "gl201", cwd=REPO)
    assert result.returncode == 0
    for part in ("# GL201 inplace-on-saved", "## What it flags", "## Why it matters", "## Example",
                 "## Use instead", "## Example models", "Flagged: a view, .data and out= on saved tensors.",
                 "Not flagged: in-place ops on tensors nobody saved."):
        assert part in result.stdout
    assert "```" not in result.stdout


@pytest.mark.cli
def test_an_unknown_rule_is_a_clear_error():
    result = run_graphlint("rule", "GL999", cwd=REPO)
    assert result.returncode == 2
    assert result.stderr.startswith("graphlint: error: no rule 'GL999'; the rules are GL101")


@pytest.mark.cli
def test_rule_listings_do_not_need_a_target_or_a_project(tmp_path):
    result = run_graphlint("rules", cwd=tmp_path)
    assert result.returncode == 0 and "GL101" in result.stdout


def test_troubleshooting_covers_the_common_failures_in_their_own_words():
    section = README.split("## Troubleshooting", 1)[1].split("\n## ", 1)[0]
    for words in ("does not exist", "has no ':NAME'", "No module named", "syntax error at", "the factory raised",
                  "args is a Tensor, not a tuple", "the forward raised", "loss function returned a tensor of shape",
                  "captured on CPU because the forward needs real values", "backward raised",
                  "did not finish within", "cannot import torch", "needs Graphviz's dot program", "unknown key",
                  "the target called sys.exit(", "its process crashed with SIGSEGV", "internal error in graphlint"):
        assert words in section, words
