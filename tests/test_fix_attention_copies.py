"""GL101 on the spellings real files copy: a mask added to a view of the scores and viewed back (BART, CLIP),
the softmax in both branches of an `if`/`else` (Swin's window attention), two boolean masks joined before
`masked_fill` (x-transformers), a `baddbmm` bias chosen in an `if`/`else` (diffusers), biases summed in a loop
(OpenFold). Each fix is proven on the model and the rewritten file computes what the original does in plain
PyTorch; what the fused call cannot say is refused with the reason, and look-alikes that compute something else
get no fix."""

from __future__ import annotations


import pytest

from conftest import assert_same_in_plain_pytorch, forward_text, model_file, findings_of, fix_plan, lint_file, write
from graphlint.rewrite.edits import apply_edits

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

    def forward(self, hidden_states, attention_mask=None):
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
        if attention_mask is not None:
            attn_weights = attn_weights.view(bsz, self.num_heads, tgt_len, src_len) + attention_mask
            attn_weights = attn_weights.view(bsz * self.num_heads, tgt_len, src_len)
        attn_weights = nn.functional.softmax(attn_weights, dim=-1)
        attn_probs = nn.functional.dropout(attn_weights, p=self.dropout, training=self.training)
        attn_output = torch.bmm(attn_probs, value_states)
        attn_output = attn_output.view(bsz, self.num_heads, tgt_len, self.head_dim).transpose(1, 2)
        return attn_output.reshape(bsz, tgt_len, self.embed_dim)


def make():
    mask = torch.zeros(2, 1, 5, 5).masked_fill(torch.rand(2, 1, 5, 5) > 0.7, -1e4)
    return Attention(), (torch.randn(2, 5, 16), mask)
