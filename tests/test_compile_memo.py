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
    # Breaks of each source: an op, a Python builtin, a library call, data-dependent control flow (the rule
    # examples hold more).
    cases += [(f"break-{name}", TEMPLATE.replace("{line}", CASES[name][0]), "make")
              for name in ("item", "print", "numpy", "branch")]
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


def test_a_setting_edited_back_and_forth_is_read_in_either_version(tmp_path):
    path = write(tmp_path, "model.py", MODEL)
    memo = CompileMemo(tmp_path / "memo")
    assert not _analysed(path, memo).reused
    assert not _analysed(path, memo, lambda s: s.replace("SCALE = 2", "SCALE = 3")).reused
    assert _analysed(path, memo, lambda s: s.replace("SCALE = 3", "SCALE = 2")).reused
    assert _analysed(path, memo, lambda s: s.replace("SCALE = 2", "SCALE = 3")).reused


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
from transformers import AutoModelForCausalLM, LlamaConfig


def llama():
    config = LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=128)
    return AutoModelForCausalLM.from_config(config), (), {"input_ids": torch.randint(0, 128, (2, 16))}
'''


@pytest.mark.cli
@pytest.mark.transformers
@pytest.mark.parametrize("family", ["llama"])
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


# -- what plain torch.compile reports after an edit, against what the memo gives -------------------------------


@pytest.fixture
def project_files(tmp_path, monkeypatch):
    """A project folder importable by name, its modules imported afresh for each analysis (no stale .pyc), and
    dynamo's settings as they were afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    saved = torch._dynamo.config.save_config()
    yield tmp_path
    torch._dynamo.config.load_config(saved)
    _forget(tmp_path)


def _forget(folder) -> None:
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(str(folder)):
            del sys.modules[name]


def _project_analysed(folder, memo, device="meta"):
    """A fresh import of `folder`'s model.py (and of every project module it imports), analysed as a new run."""
    import importlib

    _forget(folder)
    importlib.invalidate_caches()
    saved, functional = torch._dynamo.config.save_config(), dict(vars(torch.nn.functional))
    hooks = dict(torch.nn.modules.module._global_forward_hooks)
    try:
        module = importlib.import_module("model")
        torch.manual_seed(0)
        model, args = module.make()
        if device == "meta":
            model, args = model.to("meta"), tuple(a.to("meta") for a in args)
        return analyse_target(Target(model, args, {}), device, ("batch",), memo=memo)
    finally:
        _forget(folder)
        torch._dynamo.config.load_config(saved)  # the module's settings and patches last as long as its run
        vars(torch.nn.functional).update(functional)
        torch.nn.modules.module._global_forward_hooks.clear()
        torch.nn.modules.module._global_forward_hooks.update(hooks)


def _reported(analysis):
    return analysis.breaks, analysis.recompiles, analysis.recompile_limit, analysis.limit_hit


def _memo_agrees_after(folder, files: dict, edits: dict, device="meta", kept=True):
    """Analyse `files`, apply `edits` (file -> (old, new)), and check the memo's answer is plain compile's;
    `kept`: whether an unchanged run reuses the first."""
    for name, text in files.items():
        write(folder, name, text)
    memo = CompileMemo(folder / "memo")
    first = _project_analysed(folder, memo, device)
    assert not first.reused and _project_analysed(folder, memo, device).reused is kept
    for name, (old, new) in edits.items():
        text = (folder / name).read_text(encoding="utf-8")
        assert old in text
        (folder / name).write_text(text.replace(old, new), encoding="utf-8")
    fresh = _project_analysed(folder, None, device)
    assert _reported(fresh) != _reported(first), "the edit must change what torch.compile reports"
    again = _project_analysed(folder, memo, device)
    assert _reported(again) == _reported(fresh), f"memo reused={again.reused}: a stale analysis"


def _printing_block(condition: str, before: str = "", state: str = "", imports: str = "") -> str:
    """A model whose forward prints (a graph break) when `condition` holds: `before` is module-level code
    above the model, `state` lines for its __init__."""
    init = "".join(f"\n        {line}" for line in state.splitlines())
    return f'''
