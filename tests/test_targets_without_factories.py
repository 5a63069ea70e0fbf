"""Targets without factories: a model class with --input specs, --init arguments, example_inputs(), table-form
targets in [tool.graphlint], and the spec grammar's errors."""

from __future__ import annotations

import json

import pytest
import torch

from graphlint.config import read_config
from graphlint.errors import TargetFailure, UsageError
from graphlint.inputs import parse_input
from graphlint.target import TargetSpec, load_factory, target_text

from conftest import WITHOUT_COMPILE, line_of, run_graphlint, write

NETS = """
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
    def __init__(self, vocab, dim=16, depth=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Attention(dim) for _ in range(depth))

    def forward(self, ids, keep=None):
        x = self.emb(ids)
        for block in self.blocks:
            x = x + block(x)
        return x if keep is None else x * keep.unsqueeze(-1)


class Clean(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        return F.log_softmax(self.fc(x), dim=-1)


class Pooled(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return torch.log(torch.softmax(self.conv(x).flatten(1), dim=-1))

    def example_inputs(self):
        return (torch.randn(2, 3, 8, 8),)


class NoInputs(nn.Module):
    def forward(self, x):
        return x
"""


# -- the grammar --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, dtype, shape, low, high, keyword", [
    ("float32[2,3,32,32]", "float32", (2, 3, 32, 32), None, None, None),
    ("int64[2, 16]:0..1000", "int64", (2, 16), 0, 1000, None),
    ("bool[4]", "bool", (4,), None, None, None),
    ("half[]", "float16", (), None, None, None),
    ("mask=long[2,5]:-3..3", "int64", (2, 5), -3, 3, "mask"),
    ("float[8]:0..0.5", "float32", (8,), 0, 0.5, None),
])
def test_an_input_spec_reads_dtype_shape_range_and_keyword_and_writes_itself_back(text, dtype, shape, low, high, keyword):
    spec = parse_input(text)
    assert (spec.dtype, spec.shape, spec.low, spec.high, spec.keyword) == (dtype, shape, low, high, keyword)
    assert parse_input(spec.text) == spec


@pytest.mark.parametrize("text, says", [
    ("float33[2]", "unknown dtype 'float33'; the dtypes are float32, float64"),
    ("float32(2,3)", "is not DTYPE[D0,D1,...]"),
    ("int64[2,a]", "the shape must be sizes separated by commas"),
    ("int64[2]:0..x", "the range must be LOW..HIGH"),
    ("int64[2]:5..1", "is empty; HIGH must be above LOW"),
    ("int64[2]:0..1.5", "an integer range needs whole numbers"),
    ("bool[2]:0..1", "bool inputs take no range"),
    ("uint8[2]:-1..5", "uint8 holds 0..256 (HIGH excluded)"),
])
def test_a_malformed_spec_says_what_is_wrong(text, says):
    with pytest.raises(UsageError) as raised:
        parse_input(text)
    assert says in str(raised.value)


def test_built_inputs_have_the_spec_dtype_shape_and_values_in_range():
    ids = parse_input("int64[64,64]:5..9").build()
    assert ids.dtype == torch.int64 and ids.shape == (64, 64)
    assert ids.min() >= 5 and ids.max() <= 8 and set(ids.unique().tolist()) == {5, 6, 7, 8}  # HIGH excluded
    default = parse_input("int32[1000]").build()
    assert default.dtype == torch.int32 and set(default.unique().tolist()) == {0, 1}
    assert parse_input("bool[100]").build().dtype == torch.bool
    uniform = parse_input("float64[1000]:2..3").build()
    assert uniform.dtype == torch.float64 and 2 <= uniform.min() and uniform.max() < 3
    with torch.device("meta"):  # built on the capture's device
        assert parse_input("float16[2,3]").build().device.type == "meta"


def test_a_target_text_carries_its_inputs_and_arguments_and_parses_back(tmp_path):
    text = target_text("pkg/net.py:Net", ["float32[2, 8]", "keep=bool[2,8]"],
                       {"depth": 2, "act": "gelu", "sizes": [1, 2], "name": "a b", "flag": "true", "on": True})
    spec = TargetSpec.parse(text, tmp_path)
    assert spec.file == tmp_path / "pkg" / "net.py" and spec.name == "Net"
    assert [s.text for s in spec.inputs] == ["float32[2,8]", "keep=bool[2,8]"]
    assert spec.kwargs == {"depth": 2, "act": "gelu", "sizes": [1, 2], "name": "a b", "flag": "true", "on": True}
    assert TargetSpec.parse(spec.relocated("net.py"), tmp_path).kwargs == spec.kwargs
    assert target_text("pkg/net.py:make") == "pkg/net.py:make"  # factories keep their names
    assert target_text("a.py:Net", ["float32[2]"]) != target_text("a.py:Net", ["float32[3]"])  # distinct identities


