"""GL101 finds hand-written softmax attention however it is spelled, and leaves the right idioms alone."""

from __future__ import annotations

import textwrap

import pytest

from conftest import findings_of, line_of, lint_file, write

MODEL = '''
import math
import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.drop = nn.Dropout(0.1)

    def forward(self, x, mask):
        b, t, c = x.shape
        q, k, v = (z.reshape(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.qkv(x).split(c, dim=-1))
        scale = 1.0 / math.sqrt(q.size(-1))
{body}
        return out.transpose(1, 2).reshape(b, t, c)


def make():
    mask = torch.ones(16, 16, dtype=torch.bool).tril()
    return Attention(), (torch.randn(2, 16, 32), mask)
'''


def attention_model(body: str) -> str:
    return MODEL.replace("{body}", textwrap.indent(textwrap.dedent(body).strip(), " " * 8))


FLAGGED = {
    "matmul operator, scale after, masked_fill, F.softmax, dropout": """
        att = (q @ k.transpose(-2, -1)) * scale
        att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1)  # the softmax
        out = self.drop(att) @ v
    """,
    "torch.matmul, division before the product, additive mask, torch.softmax": """
        att = torch.matmul(q / math.sqrt(q.size(-1)), k.transpose(-1, -2))
        att = att + torch.zeros(16, 16).masked_fill(~mask, float("-inf"))
        out = torch.matmul(torch.softmax(att, -1), v)  # the softmax
    """,
    "bmm on flattened heads, softmax method": """
        qf, kf, vf = (z.reshape(b * self.heads, t, -1) for z in (q, k, v))
        att = torch.bmm(qf, kf.transpose(1, 2)) * scale
        att = att.softmax(dim=-1)  # the softmax
        out = torch.bmm(att, vf).view(b, self.heads, t, -1)
    """,
    "baddbmm with alpha, F.softmax with dtype and a cast back": """
        qf, kf, vf = (z.reshape(b * self.heads, t, -1) for z in (q, k, v))
        bias = torch.zeros(b * self.heads, t, t).masked_fill(~mask, float("-inf"))
        att = torch.baddbmm(bias, qf, kf.transpose(1, 2), beta=1.0, alpha=scale)
        att = F.softmax(att, dim=-1, dtype=torch.float32).to(qf.dtype)  # the softmax
        out = att.bmm(vf).view(b, self.heads, t, -1)
    """,
    "einsum both sides, torch.where mask, float() and type_as around the softmax": """
        att = torch.einsum("bhqd,bhkd->bhqk", q, k) * scale
        att = torch.where(mask, att, torch.finfo(att.dtype).min)
        att = att.float().softmax(-1).type_as(q)  # the softmax
        out = torch.einsum("bhqk,bhkd->bhqd", self.drop(att), v)
    """,
    "a mask set by index assignment": """
        att = q @ k.transpose(-2, -1) * scale
        att[..., ~mask] = float("-inf")
        out = att.softmax(-1) @ v  # the softmax
    """,
    "in-place scale and mask on the scores": """
        att = q @ k.transpose(-2, -1)
        att /= math.sqrt(q.size(-1))
        att += torch.zeros(16, 16).masked_fill(~mask, float("-inf"))
        out = nn.functional.softmax(att, dim=-1) @ v  # the softmax
    """,
}

NOT_FLAGGED = {
    "F.scaled_dot_product_attention": """
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.1)
    """,
    "linear attention without softmax": """
        kv = torch.einsum("bhkd,bhke->bhde", F.elu(k) + 1, v)
        out = torch.einsum("bhqd,bhde->bhqe", F.elu(q) + 1, kv)
    """,
    "efficient attention with softmax feature maps on q and k separately": """
        context = k.softmax(dim=-2).transpose(-2, -1) @ v
        out = q.softmax(dim=-1) @ context
    """,
    "softmax over the query dimension (slot-attention style)": """
        att = (q @ k.transpose(-2, -1)) * scale
        att = att.softmax(dim=-2)
        out = att @ v
    """,
}


@pytest.mark.parametrize("body", FLAGGED.values(), ids=FLAGGED.keys())
def test_hand_written_attention_is_flagged_at_the_softmax(body, tmp_path):
    path = write(tmp_path, "model.py", attention_model(body))
    report = lint_file(path)
    assert report.errors == []
    [finding] = findings_of(report, "GL101")
    assert finding.location.line == line_of(path, "# the softmax")
    assert finding.occurrences == 1