import torch
from torch import nn
{imports}

{before}

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8){init}

    def forward(self, x):
        h = self.fc(x)
        if {condition}:
            print("h")
        return h


def make():
    return Block(), (torch.randn(4, 8),)
'''


VERBOSE_MODEL = _printing_block("settings.VERBOSE", imports="import settings")


def test_hole_a_global_of_an_imported_module_read_as_its_attribute(project_files):
    """`import settings` ... `settings.VERBOSE`: the value lives in another module's globals."""
    _memo_agrees_after(project_files, {"model.py": VERBOSE_MODEL, "settings.py": "VERBOSE = False\n"},
                       {"settings.py": ("False", "True")})


def test_hole_a_global_of_a_package_module_read_through_its_package(project_files):
    """`import pkg.settings` ... `pkg.settings.VERBOSE`: two modules deep."""
    model = VERBOSE_MODEL.replace("import settings", "import pkg.settings").replace("settings.VERBOSE",
                                                                                      "pkg.settings.VERBOSE")
    _memo_agrees_after(project_files, {"model.py": model, "pkg/__init__.py": "", "pkg/settings.py": "VERBOSE = False\n"},
                       {"pkg/settings.py": ("False", "True")})


OPTIONS_MODEL = _printing_block("{reader}.verbose", before="""
class Options:
    verbose = False


OPTIONS = Options()
""", state="self.options = Options()")


@pytest.mark.parametrize("reader", ["OPTIONS", "self.options"])
def test_hole_a_class_attribute_read_through_an_instance(reader, project_files):
    """A plain (non-module) class's attribute, read through an instance kept in a global or on the model."""
    _memo_agrees_after(project_files, {"model.py": OPTIONS_MODEL.replace("{reader}", reader)},
                       {"model.py": ("verbose = False", "verbose = True")})


SLOTS_MODEL = _printing_block("OPTIONS.verbose", before="""
class Options:
    __slots__ = ("verbose",)

    def __init__(self):
        self.verbose = False


OPTIONS = Options()
""")


def test_hole_an_object_with_slots(project_files):
    _memo_agrees_after(project_files, {"model.py": SLOTS_MODEL},
                       {"model.py": ("self.verbose = False", "self.verbose = True")})


HASHED_MODEL = _printing_block("self.use_hashing", state="self.use_hashing = False")


def test_hole_a_module_attribute_named_with_hash(project_files):
    _memo_agrees_after(project_files, {"model.py": HASHED_MODEL},
                       {"model.py": ("self.use_hashing = False", "self.use_hashing = True")})


PLAIN_MODEL = '''
import torch
from torch import nn


def helper(h):
    print("h")
    return h * 2


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return helper(self.fc(x))


def make():
    x = torch.randn(4, 8)
    return Block(), (x,)
# settings
'''


@pytest.mark.parametrize("setting", ["torch._dynamo.config.automatic_dynamic_shapes = False",
                                     "torch._dynamo.config.recompile_limit = 1"])
def test_hole_a_dynamo_setting_made_by_the_model_file(setting, project_files):
    _memo_agrees_after(project_files, {"model.py": PLAIN_MODEL.replace("print(\"h\")\n", "")},
                       {"model.py": ("# settings", setting)})


def test_hole_allow_in_graph_called_as_a_statement(project_files):
    _memo_agrees_after(project_files, {"model.py": PLAIN_MODEL},
                       {"model.py": ("# settings", "torch._dynamo.allow_in_graph(helper)")})


def test_hole_mark_dynamic_on_the_factorys_inputs(project_files):
    _memo_agrees_after(project_files, {"model.py": PLAIN_MODEL.replace("print(\"h\")\n", "")},
                       {"model.py": ("    x = torch.randn(4, 8)\n",
                                     "    x = torch.randn(4, 8); torch._dynamo.mark_dynamic(x, 0)\n")},
                       device="cpu")


PATCHED_MODEL = '''
import torch
import torch.nn.functional as F
from torch import nn


def loud_gelu(h, approximate="none"):
    print("gelu")
    return h * 2


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return F.gelu(self.fc(x))


def make():
    return Block(), (torch.randn(4, 8),)
