"""GL101 on spellings of public repositories the held-out set (benchmarks/fix_share.py) showed unfixed, each
written here in that style: a shift by the row maximum before the softmax (torchaudio's wav2vec2), the
probabilities made in a helper that only returns them (fairseq's `utils.softmax`, Uni-Core's `softmax_dropout`,
MMCV's NonLocal2d) or reached otherwise (Megatron's softmax module), weights returned through a view (OpenNMT-py);
the masks are in test_fix_attention_heldout_masks.py. Each fix is proven on the
model and, where it is safe, the rewritten file computes what the original does in plain PyTorch; what cannot
be rewritten is refused with a reason that names what stands in the way."""

from __future__ import annotations


import pytest

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
from graphlint.results import UNSAFE

HEADER = '''
import math

import torch
import torch.nn.functional as F
from torch import nn


'''

WAV2VEC2 = '''
class SelfAttention(nn.Module):
    def __init__(self, embed_dim=16, num_heads=2):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
        self.scaling = self.head_dim ** -0.5
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(embed_dim, embed_dim) for _ in range(3))

    def forward(self, x, attention_mask):
        batch_size, length, embed_dim = x.size()
        shape = (batch_size, length, self.num_heads, self.head_dim)
        q = self.q_proj(x).view(*shape).transpose(2, 1)
        k = self.k_proj(x).view(*shape).permute(0, 2, 3, 1)
        v = self.v_proj(x).view(*shape).transpose(2, 1)
        weights = (self.scaling * q) @ k
        weights += attention_mask
        weights = weights - weights.max(dim=-1, keepdim=True)[0]
        weights = torch.nn.functional.softmax(weights, dim=-1)
        weights = F.dropout(weights, p=0.1, training=self.training)
        output = weights @ v
        return output.transpose(2, 1).reshape(batch_size, length, embed_dim)


def make():
    mask = torch.zeros(2, 1, 5, 5).masked_fill(torch.rand(2, 1, 5, 5) > 0.7, -1e4)
    return SelfAttention(), (torch.randn(2, 5, 16), mask)
'''


def _model(tmp_path, source: str, name: str = "model.py"):
    return model_file(tmp_path, source, HEADER, name)





def _safe_fix(tmp_path, source: str) -> tuple:
    path = _model(tmp_path, source)
    return path, safe_gl101_fix(tmp_path, path)


@pytest.mark.proof
def test_a_shift_by_the_row_maximum_is_attention_and_the_fix_drops_it(tmp_path):
    path, fixed = _safe_fix(tmp_path, WAV2VEC2)
    assert forward_text(fixed) == '''
    def forward(self, x, attention_mask):
        batch_size, length, embed_dim = x.size()
        shape = (batch_size, length, self.num_heads, self.head_dim)
        q = self.q_proj(x).view(*shape).transpose(2, 1)
        k = self.k_proj(x).view(*shape).permute(0, 2, 3, 1)
        v = self.v_proj(x).view(*shape).transpose(2, 1)
        output = F.scaled_dot_product_attention(
            q,
            k.transpose(-2, -1),
            v,
            attn_mask=attention_mask,
            dropout_p=0.1 if self.training else 0.0,
        )
        return output.transpose(2, 1).reshape(batch_size, length, embed_dim)
'''
    assert_same_in_plain_pytorch(path, write(tmp_path, "rewritten.py", fixed))


@pytest.mark.parametrize("shift", ["weights.mean(dim=-1, keepdim=True)", "weights.max(dim=-2, keepdim=True)[0]"])
def test_a_shift_the_softmax_does_not_ignore_is_still_no_attention(tmp_path, shift):
    path = _model(tmp_path, WAV2VEC2.replace("weights.max(dim=-1, keepdim=True)[0]", shift))
    assert findings_of(lint_file(path, device="cpu"), "GL101") == []


