"""Every rule's BAD examples are flagged at exactly their `# expect:` lines; its GOOD examples are not flagged."""

from __future__ import annotations

import pytest

from conftest import REPO, findings_of, lint_file, write
from graphlint.engine import load_rules
from graphlint.rewrite.edits import apply_edits
from graphlint.rule import anatomy_problems

RULES = load_rules()
BAD = [(rule, example) for rule in RULES for example in rule.bad_examples]
GOOD = [(rule, example) for rule in RULES for example in rule.good_examples]


def _id(case) -> str:
    rule, example = case
    return f"{rule.id}-{example.title or 'example'}".replace(" ", "-")


def test_every_rule_module_holds_the_rule_its_file_name_says():
    """A module in rules/ (or a rule's package) whose class is not found (not a Rule subclass, a typo in its ID)
    would never run."""
    modules = sorted([path.stem for path in (REPO / "rules").glob("gl[0-9][0-9][0-9]_*.py")]
                     + [path.parent.name for path in (REPO / "rules").glob("gl[0-9][0-9][0-9]_*/__init__.py")])
    found = sorted(f"{rule.id.lower()}_{rule.name.replace('-', '_')}" for rule in RULES)
    assert found == modules


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.id)
def test_every_rule_has_its_full_anatomy(rule):
    assert anatomy_problems(rule) == []
    docs = rule.docs_markdown()
    for heading in ("## What it flags", "## Why it matters", "## Example", "## Use instead"):
        assert heading in docs
    assert rule.bad_examples and rule.good_examples


# Each BAD example is linted once for both of its tests: the fixture's module scope groups them together (also on
# one pytest-xdist worker, which takes tests in order).
@pytest.fixture(scope="module", params=BAD, ids=[_id(c) for c in BAD])
def linted_bad(request, tmp_path_factory):
    """A BAD example's rule, the example, its file and its report with the rule selected."""
    rule, example = request.param
    path = write(tmp_path_factory.mktemp("bad_example"), "example.py", example.code)
    return rule, example, path, lint_file(path, extend_select=(rule.id,), **dict(example.settings))


def test_bad_example_is_flagged_at_its_expected_lines(linted_bad):
    rule, example, _, report = linted_bad
    assert report.errors == []
    assert sorted(f.location.line for f in findings_of(report, rule.id)) == example.expected_lines(rule.id)


def test_bad_example_fixes_give_its_expected_fixed_source(linted_bad):
    """Every fix the rule offers, applied to the example, gives exactly `Example.fixed` (the source itself when
    the example has nothing fixable), and a rule documents a fix exactly when it offers one."""
    rule, example, path, report = linted_bad
    fixes = [f.fix for f in findings_of(report, rule.id) if f.fix is not None]
    assert all(e.path == str(path) for fix in fixes for e in fix.edits)
    fixed = apply_edits(example.code, [e for fix in fixes for e in fix.edits])
    assert fixed == (example.fixed_code or example.code)
    if example.fixed:
        assert rule.fixes and fixed != example.code


@pytest.mark.parametrize("case", GOOD, ids=[_id(c) for c in GOOD])
def test_good_example_is_not_flagged(case, tmp_path):
    rule, example = case
    report = lint_file(write(tmp_path, "example.py", example.code), extend_select=(rule.id,), **dict(example.settings))
    assert report.errors == []
    assert findings_of(report, rule.id) == []