'''

X_TRANSFORMERS = '''
class Attention(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.to_q, self.to_k, self.to_v = (nn.Linear(dim, dim, bias=False) for _ in range(3))

    def forward(self, x, input_mask):
        b, n, _ = x.shape
        q, k, v = (w(x).view(b, n, self.heads, -1).transpose(1, 2) for w in (self.to_q, self.to_k, self.to_v))
        sim = torch.einsum("b h i d, b h j d -> b h i j", q, k) * self.scale
        causal_mask = torch.ones(n, n, device=x.device, dtype=torch.bool).tril()
        mask = input_mask[:, None, None, :] & causal_mask
        max_neg_value = -torch.finfo(sim.dtype).max
        sim = sim.masked_fill(~mask, max_neg_value)
        attn = sim.softmax(dim=-1)
        return torch.einsum("b h i j, b h j d -> b h i d", attn, v)


def make():
    keep = torch.rand(2, 6) > 0.3
    keep[:, 0] = True
    return Attention(), (torch.randn(2, 6, 16), keep)
'''

SWIN = '''
class WindowAttention(nn.Module):
    def __init__(self, dim=16, window=3, num_heads=2):
        super().__init__()
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        n = window * window
        self.relative_position_bias_table = nn.Parameter(torch.randn(n * n, num_heads) * 0.02)
        self.register_buffer("relative_position_index", torch.arange(n * n).view(n, n))
        self.qkv = nn.Linear(dim, dim * 3)
        self.attn_drop = nn.Dropout(0.1)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x, mask=None):
        B_, N, C = x.shape
        qkv = self.qkv(x).reshape(B_, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        q = q * self.scale
        attn = (q @ k.transpose(-2, -1))
        relative_position_bias = self.relative_position_bias_table[self.relative_position_index.view(-1)].view(N, N, -1)
        relative_position_bias = relative_position_bias.permute(2, 0, 1).contiguous()
        attn = attn + relative_position_bias.unsqueeze(0)
        if mask is not None:
            nW = mask.shape[0]
            attn = attn.view(B_ // nW, nW, self.num_heads, N, N) + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, self.num_heads, N, N)
            attn = self.softmax(attn)
        else:
            attn = self.softmax(attn)
        attn = self.attn_drop(attn)
        return (attn @ v).transpose(1, 2).reshape(B_, N, C)


def make():
    mask = torch.zeros(4, 9, 9).masked_fill(torch.rand(4, 9, 9) > 0.7, -100.0)
    return WindowAttention(), (torch.randn(8, 9, 16), mask)
'''

DIFFUSERS = '''
class Attention(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.to_q, self.to_k, self.to_v = (nn.Linear(dim, dim, bias=False) for _ in range(3))

    def head_to_batch_dim(self, tensor):
        b, n, d = tensor.shape
        return tensor.reshape(b, n, self.heads, d // self.heads).permute(0, 2, 1, 3).reshape(b * self.heads, n, -1)

    def forward(self, x, attention_mask=None):
        query, key, value = (self.head_to_batch_dim(w(x)) for w in (self.to_q, self.to_k, self.to_v))
        if attention_mask is None:
            baddbmm_input = torch.empty(
                query.shape[0], query.shape[1], key.shape[1], dtype=query.dtype, device=query.device
            )
            beta = 0
        else:
            baddbmm_input = attention_mask
            beta = 1
        attention_scores = torch.baddbmm(baddbmm_input, query, key.transpose(-1, -2), beta=beta, alpha=self.scale)
        attention_probs = attention_scores.softmax(dim=-1)
        return torch.bmm(attention_probs, value)


def make():
    mask = torch.zeros(4, 1, 5).masked_fill(torch.rand(4, 1, 5) > 0.7, -1e4)
    return Attention(), (torch.randn(2, 5, 16), mask)
'''

OPENFOLD = '''
class Attention(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.to_q, self.to_k, self.to_v = (nn.Linear(dim, dim, bias=False) for _ in range(3))

    def forward(self, x, mask_bias, pair_bias):
        b, n, _ = x.shape
        q, k, v = (w(x).view(b, n, self.heads, -1).transpose(1, 2) for w in (self.to_q, self.to_k, self.to_v))
        q = q / math.sqrt(q.shape[-1])
        biases = [mask_bias, pair_bias]
        a = torch.matmul(q, k.transpose(-1, -2))
        for bias in biases:
            a += bias
        a = torch.softmax(a, -1)
        return torch.matmul(a, v)


def make():
    return Attention(), (torch.randn(2, 6, 16), torch.randn(2, 1, 1, 6), torch.randn(1, 2, 6, 6))
'''

DIFFUSERS_HELPER = '''
class Attention(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.upcast_attention, self.upcast_softmax = False, True
        self.to_q, self.to_k, self.to_v = (nn.Linear(dim, dim, bias=False) for _ in range(3))

    def head_to_batch_dim(self, tensor):
        b, n, d = tensor.shape
        return tensor.reshape(b, n, self.heads, d // self.heads).permute(0, 2, 1, 3).reshape(b * self.heads, n, -1)

    def get_attention_scores(self, query, key, attention_mask=None):
        dtype = query.dtype
        if self.upcast_attention:
            query = query.float()
            key = key.float()

        if attention_mask is None:
            baddbmm_input = torch.empty(
                query.shape[0], query.shape[1], key.shape[1], dtype=query.dtype, device=query.device
            )
            beta = 0
        else:
            baddbmm_input = attention_mask
            beta = 1

        attention_scores = torch.baddbmm(
            baddbmm_input,
            query,
            key.transpose(-1, -2),
            beta=beta,
            alpha=self.scale,
        )
        del baddbmm_input

        if self.upcast_softmax:
            attention_scores = attention_scores.float()

        attention_probs = attention_scores.softmax(dim=-1)
        del attention_scores

        attention_probs = attention_probs.to(dtype)

        return attention_probs

    def forward(self, x, attention_mask=None):
        query, key, value = (self.head_to_batch_dim(w(x)) for w in (self.to_q, self.to_k, self.to_v))
        attention_probs = self.get_attention_scores(query, key, attention_mask)
        return torch.bmm(attention_probs, value)


def make():
    mask = torch.zeros(4, 1, 5).masked_fill(torch.rand(4, 1, 5) > 0.7, -1e4)
    return Attention(), (torch.randn(2, 5, 16), mask)
'''

# The masks the fixes write: the mask broadcast to the shape it was added in, viewed as the scores are.
BART_MASK = ("attention_mask.expand(bsz, self.num_heads, tgt_len, src_len).reshape(bsz * self.num_heads, tgt_len, "
             "src_len) if attention_mask is not None else None")
SWIN_MASK = ("relative_position_bias.unsqueeze(0) + mask.unsqueeze(1).unsqueeze(0).expand(B_ // mask.shape[0], "
             "mask.shape[0], self.num_heads, N, N).reshape(-1, self.num_heads, N, N) if mask is not None else "
             "relative_position_bias.unsqueeze(0)")

# (the model, its forward as the proven fix writes it)
FIXED = {
    "bart-mask-added-to-a-view-of-the-scores": (BART, '''
    def forward(self, hidden_states, attention_mask=None):
        bsz, tgt_len, _ = hidden_states.size()
        query_states = self.q_proj(hidden_states) * self.scaling
        key_states = self._shape(self.k_proj(hidden_states), -1, bsz)
        value_states = self._shape(self.v_proj(hidden_states), -1, bsz)
        proj_shape = (bsz * self.num_heads, -1, self.head_dim)
        query_states = self._shape(query_states, tgt_len, bsz).view(*proj_shape)
        key_states = key_states.reshape(*proj_shape)
        value_states = value_states.reshape(*proj_shape)
        src_len = key_states.size(1)
        attn_output = F.scaled_dot_product_attention(
            query_states,
            key_states,
            value_states,
            attn_mask={BART_MASK},
            dropout_p=self.dropout if self.training else 0.0,
            scale=1.0,
        )
        attn_output = attn_output.view(bsz, self.num_heads, tgt_len, self.head_dim).transpose(1, 2)
        return attn_output.reshape(bsz, tgt_len, self.embed_dim)
'''.replace("{BART_MASK}", BART_MASK)),
    "x-transformers-boolean-masks-joined": (X_TRANSFORMERS, '''
    def forward(self, x, input_mask):
        b, n, _ = x.shape
        q, k, v = (w(x).view(b, n, self.heads, -1).transpose(1, 2) for w in (self.to_q, self.to_k, self.to_v))
        causal_mask = torch.ones(n, n, device=x.device, dtype=torch.bool).tril()
        mask = input_mask[:, None, None, :] & causal_mask
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=torch.where(mask, q.new_zeros(()), torch.finfo(q.dtype).min),
        )
'''),
    "x-transformers-causal-mask-joined-in-place": (X_TRANSFORMERS.replace('''
        causal_mask = torch.ones(n, n, device=x.device, dtype=torch.bool).tril()
        mask = input_mask[:, None, None, :] & causal_mask''', '''
        mask = torch.ones(n, n, device=x.device, dtype=torch.bool).tril() & input_mask[:, None, None, :]'''), '''
    def forward(self, x, input_mask):
        b, n, _ = x.shape
        q, k, v = (w(x).view(b, n, self.heads, -1).transpose(1, 2) for w in (self.to_q, self.to_k, self.to_v))
        mask = torch.ones(n, n, device=x.device, dtype=torch.bool).tril() & input_mask[:, None, None, :]
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=torch.where(mask, q.new_zeros(()), torch.finfo(q.dtype).min),
        )
'''),
    "swin-softmax-in-both-branches": (SWIN, '''
    def forward(self, x, mask=None):
        B_, N, C = x.shape
        qkv = self.qkv(x).reshape(B_, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        relative_position_bias = self.relative_position_bias_table[self.relative_position_index.view(-1)].view(N, N, -1)
        relative_position_bias = relative_position_bias.permute(2, 0, 1).contiguous()
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask={SWIN_MASK},
            dropout_p=self.attn_drop.p if self.training else 0.0,
        ).transpose(1, 2).reshape(B_, N, C)
'''.replace("{SWIN_MASK}", SWIN_MASK)),
    "diffusers-baddbmm-bias-chosen-in-an-if-else": (DIFFUSERS, '''
    def forward(self, x, attention_mask=None):
        query, key, value = (self.head_to_batch_dim(w(x)) for w in (self.to_q, self.to_k, self.to_v))
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, scale=self.scale
        )
'''),
    "openfold-biases-summed-in-a-loop": (OPENFOLD, '''
    def forward(self, x, mask_bias, pair_bias):
        b, n, _ = x.shape
        q, k, v = (w(x).view(b, n, self.heads, -1).transpose(1, 2) for w in (self.to_q, self.to_k, self.to_v))
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask_bias + pair_bias, scale=1 / math.sqrt(q.shape[-1])
        )
'''),
    "bart-with-the-masks-size-checked-under-the-guard": (BART.replace("""
        if attention_mask is not None:
""", """
        if attention_mask is not None:
            if attention_mask.size() != (bsz, 1, tgt_len, src_len):
                raise ValueError(f"Attention mask should be of size {(bsz, 1, tgt_len, src_len)}")
"""), '''
    def forward(self, hidden_states, attention_mask=None):
        bsz, tgt_len, _ = hidden_states.size()
        query_states = self.q_proj(hidden_states) * self.scaling
        key_states = self._shape(self.k_proj(hidden_states), -1, bsz)
        value_states = self._shape(self.v_proj(hidden_states), -1, bsz)
        proj_shape = (bsz * self.num_heads, -1, self.head_dim)
        query_states = self._shape(query_states, tgt_len, bsz).view(*proj_shape)
        key_states = key_states.reshape(*proj_shape)
        value_states = value_states.reshape(*proj_shape)
        src_len = key_states.size(1)
        if attention_mask is not None:
            if attention_mask.size() != (bsz, 1, tgt_len, src_len):
                raise ValueError(f"Attention mask should be of size {(bsz, 1, tgt_len, src_len)}")
        attn_output = F.scaled_dot_product_attention(
            query_states,
            key_states,
            value_states,
            attn_mask={BART_MASK},
            dropout_p=self.dropout if self.training else 0.0,
            scale=1.0,
        )
        attn_output = attn_output.view(bsz, self.num_heads, tgt_len, self.head_dim).transpose(1, 2)
        return attn_output.reshape(bsz, tgt_len, self.embed_dim)
'''.replace("{BART_MASK}", BART_MASK)),
    "diffusers-get-attention-scores-as-written": (DIFFUSERS_HELPER, '''
    def forward(self, x, attention_mask=None):
        query, key, value = (self.head_to_batch_dim(w(x)) for w in (self.to_q, self.to_k, self.to_v))
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, scale=self.scale
        )
'''),
    "diffusers-get-attention-scores-upcasting-q-and-k": (DIFFUSERS_HELPER.replace(
        "self.upcast_attention, self.upcast_softmax = False, True",
        "self.upcast_attention, self.upcast_softmax = True, True"), '''
    def forward(self, x, attention_mask=None):
        query, key, value = (self.head_to_batch_dim(w(x)) for w in (self.to_q, self.to_k, self.to_v))
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, scale=self.scale
        )
'''),
    "a-bias-then-a-guard-that-keeps-what-it-prepares": ('''
class Attention(nn.Module):
    def forward(self, q, k, v, bias, mask=None):
        scores = q @ k.transpose(-2, -1)
        scores = scores + bias
        if mask is not None:
            m = mask * 2
            self.last_mask = m
            scores = scores + m
        return scores.softmax(-1) @ v


def make():
    q, k, v = (torch.randn(2, 2, 6, 8) for _ in range(3))
    return Attention(), (q, k, v, torch.randn(6, 6), torch.randn(6, 6))
''', '''
    def forward(self, q, k, v, bias, mask=None):
        if mask is not None:
            m = mask * 2
            self.last_mask = m
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=bias + m if mask is not None else bias, scale=1.0
        )