OPENNMT = '''
class MultiHeadedAttention(nn.Module):
    def __init__(self, head_count=2, model_dim=16):
        super().__init__()
        self.dim_per_head, self.head_count = model_dim // head_count, head_count
        self.linear_keys, self.linear_values, self.linear_query = (nn.Linear(model_dim, model_dim) for _ in range(3))

    def forward(self, key, value, query, mask):
        batch_size = key.size(0)
        dim_per_head, head_count = self.dim_per_head, self.head_count

        def shape(x):
            return x.view(batch_size, -1, head_count, dim_per_head).transpose(1, 2)

        key = shape(self.linear_keys(key))
        value = shape(self.linear_values(value))
        query = shape(self.linear_query(query))
        query = query / math.sqrt(dim_per_head)
        query_key = torch.matmul(query, key.transpose(2, 3))
        scores = query_key.float()
        scores = scores.masked_fill(mask.unsqueeze(1), float("-inf"))
        attn = F.softmax(scores, dim=-1).to(query.dtype)
        context = torch.matmul(attn, value)
        attns = attn.view(batch_size, head_count, query.size(2), key.size(2))
        return context.transpose(1, 2).reshape(batch_size, -1, head_count * dim_per_head), attns


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn = MultiHeadedAttention()

    def forward(self, x, mask):
        context, _ = self.self_attn(x, x, x, mask=mask)  # the caller drops the weights, as OpenNMT's encoder
        return context


def make():
    return Layer(), (torch.randn(2, 5, 16), torch.rand(2, 1, 5) > 0.8)
'''


@pytest.mark.proof
def test_weights_returned_through_a_view_get_the_unsafe_fix_that_returns_none(tmp_path):
    path = _model(tmp_path, OPENNMT)
    report = lint_file(path, device="cpu")
    [finding] = findings_of(report, "GL101")
    assert finding.fix is not None and finding.fix.applicability == UNSAFE, finding.no_fix
    assert "`attn.view(batch_size, head_count, query.size(2), key.size(2))` returned or stored as None" \
        in finding.fix.message
    assert prove_fix(report, tmp_path, finding).ok
    plan = fix_plan(report, tmp_path, unsafe=True)
    assert plan.applied == [finding]
    assert forward_text(plan.texts[str(path)]).endswith('''
        query = query / math.sqrt(dim_per_head)
        context = F.scaled_dot_product_attention(
            query, key, value, attn_mask=~mask.unsqueeze(1), scale=1.0
        )
        attns = None
        return context.transpose(1, 2).reshape(batch_size, -1, head_count * dim_per_head), attns
''')


def test_weights_returned_and_a_finite_fill_say_both_reasons_the_fix_is_unsafe(tmp_path):
    path = _model(tmp_path, OPENNMT.replace('float("-inf")', "-1e18"))
    [finding] = findings_of(lint_file(path, device="cpu"), "GL101")
    assert finding.fix.applicability == UNSAFE
    assert "returned or stored as None; on a row whose every key is masked, the fill `-1e18`" in finding.fix.message


UNICORE = '''
def softmax_dropout(input, dropout_prob, is_training=True, mask=None, bias=None, inplace=True):
    input = input.contiguous()
    if not inplace:
        input = input.clone()
    if mask is not None:
        input += mask
    if bias is not None:
        input += bias
    return F.dropout(F.softmax(input, dim=-1), p=dropout_prob, training=is_training)


class Attention(nn.Module):
    def __init__(self, dim=16, head_dim=8, num_heads=2, dropout=0.1):
        super().__init__()
        self.num_heads, self.norm, self.dropout = num_heads, head_dim ** -0.5, dropout
        self.linear_q, self.linear_k, self.linear_v = (nn.Linear(dim, head_dim * num_heads) for _ in range(3))

    def forward(self, q, k, v, mask=None, bias=None):
        q = self.linear_q(q) * self.norm
        k, v = self.linear_k(k), self.linear_v(v)
        q = q.view(q.shape[:-1] + (self.num_heads, -1)).transpose(-2, -3).contiguous()
        k = k.view(k.shape[:-1] + (self.num_heads, -1)).transpose(-2, -3).contiguous()
        v = v.view(v.shape[:-1] + (self.num_heads, -1)).transpose(-2, -3)
        attn = torch.matmul(q, k.transpose(-1, -2))
        del q, k
        attn = softmax_dropout(attn, self.dropout, self.training, mask=mask, bias=bias)
        o = torch.matmul(attn, v)
        del attn, v
        return o.transpose(-2, -3).reshape(*o.shape[:-3], o.shape[-2], -1)


def make():
    x = torch.randn(2, 5, 16)
    mask = torch.zeros(2, 1, 1, 5).masked_fill(torch.rand(2, 1, 1, 5) > 0.7, -1e9)
    return Attention(), (x, x, x, mask, torch.randn(2, 2, 5, 5))
'''


