"""Detection stands alone: a failure of graphlint's own code after a rule found something (finding the exact span,
a related site, the roles of a fix, building, merging, proving or applying a fix) never costs a finding, never
changes its line or message, and never changes the exit code. Faults are injected into each stage, for every rule
that offers a fix, and the report is compared with the one the same example gives without the fault."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest

import graphlint.fix.apply
from conftest import WITHOUT_COMPILE, findings_of, lint_file, run_graphlint, validate_sarif, write
from graphlint.engine import load_rules
from graphlint.locate import place
from graphlint.locate.spans import SourceSpans
from graphlint.project import Project
from graphlint.session import Session

# The first example of each rule with a fix: a finding that really has one, so that losing it would show.
FIXING = [(rule, next(e for e in rule.bad_examples if e.fixed)) for rule in load_rules()
          if any(e.fixed for e in rule.bad_examples)]


def _fault_in(owner):
    """A function that raises, compiled as if it were written in `owner`'s own source file: a bug in graphlint."""
    source = "def _injected(*args, **kwargs):\n    raise TypeError(\"'set' object is not callable\")\n"
    namespace: dict = {}
    exec(compile(source, sys.modules[owner.__module__].__file__, "exec"), namespace)
    return namespace["_injected"]


def _fixers_that_raise(monkeypatch, rule):
    """The rule's problems offered with a fixer that raises, as a fixer's bug would."""
    check = rule.check
    fixer = _fault_in(SourceSpans)

    def check_with_failing_fixer(self, capture):
        return [dataclasses.replace(p, fix=fixer) if p.fix is not None else p for p in check(self, capture)]

    monkeypatch.setattr(rule, "check", check_with_failing_fixer)


# Each stage after detection, and how to make it fail.
STAGES = {
    "fixer": _fixers_that_raise,
    "fix": lambda monkeypatch, rule: monkeypatch.setattr(SourceSpans, "fix", _fault_in(SourceSpans)),
    "roles": lambda monkeypatch, rule: monkeypatch.setattr(place.Locator, "_role_sites", _fault_in(place.Locator)),
    "span": lambda monkeypatch, rule: monkeypatch.setattr(SourceSpans, "span", _fault_in(SourceSpans)),
    "related": lambda monkeypatch, rule: monkeypatch.setattr(place.Locator, "_add_related", _fault_in(place.Locator)),
    "merge": lambda monkeypatch, rule: monkeypatch.setattr(place._Group, "message", _fault_in(place.Locator)),
}
# Stages after which the finding keeps its exact span and message, not only its line.
KEEPS_SPAN = {"fixer", "fix", "roles", "related"}


def _seen(report, rule_id: str) -> list[tuple[int, str]]:
    return sorted((f.location.line, f.message) for f in findings_of(report, rule_id))


# The report without a fault is the same for every stage: one lint per rule, shared by its stages' tests (the
# fixture's module scope groups them together, also on one pytest-xdist worker).
@pytest.fixture(scope="module", params=FIXING, ids=[rule.id for rule, _ in FIXING])
def linted_clean(request, tmp_path_factory):
    """A rule with a fix, its example, the example's file and its report without a fault."""
    rule, example = request.param
    path = write(tmp_path_factory.mktemp("example"), "example.py", example.code)
    return rule, example, path, lint_file(path, extend_select=(rule.id,))


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_a_fault_after_detection_costs_no_finding(linted_clean, stage, monkeypatch):
    rule, example, path, clean = linted_clean
    assert [f for f in findings_of(clean, rule.id) if f.fix is not None], "the example must have a fix to lose"
    STAGES[stage](monkeypatch, rule)

    faulty = lint_file(path, extend_select=(rule.id,))

    assert faulty.errors == []
    assert sorted(f.location.line for f in findings_of(faulty, rule.id)) == example.expected_lines(rule.id)
    if stage in KEEPS_SPAN:
        assert _seen(faulty, rule.id) == _seen(clean, rule.id)
        assert [f.location for f in findings_of(faulty, rule.id)] == [f.location for f in findings_of(clean, rule.id)]
    assert [f.severity for f in faulty.failing] == [f.severity for f in clean.failing]
    [result] = faulty.results
    assert result.failures and all("TypeError: 'set' object is not callable" in f for f in result.failures)
    if stage in ("fixer", "fix", "roles"):
        for finding in findings_of(faulty, rule.id):
            assert finding.fix is None
            assert finding.no_fix.startswith("graphlint could not build this fix: TypeError: 'set' object is not "
                                             "callable; please report it with --debug")


# Rules with an example whose fix is safe, so that it goes through a proof: GL101's last (its first is safe
# too: it drops a dropout submodule that has no hook).
PROVEN = [(rule, [e for e in rule.bad_examples if e.fixed][-1]) for rule in load_rules() if rule.id in ("GL101", "GL106")]


