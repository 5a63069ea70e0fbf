"""The capture: a real torch.fx forward graph, a real autograd pass, meta first and CPU when needed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import fx, nn

from conftest import line_of, lint_file, write
from graphlint.capture import capture_model, capture_target, load_target
from graphlint.errors import TargetFailure
from graphlint.target import TargetSpec

SMALL = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.mlp = nn.Sequential(
            nn.Linear(8, 8),
            nn.ReLU(inplace=True),
        )
        self.frozen = nn.Linear(8, 8).requires_grad_(False)

    def forward(self, x):
        h = self.proj(x)
        scores = h @ h.transpose(-2, -1)
        gate = torch.sigmoid(scores)
        gate.mul_(2)  # writes the tensor sigmoid saved
        return self.mlp(gate @ h) + self.frozen(x)


def make():
    return Net(), (torch.randn(2, 4, 8),)
'''


def capture_file(path: Path, name: str = "make", device: str = "auto"):
    sys.path.insert(0, str(path.parent))
    try:
        return capture_target(load_target(TargetSpec.parse(f"{path}:{name}", path.parent)), device)
    finally:
        sys.path.remove(str(path.parent))


@pytest.fixture
def small(tmp_path):
    path = write(tmp_path, "net.py", SMALL)
    return path, capture_file(path)


def test_forward_graph_is_a_real_fx_graph_with_user_level_ops(small):
    path, capture = small
    assert capture.device == "meta"
    graph = capture.forward
    assert isinstance(graph, fx.Graph)
    graph.lint()  # every input is defined before use
    ops = [n.meta["op"] for n in capture.ops]
    assert ops[:6] == ["linear", "transpose", "matmul", "sigmoid", "mul_", "matmul"]
    placeholders = [n.target for n in graph.nodes if n.op == "placeholder"]
    attributes = {n.target for n in graph.nodes if n.op == "get_attr"}
    assert placeholders == ["arg0"]
    assert {"proj.weight", "proj.bias", "mlp.0.weight", "frozen.weight"} <= attributes


def test_nodes_carry_shapes_module_paths_and_source_positions(small):
    path, capture = small
    matmul = next(n for n in capture.ops if n.meta["op"] == "matmul")
    assert matmul.meta["tensor_meta"].shape == (2, 4, 4)
    assert matmul.meta["tensor_meta"].dtype == torch.float32
    frame = matmul.meta["stack"][-1]
    assert (frame.file, frame.line) == (str(path), line_of(path, "scores = h @ h"))
    assert "scores = h @ h" in path.read_text().splitlines()[frame.line - 1]
    assert matmul.meta["stack_trace"].strip().startswith('File "')
    relu = next(n for n in capture.ops if n.meta["op"] == "relu")
    assert relu.meta["module_path"] == "mlp.1"
    assert [m.path for m in relu.meta["module_stack"]] == ["", "mlp", "mlp.1"]
    assert capture.modules["mlp.1"].built_at[-1].line == line_of(path, "nn.ReLU(inplace=True)")


def test_fx_subgraph_matching_works_on_the_captured_graph(small):
    from torch.fx.passes.utils.matcher_utils import SubgraphMatcher

    def pattern(a, b):
        return torch.sigmoid(a.matmul(b))

    matcher = SubgraphMatcher(fx.symbolic_trace(pattern).graph, ignore_literals=True)
    matches = matcher.match(small[1].forward)
    assert len(matches) == 1


def test_in_place_writes_and_saved_tensor_versions_are_recorded(small):
    _, capture = small
    write_node = next(n for n in capture.ops if n.meta["op"] == "mul_")
    [mutated] = write_node.meta["mutated"]
    assert (mutated.version_before, mutated.version_after) == (0, 1)
    sigmoid = next(n for n in capture.autograd.nodes if n.name == "SigmoidBackward0")
    [result] = sigmoid.saved
    assert result.attribute == "_saved_result"
    assert result.modified_after_save and result.storage == mutated.storage
    assert sigmoid.forward_node.meta["op"] == "sigmoid"


def test_accumulate_grad_nodes_are_mapped_to_trainable_parameters(small):
    _, capture = small
    sinks = capture.autograd.accumulate_grad
    trainable = {name for name, p in capture.parameters.items() if p.requires_grad}
    assert set(sinks) == trainable == {"proj.weight", "proj.bias", "mlp.0.weight", "mlp.0.bias"}
    outcome = capture.autograd.backward
    assert outcome.ran and outcome.error is None and outcome.reached == trainable


def test_autograd_node_count_matches_an_independent_walk(tmp_path):
    path = write(tmp_path, "net.py", SMALL)
    capture = capture_file(path, device="cpu")
    sys.path.insert(0, str(tmp_path))
    try:
        import importlib

        model, args = importlib.import_module("net").make()
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("net", None)  # as in the test below: no later child may find it
    loss = model(*args).float().sum()
    seen, stack = set(), [loss.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    assert len(capture.autograd.nodes) == len(seen)
    assert sorted(n.name for n in capture.autograd.nodes) == sorted(fn.name() for fn in seen)


def test_data_dependent_branch_is_rebuilt_on_cpu_and_says_so(tmp_path):
    path = write(tmp_path, "branchy.py", '''
        import torch
        from torch import nn


        class Branchy(nn.Module):
            def __init__(self):
                super().__init__()
                self.a = nn.Linear(4, 4)
                self.b = nn.Linear(4, 4)

            def forward(self, x):
                if x.sum() > 0:  # needs the value
                    return self.a(x)
                return self.b(x)


        def make():
            return Branchy(), (torch.ones(2, 4),)
    ''')
    capture = capture_file(path)
    assert capture.device == "cpu"
    assert len(capture.notes) == 1
    assert "a Python branch on a tensor value" in capture.notes[0]
    assert f"branchy.py:{line_of(path, 'if x.sum() > 0')}" in capture.notes[0]
    assert capture.autograd.backward.reached == {"a.weight", "a.bias"}


def test_forcing_meta_on_a_data_dependent_forward_is_a_clear_failure(tmp_path):
    path = write(tmp_path, "itemy.py", '''
        import torch
        from torch import nn


        class Itemy(nn.Module):
            def __init__(self):
                super().__init__()
                self.a = nn.Linear(4, 4)

            def forward(self, x):
                return self.a(x) * x.max().item()


        def make():
            return Itemy(), (torch.ones(2, 4),)
    ''')
    message = (r"cannot capture on the meta device: the forward needs real values \(\.item\(\) at .*itemy.py:11\); "
               r"use --device auto")
    with pytest.raises(TargetFailure, match=message):
        capture_file(path, device="meta")


@pytest.mark.compile
def test_graph_breaks_do_not_stop_the_capture(tmp_path):
    path = write(tmp_path, "breaky.py", '''
        import numpy as np
        import torch
        from torch import nn


        class Breaky(nn.Module):
            def __init__(self):
                super().__init__()
                self.a = nn.Linear(4, 4)
                self.b = nn.Linear(4, 4)

            def forward(self, x):
                h = self.a(x)
                print("checkpoint", h.shape)
                scale = float(np.sqrt(h.shape[-1]))
                steps = [int(s) for s in torch.tensor([1, 2]).tolist()]
                return self.b(h / scale) * len(steps)


        def make():
            return Breaky(), (torch.randn(2, 4),)
    ''')
    sys.path.insert(0, str(tmp_path))
    try:
        import importlib

        model, args = importlib.import_module("breaky").make()
    finally:
        sys.path.remove(str(tmp_path))
        # Children forked from this process later would find this module under a name another test's model imports.
        sys.modules.pop("breaky", None)
    explained = torch._dynamo.explain(model)(*args)
    assert explained.graph_break_count >= 1  # dynamo cannot take this forward whole
    capture = capture_file(path)
    ops = [n.meta["op"] for n in capture.ops]
    assert ops.count("linear") == 2  # both sides of the breaks are in the graph
    assert capture.autograd.backward.reached == {"a.weight", "a.bias", "b.weight", "b.bias"}


def test_loss_comes_from_the_target_then_the_output_then_a_sum(tmp_path):
    model = nn.Linear(4, 2)
    x = torch.randn(3, 4)

    class WithLoss:
        def __init__(self, out):
            self.loss = out.pow(2).mean()
            self.logits = out

    custom = capture_model(model, (x,), {}, loss_fn=lambda out: out[:, 0].mean())
    assert custom.autograd.root.name == "MeanBackward0"
    hf_style = capture_model(nn.Sequential(model), (x,), {})
    assert hf_style.autograd.root.name == "SumBackward0"

    class Wrapper(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, x):
            return WithLoss(self.inner(x))

    own = capture_model(Wrapper(), (x,), {})
    root = own.autograd.root
    assert root.name == "MeanBackward0"
    assert [own.autograd.nodes[i].name for i in root.next] == ["PowBackward0"]


def test_a_loss_that_is_not_a_scalar_is_a_clear_failure():
    with pytest.raises(TargetFailure, match=r"returned a tensor of shape \(3, 2\); return a scalar"):
        capture_model(nn.Linear(4, 2), (torch.randn(3, 4),), {}, loss_fn=lambda out: out)


def test_linting_restores_global_torch_state_and_sys_path(tmp_path):
    path = write(tmp_path, "sloppy.py", '''
        import sys
        import torch
        from torch import nn

        sys.path.append("/nonexistent/added-by-import")


        def make():
            torch.set_default_dtype(torch.float64)
            torch.set_grad_enabled(False)
            return nn.Linear(4, 4), (torch.randn(2, 4),)
    ''')
    before = (torch.get_default_dtype(), torch.is_grad_enabled(), list(sys.path))
    report = lint_file(path)
    assert report.errors == [] and report.results[0].device == "meta"
    assert (torch.get_default_dtype(), torch.is_grad_enabled(), list(sys.path)) == before


def test_the_capture_records_gradients_even_when_the_caller_disabled_them():
    with torch.no_grad():
        capture = capture_model(nn.Linear(4, 4), (torch.randn(2, 4),), {})
    assert capture.autograd.backward.reached == {"weight", "bias"}
