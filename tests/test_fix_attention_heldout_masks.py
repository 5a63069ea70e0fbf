"""GL101 on the masks of public repositories the held-out set (benchmarks/fix_share.py) showed unfixed, each
written here in that style: fairseq's and Graphormer's key padding filled on a view of the scores under an `if`
after an added mask, CLIP's two masks under two guards, SAM's decomposed relative position added by a helper,
BLIP's probabilities read or changed under a flag (the guarded fallback). Proven on the model and, where the
guards choose, checked in plain PyTorch for each case of them; what cannot be rewritten is refused
naming what stands in the way."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from conftest import (
    assert_same_in_plain_pytorch,
    findings_of,
    fix_plan,
    forward_text,
    lint_file,
    model_file,
    prove_fix,
    safe_gl101_fix,
    write,
)
from graphlint.results import SAFE, UNSAFE

HEADER = '''
import math

import torch
import torch.nn.functional as F
from torch import nn


'''


def _model(tmp_path, source: str, name: str = "model.py"):
    return model_file(tmp_path, source, HEADER, name)





def _safe_fix(tmp_path, source: str) -> tuple:
    path = _model(tmp_path, source)
    return path, safe_gl101_fix(tmp_path, path)


BLIP = '''
class BertSelfAttention(nn.Module):
    def __init__(self, hidden_size=16, heads=2):
        super().__init__()
        self.num_attention_heads, self.attention_head_size = heads, hidden_size // heads
        self.query, self.key, self.value = (nn.Linear(hidden_size, hidden_size) for _ in range(3))
        self.dropout = nn.Dropout(0.1)
        self.save_attention = False

    def save_attention_map(self, attention_map):
        self.attention_map = attention_map

    def transpose_for_scores(self, x):
        return x.view(*x.size()[:-1], self.num_attention_heads, self.attention_head_size).permute(0, 2, 1, 3)

    def forward(self, hidden_states, attention_mask, head_mask=None):
        query_layer = self.transpose_for_scores(self.query(hidden_states))
        key_layer = self.transpose_for_scores(self.key(hidden_states))
        value_layer = self.transpose_for_scores(self.value(hidden_states))
        attention_scores = torch.matmul(query_layer, key_layer.transpose(-1, -2))
        attention_scores = attention_scores / math.sqrt(self.attention_head_size)
        attention_scores = attention_scores + attention_mask
        attention_probs = nn.Softmax(dim=-1)(attention_scores)
        if self.save_attention:
            self.save_attention_map(attention_probs)
        attention_probs_dropped = self.dropout(attention_probs)
        HEAD_MASK
        context_layer = torch.matmul(attention_probs_dropped, value_layer)
        return context_layer.permute(0, 2, 1, 3).flatten(2)


def make():
    return BertSelfAttention(), (torch.randn(2, 5, 16), torch.zeros(2, 1, 1, 5))
'''


@pytest.mark.proof
@pytest.mark.parametrize("head_mask, guard", [
    ("", "not self.save_attention"),
    ("if head_mask is not None:\n            attention_probs_dropped = attention_probs_dropped * head_mask",
     "not self.save_attention and head_mask is None"),
])
def test_probabilities_read_or_changed_under_a_flag_the_graph_did_not_take_get_the_guarded_fallback(
        tmp_path, head_mask, guard):
    """BLIP: the flag is false in the graph, but the statement under it needs the probabilities: the fused call
    where the flags are off, the statements as written otherwise (tests/test_fix_attention_fallback.py checks
    both cases in plain PyTorch); safe, since the dropout the fused path no longer calls has no hook."""
    path = _model(tmp_path, BLIP.replace("HEAD_MASK", head_mask))
    report = lint_file(path, device="cpu")
    [finding] = findings_of(report, "GL101")
    assert finding.fix is not None and finding.fix.applicability == SAFE, finding.no_fix
    assert f"where `{guard}`, the statements as written otherwise" in finding.fix.message
    assert prove_fix(report, tmp_path, finding).ok


KEY_PADDING = '''
class MultiheadAttention(nn.Module):
    def __init__(self, embed_dim=16, num_heads=2):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
        self.scaling = self.head_dim ** -0.5
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(embed_dim, embed_dim) for _ in range(3))

    def forward(self, query, key_padding_mask=None, attn_mask=None, need_weights=False):
        tgt_len, bsz, embed_dim = query.size()
        src_len = tgt_len
        q = self.q_proj(query) * self.scaling
        q = q.contiguous().view(tgt_len, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        k = self.k_proj(query).contiguous().view(-1, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        v = self.v_proj(query).contiguous().view(-1, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        attn_weights = torch.bmm(q, k.transpose(1, 2))
        assert list(attn_weights.size()) == [bsz * self.num_heads, tgt_len, src_len]
        if attn_mask is not None:
            attn_mask = attn_mask.unsqueeze(0)
            attn_weights += attn_mask
        if key_padding_mask is not None:
            attn_weights = attn_weights.view(bsz, self.num_heads, tgt_len, src_len)
            attn_weights = attn_weights.masked_fill(key_padding_mask.unsqueeze(1).unsqueeze(2), float("-inf"))
            attn_weights = attn_weights.view(bsz * self.num_heads, tgt_len, src_len)
        attn_weights_float = F.softmax(attn_weights, dim=-1, dtype=torch.float32)
        attn_weights = attn_weights_float.type_as(attn_weights)
        attn_probs = F.dropout(attn_weights, p=0.1, training=self.training)
        attn = torch.bmm(attn_probs, v)
        attn = attn.transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim)
        weights = None
        if need_weights:
            weights = attn_weights_float.view(bsz, self.num_heads, tgt_len, src_len).mean(dim=1)
        return attn, weights


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn = MultiheadAttention()

    def forward(self, x, padding, attn_mask):
        return self.self_attn(x, key_padding_mask=padding, attn_mask=attn_mask)[0]


def make():
    padding = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    return Layer(), (torch.randn(5, 2, 16), padding, torch.randn(5, 5))
'''


@pytest.mark.proof
def test_a_mask_added_then_a_key_padding_filled_in_a_view_become_one_float_mask(tmp_path):
    """fairseq and Graphormer: `attn_mask` (made under its guard) added, then the key padding filled with -inf
    on a (bsz, heads, tgt, src) view under another guard, the size assert, the weights averaged under
    `need_weights` then given a new value: one float mask for each case the two guards allow, the weights None."""
    path = _model(tmp_path, KEY_PADDING)
    report = lint_file(path, device="cpu")
    [finding] = findings_of(report, "GL101")
    assert finding.fix is not None and finding.fix.applicability == UNSAFE, finding.no_fix
    assert "`attn_weights_float.view(bsz, self.num_heads, tgt_len, src_len).mean(dim=1)` returned or stored as " \
        "None" in finding.fix.message
    assert prove_fix(report, tmp_path, finding).ok
    plan = fix_plan(report, tmp_path, unsafe=True)
    fixed = plan.texts[str(path)]
    padding = "key_padding_mask.unsqueeze(1).unsqueeze(2).expand(bsz, self.num_heads, tgt_len, src_len).reshape(" \
        "bsz * self.num_heads, tgt_len, src_len)"
    mask = f'(torch.where({padding}, float("-inf"), attn_mask.unsqueeze(0)) if key_padding_mask is not None else ' \
        f"attn_mask.unsqueeze(0)) if attn_mask is not None else (~{padding} if key_padding_mask is not None else None)"
    expected = f'''        attn = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask={mask},
            dropout_p=0.1 if self.training else 0.0,
            scale=1.0,
        )
        attn = attn.transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim)
        weights = None
        if need_weights:
            weights = None
        return attn, weights
'''
    assert forward_text(fixed).split("v = self.v_proj")[1].split("\n", 1)[1] == expected
    # In plain PyTorch, each case of the two guards (the weights are not asked for).
    original, rewritten = _import(path, "kp_original"), _import(write(tmp_path, "rewritten.py", fixed), "kp_fixed")
    for padded, masked in ((True, True), (True, False), (False, True), (False, False)):
        torch.manual_seed(0)
        _, (x, padding, attn_mask) = original.make()
        args = (x.double(), padding if padded else None, attn_mask.double() if masked else None)
        outputs = []
        for module in (original, rewritten):
            torch.manual_seed(0)
            model = module.MultiheadAttention().double().eval()
            outputs.append(model(*args)[0])
        assert torch.allclose(outputs[0], outputs[1], atol=1e-9), (padded, masked)


def _import(path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CLIP = '''
class Attention(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.embed_dim, self.num_heads, self.head_dim = dim, heads, dim // heads
        self.scaling = self.head_dim ** -0.5
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(dim, dim) for _ in range(3))

    def forward(self, hidden_states, attention_mask=None, causal_attention_mask=None):
        bsz, tgt_len, _ = hidden_states.size()
        q = (self.q_proj(hidden_states) * self.scaling).view(bsz, tgt_len, self.num_heads, -1).transpose(1, 2)
        k = self.k_proj(hidden_states).view(bsz, tgt_len, self.num_heads, -1).transpose(1, 2)
        v = self.v_proj(hidden_states).view(bsz, tgt_len, self.num_heads, -1).transpose(1, 2)
        proj_shape = (bsz * self.num_heads, -1, self.head_dim)
        q, k, v = q.reshape(*proj_shape), k.reshape(*proj_shape), v.reshape(*proj_shape)
        src_len = k.size(1)
        attn_weights = torch.bmm(q, k.transpose(1, 2))
        if causal_attention_mask is not None:
            attn_weights = attn_weights.view(bsz, self.num_heads, tgt_len, src_len) + causal_attention_mask
            attn_weights = attn_weights.view(bsz * self.num_heads, tgt_len, src_len)
        if attention_mask is not None:
            attn_weights = attn_weights.view(bsz, self.num_heads, tgt_len, src_len) + attention_mask
            attn_weights = attn_weights.view(bsz * self.num_heads, tgt_len, src_len)
        attn_weights = nn.functional.softmax(attn_weights, dim=-1)
        attn_output = torch.bmm(attn_weights, v)
        return attn_output.view(bsz, self.num_heads, tgt_len, self.head_dim).transpose(1, 2).reshape(bsz, tgt_len, -1)


def make():
    mask = torch.zeros(2, 1, 5, 5).masked_fill(torch.rand(2, 1, 5, 5) > 0.7, -1e4)
    return Attention(), (torch.randn(2, 5, 16), mask, torch.triu(torch.full((1, 1, 5, 5), -1e4), 1))
'''


@pytest.mark.proof
def test_two_masks_each_under_its_own_guard_are_summed_for_every_case_of_the_guards(tmp_path):
    """CLIP (and Uni-Core's softmax_dropout): two additive masks, each under `if m is not None:`, give one mask
    for each case the guards allow; in plain PyTorch the rewritten model computes the same in all four."""
    path, fixed = _safe_fix(tmp_path, CLIP)
    causal = "causal_attention_mask.expand(bsz, self.num_heads, tgt_len, src_len).reshape(bsz * self.num_heads, " \
        "tgt_len, src_len)"
    mask = causal.replace("causal_attention_mask", "attention_mask")
    assert f"attn_mask=({causal} + {mask} if attention_mask is not None else {causal}) if causal_attention_mask " \
        f"is not None else ({mask} if attention_mask is not None else None)," in fixed
    original, rewritten = _import(path, "clip_original"), _import(write(tmp_path, "rewritten.py", fixed), "clip_fixed")
    for first, second in ((True, True), (True, False), (False, True), (False, False)):
        _, (x, attention_mask, causal_mask) = original.make()
        args = (x.double(), attention_mask.double() if first else None, causal_mask.double() if second else None)
        outputs = []
        for module in (original, rewritten):
            torch.manual_seed(0)
            outputs.append(module.Attention().double()(*args))
        assert torch.allclose(outputs[0], outputs[1], atol=1e-9), (first, second)


SAM = '''
def add_decomposed_rel_pos(attn, q, rel_pos_h, rel_pos_w, q_size, k_size):
    q_h, q_w = q_size
    k_h, k_w = k_size
    B, _, dim = q.shape
    r_q = q.reshape(B, q_h, q_w, dim)
    rel_h = torch.einsum("bhwc,hkc->bhwk", r_q, rel_pos_h)
    rel_w = torch.einsum("bhwc,wkc->bhwk", r_q, rel_pos_w)
    attn = (attn.view(B, q_h, q_w, k_h, k_w) + rel_h[:, :, :, :, None] + rel_w[:, :, :, None, :]).view(
        B, q_h * q_w, k_h * k_w)
    return attn


class Attention(nn.Module):
    def __init__(self, dim=16, num_heads=2, size=3):
        super().__init__()
        self.num_heads, self.scale, self.use_rel_pos = num_heads, (dim // num_heads) ** -0.5, True
        self.qkv = nn.Linear(dim, dim * 3)
        self.rel_pos_h = nn.Parameter(torch.randn(size, size, dim // num_heads))
        self.rel_pos_w = nn.Parameter(torch.randn(size, size, dim // num_heads))

    def forward(self, x):
        B, H, W, _ = x.shape
        qkv = self.qkv(x).reshape(B, H * W, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.reshape(3, B * self.num_heads, H * W, -1).unbind(0)
        attn = (q * self.scale) @ k.transpose(-2, -1)
        if self.use_rel_pos:
            attn = ADDED
        attn = attn.softmax(dim=-1)
        return (attn @ v).view(B, self.num_heads, H, W, -1).permute(0, 2, 3, 1, 4).reshape(B, H, W, -1)


def make():
    return Attention(), (torch.randn(2, 3, 3, 16),)
'''


@pytest.mark.proof
def test_a_helper_that_only_adds_to_the_scores_gives_the_mask_it_adds_to_zeros(tmp_path):
    """SAM's decomposed relative position: the helper views the scores, adds two einsum biases and views back,
    so what it adds is itself called on zeros shaped as the scores."""
    path, fixed = _safe_fix(tmp_path, SAM.replace(
        "ADDED", "add_decomposed_rel_pos(attn, q, self.rel_pos_h, self.rel_pos_w, (H, W), (H, W))"))
    assert "attn_mask=add_decomposed_rel_pos(q.new_zeros(*q.shape[:-1], k.shape[-2]), q, self.rel_pos_h, " \
        "self.rel_pos_w, (H, W), (H, W)) if self.use_rel_pos else None," in fixed
    assert "def add_decomposed_rel_pos(" in fixed
    assert_same_in_plain_pytorch(path, write(tmp_path, "rewritten.py", fixed))


def test_a_helper_that_does_more_than_add_to_the_scores_is_no_mask(tmp_path):
    source = SAM.replace("ADDED", "add_decomposed_rel_pos(attn, q, self.rel_pos_h, self.rel_pos_w, (H, W), (H, W))") \
        .replace("(attn.view(B, q_h, q_w, k_h, k_w) + rel_h", "(attn.view(B, q_h, q_w, k_h, k_w) * rel_h")
    [finding] = findings_of(lint_file(_model(tmp_path, source), device="cpu"), "GL101")
    assert finding.fix is None and finding.no_fix == "`if self.use_rel_pos:` does more to the scores than mask them"


ADDED_THEN_FILLED = '''
class Attention(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x, mask, keep):
        b, n, _ = x.shape
        q, k, v = (t.view(b, n, self.heads, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        scores = (q @ k.transpose(-2, -1) + mask).masked_fill(~keep, float("-inf"))
        return (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, n, -1)


def make():
    keep = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    keep[1, ..., 3:] = False
    return Attention(), (torch.randn(2, 5, 16), torch.randn(5, 5), keep)
'''


@pytest.mark.proof
def test_a_mask_added_then_a_fill_become_one_float_mask(tmp_path):
    path, fixed = _safe_fix(tmp_path, ADDED_THEN_FILLED)
    assert 'attn_mask=torch.where(~keep, float("-inf"), mask)' in fixed
    assert_same_in_plain_pytorch(path, write(tmp_path, "rewritten.py", fixed))