@pytest.mark.proof
@pytest.mark.parametrize("case", PROVEN, ids=[rule.id for rule, _ in PROVEN])
@pytest.mark.parametrize("stage", ["prove", "apply"])
def test_a_fault_while_proving_or_applying_a_fix_keeps_the_finding(case, stage, tmp_path, monkeypatch):
    rule, example = case
    path = write(tmp_path, "example.py", example.code)
    project = Project(root=tmp_path, first_party_folders=[tmp_path])
    session = Session([f"{path}:make"], project, project.config.overridden(extend_select=(rule.id,)))
    report = session.report(session.results([f"{path}:make"]))
    target = "prove" if stage == "prove" else "rewritten_files"
    monkeypatch.setattr(graphlint.fix.apply, target, _fault_in(graphlint.fix.apply.FixPlan))

    plan = session.fixes(report, unsafe=False)

    assert plan.applied == [] and plan.texts == {}
    refused = dict(plan.refused)
    for finding in findings_of(report, rule.id):
        if finding.fix is not None and finding.fix.applicability == "safe":
            assert refused[finding].startswith(f"graphlint could not {stage} this fix: TypeError")
    assert plan.failures
    assert path.read_text(encoding="utf-8") == example.code


GL101_MODEL = '''
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-2, -1) / 4.0
        return scores.softmax(dim=-1) @ v


def make():
    return Attention(), (torch.randn(2, 8, 16),)
'''

# A fault compiled into graphlint's span finder, as a fixer's bug would be.
SITECUSTOMIZE = '''
import graphlint.locate.spans as spans

source = "def _injected(*args, **kwargs):\\n    raise TypeError(\\"'set' object is not callable\\")\\n"
namespace = {}
exec(compile(source, spans.__file__, "exec"), namespace)
spans.SourceSpans.fix = namespace["_injected"]
'''


@pytest.mark.cli
def test_the_command_reports_the_finding_and_names_graphlint_once(project_dir):
    write(project_dir, "model.py", GL101_MODEL)
    write(project_dir / "inject", "sitecustomize.py", SITECUSTOMIZE)
    env = {"PYTHONPATH": str(project_dir / "inject")}
    # Only the fault-free reference leaves the compile rules out: they find nothing here (the SARIF rule list says so).
    clean = run_graphlint("check", "model.py:make", "--no-cache", *WITHOUT_COMPILE, cwd=project_dir)
    # The text on stdout and SARIF to a file, from the same run (--report).
    faulty = run_graphlint("check", "model.py:make", "--no-cache", "--report", "sarif=out.sarif", cwd=project_dir,
                           env=env)

    assert (clean.returncode, faulty.returncode) == (1, 1)
    assert faulty.stdout.splitlines()[0] == clean.stdout.splitlines()[0].removesuffix(" [*]")
    assert "GL101" in faulty.stdout
    notes = [line for line in faulty.stderr.splitlines() if "graphlint's own code failed" in line]
    assert len(notes) == 1 and "this is a bug in graphlint" in notes[0] and "--debug" in notes[0]
    assert "Traceback" not in faulty.stderr and "error:" not in faulty.stderr

    log = json.loads((project_dir / "out.sarif").read_text(encoding="utf-8"))
    validate_sarif(log)
    [run] = log["runs"]
    assert [r["ruleId"] for r in run["results"]] == ["GL101"]
    [invocation] = run["invocations"]
    assert invocation["executionSuccessful"] is True
    assert any("graphlint's own code failed" in n["message"]["text"]
               for n in invocation["toolExecutionNotifications"])

    diff = run_graphlint("check", "model.py:make", "--no-cache", "--diff", cwd=project_dir, env=env)
    assert diff.returncode == 0 and diff.stdout == ""  # no fix to show: nothing would change
    assert "GL101" in diff.stderr or "0 fixes" in diff.stderr


def test_a_helper_that_masks_with_where_keeps_its_finding_and_gets_a_reason(project_dir):
    """An attention helper in another file that masks with `torch.where(mask, scores, finfo.min)` and whose
    scores are read again once made GL101's fixer fail (a name shadowing a function); the finding now gets
    the fixer's own reason for refusing."""
    write(project_dir, "attn_ops.py", '''
        import torch


        def attention(q, k, v, mask):
            scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
            scores = torch.where(mask, scores, torch.finfo(scores.dtype).min)
            probs = scores.softmax(dim=-1)
            return probs @ v, scores.amax(dim=-1)
    ''')
    path = write(project_dir, "model.py", '''
        import torch
        from torch import nn

        import attn_ops


        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.qkv = nn.Linear(16, 48)

            def forward(self, x, mask):
                q, k, v = self.qkv(x).chunk(3, dim=-1)
                out, top = attn_ops.attention(q, k, v, mask)
                return out + top.unsqueeze(-1)


        def make():
            mask = torch.ones(8, 8, dtype=torch.bool).tril()
            return Block(), (torch.randn(2, 8, 16), mask)
    ''')
    report = lint_file(path)
    [finding] = findings_of(report, "GL101")
    assert finding.location.path.endswith("attn_ops.py")
    assert finding.no_fix.startswith("`scores` is used outside the attention"), finding.no_fix
    assert report.results[0].failures == []
