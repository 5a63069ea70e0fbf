"""Written in the style of karpathy/nanoGPT, model.py (read at commit 0011cd4442915c844e9b8f5c5117f25f5a7096c5).

`CausalSelfAttention` with its manual path (taken when `self.flash` is false, as on a torch without
`scaled_dot_product_attention`): one `c_attn` Linear split into q, k, v, heads by `view(...).transpose(1, 2)`,
`(q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))`, a `tril` buffer `bias` masked with
`masked_fill(... == 0, float('-inf'))`, `F.softmax(att, dim=-1)`, `self.attn_dropout(att)` (an nn.Dropout), `att @ v`.
Kept: the flash/manual branch, the buffer, the dropout modules, pre-norm blocks with GPT-2's biased LayerNorm.
Left out: the repository's optional softermax/RMSNorm/ReLU variants, from_pretrained, the optimizer and
generate; the factory sets `flash = False` so that the hand-written path is the one built.
"""

import math

import torch
import torch.nn as nn
from torch.nn import functional as F

STYLE = "nanoGPT CausalSelfAttention, manual path"
REPOSITORY = "karpathy/nanoGPT"
PATH = "model.py"
COMMIT = "0011cd4442915c844e9b8f5c5117f25f5a7096c5"


class LayerNorm(nn.Module):
    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input):
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size, dropout, flash):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        self.n_head = n_head
        self.n_embd = n_embd
        self.dropout = dropout
        self.flash = flash
        if not self.flash:
            self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        if self.flash:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            att = self.attn_dropout(att)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, block_size, dropout, flash):
        super().__init__()
        self.ln_1 = LayerNorm(n_embd, bias=True)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size, dropout, flash)
        self.ln_2 = LayerNorm(n_embd, bias=True)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd), nn.Dropout(dropout))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32, dropout=0.1, flash=False):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList([Block(n_embd, n_head, block_size, dropout, flash) for _ in range(n_layer)])
        self.ln_f = LayerNorm(n_embd, bias=True)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight

    def forward(self, idx):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def make_model():
    torch.manual_seed(0)
    return GPT(flash=False), (torch.randint(0, 64, (2, 12)),)
