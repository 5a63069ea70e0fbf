"""`pytest --graphlint`: an ordinary project's own tests, run by pytest in a subprocess (pytester), with and
without the option."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import textwrap

import pytest
import torch

pytest_plugins = ("pytester",)

MODELS = """
import math
import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, dim, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in self.qkv(x).chunk(3, dim=-1))
        probs = F.softmax(q @ k.transpose(-2, -1) / math.sqrt(c // self.heads), dim=-1)
        return (probs @ v).transpose(1, 2).reshape(b, t, c)


class TinyLM(nn.Module):
    def __init__(self, vocab, dim=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.block = Attention(dim)

    def forward(self, ids, mask=None):
        x = self.emb(ids)
        return self.block(x) if mask is None else self.block(x) * mask.unsqueeze(-1)


class Gate(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        y = self.fc(x)
        if x.sum() > 0:  # a branch on values: captured on CPU, with the recorded values
            return torch.log(torch.softmax(y, dim=-1))
        return F.log_softmax(y, dim=-1)


class Clean(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        return F.log_softmax(self.fc(x), dim=-1)
"""

TESTS = """
import torch
from zoo.models import Clean, Gate, TinyLM


def make_lm():
    return TinyLM(vocab=40)


def test_lm_many_calls_without_grad():
    model = make_lm().eval()
    ids = torch.randint(0, 40, (2, 6))
    with torch.no_grad():
        for _ in range(3000):
            out = model(ids, mask=torch.ones(2, 6))
    assert out.shape == (2, 6, 16)


def test_lm_built_at_the_same_line_again():
    assert make_lm()(torch.zeros(1, 3, dtype=torch.long)).shape == (1, 3, 16)


def test_gate_inputs_changed_in_place_after_the_call():
    model = Gate()
    x = torch.ones(2, 8)
    model(x)
    x.mul_(-1)  # the recording keeps the first call's values: the branch with the problem
    model(x)
    loss = torch.nn.functional.mse_loss(model(x), torch.zeros(2, 8))
    assert torch.isfinite(loss)


def test_clean_with_a_loss_module():
    model = Clean()
    out = model(torch.randn(3, 8))
    assert torch.nn.NLLLoss()(out, torch.tensor([0, 1, 2])) > 0


def test_a_torch_layer_alone():
    assert torch.nn.Linear(4, 2)(torch.randn(3, 4)).shape == (3, 2)
"""


# conftest's WITHOUT_COMPILE for the plugin, which reads the rules from the project: no dynamo trace per linted model.
PYPROJECT_WITHOUT_COMPILE = '\n[tool.graphlint]\nignore = ["GL3"]\n'


def _project(pytester, compile_rules: bool = True):
    pytester.makepyfile(**{"src/zoo/__init__.py": "", "src/zoo/models.py": textwrap.dedent(MODELS),
                           "tests/test_models.py": textwrap.dedent(TESTS)})
    pytester.makepyprojecttoml(textwrap.dedent("""
        [project]
        name = "zoo"
        version = "0"
        [tool.pytest.ini_options]
        pythonpath = ["src"]
    """) + ("" if compile_rules else PYPROJECT_WITHOUT_COMPILE))
    return pytester.path


def _line(pytester, fragment: str) -> int:
    lines = (pytester.path / "src/zoo/models.py").read_text().splitlines()
    return next(number for number, line in enumerate(lines, 1) if fragment in line)


@pytest.mark.cli
def test_pytest_graphlint_lints_each_model_the_tests_ran_once_and_fails_the_session(pytester):
    _project(pytester)  # the defaults users get: the report reads GL301 too
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--graphlint", "--graphlint-output", "out.json",
                                           "--graphlint-format", "json", timeout=600)
    assert result.ret == 1, result.stdout.str()
    result.assert_outcomes(passed=5)  # the tests themselves are unchanged
    output = result.stdout.str()
    section = output.split("= graphlint =", 1)[1]
    expected = [f"src/zoo/models.py:{_line(pytester, 'F.softmax(q @ k')}:17: GL101 ",
                f"src/zoo/models.py:{_line(pytester, 'if x.sum() > 0')}:12: GL103 ",  # the branch on a value
                f"src/zoo/models.py:{_line(pytester, 'if x.sum() > 0')}:12: GL301 ",  # ...ends the compiled graph
                f"src/zoo/models.py:{_line(pytester, 'torch.log(torch.softmax')}:20: GL204 "]
    found = [line for line in section.splitlines() if line.startswith("src/")]
    assert len(found) == 4 and all(line.startswith(start) for line, start in zip(found, expected, strict=True)), section
    # TinyLM, built twice at one line, is one model; Gate and Clean are the others; torch's NLLLoss and Linear
    # called by a test are not the project's models.
    assert "Found 4 findings in 3 targets" in section
    report = json.loads((pytester.path / "out.json").read_text())
    tests = (pytester.path / "tests/test_models.py").read_text().splitlines()
    built = {name: next(n for n, line in enumerate(tests, 1) if f"{name}(" in line) for name in ("Gate", "TinyLM")}
    assert sorted((f["rule"], f["targets"]) for f in report["findings"]) == [
        ("GL101", [f"TinyLM built at tests/test_models.py:{built['TinyLM']}"]),
        ("GL103", [f"Gate built at tests/test_models.py:{built['Gate']}"]),
        ("GL204", [f"Gate built at tests/test_models.py:{built['Gate']}"]),
        ("GL301", [f"Gate built at tests/test_models.py:{built['Gate']}"])]


@pytest.mark.cli
def test_without_the_option_the_plugin_does_nothing_and_imports_no_torch(pytester):
    _project(pytester)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=600)
    assert result.ret == 0
    assert "= graphlint =" not in result.stdout.str()
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, graphlint.pytest_plugin; print(sorted(m for m in sys.modules "
                               "if m.split('.')[0] == 'torch' or m in ('graphlint.recorded', 'graphlint.capture')))"],
        capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"


@pytest.mark.cli
def test_report_without_failing_and_a_baseline_written_by_graphlint_check(pytester):
    _project(pytester)  # the defaults users get: a baseline of the whole report (GL301 included) from the command
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--graphlint", "--graphlint-no-fail",
                                           "-k", "gate", timeout=600)
    assert result.ret == 0
    assert " GL204 " in result.stdout.str() and "Found 3 findings in 1 target" in result.stdout.str()
    # The same model as a class target, on positive inputs (the branch with the problem), is the baseline; kept
    # outside the project, where pytest's rootdir does not follow it when written with "=".
    baseline = pytester.path.parent / f"{pytester.path.name}-baseline.json"
    written = subprocess.run([sys.executable, "-m", "graphlint", "check", "src/zoo/models.py:Gate", "--input",
                              "float32[2,8]:1..2", "--no-cache", "--write-baseline", str(baseline)],
                             cwd=pytester.path, capture_output=True, text=True)
    assert "wrote 3 findings to the baseline" in written.stderr, written.stderr
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--graphlint", f"--graphlint-baseline={baseline}",
                                           "-k", "gate", timeout=600)
    assert result.ret == 0, result.stdout.str()
    assert "No findings in 1 target" in result.stdout.str()

@pytest.mark.cli
@pytest.mark.proof
def test_the_summary_names_the_command_that_lints_and_fixes_the_recorded_model(pytester):
    _project(pytester, compile_rules=False)  # TinyLM's GL101 and its fix; the command below reads the same pyproject
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--graphlint", "-k", "same_line", timeout=600)
    section = result.stdout.str().split("= graphlint =", 1)[1]
    assert "(the command named for each model below proves and applies it)" in section
    commands = [line.split(": graphlint check ", 1)[1] for line in section.splitlines()
                if line.startswith("graphlint: TinyLM built at tests/test_models.py:")]
    # The class as a target, with its literal constructor argument and the recorded input's dtype, shape and range.
    assert commands == ["src/zoo/models.py:TinyLM --input 'int64[1,3]:0..1' --init vocab=40 --fix"], section
    fixed = subprocess.run([sys.executable, "-m", "graphlint", "check", *shlex.split(commands[0])],
                           cwd=pytester.path, capture_output=True, text=True, timeout=600)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "scaled_dot_product_attention" in (pytester.path / "src/zoo/models.py").read_text()


CONFIGURED = """
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F


class Attn(nn.Module):
    def __init__(self, dim, heads=1, fused=False):
        super().__init__()
        self.heads, self.fused = heads, fused
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in self.qkv(x).chunk(3, dim=-1))
        if self.fused:
            out = F.scaled_dot_product_attention(q, k, v)
        else:
            out = F.softmax(q @ k.transpose(-2, -1) / math.sqrt(c // self.heads), dim=-1) @ v
        return out.transpose(1, 2).reshape(b, t, c)


@pytest.mark.parametrize("heads,fused", [(1, False), (2, True), (2, False)])
def test_attn(heads, fused):
    model = Attn(8, heads=heads, fused=fused)
    assert model(torch.randn(2, 4, 8)).shape == (2, 4, 8)
"""


@pytest.mark.cli
def test_configurations_of_one_class_are_distinct_targets_up_to_the_bound(pytester):
    pytester.makepyfile(test_configured=textwrap.dedent(CONFIGURED))
    pytester.makepyprojecttoml(PYPROJECT_WITHOUT_COMPILE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--graphlint", "--graphlint-configurations", "2",
                                           "--graphlint-output", "out.json", "--graphlint-format", "json", timeout=600)
    assert result.ret == 1, result.stdout.str()
    lines = (pytester.path / "test_configured.py").read_text().splitlines()
    built = next(n for n, text in enumerate(lines, 1) if "Attn(8, heads" in text)
    report = json.loads((pytester.path / "out.json").read_text())
    # Two configurations linted, each a target of its own; the finding names the one it holds for.
    assert [(f["rule"], f["targets"]) for f in report["findings"]] == [
        ("GL101", [f"Attn built at test_configured.py:{built} with (8, heads=1, fused=False)"])]
    assert "Found 1 finding in 2 targets" in result.stdout.str()
    result.stdout.fnmatch_lines([f"graphlint: note: Attn built at test_configured.py:{built} was not linted: 1 more "
                                 "configuration (other constructor arguments) was left out: at most 2 *"])


CONFTEST = """
from zoo.models import Clean

SHARED = Clean(8)  # built while conftest.py is imported
"""

MORE_TESTS = """
import torch
from zoo.models import Gate


def test_shared(request):
    from conftest import SHARED
    assert SHARED(torch.randn(2, 8)).shape == (2, 8)


def test_compiled_only():
    model = torch.compile(Gate(), backend="eager")  # only ever called through torch.compile's wrapper
    assert model(torch.ones(2, 8)).shape == (2, 8)
"""


@pytest.mark.cli
def test_models_from_conftest_compiled_models_and_xdist_workers(pytester):
    _project(pytester)  # the defaults users get: GL301 of the model recorded through torch.compile's wrapper is read
    pytester.makepyfile(**{"tests/conftest.py": textwrap.dedent(CONFTEST),
                           "tests/test_more.py": textwrap.dedent(MORE_TESTS)})
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--graphlint", "-n", "2", "--graphlint-output",
                                           "out.json", "--graphlint-format", "json", timeout=600)
    assert result.ret == 1, result.stdout.str()
    result.assert_outcomes(passed=7)
    report = json.loads((pytester.path / "out.json").read_text())
    more = (pytester.path / "tests/test_more.py").read_text().splitlines()
    compiled_at = next(n for n, line in enumerate(more, 1) if "torch.compile(" in line)
    targets = {t for f in report["findings"] for t in f["targets"]}
    assert f"Gate built at tests/test_more.py:{compiled_at}" in targets  # the model, not torch's wrapper
    assert not any("torch" in f["location"]["path"] for f in report["findings"])
    assert sorted({f["rule"] for f in report["findings"]}) == ["GL101", "GL103", "GL204", "GL301"]
    # Every distinct model once, whichever worker ran it: TinyLM, Gate (two sites), Clean (two sites).
    assert "Found 4 findings in 5 targets" in result.stdout.str()


LOCAL = """
import torch
from torch import nn


def test_a_class_of_the_test_with_a_lambda():
    class Local(nn.Module):
        def __init__(self, act):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.act = act

        def forward(self, x):
            return torch.log(torch.softmax(self.act(self.fc(x)), dim=-1))

    assert Local(lambda t: t * 2)(torch.randn(2, 4)).shape == (2, 4)
"""


@pytest.mark.cli
def test_a_model_torch_save_cannot_write_is_linted_from_memory(pytester):
    pytester.makepyfile(test_local=textwrap.dedent(LOCAL))
    pytester.makepyprojecttoml(PYPROJECT_WITHOUT_COMPILE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--graphlint", timeout=600)
    assert result.ret == 1, result.stdout.str()
    lines = (pytester.path / "test_local.py").read_text().splitlines()
    line = next(n for n, text in enumerate(lines, 1) if "torch.log(" in text)
    result.stdout.fnmatch_lines([f"test_local.py:{line}:20: GL204 *", "Found 1 finding in 1 target*"])
    # A class defined in a test, built with a lambda: no command line can build it, a factory can.
    result.stdout.fnmatch_lines(["graphlint: Local built at test_local.py:*: its constructor arguments or inputs are "
                                 "no literals: write a factory function *"])


BLOCKS = """
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        nn.Linear(dim, dim)  # a probe built and dropped: CPython hands its id to the next module
        self.conv = nn.Conv2d(dim, dim, 3, padding=1)
        self.norm = nn.BatchNorm2d(dim)

    def forward(self, x):
        return self.norm(self.conv(x))


class Stack(nn.Module):
    def __init__(self, depth=3):
        super().__init__()
        self.blocks = nn.Sequential(*[Block() for _ in range(depth)])

    def forward(self, x):
        return self.blocks(x)
"""

BLOCK_TESTS = """
import torch
from blocks import Stack


def test_stack():
    assert Stack()(torch.randn(2, 8, 6, 6)).shape == (2, 8, 6, 6)
"""


@pytest.mark.cli
def test_the_plugin_places_every_layer_of_repeated_blocks_at_its_construction_on_every_run(pytester):
    pytester.makepyfile(blocks=textwrap.dedent(BLOCKS), test_blocks=textwrap.dedent(BLOCK_TESTS))
    pytester.makepyprojecttoml(PYPROJECT_WITHOUT_COMPILE)
    reports = []
    for run in range(2):
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--graphlint", "--graphlint-output",
                                               f"out{run}.json", "--graphlint-format", "json", timeout=600)
        assert result.ret == 1, result.stdout.str()
        report = json.loads((pytester.path / f"out{run}.json").read_text())
        reports.append(sorted((f["rule"], f["location"]["line"]) for f in report["findings"]))
    conv = next(n for n, line in enumerate((pytester.path / "blocks.py").read_text().splitlines(), 1)
                if "nn.Conv2d" in line)
    assert reports[0] == reports[1] == [("GL105", conv)]


NESTED = """
import torch
from torch import nn


class Decoder(nn.Module):
    def __init__(self, dim=16, depth=1):
        super().__init__()
        self.qkv = nn.ModuleList(nn.Linear(dim, 3 * dim) for _ in range(depth))

    def forward(self, x):
        for qkv in self.qkv:
            q, k, v = qkv(x).chunk(3, dim=-1)
            x = x + (q @ k.transpose(-2, -1) / 4.0).softmax(dim=-1) @ v
        return x


class Wrapper(nn.Module):
    def __init__(self, attn_layers, vocab=40):
        super().__init__()
        self.embed = nn.Embedding(vocab, attn_layers.qkv[0].in_features)
        self.attn_layers = attn_layers

    def forward(self, ids):
        return self.attn_layers(self.embed(ids))
"""

NESTED_TESTS = """
import torch
from zoo.nested import Decoder, Wrapper


def test_wrapper():
    model = Wrapper(attn_layers=Decoder(dim=16, depth=2), vocab=40)
    assert model(torch.randint(0, 40, (2, 5))).shape == (2, 5, 16)
"""


@pytest.mark.cli
def test_a_model_built_from_another_module_gets_a_factory_file_whose_command_fixes_it(pytester):
    pytester.makepyfile(**{"src/zoo/__init__.py": "", "src/zoo/nested.py": textwrap.dedent(NESTED),
                           "tests/test_nested.py": textwrap.dedent(NESTED_TESTS)})
    pytester.makepyprojecttoml('[tool.pytest.ini_options]\npythonpath = ["src"]\n' + PYPROJECT_WITHOUT_COMPILE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--graphlint", timeout=600)
    assert result.ret == 1, result.stdout.str()
    [line] = [line for line in result.stdout.lines if line.startswith("graphlint: Wrapper built at")]
    command = line.split(": graphlint check ", 1)[1].split(" (a factory", 1)[0].split()
    assert command[0].startswith(".graphlint_cache/factories/") and command[1:] == ["--fix"], line
    factory = (pytester.path / command[0].split(":")[0]).read_text()
    assert "Wrapper(attn_layers=Decoder(dim=16, depth=2), vocab=40)" in factory  # the test's own calls
    from conftest import run_graphlint

    fixed = run_graphlint("check", *command, cwd=pytester.path)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "scaled_dot_product_attention" in (pytester.path / "src/zoo/nested.py").read_text()


CONFIGURED_WRAPPERS = """
import pytest
import torch
from zoo.nested import Decoder, Wrapper


@pytest.mark.parametrize("scale", [1.0, 2.0])
def test_wrapper(scale):
    model = Wrapper(attn_layers=Decoder(dim=16, depth=2), vocab=40, embedding_scale_for_the_wrapper=scale)
    assert model(torch.randint(0, 40, (2, 5))).shape == (2, 5, 16)
"""


@pytest.mark.cli
def test_configurations_built_at_one_line_get_factory_files_of_their_own(pytester):
    # The names of the two configurations agree in their first 80 characters, and each command's factory must
    # still build its own configuration.
    nested = textwrap.dedent(NESTED).replace(
        "def __init__(self, attn_layers, vocab=40):\n        super().__init__()",
        "def __init__(self, attn_layers, vocab=40, embedding_scale_for_the_wrapper=1.0):\n        super().__init__()\n"
        "        self.scale = embedding_scale_for_the_wrapper")
    pytester.makepyfile(**{"src/zoo/__init__.py": "", "src/zoo/nested.py": nested,
                           "tests/test_wrappers.py": textwrap.dedent(CONFIGURED_WRAPPERS)})
    pytester.makepyprojecttoml('[tool.pytest.ini_options]\npythonpath = ["src"]\n' + PYPROJECT_WITHOUT_COMPILE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--graphlint", timeout=600)
    assert result.ret == 1, result.stdout.str()
    lines = [line for line in result.stdout.lines if line.startswith("graphlint: Wrapper built at")]
    assert len(lines) == 2, result.stdout.str()
    for line in lines:
        scale = line.split("embedding_scale_for_the_wrapper=", 1)[1].split(")", 1)[0]
        command = line.split("): graphlint check ", 1)[1].split(" (a factory", 1)[0].split()
        factory = (pytester.path / command[0].split(":")[0]).read_text()
        assert f"embedding_scale_for_the_wrapper={scale})" in factory, (line, factory)


INNER = """
import torch
from torch import nn


class Inner(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.pool = nn.Linear(dim, dim)  # built, never called

    def forward(self, x):
        return self.proj(x)


class Outer(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x)
"""

INNER_TESTS = """
import torch
from zoo.inner import Inner, Outer


def test_outer():
    model = Outer(Inner(8))
    assert model(torch.randn(2, 8)).shape == (2, 8)
"""


@pytest.mark.cli
def test_a_module_argument_is_rebuilt_so_its_findings_point_where_its_layers_were_built(pytester):
    # x-transformers' UniversalPretrainWrapper(TransformerWrapper(...)): a finding on the wrapped model's unused
    # layer belongs at the line that built that layer, as `graphlint check` on a factory reports it.
    pytester.makepyfile(**{"src/zoo/__init__.py": "", "src/zoo/inner.py": textwrap.dedent(INNER),
                           "tests/test_inner.py": textwrap.dedent(INNER_TESTS)})
    pytester.makepyprojecttoml('[tool.pytest.ini_options]\npythonpath = ["src"]\n' + PYPROJECT_WITHOUT_COMPILE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--graphlint", "--graphlint-no-fail",
                                           "--graphlint-output", "out.json", "--graphlint-format", "json",
                                           timeout=600)
    result.assert_outcomes(passed=1)
    report = json.loads((pytester.path / "out.json").read_text())
    lines = (pytester.path / "src/zoo/inner.py").read_text().splitlines()
    built = next(n for n, text in enumerate(lines, 1) if "# built, never called" in text)
    assert [(f["rule"], f["location"]["path"], f["location"]["line"]) for f in report["findings"]] == [
        ("GL203", "src/zoo/inner.py", built)]
    assert report["notes"] == [], report["notes"]  # built on the meta device with the model, not moved there


LIBRARY_LAYER = '''
from torch import nn


class Flattened(nn.Module):
    """A parameter-free reshaping layer, as einops' Rearrange."""

    def forward(self, x):
        return x.flatten(1)


class Scaled(nn.Module):
    """A library layer with a weight: a model of its own when a test calls it."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x) * 2
'''

LIBRARY_TESTS = '''
import torch
from shapelib import Flattened, Scaled


def test_flattened():
    assert Flattened()(torch.randn(2, 3, 4)).shape == (2, 12)


def test_scaled():
    assert Scaled()(torch.randn(2, 4)).shape == (2, 4)
'''


@pytest.mark.cli
def test_a_libraries_parameter_free_layer_called_by_a_test_is_not_a_target(pytester):
    pytester.makepyfile(**{"site-packages/shapelib.py": textwrap.dedent(LIBRARY_LAYER),
                           "tests/test_layers.py": textwrap.dedent(LIBRARY_TESTS)})
    pytester.makepyprojecttoml('[project]\nname = "p"\nversion = "0"\n[tool.pytest.ini_options]\n'
                               'pythonpath = ["site-packages"]\n' + PYPROJECT_WITHOUT_COMPILE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--graphlint", "--graphlint-no-fail",
                                           "--graphlint-output", "out.json", "--graphlint-format", "json",
                                           timeout=600)
    result.assert_outcomes(passed=2)
    report = json.loads((pytester.path / "out.json").read_text())
    assert report["summary"]["targets"] == 1, report["summary"]  # Scaled only: it has a weight to train


class Shape(tuple):
    """A tuple subclass whose constructor takes the sizes one by one, as `Shape(4, 2)`."""

    def __new__(cls, *sizes):
        return super().__new__(cls, sizes)


class Grid(torch.nn.Module):
    def __init__(self, shape):
        super().__init__()
        assert type(shape) is Shape, shape
        self.fc = torch.nn.Linear(shape[0], shape[1])
        self.shape = shape

    def forward(self, x, shape):
        return self.fc(x).reshape(-1, *shape[1:])


def test_a_tuple_subclass_with_its_own_new_is_rebuilt_as_the_test_built_it(tmp_path):
    from graphlint import recorded

    recorder = recorded.ModelRecorder()
    recorder.install()
    try:
        Grid(Shape(4, 2))(torch.randn(3, 4), Shape(3, 2))
    finally:
        recorder.uninstall()
    [recording] = recorder.recordings.values()
    assert recording.problem is None and recording.target is None  # no command line spells a Shape
    path = tmp_path / "grid.pt"
    path.write_bytes(recording.data)
    made = recorded.rebuild(str(path))  # Shape((4, 2)) before: the constructor's assertion
    assert type(made.model.shape) is Shape and made.model.shape == (4, 2)
    assert type(made.args[1]) is Shape and made.args[1] == (3, 2)
    assert made.model(*made.args).shape == (3, 2)


SAME_MODELS = """
import os

import torch
from torch import nn


def _built(model):
    with open(os.environ["GRAPHLINT_TEST_BUILDS"], "a") as out:
        out.write(f"{type(model).__name__} {os.getpid()}\\n")


class LogSoftmax(nn.Module):
    def __init__(self, dim):
        super().__init__()
        _built(self)
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        return torch.log(torch.softmax(self.fc(x), dim=-1))


class Gate(nn.Module):
    def __init__(self, dim):
        super().__init__()
        _built(self)
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        if x.sum() > 0:  # a branch on a value: captured on the CPU, where the inputs' values count
            return self.fc(x)
        return x
"""

SAME_TESTS = """
import torch
from zoo.models import Gate, LogSoftmax


def test_one():
    assert LogSoftmax(8)(torch.randn(2, 8)).shape == (2, 8)


def test_two():
    assert LogSoftmax(8)(torch.randn(2, 8)).shape == (2, 8)


def test_three():
    assert LogSoftmax(8)(torch.randn(2, 8)).shape == (2, 8)


def test_gate_random():
    Gate(8)(torch.randn(2, 8))


def test_gate_random_again():
    Gate(8)(torch.randn(2, 8))


def test_gate_ones():
    Gate(8)(torch.ones(2, 8))


def test_gate_ones_again():
    Gate(8)(torch.ones(2, 8))
"""


@pytest.mark.cli
def test_one_model_built_at_several_lines_is_linted_once_and_reported_for_each(pytester, monkeypatch):
    pytester.makepyfile(**{"src/zoo/__init__.py": "", "src/zoo/models.py": textwrap.dedent(SAME_MODELS),
                           "tests/test_same.py": textwrap.dedent(SAME_TESTS)})
    pytester.makepyprojecttoml('[project]\nname = "zoo"\nversion = "0"\n[tool.pytest.ini_options]\npythonpath = ["src"]\n'
                               + PYPROJECT_WITHOUT_COMPILE)
    builds = pytester.path / "builds.txt"
    monkeypatch.setenv("GRAPHLINT_TEST_BUILDS", str(builds))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--graphlint", "--graphlint-no-fail",
                                           "--graphlint-output", "out.json", "--graphlint-format", "json", timeout=600)
    result.assert_outcomes(passed=7)
    lines = [line.split() for line in builds.read_text().splitlines()]
    tests = {pid for name, pid in lines[:7]}  # the tests' own constructions, in pytest's process
    lints = {name: len({pid for n, pid in lines[7:] if n == name and pid not in tests}) for name in ("LogSoftmax", "Gate")}
    # Each lint runs in a process of its own. One LogSoftmax(8) on float32[2,8], whatever the line: one lint. Gate
    # is captured on the CPU, where values count: the two random draws are two lints, the two torch.ones one.
    assert lints == {"LogSoftmax": 1, "Gate": 3}, lines
    report = json.loads((pytester.path / "out.json").read_text())
    assert report["summary"]["targets"] == 7, report["summary"]
    targets = {f["rule"]: f["targets"] for f in report["findings"] if f["rule"] in ("GL204", "GL103")}
    source = (pytester.path / "tests/test_same.py").read_text().splitlines()
    built = {name: [f"{name} built at tests/test_same.py:{n}" for n, line in enumerate(source, 1) if f"{name}(8)" in line]
             for name in ("LogSoftmax", "Gate")}
    assert sorted(targets["GL204"]) == sorted(built["LogSoftmax"]) and sorted(targets["GL103"]) == sorted(built["Gate"])
