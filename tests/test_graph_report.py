"""`graphlint graph`: the numbers agree with independent walks of grad_fn, and the pictures render."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections import Counter

import pytest
import torch
from torch import nn

import graphlint.engine
from conftest import REPO, run_graphlint, write
from graphlint.capture import capture_model
from graphlint.graph import describe
from graphlint.graph.categories import CATEGORIES
from graphlint.report.dot import render_dot
from graphlint.locate.place import Locator
from graphlint.project import Project
from graphlint.tags import FUSABLE_ATTENTION_TAG
from graphlint.rules.gl101_unfused_attention import UnfusedAttention

# A transformer block: LayerNorm, nn.MultiheadAttention, GELU MLP, residuals.
BLOCK = '''
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d=768, heads=12):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


def make(batch=2, seq=128):
    return Block(), (torch.randn(batch, seq, 768),)
'''


def load(path, name="make"):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"graph_{abs(hash(str(path)))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def plain_walk(loss: torch.Tensor):
    """The test's own walk of grad_fn.next_functions, with nothing of graphlint's."""
    seen, stack = [], [loss.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.append(fn)
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    return seen


def plain_node_count(block_file, batch=2, seq=128) -> int:
    """The number of autograd nodes of the block's graph on CPU, walked with nothing of graphlint's."""
    torch.manual_seed(0)
    model, (x,) = load(block_file)(batch, seq)
    return len(plain_walk(model(x).float().sum()))


def saved_activation_bytes(functions, model) -> int:
    """Bytes of tensors the nodes saved, read through their `_saved_*` attributes, each storage once,
    weights left out."""
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen, total = set(), 0
    for fn in functions:
        for attribute in dir(fn):
            if not attribute.startswith("_saved_"):
                continue
            value = getattr(fn, attribute)
            for tensor in value if isinstance(value, (tuple, list)) else [value]:
                if isinstance(tensor, torch.Tensor) and tensor.dim() > 0:
                    pointer = tensor.untyped_storage().data_ptr()
                    if pointer not in weights and pointer not in seen:
                        seen.add(pointer)
                        total += tensor.untyped_storage().nbytes()
    return total


@pytest.fixture(scope="module")
def block_file(tmp_path_factory):
    return write(tmp_path_factory.mktemp("seed"), "block.py", BLOCK)


def graph_of(block_file, batch=2, seq=128):
    model, (x,) = load(block_file)(batch, seq)
    project = Project(root=block_file.parent, first_party_folders=[block_file.parent])
    return model, x, describe(capture_model(model, (x,), {}), Locator(project))


def test_node_counts_agree_with_a_plain_walk_of_grad_fn(block_file):
    model, x, report = graph_of(block_file)
    torch.manual_seed(0)
    functions = plain_walk(model(x).float().sum())
    names = Counter(fn.name() for fn in functions)
    assert report.total == len(functions) > 40  # the number depends on the torch version; the walk is the truth
    assert Counter(view.name for view in report.nodes) == names
    assert sum(sum(c.values()) for c in report.categories.values()) == report.total
    assert report.sinks == names["torch::autograd::AccumulateGrad"] == len(list(model.parameters())) == 12
    assert report.categories["attention"] == {"ScaledDotProductFlashAttentionForCpuBackward0": 1}
    assert report.categories["normalisation"] == {"NativeLayerNormBackward0": 2}
    assert report.categories["activation"] == {"GeluBackward0": 1}
    assert report.categories["loss"] == {"SumBackward0": 1}
    assert report.fused == {"NativeLayerNormBackward0": 2, "ScaledDotProductFlashAttentionForCpuBackward0": 1}
    assert report.without_sink == []


def test_saved_activation_memory_agrees_with_the_saved_tensors_read_directly(block_file):
    model, x, report = graph_of(block_file)
    functions = plain_walk(model(x).float().sum())
    assert report.saved_bytes == saved_activation_bytes(functions, model)
    assert sum(line.bytes for line in report.saved_by_line) <= report.saved_bytes
    biggest = report.saved_by_line[0]  # the `self.mlp(...)` line: its input and its two batch × seq × 4·d activations
    assert biggest.bytes == (2 * 128 * 768 + 2 * (2 * 128 * 3072)) * 4
    assert biggest.where == "mlp.0 … mlp.2" and biggest.ops == ["linear", "gelu"]


def test_saved_bytes_by_node_category_add_up_to_the_saved_activations(block_file):
    _, _, report = graph_of(block_file)
    assert sum(report.saved_by_category.values()) == report.saved_bytes
    # The GELU keeps its batch × seq × 4·d input; the MLP's two Linears keep theirs (matmul-class).
    assert report.saved_by_category["activation"] == 2 * 128 * 3072 * 4
    assert report.saved_by_category["matmul-class"] >= (2 * 128 * 768 + 2 * 128 * 3072) * 4


@pytest.mark.parametrize(("batch", "seq"), [(4, 128), (8, 128), (2, 32), (2, 512)])
def test_the_node_count_does_not_depend_on_batch_or_sequence_length(block_file, batch, seq):
    # From batch 2 up: at batch 1, nn.MultiheadAttention itself records two nodes fewer (55), in PyTorch too.
    _, _, base = graph_of(block_file)
    _, _, varied = graph_of(block_file, batch, seq)
    assert varied.total == base.total
    assert varied.saved_bytes != base.saved_bytes


@pytest.mark.cli
def test_the_command_shows_the_graph_size_against_the_batch_size(block_file):
    result = run_graphlint("graph", "block.py:make", "--device", "cpu", "--vary", "batch", cwd=block_file.parent)
    assert result.returncode == 0, result.stderr
    at_2, at_4 = plain_node_count(block_file, batch=2), plain_node_count(block_file, batch=4)
    assert f"Nodes: {at_2}" in result.stdout
    assert f"  batch 2: {at_2} nodes" in result.stdout and f"  batch 4: {at_4} nodes" in result.stdout
    assert "The number of nodes does not depend on the input size" in result.stdout


def test_a_parameter_without_a_sink_is_named():
    class Partly(nn.Module):
        def __init__(self):
            super().__init__()
            self.used = nn.Linear(4, 4)
            self.cut = nn.Linear(4, 4)

        def forward(self, x):
            return self.used(x) + self.cut(x).detach()

    report = describe(capture_model(Partly(), (torch.randn(2, 4),), {}), Locator(Project.discover()))
    assert (report.sinks, report.trainable) == (2, 4)
    assert report.without_sink == ["cut.weight", "cut.bias"]


@pytest.mark.cli
def test_on_meta_the_report_says_that_sdpa_appears_lowered(tmp_path):
    write(tmp_path, "sdpa.py", BLOCK)
    result = run_graphlint("graph", "sdpa.py:make", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "captured on meta" in result.stdout
    assert "on meta it runs as its math decomposition" in " ".join(result.stdout.split())
    assert "fused attention           0" in result.stdout


@pytest.mark.cli
def test_json_gives_the_same_numbers(block_file):
    result = run_graphlint("graph", "block.py:make", "--device", "cpu", "--format", "json", cwd=block_file.parent)
    data = json.loads(result.stdout)
    expected = plain_node_count(block_file)
    assert data["total"] == expected and len(data["nodes"]) == expected
    assert list(data["categories"]) == list(CATEGORIES)
    assert data["sinks"] == 12 and data["device"] == "cpu"
    edges = sum(len(node["next"]) for node in data["nodes"])
    assert edges >= data["total"] - 1


STACK = '''
import torch
from torch import nn


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        return x + torch.relu(self.fc(self.norm(x)))


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.layers = nn.ModuleList(Layer() for _ in range(12))
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def make():
    return Stack(), (torch.randn(4, 8),)
'''


def test_a_twelve_layer_picture_draws_identical_layers_once(tmp_path):
    model, args = load(write(tmp_path, "stack.py", STACK))()
    report = describe(capture_model(model, args, {}), Locator(Project(root=tmp_path, first_party_folders=[tmp_path])))
    collapsed = render_dot(report)
    full = render_dot(report, collapse=False)
    assert 'label="layers.0 … layers.11 (×12 identical layers)"' in collapsed

    def count(dot: str) -> int:
        return sum(1 for line in dot.splitlines() if line.strip().startswith("n") and "[label=" in line)

    assert count(full) == report.total
    per_layer = (report.total - count(collapsed)) // 11
    assert count(collapsed) == report.total - 11 * per_layer and per_layer > 0
    assert "layers.5" not in collapsed and "layers.5" in full
    boxes = render_dot(report, depth=1)
    assert count(boxes) == 4  # embed, the layers drawn once, head, the loss
    assert 'cluster' in collapsed and 'fillcolor="#9fd19a"' in collapsed  # normalisation green


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed (CI installs it)")
@pytest.mark.cli
def test_svg_is_rendered_by_graphviz(tmp_path):
    write(tmp_path, "stack.py", STACK)
    result = run_graphlint("graph", "stack.py:make", "--format", "svg", "--output", "stack.svg", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    svg = (tmp_path / "stack.svg").read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg and "AccumulateGrad" in svg
    assert "layers.0 … layers.11 (×12 identical layers)" in svg


@pytest.mark.cli
def test_without_graphviz_svg_says_how_to_get_it(tmp_path):
    write(tmp_path, "stack.py", STACK)
    bare_path = os.path.dirname(sys.executable)  # python only: no dot on this PATH
    result = run_graphlint("graph", "stack.py:make", "--format", "svg", cwd=tmp_path, env={"PATH": bare_path})
    assert result.returncode == 2
    assert "needs Graphviz's dot program, which is not installed" in result.stderr
    assert "apt-get install graphviz" in result.stderr and "Traceback" not in result.stderr


def test_the_documentation_shows_a_report_and_a_picture():
    page = (REPO / "docs" / "graph.md").read_text(encoding="utf-8")
    assert "(docs/graph.md)" in (REPO / "README.md").read_text(encoding="utf-8")
    assert "graphlint graph" in page and "Nodes:" in page
    assert "(graph-example.svg)" in page and (REPO / "docs" / "graph-example.svg").is_file()


HAND_WRITTEN = '''
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v


def make():
    return Attention(), (torch.randn(2, 8, 16),)
'''


def test_what_could_be_fused_comes_from_the_rules_tagged_for_it_whatever_their_id(tmp_path, monkeypatch):
    """`graphlint graph` finds the rule by its tag (graphlint.tags), so a plugin's rule could take GL101's role."""
    class Tagged(UnfusedAttention):
        id = "GLX101"

    class Untagged(UnfusedAttention):
        tags = tuple(tag for tag in UnfusedAttention.tags if tag != FUSABLE_ATTENTION_TAG)

    path = write(tmp_path, "attention.py", HAND_WRITTEN)
    model, args = load(path)()
    capture = capture_model(model, args, {})

    def could_fuse(rules) -> list[str]:
        monkeypatch.setattr(graphlint.engine, "load_rules", lambda: rules)  # read when the report is made
        return [finding.rule_id for finding in describe(capture, Locator(Project(root=tmp_path))).could_fuse]

    assert could_fuse((UnfusedAttention,)) == ["GL101"]
    assert could_fuse((Tagged,)) == ["GLX101"]
    assert could_fuse((Untagged,)) == []
