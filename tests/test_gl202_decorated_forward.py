"""GL202 for functions whose whole call runs with autograd off: a forward (or a helper on the way to the loss)
decorated with `@torch.no_grad()`, `@torch.inference_mode()` or `@torch.set_grad_enabled(False)`, reported at the
decorator and naming the parameters that cannot train. Checked in plain PyTorch: those parameters get no `.grad`
(or, for a whole decorated forward, the output needs no grad at all)."""

from __future__ import annotations

import importlib.util

import pytest

from conftest import backward_in_plain_pytorch, findings_of, line_of, lint_file, write

ENCODER = ["encoder.proj.weight", "encoder.proj.bias"]

SUBMODULE = '''
import functools
import torch
import torch as t
from torch import inference_mode, nn


def logged(function):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        return function(*args, **kwargs)
    return wrapper


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 16)

{decorated}
        return self.proj(x).relu()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = Encoder()
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        return self.head(self.encoder(x) + 1)


def make():
    return Net(), (torch.randn(4, 8),)
'''

DECORATORS = {
    "no_grad()": "    @torch.no_grad()  # the decorator\n    def forward(self, x):",
    "no_grad without parentheses": "    @torch.no_grad  # the decorator\n    def forward(self, x):",
    "an alias of torch": "    @t.no_grad()  # the decorator\n    def forward(self, x):",
    "set_grad_enabled(False)": "    @torch.set_grad_enabled(False)  # the decorator\n    def forward(self, x):",
    "below another decorator": "    @logged\n    @torch.no_grad()  # the decorator\n    def forward(self, x):",
    "above another decorator": "    @torch.no_grad()  # the decorator\n    @logged\n    def forward(self, x):",
    "a helper the forward calls": "    def forward(self, x):\n        return self.project(x)\n\n"
                                  "    @torch.no_grad()  # the decorator\n    def project(self, x):",
}


@pytest.mark.parametrize("decorated", DECORATORS.values(), ids=DECORATORS.keys())
def test_a_decorated_function_on_the_path_to_the_loss_is_flagged_at_its_decorator(decorated, tmp_path):
    path = write(tmp_path, "net.py", SUBMODULE.replace("{decorated}", decorated))
    model = backward_in_plain_pytorch(path)
    assert [name for name, p in model.named_parameters() if p.grad is None] == ENCODER  # really cut
    report = lint_file(path)
    assert report.errors == []
    [finding] = findings_of(report, "GL202")
    assert finding.location.line == line_of(path, "# the decorator")
    assert finding.message.startswith("The torch.no_grad() decorator on ")
    assert "turns autograd off for its whole call, which cuts encoder.proj.weight, encoder.proj.bias off" in finding.message
    assert "in encoder " in finding.message
    assert findings_of(report, "GL203") == findings_of(report, "GL103") == []


def test_the_span_is_the_decorator_call(tmp_path):
    path = write(tmp_path, "net.py", SUBMODULE.replace("{decorated}", DECORATORS["no_grad()"]))
    [finding] = findings_of(lint_file(path), "GL202")
    line = path.read_text().splitlines()[finding.location.line - 1]
    assert line[finding.location.column - 1 : finding.location.end_column - 1] == "torch.no_grad()"


LLAMA = '''
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.wq, self.wk, self.wv = (nn.Linear(dim, dim, bias=False) for _ in range(3))
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        q, k, v = self.wq(x), self.wk(x), self.wv(x)
        return self.wo(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))


class Transformer(nn.Module):
    def __init__(self, vocab=32, dim=16, layers=2):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Attention(dim) for _ in range(layers))
        self.norm = nn.RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)

    {decorator}  # the decorator
    def forward(self, tokens: torch.Tensor, start_pos: int):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = h + layer(h)
        return self.output(self.norm(h)).float()


def make():
    return Transformer(), (torch.randint(0, 32, (2, 6)), 0)


def make_frozen():
    model = Transformer()
    model.requires_grad_(False)
    return model, (torch.randint(0, 32, (2, 6)), 0)
'''


