"""The torch.compile analysis kept across runs (graphlint.capture.compile_memo): after an edit of a target's file
outside its model, the second run reports what the first did without compiling again; after an edit of what
the model's compilation reads (its traced code, a global it names, a class attribute, a module's state, the
inputs) it compiles again and reports what the edited model has."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import torch

from conftest import run_graphlint, write
from graphlint.capture.compile import analyse_target
from graphlint.capture.compile_memo import CompileMemo
from graphlint.config import Config
from graphlint.engine import load_rules
from graphlint.project import Project
from graphlint.session import Options, check
from graphlint.target import Target
from test_gl301_gl302_compile import CASES, RECOMPILES, TEMPLATE

pytestmark = pytest.mark.compile

GL3 = ("GL301", "GL302")


def _seen(report):
    return sorted((f.rule_id, f.location.path, f.location.line, f.message) for f in report.findings), \
        sorted(note for result in report.results for note in result.notes)


def _check(path, target: str, cache):
    project = Project(root=path.parent, first_party_folders=[path.parent])
    return _seen(check([f"{path}:{target}"], project, Config(select=GL3), Options(cache=cache)))


def _memo_files(cache) -> list:
    return sorted(cache.glob("v*/compile-*/*.json"))


def _targets():
    cases = [(f"{rule.id}-{index}", example.code, "make") for rule in load_rules() if rule.id in GL3
             for index, example in enumerate((*rule.bad_examples, *rule.good_examples))]
    cases += [(f"break-{name}", TEMPLATE.replace("{line}", bad), "make") for name, (bad, _) in CASES.items()]
    cases += [(f"recompiles-{name}", RECOMPILES, name) for name in ("counter", "loop_over_batch", "steps", "shape_branch")]
    return cases


TARGETS = _targets()


@pytest.mark.parametrize("case", TARGETS, ids=[case[0] for case in TARGETS])
def test_an_edit_outside_the_model_reuses_the_analysis_and_reports_the_same(case, tmp_path):
    name, code, target = case
    path = write(tmp_path, "model.py", code)
    cold = _check(path, target, tmp_path / "cache")
    assert len(_memo_files(tmp_path / "cache")) == 1
    stamp = _memo_files(tmp_path / "cache")[0].stat().st_mtime_ns
    path.write_text(path.read_text(encoding="utf-8") + "\n# an edit after the model\n", encoding="utf-8")
    assert _check(path, target, tmp_path / "cache") == cold
    # Read, not compiled and written again (under this key or another).
    assert len(_memo_files(tmp_path / "cache")) == 1 and _memo_files(tmp_path / "cache")[0].stat().st_mtime_ns == stamp
    if name.startswith("GL3"):  # and what a run without any cache reports (the rule examples: the others agree too)
        assert cold == _check(path, target, None)


def test_an_edit_of_the_forward_compiles_again(tmp_path):
    """A break removed from the forward: the memo's finding must not outlive it."""
    bad, good = CASES["print"]
    path = write(tmp_path, "model.py", TEMPLATE.replace("{line}", bad))
    findings, _ = _check(path, "make", tmp_path / "cache")
    assert [f[0] for f in findings] == ["GL301"]
    path.write_text(TEMPLATE.replace("{line}", good), encoding="utf-8")
    findings, _ = _check(path, "make", tmp_path / "cache")
    assert findings == []


# -- what a change must reach, one at a time, in-process ---------------------------------------------------

MODEL = '''
import torch
from torch import nn

SCALE = 2
LIMIT = {"steps": 1}


def helper(h):
    return h * SCALE


def unused(h):
    return h - 1


class Settings:
    offset = 0


ACT = nn.Softplus(beta=1)


class Block(nn.Module):
    shift = 0

    def __init__(self, width=8):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.mode = "plain"

    def forward(self, x):
        h = ACT(helper(self.fc(x))) + self.shift + Settings.offset
        for _ in range(LIMIT["steps"]):
            h = h + 1
        return h


def make(batch=4, width=8):
    return Block(width), (torch.randn(batch, width),)
'''


