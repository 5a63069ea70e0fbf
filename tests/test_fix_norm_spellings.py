"""GL106 norms, GL107 activations and GL204 log-probabilities in the spellings public model files use: each
model really has the problem, its fix is proven on the model, and the rewrite is read back; models that only
look alike (an epsilon on the standard deviation, QuickGELU, a log with an epsilon added) are left alone."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from conftest import findings_of, fix_plan, lint_file, write
from graphlint.rewrite.edits import apply_edits

HEADER = "import math\n\nimport torch\nimport torch.nn.functional as F\nfrom torch import nn\n\n\n"


def _joined(text: str) -> str:
    """The code with calls laid out over several lines joined again, to look for a call in it."""
    joined = re.sub(r",?\s*\n\s*\)", ")", re.sub(r"\(\s*\n\s*", "(", re.sub(r",\n\s+", ", ", text)))
    return joined.replace(", )", ")")


def _model(tmp_path, source: str):
    write(tmp_path, "pyproject.toml", '[project]\nname = "user-project"\nversion = "0"\n')
    source = textwrap.dedent(source).lstrip("\n")
    return write(tmp_path, "model.py", source if source.startswith(("import", "from")) else HEADER + source)


# (rule, model, fragments the fixed file contains, fragments it no longer contains)
FIXED = {
    # -- GL106 ------------------------------------------------------------------------------------------------
    "rmsnorm-forward-with-casts-around-it": ("GL106", '''
        class LlamaRMSNorm(nn.Module):
            def __init__(self, hidden_size, eps=1e-6):
                super().__init__()
                self.weight = nn.Parameter(torch.ones(hidden_size) + 0.1 * torch.randn(hidden_size))
                self.variance_epsilon = eps

            def forward(self, hidden_states):
                input_dtype = hidden_states.dtype
                hidden_states = hidden_states.to(torch.float32)
                variance = hidden_states.pow(2).mean(-1, keepdim=True)
                hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
                return self.weight * hidden_states.to(input_dtype)


        def make():
            return LlamaRMSNorm(16), (torch.randn(2, 5, 16),)
    ''', ["return F.rms_norm(hidden_states, (hidden_states.shape[-1],), self.weight, self.variance_epsilon)"],
        ["variance =", "input_dtype"]),
    "t5-norm-with-a-cast-for-a-half-weight": ("GL106", '''
        class T5LayerNorm(nn.Module):
            def __init__(self, hidden_size, eps=1e-6):
                super().__init__()
                self.weight = nn.Parameter(torch.ones(hidden_size) + 0.1 * torch.randn(hidden_size))
                self.variance_epsilon = eps

            def forward(self, hidden_states):
                variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
                hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
                if self.weight.dtype in [torch.float16, torch.bfloat16]:
                    hidden_states = hidden_states.to(torch.float16)
                return self.weight * hidden_states


        def make():
            return T5LayerNorm(16), (torch.randn(2, 5, 16),)
    ''', ["hidden_states = F.rms_norm(hidden_states, (hidden_states.shape[-1],), eps=self.variance_epsilon)\n",
          "hidden_states.to(torch.float16)", "return self.weight * hidden_states"], ["variance ="]),
    "gemma-helper-with-one-plus-weight": ("GL106", '''
        class RMSNorm(nn.Module):
            def __init__(self, dim, eps=1e-6):
                super().__init__()
                self.eps = eps
                self.weight = nn.Parameter(0.1 * torch.randn(dim))

            def _norm(self, x):
                return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

            def forward(self, x):
                output = self._norm(x.float())
                output = output * (1.0 + self.weight.float())
                return output.type_as(x)


        def make():
            return RMSNorm(16), (torch.randn(2, 5, 16),)
    ''', ["return F.rms_norm(x, (x.shape[-1],), eps=self.eps)", "output * (1.0 + self.weight.float())"], ["rsqrt"]),
    "one-plus-weight-inside-forward-is-not-taken-as-the-weight": ("GL106", '''
        class RMSNorm(nn.Module):
            def __init__(self, dim, eps=1e-6):
                super().__init__()
                self.eps = eps
                self.weight = nn.Parameter(0.1 * torch.randn(dim))

            def forward(self, x):
                x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
                return x * (1 + self.weight)


        def make():
            return RMSNorm(16), (torch.randn(2, 5, 16),)
    ''', ["x = F.rms_norm(x, (x.shape[-1],), eps=self.eps)\n", "return x * (1 + self.weight)"], ["rsqrt"]),
    "a-norm-module-that-also-activates-keeps-its-activation": ("GL106", '''
        class NormAct(nn.Module):
            def __init__(self, dim=16):
                super().__init__()
                self.weight = nn.Parameter(torch.ones(dim) + 0.1 * torch.randn(dim))

            def forward(self, x):
                x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
                return F.gelu(self.weight * x)


        def make():
            return NormAct(), (torch.randn(2, 5, 16),)
    ''', ["x = F.rms_norm(x, (x.shape[-1],), eps=1e-6)\n        return F.gelu(self.weight * x)\n"], ["rsqrt"]),
    "scale-of-shape-1-1-dim-before-the-division": ("GL106", '''
        class RMSNorm(nn.Module):
            def __init__(self, dim, eps=1e-8):
                super().__init__()
                self.eps = eps
                self.scale = nn.Parameter(torch.ones(1, 1, dim) + 0.1 * torch.randn(1, 1, dim))

            def forward(self, x):
                ms = (x * x).mean(dim=-1, keepdim=True)
                return self.scale * x / torch.sqrt(ms + self.eps)


        def make():
            return RMSNorm(16), (torch.randn(2, 5, 16),)
    ''', ["return self.scale * F.rms_norm(x, (x.shape[-1],), eps=self.eps)"], ["ms ="]),
    "root-as-power-minus-a-half-and-gain-g": ("GL106", '''
        class RMSNorm(nn.Module):
            def __init__(self, dim, eps=1e-6):
                super().__init__()
                self.eps = eps
                self.g = nn.Parameter(torch.ones(dim) + 0.1 * torch.randn(dim))

            def forward(self, x):
                norm = (x ** 2).mean(-1, keepdim=True)
                return self.g * (x * (norm + self.eps) ** -0.5)


        def make():
            return RMSNorm(16), (torch.randn(2, 5, 16),)
    ''', ["return F.rms_norm(x, (x.shape[-1],), self.g, self.eps)"], ["norm ="]),
    "one-over-sqrt-in-a-variable": ("GL106", '''
        class RMSNorm(nn.Module):
            def __init__(self, dim, eps=1e-6):
                super().__init__()
                self.eps = eps
                self.weight = nn.Parameter(torch.ones(dim) + 0.1 * torch.randn(dim))

            def forward(self, x):
                dtype = x.dtype
                x = x.float()
                rms = 1 / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
                return self.weight * (x * rms).to(dtype)


        def make():
            return RMSNorm(16), (torch.randn(2, 5, 16),)
    ''', ["return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)"], ["rms =", "dtype"]),
    "function-with-add-method-and-rsqrt-method": ("GL106", '''
        def rms_norm(x, weight, eps: float = 1e-6):
            return x * x.pow(2).mean(-1, keepdim=True).add(eps).rsqrt() * weight


        class Block(nn.Module):
            def __init__(self, dim=16):
                super().__init__()
                self.w = nn.Parameter(torch.ones(dim) + 0.1 * torch.randn(dim))
                self.fc = nn.Linear(dim, dim)

            def forward(self, x):
                return self.fc(rms_norm(x, self.w))


        def make():
            return Block(), (torch.randn(2, 5, 16),)
    ''', ["return F.rms_norm(x, (x.shape[-1],), eps=eps) * weight"], ["rsqrt"]),
    "layernorm-gamma-beta-root-as-power-a-half": ("GL106", '''
        class LayerNorm(nn.Module):
            def __init__(self, dim, eps=1e-5):
                super().__init__()
                self.eps = eps
                self.gamma = nn.Parameter(torch.ones(dim) + 0.1 * torch.randn(dim))
                self.beta = nn.Parameter(torch.zeros(dim) + 0.1)

            def forward(self, x):
                mean = x.mean(dim=-1, keepdim=True)
                var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
                return self.gamma * (x - mean) / (var + self.eps) ** 0.5 + self.beta


        def make():
            return LayerNorm(16), (torch.randn(2, 5, 16),)
    ''', ["return F.layer_norm(x, (x.shape[-1],), self.gamma, self.beta, self.eps)"], ["mean =", "var ="]),
    "layernorm-var-unbiased-false-and-rsqrt-method": ("GL106", '''
        class LayerNorm(nn.Module):
            def __init__(self, dim, eps=1e-5):
                super().__init__()
                self.eps = eps
                self.gamma = nn.Parameter(torch.ones(dim) + 0.1 * torch.randn(dim))

            def forward(self, x):
                var = torch.var(x, dim=-1, unbiased=False, keepdim=True)
                mean = torch.mean(x, dim=-1, keepdim=True)
                return (x - mean) * (var + self.eps).rsqrt() * self.gamma


        def make():
            return LayerNorm(16), (torch.randn(2, 5, 16),)
    ''', ["return F.layer_norm(x, (x.shape[-1],), self.gamma, None, self.eps)"], ["var ="]),
    "norms-in-method-style-arithmetic": ("GL106", '''
        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(16, 16)

            def forward(self, x):
                h = self.fc(x)
                mean = h.mean(-1, keepdim=True)
                var = h.var(-1, keepdim=True, unbiased=False)
                a = h.sub(mean).div(torch.sqrt(var + 1e-5))
                b = torch.mul(h, torch.rsqrt(h.pow(2).mean(-1, keepdim=True).add(1e-6)))
                return a + b


        def make():
            return Block(), (torch.randn(2, 5, 16),)
    ''', ["a = F.layer_norm(h, (h.shape[-1],), eps=1e-5)\n", "b = F.rms_norm(h, (h.shape[-1],), eps=1e-6)\n"],
        ["mean =", "var ="]),
    "convnext-channels-first-under-a-branch": ("GL106", '''
        class LayerNorm(nn.Module):
            def __init__(self, normalized_shape, eps=1e-6, data_format="channels_last"):
                super().__init__()
                self.weight = nn.Parameter(torch.ones(normalized_shape) + 0.1 * torch.randn(normalized_shape))
                self.bias = nn.Parameter(torch.zeros(normalized_shape) + 0.1)
                self.eps = eps
                self.data_format = data_format
                self.normalized_shape = (normalized_shape,)

            def forward(self, x):
                if self.data_format == "channels_last":
                    return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
                elif self.data_format == "channels_first":
                    u = x.mean(1, keepdim=True)
                    s = (x - u).pow(2).mean(1, keepdim=True)
                    x = (x - u) / torch.sqrt(s + self.eps)
                    x = self.weight[:, None, None] * x + self.bias[:, None, None]
                    return x


        class Stem(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(3, 8, 3)
                self.norm = LayerNorm(8, data_format="channels_first")

            def forward(self, x):
                return self.norm(self.conv(x))


        def make():
            return Stem(), (torch.randn(2, 3, 9, 9),)
    ''', ["x = F.layer_norm(x.movedim(1, -1), (x.shape[1],), eps=self.eps).movedim(-1, 1)\n",
          "x = self.weight[:, None, None] * x + self.bias[:, None, None]"], ["u = x.mean", "s = (x - u)"]),
    "channel-layernorm-with-1-dim-1-1-gain": ("GL106", '''
        class ChanLayerNorm(nn.Module):
            def __init__(self, dim, eps=1e-5):
                super().__init__()
                self.eps = eps
                self.g = nn.Parameter(torch.ones(1, dim, 1, 1) + 0.1 * torch.randn(1, dim, 1, 1))
                self.b = nn.Parameter(torch.zeros(1, dim, 1, 1) + 0.1)

            def forward(self, x):
                var = torch.var(x, dim=1, unbiased=False, keepdim=True)
                mean = torch.mean(x, dim=1, keepdim=True)
                return (x - mean) / (var + self.eps).sqrt() * self.g + self.b


        def make():
            return ChanLayerNorm(8), (torch.randn(2, 8, 5, 5),)
    ''', ["return F.layer_norm(x.movedim(1, -1), (x.shape[1],), eps=self.eps).movedim(-1, 1) * self.g + self.b"],
        ["var =", "mean ="]),
    "rmsnorm-in-a-forward-with-import-torch-as-t": ("GL106", '''
        import torch as t
        from torch.nn import functional as fn


        class Block(t.nn.Module):
            def __init__(self, dim=16):
                super().__init__()
                self.fc = t.nn.Linear(dim, dim)
                self.scale = t.nn.Parameter(t.ones(dim) + 0.1 * t.randn(dim))

            def forward(self, x):
                h = self.fc(x)
                h = h / t.sqrt(t.mean(h ** 2, dim=-1, keepdim=True) + 1e-6) * self.scale
                return fn.gelu(h)


        def make():
            return Block(), (t.randn(2, 5, 16),)
    ''', ["h = fn.rms_norm(h, (h.shape[-1],), eps=1e-6) * self.scale\n"], ["t.sqrt"]),
    # -- GL107 ------------------------------------------------------------------------------------------------
    "silu-in-each-operand-order-and-spelling": ("GL107", '''
        class Gate(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(16, 16)

            def forward(self, x):
                h = self.fc(x)
                a = h * F.sigmoid(h)
                b = h.sigmoid() * h
                c = torch.sigmoid(h) * h
                return a + b + c


        def make():
            return Gate(), (torch.randn(2, 16),)
    ''', ["a = F.silu(h)\n", "b = F.silu(h)\n", "c = F.silu(h)\n"], ["sigmoid"]),
    "swish-with-the-sigmoid-written-out-in-a-helper": ("GL107", '''
        import torch as th
        from torch import nn


        def swish(x):
            return x / (1 + th.exp(-x))


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(16, 16)
                self.out = nn.Linear(16, 16)

            def forward(self, x):
                return self.out(swish(self.fc(x)))


        def make():
            return Net(), (th.randn(2, 16),)
    ''', ["def swish(x):\n    return nn.functional.silu(x)\n"], ["exp("]),
    "gelu-activation-modules-as-transformers-writes-them": ("GL107", '''
        class NewGELUActivation(nn.Module):
            def forward(self, input):
                return 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))


        class FastGELUActivation(nn.Module):
            def forward(self, input):
                return 0.5 * input * (1.0 + torch.tanh(input * 0.7978845608 * (1.0 + 0.044715 * input * input)))


        class GELUActivation(nn.Module):
            def forward(self, x):
                return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


        class MLP(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(16, 16)
                self.a, self.b, self.c = NewGELUActivation(), FastGELUActivation(), GELUActivation()

            def forward(self, x):
                h = self.fc(x)
                return self.a(h) + self.b(h) + self.c(h)


        def make():
            return MLP(), (torch.randn(2, 16),)
    ''', ['return F.gelu(input, approximate="tanh")\n', "return F.gelu(x)\n"], ["tanh(", "erf("]),
    "gelu-cube-spellings-cdf-variable-and-halved": ("GL107", '''
        def gelu_cubed(x):
            return 0.5 * x * (1 + torch.tanh(0.7978845608 * (x + 0.044715 * x ** 3)))


        def gelu_product(x):
            return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)))


        def gelu_cdf(x):
            cdf = 0.5 * (1.0 + torch.tanh((math.sqrt(2 / math.pi) * (x + 0.044715 * torch.pow(x, 3)))))
            return x * cdf


        def gelu_halved(x):
            return x * (1.0 + torch.erf(x / math.sqrt(2.0))) / 2


        class MLP(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(16, 16)

            def forward(self, x):
                h = self.fc(x)
                return gelu_cubed(h) + gelu_product(h * 2) + gelu_cdf(h) + gelu_halved(h) + gelu_cubed(h - 1)


        def make():
            return MLP(), (torch.randn(2, 16),)
    ''', ['    return F.gelu(x, approximate="tanh")\n\n\ndef gelu_product', "def gelu_cdf(x):\n    return F.gelu(x, "
          'approximate="tanh")\n', "def gelu_halved(x):\n    return F.gelu(x)\n"], ["cdf =", "tanh(", "erf("]),
    "gelu-cdf-in-a-helper-function-called-on-the-input": ("GL107", '''
        def cdf(x):
            return 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


        class MLP(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(16, 16)

            def forward(self, x):
                h = self.fc(x)
                return h * cdf(h)


        def make():
            return MLP(), (torch.randn(2, 16),)
    ''', ["        return F.gelu(h)\n"], ["h * cdf(h)"]),
    "gelu-with-its-constant-made-a-tensor-and-a-scale-shift-layernorm": ("GL107", '''
        import torch
        import torch.nn as nn


        class LayerNorm(nn.Module):
            def __init__(self, emb_dim):
                super().__init__()
                self.eps = 1e-5
                self.scale = nn.Parameter(torch.ones(emb_dim) + 0.1 * torch.randn(emb_dim))
                self.shift = nn.Parameter(torch.zeros(emb_dim) + 0.1)

            def forward(self, x):
                mean = x.mean(dim=-1, keepdim=True)
                var = x.var(dim=-1, keepdim=True, unbiased=False)
                norm_x = (x - mean) / torch.sqrt(var + self.eps)
                return self.scale * norm_x + self.shift


        class GELU(nn.Module):
            def forward(self, x):
                return 0.5 * x * (1 + torch.tanh(
                    torch.sqrt(torch.tensor(2.0 / torch.pi)) *
                    (x + 0.044715 * torch.pow(x, 3))
                ))


        def make():
            return nn.Sequential(LayerNorm(16), nn.Linear(16, 64), GELU(), nn.Linear(64, 16)), (torch.randn(2, 4, 16),)
    ''', ['        return nn.functional.gelu(x, approximate="tanh")\n',
          "        return nn.functional.layer_norm(x, (x.shape[-1],), self.scale, self.shift, self.eps)\n"],
        ["tanh(", "norm_x"]),
    "gelu-and-silu-of-an-expression-written-twice": ("GL107", '''
        class MLP(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(16, 16, bias=False)
                self.bias = nn.Parameter(torch.randn(16))
                self.gate = nn.Linear(16, 16)

            def forward(self, x):
                y = self.fc(x)
                h = (y + self.bias) * 0.5 * (1.0 + torch.erf((y + self.bias) * 0.7071067811865476))
                return h + self.gate(x) * torch.sigmoid(self.gate(x))


        def make():
            return MLP(), (torch.randn(2, 16),)
    ''', ["h = F.gelu(y + self.bias)\n", "return h + F.silu(self.gate(x))\n"], ["erf(", "sigmoid("]),
    "mish-and-swish-lambdas-with-functional-as-fn": ("GL107", '''
        import torch
        from torch import nn
        from torch.nn import functional as fn


        class MLP(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(16, 16)
                self.mish = lambda t: t * torch.tanh(fn.softplus(t))
                self.swish = lambda t: t * torch.sigmoid(t)

            def forward(self, x):
                h = self.fc(x)
                return self.mish(h) + self.swish(h)


        def make():
            return MLP(), (torch.randn(2, 16),)
    ''', ["self.mish = lambda t: fn.mish(t)\n", "self.swish = lambda t: fn.silu(t)\n"], ["softplus"]),
    "mish-with-the-softplus-written-out": ("GL107", '''
        class Mish(nn.Module):
            def forward(self, x):
                return x * torch.tanh(torch.log(1 + torch.exp(x)))


        class Mish1p(nn.Module):
            def forward(self, x):
                return x * (torch.tanh(torch.log1p(torch.exp(x))))


        def make():
            return nn.Sequential(nn.Linear(16, 16), Mish(), nn.Linear(16, 16), Mish1p()), (torch.randn(2, 16),)
    ''', ["class Mish(nn.Module):\n    def forward(self, x):\n        return F.mish(x)\n",
          "class Mish1p(nn.Module):\n    def forward(self, x):\n        return F.mish(x)\n"], ["exp("]),
    "softmax-from-stabilised-exponentials-in-a-variable": ("GL107", '''
        class Head(nn.Module):
            def __init__(self):
                super().__init__()
                self.out = nn.Linear(16, 5)

            def forward(self, x):
                logits = self.out(x)
                e = torch.exp(logits - logits.amax(-1, keepdim=True))
                return e / torch.sum(e, -1, keepdim=True)


        def make():
            return Head(), (torch.randn(4, 16),)
    ''', ["return torch.softmax(logits, -1)\n"], ["e =", "exp"]),
    "softmax-with-torch-max-and-torch-sum": ("GL107", '''
        class Head(nn.Module):
            def __init__(self):
                super().__init__()
                self.out = nn.Linear(16, 5)

            def forward(self, x):
                logits = self.out(x)
                exp_x = torch.exp(logits - torch.max(logits, dim=1, keepdim=True)[0])
                return exp_x / torch.sum(exp_x, dim=1, keepdim=True)


        def make():
            return Head(), (torch.randn(4, 16),)
    ''', ["return torch.softmax(logits, dim=1)\n"], ["exp_x"]),
    # -- GL204 ------------------------------------------------------------------------------------------------
    "log-of-a-softmax-picked-at-the-targets": ("GL204", '''
        class Classifier(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(16, 10)

            def forward(self, x, y):
                logits = self.fc(x)
                probs = F.softmax(logits, dim=-1)
                return -torch.log(probs[torch.arange(x.shape[0]), y]).mean()


        def make():
            return Classifier(), (torch.randn(4, 16), torch.randint(0, 10, (4,)))
    ''', ["return -F.log_softmax(logits, dim=-1)[torch.arange(x.shape[0]), y].mean()\n"], ["probs ="]),
    "log-of-gathered-probabilities-with-a-dtype": ("GL204", '''
        class Classifier(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(16, 10)

            def forward(self, x, y):
                probs = torch.softmax(self.fc(x), dim=-1, dtype=torch.float32)
                return -probs.gather(1, y[:, None]).log().mean()


        def make():
            return Classifier(), (torch.randn(4, 16), torch.randint(0, 10, (4,)))
    ''', ["return -F.log_softmax(self.fc(x), dim=-1, dtype=torch.float32).gather(1, y[:, None]).mean()\n"],
        ["probs ="]),
    "binary-cross-entropy-by-hand-from-a-sigmoid-variable": ("GL204", '''
        class Scorer(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(16, 1)

            def forward(self, x, t):
                logits = self.fc(x).squeeze(-1)
                p = torch.sigmoid(logits)
                return -(t * torch.log(p) + (1 - t) * torch.log(1 - p)).mean()


        def make():
            return Scorer(), (torch.randn(4, 16), torch.rand(4))
    ''', ["return -(t * F.logsigmoid(logits) + (1 - t) * F.logsigmoid(-logits)).mean()\n"], ["torch.log"]),
    "log2-and-log10-divide-by-the-log-of-their-base": ("GL204", '''
        import torch
        import torch.nn.functional as F
        from torch import nn


        class Entropy(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(16, 8)

            def forward(self, x):
                z = self.fc(x)
                bits = torch.log2(F.softmax(z, dim=-1))
                return bits, torch.log10(torch.sigmoid(z)).sum(-1)


        def make():
            return Entropy(), (torch.randn(4, 16),)
    ''', ["from torch import nn\nimport math\n", "bits = F.log_softmax(z, dim=-1) / math.log(2)\n",
          "return bits, (F.logsigmoid(z) / math.log(10)).sum(-1)\n"], ["log2(", "log10("]),
    "log-methods-and-an-alias-of-functional": ("GL204", '''
        import torch as t
        import torch.nn.functional as fn


        class Heads(t.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = t.nn.Linear(16, 10)

            def forward(self, x):
                z = self.fc(x)
                return z.softmax(-1).log() + (1 - t.sigmoid(z)).log() + fn.softmax(z, dim=-1).log()


        def make():
            return Heads(), (t.randn(4, 16),)
    ''', ["return fn.log_softmax(z, -1) + fn.logsigmoid(-z) + fn.log_softmax(z, dim=-1)\n"], [".log()"]),
}


@pytest.mark.proof
@pytest.mark.parametrize("case", list(FIXED))
def test_each_spelling_is_found_and_its_fix_is_proven_on_the_model(tmp_path, case):
    rule, source, present, absent = FIXED[case]
    path = _model(tmp_path, source)
    report = lint_file(path, device="cpu")
    found = [f for f in report.findings if f.rule_id in ("GL106", "GL107", "GL204")]
    assert rule in {f.rule_id for f in found}
    assert found and all(f.fix is not None for f in found), [f.no_fix for f in found]
    plan = fix_plan(report, tmp_path)
    assert [(f.rule_id, why) for f, why in plan.refused if f in found] == [] and set(found) <= set(plan.applied)
    fixed = plan.texts[str(path)]
    assert [fragment for fragment in present if fragment not in fixed and fragment not in _joined(fixed)] == [], fixed
    body = fixed.split("\n\n\ndef make", 1)[0]
    assert [fragment for fragment in absent if fragment in body] == [], fixed
    compile(fixed, "model.py", "exec")


# -- left alone ----------------------------------------------------------------------------------------------

LOOKALIKES = {
    "epsilon-on-the-standard-deviation": ("GL106", '''
        class LayerNorm(nn.Module):
            def __init__(self, features, eps=1e-6):
                super().__init__()
                self.a_2 = nn.Parameter(torch.ones(features))
                self.b_2 = nn.Parameter(torch.zeros(features))
                self.eps = eps

            def forward(self, x):
                mean = x.mean(-1, keepdim=True)
                std = x.std(-1, keepdim=True)
                return self.a_2 * (x - mean) / (std + self.eps) + self.b_2


        def make():
            return LayerNorm(16), (torch.randn(2, 5, 16),)
    '''),
    "mu-over-sigma-plus-epsilon": ("GL106", '''
        class Standardise(nn.Module):
            def forward(self, x):
                mu = x.mean(-1, keepdim=True)
                sigma = x.std(-1, keepdim=True, unbiased=False)
                return (x - mu) / (sigma + 1e-5)


        def make():
            return Standardise(), (torch.randn(2, 5, 16),)
    '''),
    "quick-gelu": ("GL107", '''
        class QuickGELU(nn.Module):
            def forward(self, x):
                return x * torch.sigmoid(1.702 * x)


        def make():
            return nn.Sequential(nn.Linear(16, 16), QuickGELU()), (torch.randn(2, 16),)
    '''),
    "swish-with-a-beta": ("GL107", '''
        class Swish(nn.Module):
            def __init__(self):
                super().__init__()
                self.beta = nn.Parameter(torch.tensor(1.5))

            def forward(self, x):
                return x * torch.sigmoid(self.beta * x)


        def make():
            return nn.Sequential(nn.Linear(16, 16), Swish()), (torch.randn(2, 16),)
    '''),
    "two-dropouts-of-one-input-are-two-values": ("GL107", '''
        class Noisy(nn.Module):
            def forward(self, x):
                return F.dropout(x, 0.5) * torch.sigmoid(F.dropout(x, 0.5))


        def make():
            return nn.Sequential(nn.Linear(16, 16), Noisy()), (torch.randn(2, 16),)
    '''),
    "log-of-probabilities-plus-an-epsilon": ("GL204", '''
        class Policy(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(16, 6)

            def forward(self, x):
                probs = F.softmax(self.fc(x), dim=-1)
                return torch.log(probs + 1e-9), torch.log(probs.clamp(min=1e-8))


        def make():
            return Policy(), (torch.randn(4, 16),)
    '''),
}


@pytest.mark.parametrize("case", list(LOOKALIKES))
def test_formulas_that_only_look_like_the_library_op_are_left_alone(tmp_path, case):
    rule, source = LOOKALIKES[case]
    report = lint_file(_model(tmp_path, source), device="meta", extend_select=(rule,))
    assert findings_of(report, rule) == []


def test_the_lookalikes_really_compute_something_else_than_the_library_op():
    # What a rewrite to the library op would change: each differs in float64 well beyond rounding.
    torch.manual_seed(0)
    x = torch.randn(64, 16, dtype=torch.float64)
    assert not torch.allclose(x * torch.sigmoid(1.702 * x), F.gelu(x), atol=1e-3)
    assert not torch.allclose(x * torch.sigmoid(1.5 * x), F.silu(x), atol=1e-3)
    mean, std = x.mean(-1, keepdim=True), x.std(-1, keepdim=True)
    assert not torch.allclose((x - mean) / (std + 1e-6), F.layer_norm(x, (16,), eps=1e-6), atol=1e-3)
    logits = torch.cat([torch.zeros(1, 5), torch.full((1, 1), -30.0)], -1).double()
    assert not torch.allclose(torch.log(F.softmax(logits, -1) + 1e-9), F.log_softmax(logits, -1), atol=1.0)


@pytest.mark.proof
@pytest.mark.parametrize("made, read", [
    ("probs = F.softmax(self.fc(self.drop(x)), dim=-1)", "return probs, torch.log(probs)"),
    ("probs = torch.sigmoid(self.fc(self.drop(x)))", "return probs, torch.log(1 - probs)"),
])
def test_probabilities_read_elsewhere_get_their_logits_named_once_and_read_by_both(tmp_path, made, read):
    # With the logits written twice, the layer would run twice and the dropout would draw two masks.
    source = f'''
        class Policy(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(16, 6)
                self.drop = nn.Dropout(0.2)

            def forward(self, x):
                {made}
                {read}


        def make():
            return Policy(), (torch.randn(4, 16),)
    '''
    path = _model(tmp_path, source)
    report = lint_file(path, device="cpu")
    [finding] = findings_of(report, "GL204")
    assert finding.fix is not None, finding.no_fix
    plan = fix_plan(report, tmp_path)
    assert plan.refused == [] and plan.applied == [finding]
    fixed = plan.texts[str(path)]
    assert "        logits = self.fc(self.drop(x))\n        probs = " in fixed, fixed
    assert fixed.count("self.fc(") == 1 and ("F.log_softmax(logits, dim=-1)" in fixed or "F.logsigmoid(-logits)" in fixed)


def test_a_norm_that_reads_a_statistic_later_keeps_that_statistic(tmp_path):
    source = '''
        class Centre(nn.Module):
            def __init__(self, first=True):
                super().__init__()
                self.first = first

            def forward(self, x):
                if self.first:
                    u = x.mean(1, keepdim=True)
                    s = (x - u).pow(2).mean(1, keepdim=True)
                    x = (x - u) / torch.sqrt(s + 1e-6)
                return x + u


        def make():
            return Centre(), (torch.randn(2, 8, 5, 5),)
    '''
    report = lint_file(_model(tmp_path, source), device="meta")
    [finding] = findings_of(report, "GL106")
    assert finding.fix is not None, finding.no_fix
    fixed = apply_edits(open(finding.location.path, encoding="utf-8").read(), finding.fix.edits)
    assert "            u = x.mean(1, keepdim=True)\n            x = F.layer_norm(x.movedim(1, -1)" in fixed
    assert "s = (x - u)" not in fixed


FORMATTED = '''\
import math

import torch
import torch.nn.functional as F
from torch import nn


class LlamaRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class LayerNorm2d(nn.Module):
    def __init__(self, num_channels, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(num_channels))
        self.bias = nn.Parameter(torch.zeros(num_channels))
        self.eps = eps

    def forward(self, x):
        if self.weight is not None:
            u = x.mean(1, keepdim=True)
            s = (x - u).pow(2).mean(1, keepdim=True)
            x = (x - u) / torch.sqrt(s + self.eps)
        return self.weight[:, None, None] * x + self.bias[:, None, None]


class NewGELUActivation(nn.Module):
    def forward(self, input):
        return (
            0.5
            * input
            * (
                1.0
                + torch.tanh(
                    math.sqrt(2.0 / math.pi)
                    * (input + 0.044715 * torch.pow(input, 3.0))
                )
            )
        )


class Stem(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, kernel_size=2, stride=2)
        self.norm2d = LayerNorm2d(16)
        self.act = NewGELUActivation()
        self.norm = LlamaRMSNorm(16)

    def forward(self, x):
        h = self.act(self.norm2d(self.conv(x)))
        return self.norm(h.flatten(2).transpose(1, 2))


def make():
    return Stem(), (torch.randn(2, 3, 8, 8),)
'''


@pytest.mark.proof
def test_a_formatted_file_stays_formatted_after_its_norm_and_activation_fixes(tmp_path):
    ruff = [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", "--isolated"]
    write(tmp_path, "pyproject.toml", '[project]\nname = "user-project"\nversion = "0"\n')
    path = write(tmp_path, "model.py", FORMATTED)
    assert subprocess.run([*ruff, str(path)], capture_output=True).returncode == 0  # formatted to begin with
    report = lint_file(path, device="cpu")
    plan = fix_plan(report, tmp_path)
    assert plan.refused == [] and {f.rule_id for f in plan.applied} == {"GL106", "GL107"} and len(plan.applied) == 3
    fixed = plan.texts[str(path)]
    assert "        return F.rms_norm(\n            hidden_states,\n" in fixed  # one argument a line, as ruff lays it out
    assert '        return F.gelu(input, approximate="tanh")\n' in fixed  # the formatter's parentheses go with it
    path.write_text(fixed, encoding="utf-8")
    checked = subprocess.run([*ruff, "--diff", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
