"""Rule documentation on the command line and in the generated reference, and the README's promises."""

from __future__ import annotations

import re

import pytest

from conftest import REPO, run_graphlint
from graphlint.cli_reference import RULES_BEGIN, RULES_END, options_reference, readme_rules_block, rules_table
from graphlint.config import tomllib
from graphlint.engine import load_rules
from graphlint.rule import RULES_REFERENCE_URL, rule_reference

README = (REPO / "README.md").read_text(encoding="utf-8")
CONTRIBUTING = (REPO / "CONTRIBUTING.md").read_text(encoding="utf-8")


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


def _first_bash_block(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, re.S)[0].strip().splitlines()


def test_the_readmes_two_commands_install_and_lint_a_shipped_example_then_run_the_tests():
    first, tests = _first_bash_block(README)
    install, check = first.rsplit(" && ", 1)
    contributing_install, contributing_tests = _first_bash_block(CONTRIBUTING)
    assert install == contributing_install  # the same environment the tests need
    command, target = check.split(" check ")
    assert command == ".venv/bin/graphlint"
    path, name = target.split(":")
    assert path.startswith("examples/") and f"def {name}(" in (REPO / path).read_text(encoding="utf-8")
    assert tests == contributing_tests  # which .ci/run runs (the test below)


def test_contributings_two_commands_are_the_ones_ci_runs():
    install, tests = _first_bash_block(CONTRIBUTING)
    ci = re.sub(r"\s*\\\n\s*", " ", (REPO / ".ci" / "run").read_text(encoding="utf-8")).splitlines()  # a command a line
    assert install == 'python3 -m venv .venv && .venv/bin/pip install -c constraints.txt -e ".[test]"'
    assert "python3 -m venv .venv" in ci and '.venv/bin/pip install --quiet -c constraints.txt -e ".[test]"' in ci
    # CI runs the test command in two parts, each test once: all but the command-line tests editable, then
    # those against the installed wheel.
    assert any(line == f'{tests} -m "not cli"' or line.startswith(f'{tests} -m "not cli" --') for line in ci)
    assert any("python -m pytest -m cli -p no:cacheprovider" in line and "GRAPHLINT_INSTALLED=1" in line
               for line in ci)
    # pytest's options in pyproject need pytest-xdist, which the test extra installs into that environment.
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    if "-n" in pyproject["tool"]["pytest"]["ini_options"]["addopts"].split():
        assert tests.startswith(".venv/bin/python -m pytest")
        assert any(d.startswith("pytest-xdist") for d in pyproject["project"]["optional-dependencies"]["test"])


def test_the_readmes_rules_table_is_generated_from_the_rules():
    committed = readme_rules_block(README)
    assert committed, f"the README has no rules table between {RULES_BEGIN!r} and {RULES_END!r}"
    assert committed == rules_table(load_rules()), "regenerate: python -m graphlint.cli_reference --rules-table"
    for rule in load_rules():
        assert f"| [{rule.id}](docs/rules.md#" in committed


def test_the_options_reference_is_generated_from_the_parser():
    committed = (REPO / "docs" / "options.md").read_text(encoding="utf-8")
    assert committed == options_reference(), "regenerate: python -m graphlint.cli_reference > docs/options.md"
    for flag in ("--fix", "--unsafe-fixes", "--memory-budget", "--device-memory", "--vary"):
        assert f"`{flag}" in committed


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _headings(path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


PAGES = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_and_anchor_resolves(page):
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    for link in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", link):
            continue
        file, _, anchor = link.partition("#")
        target = (page.parent / file).resolve() if file else page
        assert target.exists(), f"{page.name} links {link}, which does not exist"
        if anchor and target.suffix == ".md":
            assert anchor in _headings(target), f"{page.name} links {link}: no such heading"


def test_the_readme_links_every_reference_page():
    for page in sorted((REPO / "docs").glob("*.md")):
        assert f"(docs/{page.name})" in README, f"the README does not link docs/{page.name}"
    assert "(CONTRIBUTING.md)" in README


def test_the_readme_starts_where_a_user_starts():
    headings = re.findall(r"^## (.+)$", re.sub(r"```.*?```", "", README, flags=re.S), re.M)
    assert headings.index("Contents") < headings.index("Install") < headings.index("Lint your own model")
    assert headings.index("Install") < headings.index("Read a finding and act on it") < headings.index("Contributing")
    contents = README.split("## Contents", 1)[1].split("\n## ", 1)[0]
    for heading in headings[1:]:
        assert f"(#{_slug(heading)})" in contents, f"the table of contents lacks {heading!r}"
    assert "not published on PyPI yet" in " ".join(README.split())


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


TROUBLESHOOTING = (REPO / "docs" / "troubleshooting.md").read_text(encoding="utf-8")


def test_troubleshooting_covers_the_common_failures_in_their_own_words():
    section = TROUBLESHOOTING.split("# Troubleshooting", 1)[1].split("\n## ", 1)[0]
    for words in ("does not exist", "has no ':NAME'", "No module named", "syntax error at", "the factory raised",
                  "args is a Tensor, not a tuple", "the forward raised", "loss function returned a tensor of shape",
                  "captured on CPU because the forward needs real values", "backward raised",
                  "did not finish within", "cannot import torch", "needs Graphviz's dot program", "unknown key",
                  "the target called sys.exit(", "its process crashed with SIGSEGV", "internal error in graphlint"):
        assert words in section, words


def _source_text() -> str:
    return "\n".join(path.read_text(encoding="utf-8") for folder in ("graphlint", "rules")
                     for path in sorted((REPO / folder).rglob("*.py")))


def test_troubleshooting_quotes_what_graphlint_really_says():
    """The phrases the page quotes about graphlint's own failures and random draws are graphlint's own."""
    source = _source_text()
    for quoted in ("graphlint could not build this fix: ", "please report it with --debug", '"internal_failures"',
                   "graphlint's own code failed after detection", "this is a bug in graphlint",
                   "on this capture's draw: the forward draws from ", "so the count may differ from step to step",
                   "in this capture (the forward draws from ", "and another draw may use {{them}}: ",
                   'level="warning"', "numpy.random.seed(seed)", "SEED = 0"):
        assert quoted in source, quoted
    for section in ("## When graphlint itself fails", "## Repeatable runs"):
        assert section in TROUBLESHOOTING
    for words in ("graphlint could not build this fix: <Type>: <msg>; please report it with --debug",
                  "internal_failures", "warning", "on this capture's draw", "seed 0"):
        assert words in TROUBLESHOOTING, words