'''),
}


def _model(tmp_path, source: str, name: str = "model.py"):
    return model_file(tmp_path, source, HEADER, name)





@pytest.mark.proof
@pytest.mark.parametrize("case", list(FIXED))
def test_copied_spellings_are_rewritten_proven_and_compute_the_same(tmp_path, case):
    source, forward = FIXED[case]
    path = _model(tmp_path, source)
    report = lint_file(path, device="cpu")
    [finding] = findings_of(report, "GL101")
    assert finding.fix is not None, finding.no_fix
    unsafe = UNSAFE_COPIES.get(case)
    assert finding.fix.applicability == ("unsafe" if unsafe else "safe"), finding.fix.message
    plan = fix_plan(report, tmp_path, unsafe=bool(unsafe))
    # Where the proof found the unsafe fix computes something else (a finite fill's fully masked row), no flag
    # writes it.
    known_wrong = bool(unsafe) and "proven on the model" not in plan.refused[0][1]
    assert plan.applied == ([] if known_wrong else [finding]) and plan.broken == ([finding] if known_wrong else [])
    assert [why.startswith("declared unsafe: ") and unsafe[0] in why for _, why in plan.refused] == \
        ([True] if unsafe else [])
    fixed = apply_edits(path.read_text(), finding.fix.edits) if known_wrong else plan.texts[str(path)]
    assert forward_text(fixed) == forward
    rewritten = write(tmp_path, "rewritten.py", fixed)
    if not unsafe or "proven on the model" in plan.refused[0][1]:
        assert_same_in_plain_pytorch(path, rewritten)
    else:  # a finite fill: the proof's fully masked row is where it differs, and the reason says so
        assert unsafe[1] in plan.refused[0][1], plan.refused[0][1]


_FILL = "the fill `-torch.finfo(sim.dtype).max` gives an even average and no gradient to the scores"
# case: (a piece of the unsafe fix's reason, a piece of what its proof found); the others are safe (Swin's, which
# no longer calls its softmax and dropout modules, too: no hook is registered on them)
UNSAFE_COPIES = {
    "x-transformers-boolean-masks-joined": (_FILL, "on an input the factory's do not cover"),
    "x-transformers-causal-mask-joined-in-place": (_FILL, "on an input the factory's do not cover"),
}


# (the model, the finding's reason for no fix)
REFUSED = {
    "branches-ending-in-different-softmaxes": (SWIN.replace('''
        else:
            attn = self.softmax(attn)''', '''
        else:
            attn = self.softmax(attn * 2)'''),
        "the branches of `if mask is not None:` end in different statements (`attn = self.softmax(attn)`, "
        "`attn = self.softmax(attn * 2)`); the fused call would compute one of them"),
    "an-else-that-also-changes-the-scores": (SWIN.replace('''
        else:
            attn = self.softmax(attn)''', '''
        else:
            attn = attn * 2
            attn = self.softmax(attn)'''),
        "the `else` of `if mask is not None:` also changes the scores before the softmax; graphlint rewrites such "
        "a choice only when the `else` is the softmax alone"),
    "a-branch-that-also-stores-what-it-prepares": (SWIN.replace("""
            nW = mask.shape[0]
""", """
            nW = mask.shape[0]
            self.windows = nW
"""), "`if mask is not None:` does more than mask the scores; the fused call would leave part of it"),
    "a-view-with-minus-one-before-the-mask": (BART.replace(
        "attn_weights.view(bsz, self.num_heads, tgt_len, src_len) + attention_mask",
        "attn_weights.view(bsz, -1, tgt_len, src_len) + attention_mask"),
        "the mask is added to the scores viewed as `attn_weights.view(bsz, -1, tgt_len, src_len)`, a shape "
        "graphlint cannot give the mask (-1 or a starred size)"),
    "a-bias-chosen-with-another-beta": (DIFFUSERS.replace("            beta = 1\n", "            beta = 0.5\n"),
        "the bias `baddbmm_input` and `beta` are chosen under `if attention_mask is None:`, with beta = 0.5, which "
        "the fused call cannot express"),
    "biases-of-a-list-appended-to": (OPENFOLD.replace(
        "        biases = [mask_bias, pair_bias]\n",
        "        biases = [mask_bias]\n        biases.append(pair_bias)\n"),
        "the scores are summed with each bias of `biases`, a list whose items graphlint cannot read where the loop "
        "runs; the fused call takes one mask (their sum)"),
    "openfold-biases-passed-in": ("""
def _attention(query, key, value, biases):
    a = torch.matmul(query, key.transpose(-1, -2))
    for b in biases:
        a += b
    a = torch.softmax(a, -1)
    return torch.matmul(a, value)


class Attention(nn.Module):
    def forward(self, q, k, v, bias):
        return _attention(q, k, v, [bias])


def make():
    return Attention(), (*(torch.randn(2, 2, 6, 8) for _ in range(3)), torch.randn(2, 1, 6, 6))
""", "the scores are summed with each bias of `biases`, a list whose items graphlint cannot read where the loop "
        "runs; the fused call takes one mask (their sum)"),
    "a-bias-changed-after-the-loop-that-added-it": (OPENFOLD.replace("""
        a = torch.softmax(a, -1)""", """
        pair_bias = pair_bias * 2
        a = torch.softmax(a, -1)"""), "`pair_bias` changes between the scores and the values product"),
    "a-chosen-mask-changed-before-the-product": (DIFFUSERS.replace("""
        attention_scores = torch.baddbmm(""", """
        attention_mask = None
        attention_scores = torch.baddbmm("""),
        "`attention_mask` changes between the scores and the values product"),
    "a-query-changed-under-a-flag-in-the-helper": (DIFFUSERS_HELPER.replace(
        "query = query.float()", "query = query.float() * 2"),
        "`query` is computed inside `get_attention_scores`, where the fused call cannot read it"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_copied_spellings_the_fused_call_cannot_say_are_refused_with_the_reason(tmp_path, case):
    source, reason = REFUSED[case]
    path = _model(tmp_path, source)
    [finding] = findings_of(lint_file(path, device="cpu"), "GL101")
    assert finding.fix is None
    assert finding.no_fix == reason


@pytest.mark.proof
def test_swin_blocks_with_and_without_a_mask_get_the_same_fix_at_either_softmax(tmp_path):
    """A shifted block passes the mask and a plain one does not: the graph runs both softmaxes, each is a finding,
    and both give the one rewrite of the whole `if`/`else`."""
    path = _model(tmp_path, SWIN.replace('''def make():
    mask = torch.zeros(4, 9, 9).masked_fill(torch.rand(4, 9, 9) > 0.7, -100.0)
    return WindowAttention(), (torch.randn(8, 9, 16), mask)''', '''class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.plain, self.shifted = WindowAttention(), WindowAttention()

    def forward(self, x, mask):
        return self.shifted(self.plain(x), mask)


def make():
    mask = torch.zeros(4, 9, 9).masked_fill(torch.rand(4, 9, 9) > 0.7, -100.0)
    return Block(), (torch.randn(8, 9, 16), mask)'''))
    report = lint_file(path, device="cpu")
    masked, plain = sorted(findings_of(report, "GL101"), key=lambda f: f.location.line)
    assert "else" in path.read_text().splitlines()[plain.location.line - 2]  # the `else:` branch's softmax
    assert plain.fix is not None and masked.fix is not None, (plain.no_fix, masked.no_fix)
    assert plain.fix.edits == masked.fix.edits
    # Safe: the softmax and dropout modules it no longer calls have no hook in the model as built.
    assert plain.fix.applicability == masked.fix.applicability == "safe"
    plan = fix_plan(report, tmp_path)
    assert plan.refused == [] and len(plan.applied) == 2
    fixed = plan.texts[str(path)]
    assert forward_text(fixed) == FIXED["swin-softmax-in-both-branches"][1]
    rewritten = write(tmp_path, "rewritten.py", fixed)
    assert_same_in_plain_pytorch(path, rewritten)