def _analysed(path, memo, edit=None, **make):
    """The analysis of a fresh import of `path` (after `edit` of its text), as a new run would make it."""
    if edit is not None:
        path.write_text(edit(path.read_text(encoding="utf-8")), encoding="utf-8")
    spec = importlib.util.spec_from_file_location("memo_model", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["memo_model"] = module  # the one module of this file, as in a target's own process
    try:
        spec.loader.exec_module(module)
        model, args = module.make(**make)
        model = model.to("meta")
        return analyse_target(Target(model, tuple(a.to("meta") for a in args), {}), "meta", ("batch",), memo=memo)
    finally:
        del sys.modules["memo_model"]


EDITS = {
    "a comment after the model": (lambda s: s + "\n# done\n", {}, True),
    "a function the forward never calls": (lambda s: s.replace("return h - 1", "return h - 2"), {}, True),
    "the traced helper's body": (lambda s: s.replace("return h * SCALE", "return h * SCALE * 3"), {}, False),
    "a global the helper reads": (lambda s: s.replace("SCALE = 2", "SCALE = 3"), {}, False),
    "a global dict the forward reads": (lambda s: s.replace('{"steps": 1}', '{"steps": 2}'), {}, False),
    "a class attribute": (lambda s: s.replace("shift = 0", "shift = 1"), {}, False),
    "a plain class's attribute": (lambda s: s.replace("offset = 0", "offset = 1"), {}, False),
    "a module built at module level": (lambda s: s.replace("beta=1", "beta=2"), {}, False),
    "a module's own value": (lambda s: s.replace('self.mode = "plain"', 'self.mode = "other"'), {}, False),
    "the inputs' shape": (None, {"batch": 5}, False),
    "the parameters' shape": (None, {"width": 16}, False),
    "lines above the forward": (lambda s: s.replace("SCALE = 2\n", "SCALE = 2\n\n"), {}, False),
}


@pytest.mark.parametrize("edit", list(EDITS), ids=lambda e: e.replace(" ", "-"))
def test_the_memo_is_used_exactly_when_nothing_the_compilation_reads_changed(edit, tmp_path):
    change, make, reused = EDITS[edit]
    path = write(tmp_path, "model.py", MODEL)
    memo = CompileMemo(tmp_path / "memo")
    first = _analysed(path, memo)
    assert not first.reused and _analysed(path, memo).reused  # unchanged: reused
    again = _analysed(path, memo, change, **make)
    assert again.reused is reused
    if reused:
        assert (again.breaks, again.recompiles, again.calls) == (first.breaks, first.recompiles, first.calls)


VALUES = '''
import torch
from torch import nn


class Signed(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        if x.sum() > 0:
            h = h * 2
        else:
            print("negative")  # a second break, on this path only
        return h


def make(sign=1):
    return Signed(), (torch.ones(4, 8) * sign,)
'''


def test_on_the_cpu_the_inputs_values_are_part_of_the_key(tmp_path):
    """After a break on a tensor's value the path taken depends on the values: on the CPU (a capture that
    needed real values) new values compile again, and the analysis shows the other path's break."""
    path = write(tmp_path, "model.py", VALUES)
    memo = CompileMemo(tmp_path / "memo")

    def analysed(sign):
        spec = importlib.util.spec_from_file_location("memo_values", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["memo_values"] = module
        try:
            spec.loader.exec_module(module)
            torch.manual_seed(0)
            model, args = module.make(sign)
            return analyse_target(Target(model, args, {}), "cpu", None, memo=memo)
        finally:
            del sys.modules["memo_values"]

    positive = analysed(1)
    assert not positive.reused and analysed(1).reused
    negative = analysed(-1)
    assert not negative.reused
    assert len(negative.breaks) > len(positive.breaks)


def test_a_forward_without_a_source_file_is_not_kept(tmp_path):
    namespace = {"torch": torch}
    exec(compile("def forward(self, x):\n    return x * 2\n", "<generated>", "exec"), namespace)
    model = type("Generated", (torch.nn.Module,), {"forward": namespace["forward"]})().to("meta")
    memo = CompileMemo(tmp_path / "memo")
    analysis = analyse_target(Target(model, (torch.ones(4, 8, device="meta"),), {}), "meta", ("batch",), memo=memo)
    assert not analysis.unavailable and analysis.calls
    assert list((tmp_path / "memo").glob("*.json")) == []


TRANSFORMERS = '''
import torch
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig


def llama():
    config = LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=128)
    return AutoModelForCausalLM.from_config(config), (), {"input_ids": torch.randint(0, 128, (2, 16))}


def gpt2():
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64)
    return AutoModelForCausalLM.from_config(config), (), {"input_ids": torch.randint(0, 128, (2, 16))}
'''


@pytest.mark.cli
@pytest.mark.transformers
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_transformers_model_is_reused_across_runs_of_the_command(family, tmp_path):
    """Its configuration keeps values that differ in every process (a salted hash), and its outputs are
    dataclasses whose __init__ Python generates: neither may keep the memo from being read by the next run."""
    pytest.importorskip("transformers")
    path = write(tmp_path, "model.py", TRANSFORMERS)

    def run():
        done = run_graphlint("check", f"model.py:{family}", "--select", "GL301,GL302", "--format", "json",
                             "--cache-dir", str(tmp_path / "cache"), cwd=tmp_path)
        assert done.returncode in (0, 1), done.stderr
        return json.loads(done.stdout)["findings"]

    cold = run()
    [memo] = _memo_files(tmp_path / "cache")
    stamp = memo.stat().st_mtime_ns
    path.write_text(path.read_text(encoding="utf-8") + "\n# an edit after the model\n", encoding="utf-8")
    assert run() == cold
    assert _memo_files(tmp_path / "cache") == [memo] and memo.stat().st_mtime_ns == stamp
