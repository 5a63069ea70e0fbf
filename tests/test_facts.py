"""What rules read: the typed facts of each forward-graph node, answers computed once per capture, and how
problems at one location become one finding (typed messages, explicit merging)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import libcst as cst
import pytest
import torch
from torch import nn

import graphlint.flow as flow
from conftest import REPO, line_of, write
from graphlint.capture import capture_model, facts
from graphlint.rewrite.contract import Rewrite
from graphlint.locate.place import Locator
from graphlint.ops import op
from graphlint.project import Project
from graphlint.rule import Problem, Rule, fill
from graphlint.results import Severity


def test_no_rule_reads_node_meta():
    """Rules read `facts(node)` and graphlint.ops / graphlint.flow, never the recorder's string keys."""
    readers = []
    for path in sorted((REPO / "rules").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "meta":
                readers.append(f"{path.name}:{node.lineno}")
    assert readers == []


class Blocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.ReLU()
        self.frozen = nn.Linear(4, 4)

    def forward(self, x):
        h = torch.sigmoid(self.fc(x))
        h.mul_(2)  # writes what sigmoid saved
        with torch.no_grad():
            a = self.frozen(x)
        with torch.no_grad():
            b = self.frozen(x)
        return self.act(h) + a + b


def test_node_facts_say_what_the_forward_did():
    capture = capture_model(Blocks(), (torch.randn(2, 4),), {})
    by_op = {}
    for node in capture.ops:
        by_op.setdefault(op(node), []).append(node)
    [sigmoid], [write_], [relu] = by_op["sigmoid"], by_op["mul_"], by_op["relu"]
    first, second = by_op["linear"][1:]  # the frozen layer, once in each no_grad block

    assert facts(write_).mutated and facts(sigmoid).mutated == ()
    saved_by_sigmoid = [s for a, s in capture.autograd.saved if a.forward_node is sigmoid]
    assert saved_by_sigmoid and all(facts(write_).ran_after_saving(s.index) for s in saved_by_sigmoid)
    assert not any(facts(sigmoid).ran_after_saving(s.index) for s in saved_by_sigmoid)

    assert facts(first).grad_mode == "no_grad" and facts(sigmoid).grad_mode == "enabled"
    assert facts(first).grad_region is not None and facts(first).grad_region is not facts(second).grad_region
    assert facts(sigmoid).grad_region is None

    assert facts(relu).library_module.path == "act" and facts(relu).module_path == "act"
    assert facts(sigmoid).library_module is None and facts(sigmoid).module_path == ""
    assert facts(sigmoid).stack[-1].line == Blocks.forward.__code__.co_firstlineno + 1
    assert [n.target for n in capture.forward.nodes if facts(n).is_parameter] == [
        "fc.weight", "fc.bias", "frozen.weight", "frozen.bias"]
    [loss] = [n for n in capture.forward.nodes if facts(n).is_loss]
    assert facts(loss).phase == "loss" and facts(sigmoid).phase == "forward"
    assert tuple(facts(sigmoid).tensor_meta.shape) == (2, 4)


def test_gradient_cuts_are_computed_once_for_every_rule_that_asks(monkeypatch):
    class Cut(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 4)

        def forward(self, x):
            return self.b(self.a(x).detach())

    calls = []
    original = flow._gradient_cuts
    monkeypatch.setattr(flow, "_gradient_cuts", functools.wraps(original)(lambda c: calls.append(c) or original(c)))
    capture = capture_model(Cut(), (torch.randn(2, 4),), {})
    from graphlint.engine import rule_by_id

    for rule_id in ("GL103", "GL202", "GL203"):
        list(rule_by_id(rule_id)().check(capture))
    assert calls == [capture]
    assert list(flow.gradient_cuts(capture)) == ["a.weight", "a.bias"]


def test_messages_are_filled_in_one_pass_and_leave_unknown_braces():
    assert fill("The in-place {op} in {where}", {"op": "mul_", "where": "fc"}) == "The in-place mul_ in fc"
    assert fill("{op} of {'a': 1} and {unknown}", {"op": "x"}) == "x of {'a': 1} and {unknown}"
    assert fill("{op}", {"op": "{where}", "where": "never"}) == "{where}"  # a value is not filled again
    with pytest.raises(ValueError, match="where"):
        Problem(message="m", facts={"where": "clashes with the merge"})


LOOP = '''
import torch
from torch import nn


class Repeat(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))  # the line
        return x


def make():
    return Repeat(), (torch.randn(2, 4),)
'''


class _Rule(Rule):
    id, name, severity = "GL999", "test-rule", Severity.WARNING


def _relus(tmp_path):
    path = write(tmp_path, "model.py", LOOP)
    module = {}
    exec(compile(path.read_text(), str(path), "exec"), module)
    model, args = module["make"]()
    capture = capture_model(model, args, {})
    return path, capture, [n for n in capture.ops if op(n) == "relu"]


def _place(tmp_path, capture, problems):
    locator = Locator(Project(root=tmp_path, first_party_folders=[tmp_path]))
    return locator.place(_Rule, problems, capture)


def test_problems_with_one_message_at_one_location_are_one_finding_with_the_count(tmp_path):
    path, capture, relus = _relus(tmp_path)
    problems = [Problem(message="{op} in {where}{occurrences}.", node=n, facts={"op": "relu"}) for n in relus]
    [finding] = _place(tmp_path, capture, problems)
    assert finding.location.line == line_of(path, "# the line")
    assert finding.message == "relu in the model (3 occurrences)."  # the loop runs in the model's own forward
    assert finding.occurrences == 3


def test_different_messages_at_one_location_are_all_said_each_with_its_count(tmp_path):
    _, capture, relus = _relus(tmp_path)
    problems = [Problem(message="First says {x}{occurrences}.", node=relus[0], facts={"x": "this"}),
                Problem(message="First says {x}{occurrences}.", node=relus[1], facts={"x": "that"}),
                Problem(message="First says {x}{occurrences}.", node=relus[2], facts={"x": "this"})]
    [finding] = _place(tmp_path, capture, problems)
    assert finding.message == "First says this (2 occurrences). First says that."
    assert finding.occurrences == 3


def _renamer(name):
    def fixer(site):
        return Rewrite(site.node, site.node.with_changes(func=cst.parse_expression(name)), f"→ {name}")

    return fixer


def test_occurrences_that_need_different_rewrites_get_no_fix_and_say_so(tmp_path):
    _, capture, relus = _relus(tmp_path)
    same = functools.partial(_renamer("torch.nn.functional.relu"))
    agreed = [Problem(message="m", node=n, fix=same) for n in relus]
    [finding] = _place(tmp_path, capture, agreed)
    assert finding.fix is not None and finding.fix.edits[0].text.startswith("torch.nn.functional.relu(")

    differ = [Problem(message="m", node=relus[0], fix=_renamer("torch.nn.functional.relu")),
              Problem(message="m", node=relus[1], fix=_renamer("torch.clamp_min"))]
    [finding] = _place(tmp_path, capture, differ)
    assert finding.fix is None and finding.no_fix == "the occurrences at this location need different rewrites"

    refused = [Problem(message="m", node=relus[0], fix=same), Problem(message="m", node=relus[1], fix=lambda s: "no")]
    [finding] = _place(tmp_path, capture, refused)
    assert finding.fix is None and finding.no_fix == "no"


def test_the_capture_package_keeps_its_imports():
    import graphlint.capture as capture

    for name in ("Capture", "ParameterInfo", "NodeFacts", "facts", "capture_model", "capture_target",
                 "inputs_to_meta", "ForwardFailure"):
        assert hasattr(capture, name), name
    assert Path(capture.__file__).parent.joinpath("contract.py").exists()