def test_table_form_targets_in_pyproject(tmp_path):
    pyproject = write(tmp_path, "pyproject.toml", """
        [tool.graphlint]
        targets = ["models/gpt.py:make_model",
                   { model = "pkg/net.py:Net", inputs = ["float32[2,3,32,32]"], kwargs = { depth = 2, act = "gelu" } }]
    """)
    targets = read_config(pyproject).targets
    assert targets[0] == "models/gpt.py:make_model"
    spec = TargetSpec.parse(targets[1], tmp_path)
    assert spec.name == "Net" and spec.inputs[0].shape == (2, 3, 32, 32) and spec.kwargs == {"depth": 2, "act": "gelu"}
    for table, says in [('{ inputs = ["float32[2]"] }', 'needs model = "path/to/file.py:NAME"'),
                        ('{ model = "a.py:Net", input = [] }', "unknown key input"),
                        ('{ model = "a.py:Net", kwargs = 3 }', "kwargs must be a table"),
                        ("3", "must be a string or a table")]:
        write(tmp_path, "pyproject.toml", f"[tool.graphlint]\ntargets = [{table}]\n")
        with pytest.raises(UsageError) as raised:
            read_config(pyproject)
        assert says in str(raised.value)


# -- the command ------------------------------------------------------------------------------------------


@pytest.mark.cli
def test_class_targets_find_the_planted_problems_and_nothing_in_clean_ones(tmp_path):
    nets = write(tmp_path, "models/nets.py", NETS)
    write(tmp_path, "pyproject.toml", '[project]\nname = "p"\nversion = "0"\n')
    lm = run_graphlint("check", *WITHOUT_COMPILE, "models/nets.py:TinyLM", "--input", "int64[2,7]:0..50",
                       "--input", "keep=bool[2,7]", "--init", "vocab=50", "--no-cache", "--format", "json", cwd=tmp_path)
    found = json.loads(lm.stdout)
    assert lm.returncode == 1, lm.stderr
    assert [(f["rule"], f["location"]["line"]) for f in found["findings"]] == [("GL101", line_of(nets, "F.softmax"))]
    assert "--input 'int64[2,7]:0..50'" in found["findings"][0]["targets"][0]  # the identity includes the inputs
    others = run_graphlint("check", *WITHOUT_COMPILE, "models/nets.py:Clean", "models/nets.py:Pooled", "--input", "float32[2,8]",
                           "--no-cache", cwd=tmp_path)
    # Pooled has example_inputs() but --input names another shape: it fails cleanly and Clean is still linted.
    assert others.returncode == 2 and others.stdout.startswith("No findings in 2 targets"), others.stdout
    assert "models/nets.py:Pooled --input 'float32[2,8]': the forward raised" in others.stderr
    example = run_graphlint("check", *WITHOUT_COMPILE, "models/nets.py:Pooled", "--no-cache", cwd=tmp_path)
    assert example.stdout.startswith(f"models/nets.py:{line_of(nets, 'torch.log(')}:") and "GL204" in example.stdout


@pytest.mark.cli
def test_each_bad_class_target_is_one_line_with_exit_2_and_the_others_are_still_linted(tmp_path):
    write(tmp_path, "models/nets.py", NETS)
    write(tmp_path, "pyproject.toml", """
        [tool.graphlint]
        targets = [
            { model = "models/nets.py:Pooled" },
            { model = "models/nets.py:TinyLM", inputs = ["int64[2,7]:0..50"] },
            { model = "models/nets.py:Clean", inputs = ["float33[2,8]"] },
            { model = "models/nets.py:Clean", inputs = ["float32[2,8]"], kwargs = { width = 3 } },
            "models/nets.py:NoInputs",
        ]
    """)
    result = run_graphlint("check", *WITHOUT_COMPILE, "--no-cache", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("graphlint: error: ")]
    expected = [
        "models/nets.py:TinyLM --input 'int64[2,7]:0..50': TinyLM() needs vocab; give it with --init vocab=VALUE, "
        "or kwargs = { vocab = VALUE } in the [tool.graphlint] target table",
        "models/nets.py:Clean --input 'float33[2,8]': input spec 'float33[2,8]': unknown dtype 'float33'; the dtypes "
        "are float32, float64, float16, bfloat16, int64, int32, int16, int8, uint8, bool",
        "models/nets.py:Clean --input 'float32[2,8]' --init width=3: Clean() takes no argument width; it takes dim",
        "models/nets.py:NoInputs: NoInputs is a model class, and graphlint has no inputs for it: give each forward "
        "argument with --input (like --input 'float32[2,3,32,32]'), or define a method example_inputs(self) on the "
        "model that returns them",
    ]
    assert errors == [f"graphlint: error: {line}" for line in expected]
    assert "GL204" in result.stdout  # Pooled, from example_inputs(), is still linted


