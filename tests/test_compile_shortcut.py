"""The torch.compile analysis's shortcut (repeated blocks compiled once, graphlint.capture.compile_regions) gives
the findings and notes that compiling the whole model gives (GRAPHLINT_COMPILE_WHOLE_MODEL=1), on the GL301 and
GL302 rule examples it is tried on (those with alike blocks), a varied few of the GL301/GL302 tests' models (none
has a repeated block, which the test checks of them all), and models of repeated blocks that break, recompile or
change state in each way the shortcut must not hide."""

from __future__ import annotations

import dataclasses
import functools
import itertools

import pytest
import torch

from conftest import check_targets, write
from graphlint.capture import compile_regions
from graphlint.capture.compile import analyse_target
from graphlint.capture.compile_regions import WHOLE_MODEL_ENV, has_alike_blocks, repeated_blocks
from graphlint.engine import load_rules
from graphlint.target import Target
from graphlint.target.built import normalize_factory_result
from test_compile_analysis_real_calls import FINITE, GRAPH_LAYER, OWN_INIT, ROTARY
from test_gl301_gl302_compile import CASES, RECOMPILES, TEMPLATE

pytestmark = pytest.mark.compile


@pytest.fixture(scope="module", autouse=True)
def shortcut_from_two_blocks():
    """The comparisons below run the shortcut on models of four alike blocks, which the analysis otherwise
    compiles whole because that is sooner (compile_regions.SHORTCUT_FROM_BLOCKS); what they check is that,
    where the shortcut runs, it gives what the whole model gives. Children forked during a test inherit it."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(compile_regions, "SHORTCUT_FROM_BLOCKS", 2)
        yield

BLOCKS = '''
import torch
from torch import nn

CONFIG = {"scale": 1}


class Block(nn.Module):
    def __init__(self, index, kind="plain"):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.index = index if kind in ("parity", "scaled", "last") else 0  # else the blocks are alike
        self.kind = kind
        self.calls = 0
        self.scale = 1

    def forward(self, x, last=False):
        h = self.fc(x)
        if self.kind == "break":
            print(h.shape)
        if self.kind == "parity":
            torch._dynamo.graph_break()
            if self.index % 2:
                h = h * 2
        if self.kind == "counter":
            self.calls = self.calls + 1
            h = h * self.calls
        if self.kind == "loop":
            for i in range(x.shape[0]):
                h[i] = h[i] + i
        if self.kind == "scaled":
            h = h * (self.index + 1)
        if self.kind == "config":
            h = h * CONFIG["scale"]
        if self.kind == "last" and self.index == 3:
            print(h.shape)
        if last:
            print(h.shape)
        if self.kind == "mutates":
            h = h * self.scale
        if self.kind == "training":  # breaks only with gradients on, as in training
            h = h * torch.ones(h.shape[0], 1, requires_grad=h.requires_grad)
        return torch.nn.functional.gelu(h) + x


class Model(nn.Module):
    def __init__(self, kind="plain", depth=4):
        super().__init__()
        self.embed = nn.Linear(8, 8)
        self.blocks = nn.ModuleList(Block(index, kind) for index in range(depth))
        self.kind = kind

    def forward(self, x):
        x = self.embed(x)
        for index, block in enumerate(self.blocks):
            x = block(x, last=True) if self.kind == "flag" and index == len(self.blocks) - 1 else block(x)
        if self.kind == "mutates":
            self.blocks[1].scale = self.blocks[1].scale + 1
        if self.kind == "config":
            CONFIG["scale"] = CONFIG["scale"] + 1
        return x


def plain():
    return Model(), (torch.randn(2, 8),)


def block_break():
    return Model("break"), (torch.randn(2, 8),)


def last_block_breaks():
    return Model("last"), (torch.randn(2, 8),)


def parity():
    return Model("parity", depth=10), (torch.randn(2, 8),)


def counter():
    return Model("counter"), (torch.randn(2, 8),)


def loop():
    return Model("loop"), (torch.randn(2, 8),)


def scaled():
    return Model("scaled"), (torch.randn(2, 8),)


def mutates():
    return Model("mutates"), (torch.randn(2, 8),)


def flag():
    return Model("flag"), (torch.randn(2, 8),)


def config():
    return Model("config"), (torch.randn(2, 8),)


def training():
    return Model("training"), (torch.randn(2, 8),)
'''
# One model per way the shortcut could hide what the whole model shows (a glue that changes what a block reads is
# `mutates`; a subclass's glue doing the same was a twelfth model, which cost 5 s and checked nothing else).
BLOCK_TARGETS = ("plain", "block_break", "last_block_breaks", "parity", "counter", "loop", "scaled", "mutates",
                 "flag", "config", "training")


def _seen(report) -> list:
    """Everything the compile rules and analysis contribute: findings, notes and errors, target by target."""
    findings = sorted((f.rule_id, f.location.path, f.location.line, f.location.column, f.message, f.occurrences,
                       tuple((r.location.path, r.location.line) for r in f.related), tuple(f.targets))
                      for f in report.findings)
    return [findings, [(r.target, tuple(r.notes), tuple(e.message for e in r.errors)) for r in report.results]]


def _both(monkeypatch, run):
    """`run()` with the shortcut, then with whole-model compilation forced."""
    monkeypatch.delenv(WHOLE_MODEL_ENV, raising=False)
    shortcut = _seen(run())
    monkeypatch.setenv(WHOLE_MODEL_ENV, "1")
    whole = _seen(run())
    return shortcut, whole


def _analysed(path, factory: str, vary):
    """The torch.compile analysis of a freshly imported factory's model on meta, as a target's child makes it (a
    module of its own each time: the `config` model changes a module-level dict on every call)."""
    made = _made(path, factory)
    with torch.device("meta"):
        model = made.model.to("meta")
    return analyse_target(Target(model, tuple(a.to("meta") for a in made.args), {}), "meta", vary)


def _observed(analysis) -> tuple:
    """Everything of an analysis that the compile rules and notes read (not whether the shortcut ran)."""
    # A guard's values are left out (its subject kept, as GL302 reads it): state a model changes on every call,
    # such as a module-level counter, has advanced further where the shortcut ran and was then refused.
    recompiles = tuple(dataclasses.replace(recompile, guard=recompile.subject) for recompile in analysis.recompiles)
    return (tuple(analysis.breaks), recompiles, tuple(analysis.calls), analysis.recompile_limit,
            tuple(analysis.limit_hit), tuple(analysis.dropped), analysis.unavailable)


@pytest.fixture(scope="module")
def block_analyses(tmp_path_factory):
    """`analyses(vary)`: each repeated-block model's analysis with the shortcut and with whole-model compilation
    forced, by name; made once per call plan for the tests below, which read them. Where the analysis never tried
    the shortcut (never reached `compile_regions.shortcut_model`, the copy and probe `_shortcut` makes once past
    its gates), forcing it off runs the very same code again: that model is analysed once, its second one None."""
    path = write(tmp_path_factory.mktemp("blocks"), "blocks.py", BLOCKS)
    tried = []
    reached = compile_regions.shortcut_model

    def spied(*args, **kwargs):
        tried.append(True)
        return reached(*args, **kwargs)

    @functools.cache
    def analyses(vary) -> dict[str, tuple]:
        both = {}
        with pytest.MonkeyPatch.context() as monkeypatch:
            monkeypatch.setattr(compile_regions, "shortcut_model", spied)
            for name in BLOCK_TARGETS:
                monkeypatch.delenv(WHOLE_MODEL_ENV, raising=False)
                tried.clear()
                shortcut = _analysed(path, name, vary)
                whole = None
                if tried:
                    monkeypatch.setenv(WHOLE_MODEL_ENV, "1")
                    whole = _analysed(path, name, vary)
                both[name] = (shortcut, whole)
        return both

    return analyses


# Blocks that each read their own index are not alike, so `_shortcut` stops at `has_alike_blocks` and never tries.
ANALYSED_ONCE = {"last_block_breaks", "parity", "scaled"}


# The analysis with the shortcut against the whole model compiled, compared directly: the findings and notes of
# GL301 and GL302 are made from it alone (`test_the_compile_rule_examples_give_what_whole_model_compilation_gives`
# compares them through the command). `vary` None is what a run with GL301 alone asks for: one call.
@pytest.mark.parametrize("vary", [("batch",), None], ids=["GL301+GL302", "GL301"])
def test_repeated_blocks_give_what_whole_model_compilation_gives(vary, block_analyses):
    seen, taken = {}, set()
    analyses = block_analyses(vary)
    assert {name for name, (_, whole) in analyses.items() if whole is None} == ANALYSED_ONCE
    for name, (shortcut, whole) in analyses.items():
        seen[name] = shortcut
        if whole is None:
            assert not shortcut.shortcut, name
            continue
        assert not whole.shortcut
        assert _observed(shortcut) == _observed(whole), name
        if shortcut.shortcut:
            taken.add(name)
    assert "plain" in taken  # the shortcut really ran (the comparison is not vacuous)
    # The models that must be found are found: a break, or with grown calls a recompile.
    flagged = {name for name, analysis in seen.items() if analysis.breaks or (vary and analysis.recompiles)}
    expected = {"block_break", "last_block_breaks", "parity", "flag", "training"}
    if vary:
        expected |= {"counter", "loop", "mutates", "config"}
    assert expected <= flagged


def test_the_shortcut_is_taken_where_blocks_repeat_cleanly_and_not_where_state_changes(block_analyses):
    """The comparison above is only worth its name if the shortcut really runs on some models."""
    analyses = block_analyses(("batch",))
    taken = {name: analyses[name][0].shortcut for name in ("plain", "scaled", "mutates", "block_break", "config")}
    # Alike blocks only (`scaled` reads each block's own index); no state change, no break, no repeated guard.
    assert taken == {"plain": True, "scaled": False, "mutates": False, "block_break": False, "config": False}


def test_the_compile_rule_examples_give_what_whole_model_compilation_gives(tmp_path, monkeypatch):
    # The examples with alike blocks in one run per mode (none sets options of its own): one warm parent a mode.
    examples = [example for rule in load_rules() if rule.id in ("GL301", "GL302")
                for example in (*rule.bad_examples, *rule.good_examples)]
    assert len(examples) >= 4 and not any(example.settings for example in examples)
    for index, example in enumerate(examples):
        write(tmp_path, f"example_{index}.py", example.code)
    targets = [f"example_{index}.py:make" for index in range(len(examples))]
    # Without alike blocks `_shortcut` never tries (as the block models' test pins), so both modes run the same code.
    alike = [target for target in targets if has_alike_blocks(_made(tmp_path / target.split(":")[0], "make").model)]
    # Some examples have alike blocks, so the shortcut is tried on them (the comparison is not vacuous).
    assert alike
    shortcut, whole = _both(monkeypatch, lambda: check_targets(tmp_path, alike, extend_select=("GL301", "GL302")))
    assert shortcut == whole


# The compile tests' models, by file: each defines every class once, so none has a repeated block and the analysis
# compiles all of them whole with or without the shortcut (`_shortcut` stops at `has_alike_blocks`). The
# comparison runs on a few that differ in kind, in case the shortcut ever reaches such models; all are checked to
# have no repeated block, which is what makes the others' comparison needless.
def _compile_tests_models(folder) -> dict[str, tuple[str, ...]]:
    files = {}
    for name, (bad, good) in CASES.items():
        write(folder, f"{name}_bad.py", TEMPLATE.replace("{line}", bad))
        write(folder, f"{name}_good.py", TEMPLATE.replace("{line}", good))
        files[f"{name}_bad.py"] = files[f"{name}_good.py"] = ("make",)
    write(folder, "recompiles.py", RECOMPILES)
    files["recompiles.py"] = ("counter", "loop_over_batch", "steps", "shape_branch")
    for name, source, factories in (("rotary", ROTARY, ("make", "make_loop")), ("graph_layer", GRAPH_LAYER, ("make",)),
                                    ("finite", FINITE, ("make",)), ("own_init", OWN_INIT, ("make",))):
        write(folder, f"{name}.py", source)
        files[f"{name}.py"] = factories
    return files


# A break on a tensor's value and its remedy, a print, recompiles from an attribute counter, from calls the target
# lists and from a shape branch, rotary caches grown in a loop, a graph layer, a finiteness check, an own init.
COMPARED = ("branch_bad.py:make", "branch_good.py:make", "print_bad.py:make", "recompiles.py:counter",
            "recompiles.py:steps", "recompiles.py:shape_branch", "rotary.py:make_loop", "graph_layer.py:make",
            "finite.py:make", "own_init.py:make")


def test_the_compile_tests_models_give_what_whole_model_compilation_gives(tmp_path, monkeypatch):
    files = _compile_tests_models(tmp_path)
    for file, factories in files.items():
        for factory in factories:
            assert repeated_blocks(_made(tmp_path / file, factory).model) == [], f"{file}:{factory}"
    assert set(COMPARED) <= {f"{file}:{factory}" for file, factories in files.items() for factory in factories}
    shortcut, whole = _both(monkeypatch, lambda: check_targets(tmp_path, list(COMPARED), select=("GL301", "GL302"),
                                                               vary=("batch", "seq")))
    assert shortcut == whole
    # The compared models give findings of both rules (the comparison covers breaks and recompiles).
    assert {"GL301", "GL302"} <= {finding[0] for finding in shortcut[0]}


_LOADED = itertools.count()


def _made(path, factory: str) -> Target:
    """The target a factory of a model file makes, built here on the CPU (as a Target, whatever it returns)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"shortcut_models_{path.stem}_{next(_LOADED)}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return normalize_factory_result(getattr(module, factory)())


def test_the_shortcut_waits_for_enough_alike_blocks_to_pay_for_itself(tmp_path, monkeypatch):
    path = write(tmp_path, "blocks.py", BLOCKS + "\n\ndef deep():\n    return Model(depth=6), (torch.randn(2, 8),)\n")
    monkeypatch.setattr(compile_regions, "SHORTCUT_FROM_BLOCKS", 6)
    # four alike blocks compile whole (sooner than the regions' copy and machinery); six through the regions
    assert not has_alike_blocks(_made(path, "plain").model)
    assert has_alike_blocks(_made(path, "deep").model)
    assert not _analysed(path, "plain", None).shortcut