@pytest.mark.parametrize("body", NOT_FLAGGED.values(), ids=NOT_FLAGGED.keys())
def test_attention_that_is_fused_or_not_softmax_attention_is_not_flagged(body, tmp_path):
    report = lint_file(write(tmp_path, "model.py", attention_model(body)))
    assert report.errors == []
    assert findings_of(report, "GL101") == []


def test_mixture_of_experts_gating_against_a_weight_matrix_is_not_flagged(tmp_path):
    # softmax(x @ W_gate) weighs the experts' outputs (activations) with an einsum: shaped like attention,
    # but the scores are a projection against a parameter.
    report = lint_file(write(tmp_path, "model.py", '''
        import torch
        from torch import nn


        class MoE(nn.Module):
            def __init__(self, dim=16, experts=4):
                super().__init__()
                self.gate = nn.Parameter(torch.randn(dim, experts))
                self.experts = nn.ModuleList(nn.Linear(dim, dim) for _ in range(experts))

            def forward(self, x):
                weights = torch.softmax(x @ self.gate, dim=-1)
                outputs = torch.stack([expert(x) for expert in self.experts], dim=-2)
                return torch.einsum("bte,bted->btd", weights, outputs)


        def make():
            return MoE(), (torch.randn(2, 8, 16),)
    '''))
    assert report.errors == []
    assert findings_of(report, "GL101") == []


def test_span_is_the_softmax_call_and_related_locations_are_the_products(tmp_path):
    path = write(tmp_path, "model.py", attention_model(FLAGGED["matmul operator, scale after, masked_fill, F.softmax, dropout"]))
    [finding] = findings_of(lint_file(path), "GL101")
    text = path.read_text().splitlines()[finding.location.line - 1]
    assert text[finding.location.column - 1 : finding.location.end_column - 1] == "F.softmax(att, dim=-1)"
    related = {r.message: r.location for r in finding.related}
    scores = related["attention scores: matmul"]
    assert scores.line == line_of(path, "att = (q @ k")
    score_text = path.read_text().splitlines()[scores.line - 1]
    assert score_text[scores.column - 1 : scores.end_column - 1] == "q @ k.transpose(-2, -1)"
    assert related["probabilities times values: matmul"].line == line_of(path, "out = self.drop(att) @ v")
    assert related["mask of the scores"].line == line_of(path, "masked_fill(~mask")
    assert "matmul → scale → mask → softmax → dropout → matmul" in finding.message


def test_a_helper_in_another_file_is_reported_there_once_with_its_occurrences(tmp_path):
    helper = write(tmp_path, "attention_helpers.py", '''
        import torch


        def attend(q, k, v):
            scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
            return torch.softmax(scores, dim=-1) @ v
    ''')
    model = write(tmp_path, "model.py", '''
        import torch
        from torch import nn

        from attention_helpers import attend


        class Layer(nn.Module):
            def __init__(self):
                super().__init__()
                self.qkv = nn.Linear(16, 48)

            def forward(self, x):
                q, k, v = self.qkv(x).chunk(3, dim=-1)
                return x + attend(q, k, v)


        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = nn.ModuleList(Layer() for _ in range(3))

            def forward(self, x):
                for layer in self.layers:
                    x = layer(x)
                return x


        def make():
            return Model(), (torch.randn(2, 8, 16),)
    ''')
    [finding] = findings_of(lint_file(model), "GL101")
    assert finding.location.path == str(helper)
    assert finding.location.line == line_of(helper, "torch.softmax")
    assert finding.occurrences == 3
    assert "layers.0 … layers.2 (3 occurrences)" in finding.message


def test_repeated_layers_are_one_finding_that_counts_them(tmp_path):
    source = attention_model(FLAGGED["bmm on flattened heads, softmax method"])
    source = source.replace(
        "def make():\n    mask",
        "class Stack(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.layers = nn.ModuleList(Attention() for _ in range(12))\n\n"
        "    def forward(self, x, mask):\n"
        "        for layer in self.layers:\n"
        "            x = layer(x, mask)\n"
        "        return x\n\n\n"
        "def make():\n    mask",
    ).replace("return Attention(), ", "return Stack(), ")
    report = lint_file(write(tmp_path, "model.py", source))
    [finding] = findings_of(report, "GL101")
    assert finding.occurrences == 12
    assert "layers.0 … layers.11 (12 occurrences)" in finding.message