@pytest.mark.proof
def test_a_helper_that_masks_softmaxes_and_drops_out_is_read_at_its_call(tmp_path):
    """Uni-Core's softmax_dropout: both guarded masks summed into one, its dropout's p taken, and the `del`s of
    q and k (read by the fused call) and of the probabilities (no longer made) trimmed."""
    path, fixed = _safe_fix(tmp_path, UNICORE)
    assert forward_text(fixed).split("attn = ")[0].endswith('''
        v = v.view(v.shape[:-1] + (self.num_heads, -1)).transpose(-2, -3)
        o = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=(mask + bias if bias is not None else mask) if mask is not None else (bias if bias is not None else None),
            dropout_p=self.dropout if self.training else 0.0,
            scale=1.0,
        )
        del v
        return o.transpose(-2, -3).reshape(*o.shape[:-3], o.shape[-2], -1)
''')
    assert "def softmax_dropout(" in fixed  # the helper stays: other callers may use it
    assert_same_in_plain_pytorch(path, write(tmp_path, "rewritten.py", fixed))


FAIRSEQ = '''
def softmax(x, dim: int, onnx_trace: bool = False):
    if onnx_trace:
        return F.softmax(x.float(), dim=dim)
    return F.softmax(x, dim=dim, dtype=torch.float32)


class MultiheadAttention(nn.Module):
    def __init__(self, embed_dim=16, num_heads=2):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
        self.scaling = self.head_dim ** -0.5
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(embed_dim, embed_dim) for _ in range(3))

    def forward(self, query, attn_mask):
        tgt_len, bsz, embed_dim = query.size()
        q = self.q_proj(query)
        q *= self.scaling
        q = q.contiguous().view(tgt_len, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        k = self.k_proj(query).contiguous().view(-1, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        v = self.v_proj(query).contiguous().view(-1, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        attn_weights = torch.bmm(q, k.transpose(1, 2))
        attn_weights += attn_mask.unsqueeze(0)
        attn_weights_float = softmax(attn_weights, dim=-1)
        attn_weights = attn_weights_float.type_as(attn_weights)
        attn_probs = F.dropout(attn_weights, p=0.1, training=self.training)
        attn = torch.bmm(attn_probs, v)
        return attn.transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim)


def make():
    return MultiheadAttention(), (torch.randn(5, 2, 16), torch.randn(5, 5))
'''


@pytest.mark.proof
def test_a_softmax_helper_with_an_early_return_of_the_same_softmax_is_read_at_its_call(tmp_path):
    """fairseq's utils.softmax returns the same softmax on both paths, cast differently."""
    path, fixed = _safe_fix(tmp_path, FAIRSEQ)
    assert forward_text(fixed).endswith('''
        attn = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=attn_mask.unsqueeze(0),
            dropout_p=0.1 if self.training else 0.0,
            scale=1.0,
        )
        return attn.transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim)
''')
    assert_same_in_plain_pytorch(path, write(tmp_path, "rewritten.py", fixed))


NON_LOCAL = '''
class NonLocal2d(nn.Module):
    def __init__(self, channels=8, mode="embedded_gaussian"):
        super().__init__()
        self.inter, self.mode = channels // 2, mode
        self.g, self.theta, self.phi = (nn.Conv2d(channels, channels // 2, 1) for _ in range(3))

    def embedded_gaussian(self, theta_x, phi_x):
        pairwise_weight = torch.matmul(theta_x, phi_x)
        pairwise_weight /= theta_x.shape[-1] ** 0.5
        pairwise_weight = pairwise_weight.softmax(dim=-1)
        return pairwise_weight

    def dot_product(self, theta_x, phi_x):
        pairwise_weight = torch.matmul(theta_x, phi_x)
        return pairwise_weight / pairwise_weight.shape[-1]

    def forward(self, x):
        n = x.size(0)
        g_x = self.g(x).view(n, self.inter, -1).permute(0, 2, 1)
        theta_x = self.theta(x).view(n, self.inter, -1).permute(0, 2, 1)
        phi_x = self.phi(x).view(n, self.inter, -1)
        CHOSEN
        y = torch.matmul(pairwise_weight, g_x)
        return x[:, : self.inter] + y.permute(0, 2, 1).reshape(n, self.inter, *x.size()[2:])


def make():
    return NonLocal2d(), (torch.randn(2, 8, 3, 3),)
'''


