"""GL105, GL106, GL107 and GL204 checked against plain PyTorch: the bias really gets no gradient, the
hand-written norm and activation really equal the library op, the two-step log really breaks on large logits."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import findings_of, line_of, lint_file, write
from graphlint.engine import rule_by_id
from graphlint.target import Target

GL105, GL106, GL107, GL204 = (rule_by_id(i) for i in ("GL105", "GL106", "GL107", "GL204"))


def _examples(rule, kind: str):
    examples = rule.bad_examples if kind == "bad" else rule.good_examples
    return [pytest.param(example, id=f"{kind}-{example.title}".replace(" ", "-")) for example in examples]


def _load(path):
    """The example's module, imported with nothing of graphlint's."""
    spec = importlib.util.spec_from_file_location(f"plain_{path.stem}_{abs(hash(str(path)))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _made(module):
    made = module.make()
    if isinstance(made, Target):
        return made.model, made.args, made.loss
    model, args = made
    return model, args, None


def _backward(model, args, loss=None):
    """Forward, loss (the target's, else the sum of every output) and backward, as a training step runs them."""
    out = model(*args)
    if loss is not None:
        total = loss(out)
    else:
        outputs = out if isinstance(out, (tuple, list)) else (out,)
        total = sum(o.float().sum() for o in outputs)
    total.backward()
    return total


# -- GL105: the bias that a following batch norm cancels gets a zero gradient --------------------------------


@pytest.mark.parametrize("example", _examples(GL105, "bad") + _examples(GL105, "good"))
def test_gl105_flags_exactly_the_biases_that_get_no_gradient(example, tmp_path):
    path = write(tmp_path, "model.py", example.code)
    torch.manual_seed(0)
    model, args, loss = _made(_load(path))
    _backward(model, args, loss)
    layers = (torch.nn.Linear, torch.nn.modules.conv._ConvNd)
    biases = [m.bias for m in model.modules() if isinstance(m, layers) and m.bias is not None]
    dead = [b for b in biases if b.grad is None or b.grad.abs().max() < 1e-5]
    assert biases and len(dead) < len(biases)  # the check can tell a live bias from a dead one

    report = lint_file(path)
    assert report.errors == []
    assert sum(f.occurrences for f in findings_of(report, "GL105")) == len(dead)


def test_gl105_points_at_the_argument_of_nn_sequential_and_relates_the_norm(tmp_path):
    example = GL105.bad_examples[0]
    path = write(tmp_path, "model.py", example.code)
    [finding] = findings_of(lint_file(path), "GL105")
    line = example.code.splitlines()[finding.location.line - 1]
    assert line[finding.location.column - 1:].startswith("nn.Conv2d(c_in, c_out, 3, padding=1)")
    assert finding.occurrences == 2
    assert [r.message for r in finding.related] == ["the batch norm that cancels it"]
    assert "bias=False" in finding.message


# -- GL106: the hand-written norms are the library ones ------------------------------------------------------


@pytest.mark.parametrize("example", _examples(GL106, "bad"))
def test_gl106_hand_written_norms_equal_the_library_kernels(example, tmp_path):
    module = _load(write(tmp_path, "model.py", example.code))
    model, _, _ = _made(module)
    norms = [m for m in model.modules() if type(m).__module__ == module.__name__ and "Norm" in type(m).__name__]
    assert norms
    for norm in norms:
        channels_first = type(norm).__name__.endswith("2d")  # normalises dim 1 of an image batch
        x = (torch.randn(3, norm.weight.shape[0], 5, 5) if channels_first else torch.randn(3, 5, norm.weight.shape[0])) * 4 + 2
        with torch.no_grad():
            norm.weight.uniform_(0.5, 1.5)
            if type(norm).__name__ == "RMSNorm":
                expected = F.rms_norm(x, norm.weight.shape, norm.weight, norm.eps)
            elif channels_first:
                norm.bias.uniform_(-1, 1)
                expected = F.layer_norm(x.movedim(1, -1), norm.weight.shape, norm.weight, norm.bias, norm.eps).movedim(-1, 1)
            else:
                norm.bias.uniform_(-1, 1)
                expected = F.layer_norm(x, norm.weight.shape, norm.weight, norm.bias, norm.eps)
            torch.testing.assert_close(norm(x), expected, rtol=1e-5, atol=1e-5)


def test_gl106_points_at_the_normalising_step_with_the_mean_related(tmp_path):
    path = write(tmp_path, "model.py", GL106.bad_examples[1].code)
    [finding] = findings_of(lint_file(path), "GL106")
    line = path.read_text().splitlines()[finding.location.line - 1]
    assert line[finding.location.column - 1:].startswith("(x - mean) / torch.sqrt(var + self.eps)")
    [related] = finding.related
    assert related.message == "the mean it normalises by"
    assert "x.mean(-1, keepdim=True)" in path.read_text().splitlines()[related.location.line - 1]


# -- GL107: only formulas with an exact library equivalent ---------------------------------------------------

EXACT = {
    "x * torch.sigmoid(x)": F.silu,
    "torch.sigmoid(x) * x": F.silu,
    "0.5 * x * (1 + torch.erf(x / math.sqrt(2)))": F.gelu,
    "x * (1 + torch.erf(x * (1 / math.sqrt(2)))) / 2": F.gelu,
    "0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))":
        lambda x: F.gelu(x, approximate="tanh"),
    "x * 0.5 * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))":
        lambda x: F.gelu(x, approximate="tanh"),
    "x * torch.tanh(F.softplus(x))": F.mish,
    "torch.exp(x) / torch.exp(x).sum(-1, keepdim=True)": lambda x: torch.softmax(x, -1),
}
NOT_EXACT = [
    "x * torch.sigmoid(1.702 * x)",
    "x * torch.sigmoid(y)",
    "F.silu(x) * y",
    "0.5 * x * (1 + torch.tanh(x))",
    "x * torch.tanh(F.softplus(x, beta=2))",
    "torch.exp(x) / torch.exp(y).sum(-1, keepdim=True)",
]

ACTIVATION = '''
import math
import torch
from torch import nn
import torch.nn.functional as F


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, inputs):
        x, y = self.a(inputs), self.b(inputs)
        return {expression}  # the formula


def make():
    return Layer(), (torch.randn(4, 8),)
'''


@pytest.mark.parametrize("expression", EXACT)
def test_gl107_flags_formulas_that_equal_a_library_activation(expression, tmp_path):
    x = torch.randn(64) * 4
    torch.testing.assert_close(eval(expression, {"x": x, "torch": torch, "F": F, "math": math}), EXACT[expression](x))
    path = write(tmp_path, "model.py", ACTIVATION.format(expression=expression))
    [finding] = findings_of(lint_file(path), "GL107")
    source = path.read_text().splitlines()[finding.location.line - 1]
    assert "# the formula" in source and source[finding.location.column - 1:].startswith(expression)


@pytest.mark.parametrize("expression", NOT_EXACT)
def test_gl107_leaves_formulas_without_an_exact_library_form(expression, tmp_path):
    report = lint_file(write(tmp_path, "model.py", ACTIVATION.format(expression=expression)))
    assert report.errors == []
    assert findings_of(report, "GL107") == []


# -- GL204: large logits break the two-step log and not the fused one -----------------------------------------


def _with_large_logits(path):
    torch.manual_seed(0)
    model, args, loss = _made(_load(path))
    args = tuple(a * 1e4 if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
    total = _backward(model, args, loss)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return bool(torch.isfinite(total)) and all(bool(torch.isfinite(g).all()) for g in grads)


@pytest.mark.parametrize("example", _examples(GL204, "bad"))
def test_gl204_bad_examples_give_inf_or_nan_on_large_logits(example, tmp_path):
    assert not _with_large_logits(write(tmp_path, "model.py", example.code))


@pytest.mark.parametrize("example", _examples(GL204, "good"))
def test_gl204_fused_forms_stay_finite_on_large_logits(example, tmp_path):
    assert _with_large_logits(write(tmp_path, "model.py", example.code))


def test_gl204_points_at_the_log_with_the_softmax_related(tmp_path):
    path = write(tmp_path, "model.py", GL204.bad_examples[0].code)
    [finding] = findings_of(lint_file(path), "GL204")
    line = path.read_text().splitlines()[finding.location.line - 1]
    assert line[finding.location.column - 1:].startswith("torch.log(F.softmax(")
    assert [r.message for r in finding.related] == ["the softmax whose log is taken"]
    assert "F.log_softmax" in finding.message


# -- spellings, each checked in plain PyTorch: flagged exactly when the bias gets no gradient ------------------

CONV_THEN_NORM = '''
import torch
from torch import nn
import torch.nn.functional as F


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)  # the layer
        self.bn = nn.BatchNorm2d(8)
        self.register_buffer("rm", torch.zeros(8))
        self.register_buffer("rv", torch.ones(8))

    def forward(self, x):
        return torch.tanh({expression})


def make():
    return Layer(), (torch.randn(4, 3, 6, 6),)
'''
NORMS_AFTER_A_CONV = {
    "F.batch_norm(self.conv(x), None, None, training=True)": True,
    "F.group_norm(self.conv(x), 8)": True,
    "self.bn(self.conv(x).contiguous())": True,
    "self.bn(self.conv(x).unsqueeze(-1).squeeze(-1))": True,
    "F.group_norm(self.conv(x), 2)": False,
    "F.batch_norm(self.conv(x), self.rm, self.rv, training=False)": False,
    "self.bn(torch.relu(self.conv(x)))": False,
    "F.layer_norm(self.conv(x), (8, 4, 4))": False,
    "self.bn(self.conv(x).transpose(2, 3))": True,
    "self.bn(self.conv(x).transpose(1, 2).reshape(4, 8, 4, 4))": False,
}


@pytest.mark.parametrize("expression", NORMS_AFTER_A_CONV)
def test_gl105_spellings_are_flagged_exactly_when_plain_pytorch_gives_the_bias_no_gradient(expression, tmp_path):
    path = write(tmp_path, "model.py", CONV_THEN_NORM.format(expression=expression))
    torch.manual_seed(0)
    model, args, _ = _made(_load(path))
    _backward(model, args)
    cancelled = bool(model.conv.bias.grad.abs().max() < 1e-5)
    assert cancelled == NORMS_AFTER_A_CONV[expression]
    report = lint_file(path)
    assert report.errors == []
    expected = [line_of(path, "# the layer")] if cancelled else []
    assert [f.location.line for f in findings_of(report, "GL105")] == expected


NORM_FORMULAS = {
    # flagged: each equals the library norm
    "x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6)": lambda x: F.rms_norm(x, (16,), eps=1e-6),
    "x / torch.sqrt(x.square().mean(-1, keepdim=True) + 1e-6)": lambda x: F.rms_norm(x, (16,), eps=1e-6),
    "(x - x.mean(-1, keepdim=True)) * torch.rsqrt(((x - x.mean(-1, keepdim=True)) ** 2).mean(-1, keepdim=True) + 1e-5)":
        lambda x: F.layer_norm(x, (16,)),
    "(x - x.mean((-2, -1), keepdim=True)) / torch.sqrt(x.var((-2, -1), keepdim=True, correction=0) + 1e-5)":
        lambda x: F.layer_norm(x, (8, 16)),
    # not flagged: no exact library form, or not a per-row norm
    "(x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + 1e-6)": None,
    "(x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True) + 1e-5)": None,
    "x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)": None,
    "(x - x.mean(0, keepdim=True)) / torch.sqrt(x.var(0, keepdim=True, unbiased=False) + 1e-5)": None,
}

NORM = '''
import torch
from torch import nn


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, inputs):
        x = self.fc(inputs)
        return {expression}  # the norm


def make():
    return Layer(), (torch.randn(4, 8, 16),)
'''


@pytest.mark.parametrize("expression", NORM_FORMULAS)
def test_gl106_flags_exactly_the_formulas_that_equal_a_library_norm(expression, tmp_path):
    x = torch.randn(4, 8, 16) * 3 + 1
    library = NORM_FORMULAS[expression]
    written = eval(expression, {"x": x, "torch": torch})
    if library is not None:
        torch.testing.assert_close(written, library(x), rtol=1e-5, atol=1e-5)
    path = write(tmp_path, "model.py", NORM.format(expression=expression))
    report = lint_file(path)
    assert report.errors == []
    expected = [line_of(path, "# the norm")] if library is not None else []
    assert [f.location.line for f in findings_of(report, "GL106")] == expected