@pytest.mark.cli
def test_input_options_without_a_command_line_target_point_to_the_table_form(tmp_path):
    result = run_graphlint("check", "--input", "float32[2,8]", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == ('graphlint: error: --input and --init apply to the targets named on the command '
                                     'line; for [tool.graphlint] targets write a table: { model = "pkg/net.py:Net", '
                                     'inputs = [...], kwargs = { ... } }')


def test_a_constructor_that_needs_an_object_points_to_a_factory(tmp_path):
    write(tmp_path, "cfg.py", """
        from dataclasses import dataclass
        from torch import nn


        @dataclass
        class Config:
            dim: int = 4


        class Net(nn.Module):
            def __init__(self, config: Config, depth: int = 1):
                super().__init__()
                self.fc = nn.Linear(config.dim, config.dim)
    """)
    loaded = load_factory(TargetSpec.parse(target_text("cfg.py:Net", ["float32[2,4]"], {"depth": 2}), tmp_path))
    with pytest.raises(TargetFailure) as raised:
        loaded.factory()
    assert str(raised.value) == ("Net() needs config; give it with --init config=VALUE, or kwargs = { config = VALUE } "
                                 "in the [tool.graphlint] target table; config takes an object that a literal cannot "
                                 "give: write a factory function that builds the model and name it instead")


def test_a_function_returning_the_model_takes_arguments_and_inputs(tmp_path):
    write(tmp_path, "zoo.py", NETS + """

def build(name, **options):
    return {"lm": TinyLM, "clean": Clean}[name](**options)
""")
    made = load_factory(TargetSpec.parse(target_text("zoo.py:build", ["int64[2,5]:0..7"], {"name": "lm", "vocab": 7}),
                                         tmp_path)).factory()
    assert type(made.model).__name__ == "TinyLM" and made.model.emb.num_embeddings == 7
    assert made.args[0].shape == (2, 5) and made.args[0].max() < 7 and made.kwargs == {}


@pytest.mark.cli
@pytest.mark.proof
def test_a_class_target_fix_is_proven_with_its_inputs_and_arguments(tmp_path):
    nets = write(tmp_path, "nets.py", NETS)
    write(tmp_path, "pyproject.toml", '[project]\nname = "p"\nversion = "0"\n')
    result = run_graphlint("check", *WITHOUT_COMPILE, "nets.py:Pooled", "--input", "float32[2,3,8,8]", "--no-cache",
                           "--diff", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "+        return F.log_softmax(self.conv(x).flatten(1), dim=-1)" in result.stdout
    assert "graphlint: 1 fix would be applied" in result.stderr
    assert "torch.log(torch.softmax" in nets.read_text()  # --diff writes nothing


@pytest.mark.cli
def test_a_class_that_needs_an_object_it_defaults_to_none_says_to_write_a_factory(tmp_path):
    write(tmp_path, "effnet.py", '''
        import torch
        from torch import nn


        class EfficientNet(nn.Module):
            def __init__(self, blocks_args=None, global_params=None):
                super().__init__()
                assert isinstance(blocks_args, list), "blocks_args should be a list"
                self.stem = nn.Conv2d(3, 8, 3)

            def forward(self, x):
                return self.stem(x)
    ''')
    done = run_graphlint("check", "effnet.py:EfficientNet", "--input", "float32[1,3,8,8]", cwd=tmp_path)
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert "blocks_args should be a list" in line and f"effnet.py:{line_of(tmp_path / 'effnet.py', 'assert')}" in line
    assert "blocks_args, global_params left at None" in line and "write a factory function" in line