@pytest.mark.proof
def test_a_pairwise_function_that_only_returns_the_probabilities_is_read_at_its_call(tmp_path):
    """MMCV's embedded_gaussian reads the scores under the name it then gives the probabilities: that is not
    a use of the probabilities. Called as itself, the fix goes at the call."""
    path, fixed = _safe_fix(tmp_path, NON_LOCAL.replace("CHOSEN", "pairwise_weight = self.embedded_gaussian(theta_x, phi_x)"))
    assert '''
        y = F.scaled_dot_product_attention(
            theta_x, phi_x.transpose(-2, -1), g_x, scale=1 / theta_x.shape[-1] ** 0.5
        )
''' in fixed
    assert_same_in_plain_pytorch(path, write(tmp_path, "rewritten.py", fixed))


MEGATRON = '''
def attention_mask_func(attention_scores, ltor_mask):
    return attention_scores.masked_fill(ltor_mask, -10000.0)


class FusedScaleMaskSoftmax(nn.Module):
    def __init__(self, mask_func, scale=None):
        super().__init__()
        self.mask_func, self.scale = mask_func, scale

    def forward(self, input, mask):
        return self.forward_torch_softmax(input, mask)

    def forward_torch_softmax(self, input, mask):
        if self.scale is not None:
            input = input * self.scale
        mask_output = self.mask_func(input, mask) if mask is not None else input
        probs = torch.nn.Softmax(dim=-1)(mask_output)
        return probs


class Attention(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.scale_mask_softmax = FusedScaleMaskSoftmax(attention_mask_func, scale=dim ** -0.5)

    def forward(self, x, mask):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = torch.matmul(q, k.transpose(-1, -2))
        probs = self.scale_mask_softmax(scores, mask)
        return torch.matmul(probs, v)


def make():
    return Attention(), (torch.randn(2, 5, 16), torch.rand(2, 5, 5) > 0.8)
'''


@pytest.mark.parametrize("case, reason", [
    ("getattr", "`forward` calls `embedded_gaussian` through `getattr(self, self.mode)`, chosen at run time; the "
                "fused call in its place would compute `embedded_gaussian` whatever `self.mode` names"),
    ("module", "the scores pass through `self.mask_func(input, mask) if mask is not None else input`, which the "
               "fused call cannot express"),
])
def test_softmax_helpers_reached_another_way_are_refused_with_the_way(tmp_path, case, reason):
    chosen = "pairwise_func = getattr(self, self.mode)\n        pairwise_weight = pairwise_func(theta_x, phi_x)"
    source = NON_LOCAL.replace("CHOSEN", chosen) if case == "getattr" else MEGATRON
    [finding] = findings_of(lint_file(_model(tmp_path, source), device="cpu"), "GL101")
    assert finding.fix is None and finding.no_fix == reason


SOFTMAX_MODULE = MEGATRON.replace('''        if self.scale is not None:
            input = input * self.scale
        mask_output = self.mask_func(input, mask) if mask is not None else input
''', '''        input = input.float() * self.scale
        mask_output = input + mask
''').replace("torch.rand(2, 5, 5) > 0.8", "torch.randn(2, 5, 5)")


@pytest.mark.proof
def test_a_softmax_module_whose_forward_passes_on_to_a_method_that_returns_them_is_read_at_its_call(tmp_path):
    """Megatron's FusedScaleMaskSoftmax torch path: `self.scale_mask_softmax(scores, mask)` is read as its
    forward, which passes on to the method that scales, masks and softmaxes; its `self` is the module, and the
    fix, which no longer calls the module, is unsafe by declaration and proven."""
    path = _model(tmp_path, SOFTMAX_MODULE)
    report = lint_file(path, device="cpu")
    [finding] = findings_of(report, "GL101")
    assert finding.fix is not None and finding.fix.applicability == UNSAFE, finding.no_fix
    assert "the fix no longer calls self.scale_mask_softmax (a FusedScaleMaskSoftmax module)" in finding.fix.message
    assert prove_fix(report, tmp_path, finding).ok
    fixed = fix_plan(report, tmp_path, unsafe=True).texts[str(path)]
    assert '''
    def forward(self, x, mask):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=self.scale_mask_softmax.scale
        )
''' in fixed
    assert "def forward_torch_softmax(" in fixed  # the module stays: other callers may use it
