"""Written in the style of jadore801120/attention-is-all-you-need-pytorch, transformer/Modules.py (read at commit
002815545bf743d0bf2b9d172af047b37e20b6e9, an early version of the file).

`ScaledDotProductAttention` with `self.temper = np.power(d_model, 0.5)`, `torch.bmm(q, k.transpose(1, 2)) /
self.temper`, the padding mask written through `.data` in place (`attn.data.masked_fill_(attn_mask, -float('inf'))`),
the softmax as a module (`BottleSoftmax`, an `nn.Softmax` subclass that flattens to 2-d and back), `self.dropout(attn)`
(nn.Dropout), `torch.bmm(attn, v)`, returning `output, attn`; a multi-head wrapper folding heads into the batch
(the repository's `MultiHeadAttention` of the same version, heads as parameters `w_qs`/`w_ks`/`w_vs`), which uses
only the output. `math.sqrt` stands for `np.power(..., 0.5)` (a float either way; numpy is kept out of the set).
BottleSoftmax is given `dim=-1` (the old version relied on nn.Softmax's implicit dim, deprecated).
"""

import math

import torch
import torch.nn as nn

STYLE = "attention-is-all-you-need ScaledDotProductAttention (early, .data mask, Softmax subclass)"
REPOSITORY = "jadore801120/attention-is-all-you-need-pytorch"
PATH = "transformer/Modules.py"
COMMIT = "002815545bf743d0bf2b9d172af047b37e20b6e9"


class Bottle(nn.Module):
    def forward(self, input):
        if len(input.size()) <= 2:
            return super().forward(input)
        size = input.size()[:2]
        out = super().forward(input.view(size[0] * size[1], -1))
        return out.view(size[0], size[1], -1)


class BottleSoftmax(Bottle, nn.Softmax):
    pass


class ScaledDotProductAttention(nn.Module):
    def __init__(self, d_model, attn_dropout=0.1):
        super().__init__()
        self.temper = math.sqrt(d_model)
        self.dropout = nn.Dropout(attn_dropout)
        self.softmax = BottleSoftmax(dim=-1)

    def forward(self, q, k, v, attn_mask=None):
        attn = torch.bmm(q, k.transpose(1, 2)) / self.temper
        if attn_mask is not None:
            attn.data.masked_fill_(attn_mask, -float("inf"))
        attn = self.softmax(attn)
        attn = self.dropout(attn)
        output = torch.bmm(attn, v)
        return output, attn


class MultiHeadAttention(nn.Module):
    def __init__(self, n_head, d_model, d_k, d_v, dropout=0.1):
        super().__init__()
        self.n_head, self.d_k, self.d_v = n_head, d_k, d_v
        self.w_qs = nn.Parameter(torch.randn(n_head, d_model, d_k) * d_model**-0.5)
        self.w_ks = nn.Parameter(torch.randn(n_head, d_model, d_k) * d_model**-0.5)
        self.w_vs = nn.Parameter(torch.randn(n_head, d_model, d_v) * d_model**-0.5)
        self.attention = ScaledDotProductAttention(d_model)
        self.layer_norm = nn.LayerNorm(d_model)
        self.proj = nn.Linear(n_head * d_v, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, q, k, v, attn_mask=None):
        d_k, d_v, n_head = self.d_k, self.d_v, self.n_head
        residual = q
        mb_size, len_q, d_model = q.size()
        mb_size, len_k, d_model = k.size()
        mb_size, len_v, d_model = v.size()
        q_s = q.repeat(n_head, 1, 1).view(n_head, -1, d_model)
        k_s = k.repeat(n_head, 1, 1).view(n_head, -1, d_model)
        v_s = v.repeat(n_head, 1, 1).view(n_head, -1, d_model)
        q_s = torch.bmm(q_s, self.w_qs).view(-1, len_q, d_k)
        k_s = torch.bmm(k_s, self.w_ks).view(-1, len_k, d_k)
        v_s = torch.bmm(v_s, self.w_vs).view(-1, len_v, d_v)
        outputs, attns = self.attention(q_s, k_s, v_s, attn_mask=attn_mask.repeat(n_head, 1, 1))
        outputs = torch.cat(torch.split(outputs, mb_size, dim=0), dim=-1)
        outputs = self.dropout(self.proj(outputs))
        return self.layer_norm(outputs + residual)


class Encoder(nn.Module):
    def __init__(self, vocab=50, d_model=32, n_head=4, n_layers=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d_model, padding_idx=0)
        self.layers = nn.ModuleList([MultiHeadAttention(n_head, d_model, d_model // n_head, d_model // n_head)
                                     for _ in range(n_layers)])

    def forward(self, src_seq):
        x = self.emb(src_seq)
        mask = src_seq.eq(0).unsqueeze(1).expand(-1, src_seq.size(1), -1)  # keys that are padding
        for layer in self.layers:
            x = layer(x, x, x, attn_mask=mask)
        return x


def make_model():
    torch.manual_seed(0)
    src = torch.randint(1, 50, (2, 9))
    src[1, -3:] = 0
    return Encoder(), (src,)