# patch
'''


def test_hole_a_torch_function_patched_by_the_model_file(project_files):
    """`F.gelu = loud_gelu` (as flash-attention patches do) taken out: torch's own gelu is traced again."""
    _memo_agrees_after(project_files, {"model.py": PATCHED_MODEL.replace("# patch", "F.gelu = loud_gelu")},
                       {"model.py": ("F.gelu = loud_gelu", "# patch")})


STATIC_MODEL = '''
import torch
from torch import nn

VERBOSE = False


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    @staticmethod
    def show(h, verbose=VERBOSE):
        if verbose:
            print("h")
        return h

    def forward(self, x):
        return self.show(self.fc(x))


def make():
    return Block(), (torch.randn(4, 8),)
'''


def test_hole_a_staticmethods_default_from_a_global(project_files):
    _memo_agrees_after(project_files, {"model.py": STATIC_MODEL}, {"model.py": ("VERBOSE = False", "VERBOSE = True")})


COUNTING_MODEL = '''
import torch
from torch import nn

STATS = {"calls": 0}


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        STATS["calls"] += 1
        return self.fc(x)


def make():
    return Block(), (torch.randn(4, 8),)
'''


@pytest.mark.xfail(strict=True, reason="a false miss: the globals are fingerprinted after the calls changed them")
def test_a_forward_that_updates_a_global_is_reused(project_files):
    """The run that stores sees STATS after the calls; the next run reads it as imported."""
    write(project_files, "model.py", COUNTING_MODEL)
    memo = CompileMemo(project_files / "memo")
    assert not _project_analysed(project_files, memo).reused
    assert _project_analysed(project_files, memo).reused


def test_hole_a_setting_imported_inside_the_forward(project_files):
    model = VERBOSE_MODEL.replace("import settings\n", "").replace(
        "        if settings.VERBOSE:", "        from settings import VERBOSE\n        if VERBOSE:")
    # A false miss kept: the next run reads the memo before the forward has imported `settings`.
    _memo_agrees_after(project_files, {"model.py": model, "settings.py": "VERBOSE = False\n"},
                       {"settings.py": ("False", "True")}, kept=False)


def test_hole_a_global_forward_hook_registered_by_the_model_file(project_files):
    model = PLAIN_MODEL.replace('    print("h")\n', "").replace(
        "# settings", "def loud(module, args, output):\n    print('out')\n\n\n# hook")
    _memo_agrees_after(project_files, {"model.py": model},
                       {"model.py": ("# hook", "nn.modules.module.register_module_forward_hook(loud)")})



ENUM_MODEL = _printing_block('self.kind.value == "slow"', imports="import enum", before="""
class Kind(enum.Enum):
    FAST = "fast"
    SLOW = "slow"
""", state="self.kind = Kind.FAST")


def test_hole_an_enum_members_value(project_files):
    _memo_agrees_after(project_files, {"model.py": ENUM_MODEL}, {"model.py": ('FAST = "fast"', 'FAST = "slow"')})


def test_nothing_is_kept_when_torch_did_not_say_what_it_traced(tmp_path):
    """An older torch records no traced code: an entry with no source lines to check would never miss."""
    from graphlint.capture.compile import CompileAnalysis

    CompileMemo(tmp_path / "memo").store("key", CompileAnalysis(calls=["the factory's inputs"]), [])
    assert not (tmp_path / "memo").exists()


def test_an_analysis_made_under_another_analysis_version_is_not_reused(tmp_path, monkeypatch):
    """An analysis stored before what analyses mean changed (the distributions' validation the analysis runs
    under) is compiled again, not reused: the version is part of the key."""
    from graphlint.capture import compile_memo

    path = write(tmp_path, "model.py", MODEL)
    memo = CompileMemo(tmp_path / "memo")
    monkeypatch.setattr(compile_memo, "ANALYSIS_VERSION", compile_memo.ANALYSIS_VERSION - 1)
    assert not _analysed(path, memo).reused and _analysed(path, memo).reused  # the older version's memo
    monkeypatch.undo()
    assert not _analysed(path, memo).reused  # the current version does not read it
    assert _analysed(path, memo).reused
