"""GL101 where the probabilities are also read or changed under flags the capture did not take (BART's
`layer_head_mask` and `output_attentions`, BLIP's `save_attention`): the fix is the guarded fallback, the fused
call where every such flag is off and the statements as written otherwise. Proven on the model, and checked in
plain PyTorch with the flags off and on: each case computes what it did. A flag the capture took, and a flag
assigned between the attention and its `if`, get no such fix."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from conftest import model_file, findings_of, fix_plan, lint_file, prove_fix
from graphlint.results import SAFE

HEADER = '''
import math

import torch
import torch.nn.functional as F
from torch import nn


'''

BART = '''
class Attention(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.embed_dim, self.num_heads, self.head_dim = dim, heads, dim // heads
        self.scaling = self.head_dim ** -0.5
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(dim, dim) for _ in range(3))
        self.dropout = 0.1

    def _shape(self, tensor, seq_len, bsz):
        return tensor.view(bsz, seq_len, self.num_heads, self.head_dim).transpose(1, 2).contiguous()

    def forward(self, hidden_states, attention_mask=None, layer_head_mask=None, output_attentions=False):
        bsz, tgt_len, _ = hidden_states.size()
        query_states = self.q_proj(hidden_states) * self.scaling
        key_states = self._shape(self.k_proj(hidden_states), -1, bsz)
        value_states = self._shape(self.v_proj(hidden_states), -1, bsz)
        proj_shape = (bsz * self.num_heads, -1, self.head_dim)
        query_states = self._shape(query_states, tgt_len, bsz).view(*proj_shape)
        key_states = key_states.reshape(*proj_shape)
        value_states = value_states.reshape(*proj_shape)
        src_len = key_states.size(1)
        attn_weights = torch.bmm(query_states, key_states.transpose(1, 2))
        attn_weights = nn.functional.softmax(attn_weights, dim=-1)
        if layer_head_mask is not None:
            attn_weights = layer_head_mask.view(1, -1, 1, 1) * attn_weights.view(bsz, self.num_heads, tgt_len, src_len)
            attn_weights = attn_weights.view(bsz * self.num_heads, tgt_len, src_len)
        if output_attentions:
            attn_weights_reshaped = attn_weights.view(bsz, self.num_heads, tgt_len, src_len)
            attn_weights = attn_weights_reshaped.view(bsz * self.num_heads, tgt_len, src_len)
        else:
            attn_weights_reshaped = None
        attn_probs = nn.functional.dropout(attn_weights, p=self.dropout, training=self.training)
        attn_output = torch.bmm(attn_probs, value_states)
        attn_output = attn_output.view(bsz, self.num_heads, tgt_len, self.head_dim).transpose(1, 2)
        return attn_output.reshape(bsz, tgt_len, self.embed_dim), attn_weights_reshaped


def make():
    return Attention(), (torch.randn(2, 5, 16),)
'''

BART_FIXED = '''
        src_len = key_states.size(1)
        if layer_head_mask is None and not output_attentions:
            attn_weights_reshaped = None
            attn_output = F.scaled_dot_product_attention(
                query_states,
                key_states,
                value_states,
                dropout_p=self.dropout if self.training else 0.0,
                scale=1.0,
            )
        else:
            attn_weights = torch.bmm(query_states, key_states.transpose(1, 2))
            attn_weights = nn.functional.softmax(attn_weights, dim=-1)
            if layer_head_mask is not None:
                attn_weights = layer_head_mask.view(1, -1, 1, 1) * attn_weights.view(bsz, self.num_heads, tgt_len, src_len)
                attn_weights = attn_weights.view(bsz * self.num_heads, tgt_len, src_len)
            if output_attentions:
                attn_weights_reshaped = attn_weights.view(bsz, self.num_heads, tgt_len, src_len)
                attn_weights = attn_weights_reshaped.view(bsz * self.num_heads, tgt_len, src_len)
            else:
                attn_weights_reshaped = None
            attn_probs = nn.functional.dropout(attn_weights, p=self.dropout, training=self.training)
            attn_output = torch.bmm(attn_probs, value_states)
        attn_output = attn_output.view(bsz, self.num_heads, tgt_len, self.head_dim).transpose(1, 2)
'''

BLIP = '''
class BertSelfAttention(nn.Module):
    def __init__(self, hidden_size=16, heads=2):
        super().__init__()
        self.num_attention_heads, self.attention_head_size = heads, hidden_size // heads
        self.query, self.key, self.value = (nn.Linear(hidden_size, hidden_size) for _ in range(3))
        self.dropout = nn.Dropout(0.1)
        self.save_attention = SAVE

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

        # Normalize the attention scores to probabilities.
        attention_probs = nn.Softmax(dim=-1)(attention_scores)
        SAVING
        attention_probs_dropped = self.dropout(attention_probs)
        if head_mask is not None:
            attention_probs_dropped = attention_probs_dropped * head_mask
        context_layer = torch.matmul(attention_probs_dropped, value_layer)
        return context_layer.permute(0, 2, 1, 3).flatten(2)


def make():
    return BertSelfAttention(), (torch.randn(2, 5, 16), torch.zeros(2, 1, 1, 5))
'''
SAVING = "if self.save_attention:\n            self.save_attention_map(attention_probs)"


def _model(tmp_path, source: str):
    return model_file(tmp_path, source, HEADER)


def _load(path):
    spec = importlib.util.spec_from_file_location(f"plain_{path.stem}_{abs(hash(str(path)))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _both(original, rewritten, cls: str):
    """The original and the rewritten module of the same weights, in float64, in eval mode."""
    torch.manual_seed(0)
    before = getattr(_load(original), cls)().double().eval()
    after = getattr(_load(rewritten), cls)().double().eval()
    after.load_state_dict(before.state_dict())
    return before, after


def _fixed(tmp_path, source: str, unsafe: bool = False):
    path = _model(tmp_path, source)
    report = lint_file(path, device="cpu")
    [finding] = findings_of(report, "GL101")
    assert finding.fix is not None, finding.no_fix
    if unsafe:  # `--fix` never proves an unsafe fix: the proof is asked for it
        assert prove_fix(report, tmp_path, finding).ok
    plan = fix_plan(report, tmp_path, unsafe=unsafe)
    assert unsafe or (plan.refused == [] and plan.applied == [finding])
    rewritten = tmp_path / "rewritten.py"
    rewritten.write_text(plan.texts[str(path)])
    return path, finding, rewritten


@pytest.mark.proof
def test_bart_head_mask_and_output_attentions_off_in_the_capture_get_the_guarded_fallback(tmp_path):
    path, finding, rewritten = _fixed(tmp_path, BART)
    assert finding.fix.applicability == "safe"
    assert "where `layer_head_mask is None and not output_attentions`" in finding.fix.message
    assert BART_FIXED in rewritten.read_text()
    before, after = _both(path, rewritten, "Attention")
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    head_mask = torch.tensor([0.5, 2.0], dtype=torch.float64)
    for kwargs in ({}, {"output_attentions": True}, {"layer_head_mask": head_mask},
                   {"layer_head_mask": head_mask, "output_attentions": True}):
        (out, weights), (out2, weights2) = before(x, **kwargs), after(x, **kwargs)
        assert torch.allclose(out, out2), kwargs
        assert (weights is None) == (weights2 is None) and (weights is None or torch.equal(weights, weights2))
    assert not torch.allclose(before(x, layer_head_mask=head_mask)[0], before(x)[0])  # the mask does something


@pytest.mark.proof
def test_blip_save_attention_off_in_the_capture_gets_the_guarded_fallback_safe_for_a_dropout_with_no_hook(tmp_path):
    path, finding, rewritten = _fixed(tmp_path, BLIP.replace("SAVING", SAVING).replace("SAVE", "False"))
    assert finding.fix.applicability == SAFE  # the fused path no longer calls self.dropout, which has no hook
    assert "self.dropout (a Dropout module), which has no hook in the model as built" in finding.fix.message
    text = rewritten.read_text()
    assert "        if not self.save_attention and head_mask is None:\n" \
           "            context_layer = F.scaled_dot_product_attention(\n" in text
    assert "        else:\n            attention_scores = torch.matmul(query_layer, key_layer.transpose(-1, -2))\n" \
           in text
    # The comment moves into the `else:` with the statement it is about, once.
    assert text.count("# Normalize") == 1 and "\n            # Normalize the attention scores" in text
    before, after = _both(path, rewritten, "BertSelfAttention")
    x, mask = torch.randn(2, 5, 16, dtype=torch.float64), torch.zeros(2, 1, 1, 5, dtype=torch.float64)
    mask[1, ..., 3:] = -1e4
    head_mask = torch.tensor([0.5, 2.0], dtype=torch.float64).view(1, 2, 1, 1)
    for save in (False, True):
        before.save_attention = after.save_attention = save
        for kwargs in ({}, {"head_mask": head_mask}):
            assert torch.allclose(before(x, mask, **kwargs), after(x, mask, **kwargs)), (save, kwargs)
        if save:
            assert torch.equal(before.attention_map, after.attention_map)


@pytest.mark.proof
def test_a_flag_the_capture_took_gets_no_fallback(tmp_path):
    """`self.save_attention = True`: the graph ran the statement under it, so the fused branch is not the path
    the capture takes; the rewritten copy still has the finding and the proof refuses the fix, so it is never
    written."""
    path = _model(tmp_path, BLIP.replace("SAVING", SAVING).replace("SAVE", "True"))
    report = lint_file(path, device="cpu")
    [finding] = findings_of(report, "GL101")
    assert finding.fix is not None  # a call that stores them is no op of the graph: the source cannot tell
    verdict = prove_fix(report, tmp_path, finding)
    assert not verdict.ok and verdict.reason == "GL101 is still reported in model.py after the rewrite"


def test_a_flag_assigned_between_the_attention_and_its_if_is_refused(tmp_path):
    saving = "keep = self.save_attention\n        if keep:\n            self.save_attention_map(attention_probs)"
    path = _model(tmp_path, BLIP.replace("SAVING", saving).replace("SAVE", "False"))
    [finding] = findings_of(lint_file(path, device="cpu"), "GL101")
    assert finding.fix is None
    assert finding.no_fix == ("`keep` is assigned between the attention's first statement and where `keep` reads "
                              "it; a guard before the attention would read another value, so the attention stays as "
                              "written")


@pytest.mark.proof
def test_weights_returned_only_under_a_flag_join_the_guard(tmp_path):
    """BLIP's `(context, probs) if output_attentions else (context,)`: read only where the flag holds, so the
    flag joins the guard and the return stays as written; with the flag on, the same weights come back."""
    source = BLIP.replace("SAVING", SAVING).replace("SAVE", "False").replace(
        "head_mask=None):", "head_mask=None, output_attentions=False):").replace(
        "        return context_layer.permute(0, 2, 1, 3).flatten(2)",
        "        context_layer = context_layer.permute(0, 2, 1, 3).flatten(2)\n"
        "        return (context_layer, attention_probs) if output_attentions else (context_layer,)")
    path, finding, rewritten = _fixed(tmp_path, source, unsafe=True)
    assert "where `not self.save_attention and head_mask is None and not output_attentions`" in finding.fix.message
    before, after = _both(path, rewritten, "BertSelfAttention")
    x, mask = torch.randn(2, 5, 16, dtype=torch.float64), torch.zeros(2, 1, 1, 5, dtype=torch.float64)
    for flag in (False, True):
        one, two = before(x, mask, output_attentions=flag), after(x, mask, output_attentions=flag)
        assert len(one) == len(two) == 1 + flag and all(torch.allclose(a, b) for a, b in zip(one, two, strict=True))
