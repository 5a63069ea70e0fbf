"""The torch.compile analysis sees what the model really does: it runs only calls the model accepts, grows only
batch and sequence dimensions, computes the values the model's own code makes on the CPU rebuild, sees a class
compiled once per instance inside one call, and gives library breaks a remedy at the user's line. Each case is
checked against plain torch.compile in steady state (compiled after one eager call, as graphlint's analysis is)."""

from __future__ import annotations

import importlib.util
import inspect
import os

import pytest
import torch

from conftest import findings_of, line_of, lint_file, write
from graphlint import Target
from graphlint.capture.compile import analyse_target

pytestmark = pytest.mark.compile


def _module(path):
    spec = importlib.util.spec_from_file_location(f"real_calls_{path.stem}_{abs(hash(str(path)))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _explained(model, args):
    """Plain torch.compile's account of the model's graphs (torch._dynamo.explain), after one eager call."""
    with torch.no_grad():
        model(*args)
        torch._dynamo.reset()
        try:
            return torch._dynamo.explain(model)(*args)
        finally:
            torch._dynamo.reset()


def _plain_break_lines(path, model, args) -> set[int]:
    """The lines of `path` where plain torch.compile breaks the graph: the innermost frame of each break that
    explain gives with a stack in that file."""
    lines = set()
    for reason in _explained(model, args).break_reasons:
        own = [frame.lineno for frame in reason.user_stack if os.path.samefile(frame.filename, path)]
        if own:
            lines.add(own[-1])
    return lines


def _compilations_in_plain_torch(model, calls, code) -> int:
    """How many compiled versions of `code` plain torch.compile keeps after running `calls` (after one eager
    call); it stops adding them at recompile_limit."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, backend=CompileCounter())
        with torch.no_grad():
            model(*calls[0])
            for args in calls:
                compiled(*args)
        return len(_debug_get_cache_entry_list(code))
    finally:
        torch._dynamo.reset()


ROTARY = '''
import torch
from torch import nn


def rotary_table(seq, dim):
    freqs = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    return torch.outer(torch.arange(seq).float(), freqs)


class Rotary(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x, freqs_cis):
        batch, seq, dim = x.shape
        assert freqs_cis.shape == (seq, dim // 2), "the rotary table does not match the sequence"
        h = self.fc(x)
        a, b = h[..., ::2], h[..., 1::2]
        cos, sin = freqs_cis.cos(), freqs_cis.sin()
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


class RotaryLoop(Rotary):
    def forward(self, x, freqs_cis):
        h = super().forward(x, freqs_cis)
        for i in range(x.shape[0]):
            h[i] = h[i] * 2
        return h


def make():
    return Rotary(), (torch.randn(2, 8, 16), rotary_table(8, 16))


def make_loop():
    return RotaryLoop(), (torch.randn(2, 8, 16), rotary_table(8, 16))
'''


def test_a_rotary_table_beside_the_input_is_not_grown_and_a_call_the_model_refuses_is_left_out(tmp_path):
    path = write(tmp_path, "rotary.py", ROTARY)
    model, (x, table) = _module(path).make()
    analysis = analyse_target(Target(model, (x, table), {}), "cpu", ("batch", "seq"))
    assert analysis.calls[-2:] == ["batch 3", "batch 4"]  # x grows along its batch, the table stays (8, 8)
    assert [call for call, _ in analysis.dropped] == ["seq 9", "seq 10"]
    assert all("does not match the sequence" in error for _, error in analysis.dropped)
    assert analysis.breaks == [] and not any("failed under" in call for call in analysis.calls)
    with pytest.raises(AssertionError):  # the dropped calls really are refused by the model, uncompiled
        model(torch.cat([x, x[:, :1]], dim=1), table)
    assert _plain_break_lines(path, model, (x, table)) == set()

    report = lint_file(path, select=("GL301", "GL302"), vary=("batch", "seq"))
    assert report.findings == [] and report.errors == []
    notes = report.results[0].notes
    assert any("left out the calls with seq 9, seq 10, which the model refuses without torch.compile too "
               "(AssertionError: the rotary table does not match the sequence)" in note for note in notes)


def test_a_loop_over_the_batch_beside_a_rotary_table_is_still_found_on_the_calls_the_model_accepts(tmp_path):
    path = write(tmp_path, "rotary.py", ROTARY)
    model, (x, table) = _module(path).make_loop()
    grown = [(torch.cat([x] + [x[:1]] * extra), table) for extra in range(4)]
    assert _compilations_in_plain_torch(model, grown, type(model).forward.__code__) >= 3
    report = lint_file(path, "make_loop", select=("GL301", "GL302"), vary=("batch", "seq"))
    assert [(f.rule_id, f.location.line) for f in report.findings] == [("GL302", line_of(path, "range(x.shape[0])"))]


GRAPH_LAYER = '''
import torch
from torch import nn


class MessagePassing(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x, edge_index):
        if edge_index.shape[0] != 2:
            raise ValueError(f"edge_index must have shape (2, edges), got {tuple(edge_index.shape)}")
        h = self.fc(x)
        messages = h[edge_index[0]]
        return torch.zeros_like(h).index_add(0, edge_index[1], messages)


def make():
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 0], [1, 2, 3, 4, 0, 2]])
    return MessagePassing(), (torch.randn(5, 8), edge_index)
'''


def test_a_graph_layers_edge_index_keeps_its_two_rows_while_the_nodes_grow(tmp_path):
    path = write(tmp_path, "graph_layer.py", GRAPH_LAYER)
    model, args = _module(path).make()
    analysis = analyse_target(Target(model, args, {}), "meta", ("batch",))
    assert analysis.dropped == [] and analysis.calls[-2:] == ["batch 6", "batch 7"]
    assert analysis.breaks == []
    assert _plain_break_lines(path, model, args) == set()
    report = lint_file(path, select=("GL301", "GL302"))
    assert report.findings == [] and report.errors == []
    assert not any("torch.compile analysis" in note for note in report.results[0].notes)


FINITE = '''
import torch
from torch import nn


def check_finite(t, name):
    if not torch.isfinite(t).all():
        raise FloatingPointError(f"{name} is not finite")
    return t


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, x):
        h = self.fc(x)
        h = h / h.norm(dim=-1, keepdim=True)
        h = check_finite(h, "h")
        if h.mean() > 0:
            h = h * 2
        return self.norm(h)


def make():
    return Model(), (torch.randn(4, 8),)
'''


def test_on_the_cpu_rebuild_the_analysis_computes_the_models_values_and_reports_the_real_breaks_only(tmp_path):
    """A finite check that made-up values would trip (0 / 0) stays quiet: the breaks are the two data-dependent
    branches, as plain torch.compile finds them, and never a GB0088 "Observed exception" at the raise."""
    path = write(tmp_path, "finite.py", FINITE)
    model, args = _module(path).make()
    expected = {line_of(path, "if not torch.isfinite(t).all()"), line_of(path, "if h.mean() > 0")}
    assert _plain_break_lines(path, model, args) == expected
    report = lint_file(path, select=("GL301",))
    assert sorted(f.location.line for f in findings_of(report, "GL301")) == sorted(expected)
    assert not any("Observed exception" in f.message for f in report.findings)
    notes = report.results[0].notes
    assert notes[0].startswith("captured on CPU because the forward needs real values")
    assert not any("failed under torch.compile" in note for note in notes)


OWN_INIT = '''
import torch
from torch import nn


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.scale = nn.Parameter(torch.empty(8))
        self.register_buffer("shift", torch.empty(8))
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.ones_(self.scale)
        nn.init.zeros_(self.shift)

    def forward(self, x):
        h = self.fc(x) / self.scale + self.shift
        if not torch.isfinite(h).all():
            raise FloatingPointError("h is not finite")
        if h.sum() > 0:
            h = h * 2
        return h


def make():
    return Scaled(), (torch.randn(4, 8),)
'''


def test_the_cpu_rebuild_initialises_parameters_and_buffers_with_the_models_own_init_code(tmp_path):
    path = write(tmp_path, "own_init.py", OWN_INIT)
    model, args = _module(path).make()
    expected = {line_of(path, "if not torch.isfinite(h).all()"), line_of(path, "if h.sum() > 0")}
    assert _plain_break_lines(path, model, args) == expected
    report = lint_file(path, select=("GL301",))
    assert {f.location.line for f in findings_of(report, "GL301")} == expected
    assert not any("failed under torch.compile" in note for note in report.results[0].notes)


LAYERS = '''
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, layer_idx, kind):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.layer_idx = layer_idx
        self.kind = kind

    def forward(self, x):
        h = self.fc(x)
        if self.layer_idx % 2:
            h = h * 2
        return h


class Variant(Block):
    def forward(self, x):
        h = self.fc(x)
        if self.kind == "wide":
            h = h * 2
        return h


class Stack(nn.Module):
    def __init__(self, block, depth):
        super().__init__()
        self.blocks = nn.ModuleList(block(i, "wide" if i % 2 else "narrow") for i in range(depth))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
            print("layer done")
        return x


def deep():
    return Stack(Block, 10), (torch.randn(2, 8),)


def shallow():
    return Stack(Block, 4), (torch.randn(2, 8),)


def two_kinds():
    return Stack(Variant, 10), (torch.randn(2, 8),)
'''


@pytest.mark.parametrize("name, depth, compiled", [("deep", 10, 8), ("shallow", 4, 4)])
def test_a_class_compiled_once_per_instance_inside_one_call_is_reported_with_its_count_and_the_limit(
        name, depth, compiled, tmp_path):
    path = write(tmp_path, "layers.py", LAYERS)
    module = _module(path)
    model, args = getattr(module, name)()
    assert _compilations_in_plain_torch(model, [args], module.Block.forward.__code__) == compiled
    report = lint_file(path, name, select=("GL302",))
    found = findings_of(report, "GL302")
    assert [f.location.line for f in found] == [line_of(path, "if self.layer_idx % 2")]
    assert f"for each of the {depth} instances of its class (blocks.0 … blocks.{depth - 1}) inside one call" \
        in found[0].message
    reached = "past recompile_limit (8) the other 2 run `forward` uncompiled"
    assert (reached in found[0].message) == (depth > 8)
    assert "pass the value as a tensor" in found[0].message


def test_a_few_variants_shared_by_the_instances_compile_once_each_and_are_not_a_finding(tmp_path):
    path = write(tmp_path, "layers.py", LAYERS)
    module = _module(path)
    model, args = module.two_kinds()
    assert _compilations_in_plain_torch(model, [args, args], module.Variant.forward.__code__) == 2
    report = lint_file(path, "two_kinds", select=("GL302",))
    assert findings_of(report, "GL302") == []


LEVELS = '''
import torch
from torch import nn


class Down(nn.Module):
    def __init__(self, channels_in, channels_out):
        super().__init__()
        self.conv = nn.Conv2d(channels_in, channels_out, 3, padding=1)

    def forward(self, x):
        return nn.functional.max_pool2d(self.conv(x).relu(), 2)


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        channels = [3, 8, 16, 32]
        self.downs = nn.ModuleList(Down(a, b) for a, b in zip(channels, channels[1:]))

    def forward(self, x):
        for down in self.downs:
            x = down(x)
            print("level done")
        return x


def make():
    return Encoder(), (torch.randn(2, 3, 32, 32),)
'''


def test_levels_whose_shapes_differ_by_design_are_not_a_per_instance_hazard(tmp_path):
    """Plain torch.compile compiles each level's forward for its own channels too; no attribute is read, so
    there is nothing to pass as a tensor, and the compilations settle after the first call."""
    path = write(tmp_path, "levels.py", LEVELS)
    module = _module(path)
    model, args = module.make()
    assert _compilations_in_plain_torch(model, [args, args], module.Down.forward.__code__) == 3
    assert findings_of(lint_file(path, select=("GL302",)), "GL302") == []


CHECKPOINTED = '''
import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel


class Model(nn.Module):
    def __init__(self, use_cache):
        super().__init__()
        config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64)
        self.lm = GPT2LMHeadModel(config)
        self.lm.gradient_checkpointing_enable()
        self.use_cache = use_cache

    def forward(self, ids):
        return self.lm(input_ids=ids, use_cache=self.use_cache).logits


def make():
    return Model(True).train(), (torch.randint(0, 100, (2, 16)),)


def make_without_cache():
    return Model(False).train(), (torch.randint(0, 100, (2, 16)),)
'''


@pytest.mark.transformers
def test_a_library_break_that_an_argument_avoids_gets_that_argument_as_its_remedy(tmp_path):
    path = write(tmp_path, "checkpointed.py", CHECKPOINTED)
    module = _module(path)
    user_line = line_of(path, "self.lm(input_ids=ids")
    assert _explained(*module.make()).graph_break_count >= 1
    assert _explained(*module.make_without_cache()).graph_break_count == 0  # the remedy works in plain torch
    found = findings_of(lint_file(path, select=("GL301",)), "GL301")
    assert [f.location.line for f in found] == [user_line]
    assert "pass `use_cache=False` in this call while training with gradient checkpointing" in found[0].message
    assert "is_compiling" not in found[0].message and "log outside" not in found[0].message
    assert findings_of(lint_file(path, "make_without_cache", select=("GL301",)), "GL301") == []


def test_a_library_break_without_a_known_switch_says_it_is_in_the_library_and_what_the_call_covers(tmp_path):
    library = tmp_path / "env" / "site-packages" / "noisy"
    library.mkdir(parents=True)
    (library / "__init__.py").write_text(
        "import logging\n\nimport torch\n\nlogger = logging.getLogger('noisy')\n\n\n"
        "class Layer(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.fc = torch.nn.Linear(8, 8)\n\n    def forward(self, h):\n"
        "        logger.info('running')\n        return self.fc(h).relu()\n", encoding="utf-8")
    project = tmp_path / "project"
    path = write(project, "model.py", f'''
        import sys
        sys.path.insert(0, {str(library.parent)!r})
        import torch
        from torch import nn
        import noisy


        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 8)
                self.layer = noisy.Layer()

            def forward(self, x):
                return self.layer(self.fc(x))


        def make():
            return Model(), (torch.randn(2, 8),)
    ''')
    assert _plain_break_lines(path, *_module(path).make()) == {line_of(path, "self.layer(self.fc(x))")}
    found = findings_of(lint_file(path, select=("GL301",)), "GL301")
    assert [f.location.line for f in found] == [line_of(path, "self.layer(self.fc(x))")]
    message = found[0].message
    assert "the break is inside `noisy` (`forward`, line 14), not in this file" in message
    assert "recorded ops run inside it" in message
    assert "is_compiling" not in message and "log outside" not in message


def _example_cases(rule_id):
    from graphlint.engine import load_rules

    rule = next(r for r in load_rules() if r.id == rule_id)
    return [pytest.param(example, id=f"{kind}-{example.title}".replace(" ", "-"))
            for kind, examples in (("bad", rule.bad_examples), ("good", rule.good_examples)) for example in examples]


@pytest.mark.parametrize("example", _example_cases("GL301"))
def test_gl301_on_its_rule_examples_finds_exactly_the_breaks_plain_torch_compile_finds(example, tmp_path):
    path = write(tmp_path, "example.py", example.code)
    plain = _plain_break_lines(path, *_module(path).make())
    found = {f.location.line for f in findings_of(lint_file(path, select=("GL301",)), "GL301")}
    assert found == plain == set(example.expected_lines("GL301"))


def _model_classes(module) -> dict[str, type]:
    return {c.__name__: c for c in vars(module).values() if isinstance(c, type) and issubclass(c, torch.nn.Module)
            and c.__module__ == module.__name__}


def _functions_recompiling_in_plain_torch(module, calls) -> set[str]:
    """The forwards of the module's classes that plain torch.compile keeps compiling: a new version on two or
    more calls after the first, or three or more versions inside the first call (one per instance)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    from torch._dynamo.testing import CompileCounter

    codes = {name: cls.forward.__code__ for name, cls in _model_classes(module).items()}
    model = calls[0][0]
    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, backend=CompileCounter())
        with torch.no_grad():
            model(*calls[0][1])
            versions = []
            for _, args in calls:
                compiled(*args)
                versions.append({name: len(_debug_get_cache_entry_list(code)) for name, code in codes.items()})
    finally:
        torch._dynamo.reset()
    found = set()
    for name in codes:
        counts = [v[name] for v in versions]
        grew = sum(1 for before, after in zip(counts, counts[1:], strict=False) if after > before)
        if grew >= 2 or counts[0] >= 3:
            found.add(name)
    return found


@pytest.mark.parametrize("example", _example_cases("GL302"))
def test_gl302_on_its_rule_examples_agrees_with_plain_torch_compile_on_what_keeps_recompiling(example, tmp_path):
    """The calls are graphlint's: the factory's inputs three times, then the batch one and two larger."""
    path = write(tmp_path, "example.py", example.code)
    module = _module(path)
    model, (x,) = module.make()
    calls = [(model, (x,))] * 3 + [(model, (torch.cat([x] + [x[:1]] * extra),)) for extra in (1, 2)]
    plain = _functions_recompiling_in_plain_torch(module, calls)
    found = findings_of(lint_file(path, select=("GL302",)), "GL302")
    reported = set()
    for finding in found:  # the class whose forward holds the finding's line
        for name, cls in _model_classes(module).items():
            lines, start = inspect.getsourcelines(cls.forward)
            if start <= finding.location.line < start + len(lines):
                reported.add(name)
    assert reported == plain
    assert sorted(f.location.line for f in found) == example.expected_lines("GL302")