def _build(path, name="make"):
    spec = importlib.util.spec_from_file_location(f"plain_{path.stem}_{abs(hash(str(path)))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)()


@pytest.mark.parametrize("decorator", ["@torch.inference_mode()", "@torch.no_grad()"])
def test_a_whole_forward_without_autograd_is_flagged_although_no_backward_can_run(decorator, tmp_path):
    path = write(tmp_path, "llama.py", LLAMA.replace("{decorator}", decorator))
    model, args = _build(path)
    assert not model(*args).requires_grad  # plain PyTorch: nothing to differentiate, no parameter can train
    assert all(p.requires_grad for p in model.parameters())
    report = lint_file(path)
    assert report.errors == []
    [finding] = findings_of(report, "GL202")
    assert finding.location.line == line_of(path, "# the decorator")
    context = decorator[1:]
    assert finding.message.startswith(f"The {context} decorator on forward() in the model turns autograd off")
    assert "tok_embeddings.weight, layers.0.wq.weight, layers.0.wk.weight, ... (11 tensors)" in finding.message
    assert f"`with {context}:`" in finding.message
    assert findings_of(report, "GL203") == []


def test_a_model_with_nothing_to_train_keeps_only_the_note(tmp_path):
    path = write(tmp_path, "llama.py", LLAMA.replace("{decorator}", "@torch.inference_mode()"))
    report = lint_file(path, "make_frozen")
    assert report.errors == []
    assert findings_of(report, "GL202") == findings_of(report, "GL203") == []
    assert any("no backward pass was captured" in note for note in report.results[0].notes)


NO_LOSS_NOT_CUT = {
    "a Python number": "return int(self.output(self.tok_embeddings(tokens)).argmax())",
    "integer predictions": "return self.output(self.tok_embeddings(tokens)).argmax(-1)",
    "a detached output": "return self.output(self.tok_embeddings(tokens)).detach()",
}


@pytest.mark.parametrize("body", NO_LOSS_NOT_CUT.values(), ids=NO_LOSS_NOT_CUT.keys())
def test_an_output_that_is_not_differentiable_on_purpose_keeps_only_the_note(body, tmp_path):
    source = LLAMA.replace("    {decorator}  # the decorator\n", "").replace(
        "        h = self.tok_embeddings(tokens)\n", f"        {body}\n")
    path = write(tmp_path, "llama.py", source)
    report = lint_file(path)
    assert report.errors == []
    assert findings_of(report, "GL202") == findings_of(report, "GL203") == []
    assert any("no backward pass was captured" in note for note in report.results[0].notes)


NOT_CUT = {
    "enable_grad on a forward": "    @torch.enable_grad()\n    def forward(self, x):",
    "inference_mode(False) on a forward": "    @torch.inference_mode(False)\n    def forward(self, x):",
    "a decorated helper that reads no parameter": "    def forward(self, x):\n        x = x * self.keep(x)\n"
                                                  "        return self.proj(x).relu()\n\n"
                                                  "    @torch.no_grad()\n    def keep(self, x):\n"
                                                  "        return (x.abs() > 0.1).to(x.dtype)\n\n"
                                                  "    def unused(self, x):",
}


@pytest.mark.parametrize("decorated", NOT_CUT.values(), ids=NOT_CUT.keys())
def test_decorators_that_cut_nothing_trainable_are_not_flagged(decorated, tmp_path):
    path = write(tmp_path, "net.py", SUBMODULE.replace("{decorated}", decorated))
    model = backward_in_plain_pytorch(path)
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    report = lint_file(path)
    assert report.errors == []
    assert findings_of(report, "GL202") == findings_of(report, "GL203") == []


def test_a_frozen_encoder_under_a_decorator_is_not_flagged(tmp_path):
    source = SUBMODULE.replace("{decorated}", DECORATORS["no_grad()"]).replace(
        "self.proj = nn.Linear(8, 16)", "self.proj = nn.Linear(8, 16).requires_grad_(False)")
    report = lint_file(write(tmp_path, "net.py", source))
    assert report.errors == []
    assert findings_of(report, "GL202") == findings_of(report, "GL203") == []


def test_a_no_grad_decorator_inside_an_outer_no_grad_block_is_not_the_cut(tmp_path):
    source = SUBMODULE.replace("{decorated}", DECORATORS["no_grad()"]).replace(
        "        return self.head(self.encoder(x) + 1)",
        "        with torch.no_grad():\n            h = self.encoder(x) + 1  # the block\n        return self.head(h)")
    path = write(tmp_path, "net.py", source)
    [finding] = findings_of(lint_file(path), "GL202")
    assert finding.location.line == line_of(path, "# the block")  # the outer context switched autograd off


def test_every_call_of_a_decorated_layer_is_one_finding(tmp_path):
    path = write(tmp_path, "net.py", '''
        import torch
        from torch import nn


        class Layer(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 8)

            @torch.no_grad()  # the decorator
            def forward(self, x):
                return self.fc(x)


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = nn.ModuleList(Layer() for _ in range(3))
                self.head = nn.Linear(8, 2)

            def forward(self, x):
                for layer in self.layers:
                    x = x + layer(x)
                return self.head(x)


        def make():
            return Net(), (torch.randn(4, 8),)
    ''')
    model = backward_in_plain_pytorch(path)
    assert [n for n, p in model.named_parameters() if p.grad is None] == [
        f"layers.{i}.fc.{w}" for i in range(3) for w in ("weight", "bias")]
    [finding] = findings_of(lint_file(path), "GL202")
    assert finding.location.line == line_of(path, "# the decorator")
    assert finding.occurrences == 3
    assert "layers.0.fc.weight, layers.0.fc.bias, layers.1.fc.weight, ... (6 tensors in layers)" in finding.message
