"""Written in the style of karpathy/minGPT, mingpt/model.py (read at commit 08c08d8db0475a1cea334a25bf98dee51972180c).

`CausalSelfAttention` with separate `key`/`query`/`value` Linears, heads by `view(...).transpose(1, 2)`,
`(q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))`, a `tril` buffer `mask` applied with
`masked_fill(self.mask[:,:,:T,:T] == 0, float('-inf'))`, `F.softmax`, `self.attn_drop(att)` (nn.Dropout), `att @ v`;
GPT with a learned `pos_emb` Parameter and `nn.Sequential` blocks. Left out: the `@autocast()` decorators of the
read version (torch.cuda.amp, CUDA only), the configuration classes and the loss.
"""

import math

import torch
import torch.nn as nn
from torch.nn import functional as F

STYLE = "minGPT CausalSelfAttention"
REPOSITORY = "karpathy/minGPT"
PATH = "mingpt/model.py"
COMMIT = "08c08d8db0475a1cea334a25bf98dee51972180c"


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size, attn_pdrop, resid_pdrop):
        super().__init__()
        self.key = nn.Linear(n_embd, n_embd)
        self.query = nn.Linear(n_embd, n_embd)
        self.value = nn.Linear(n_embd, n_embd)
        self.attn_drop = nn.Dropout(attn_pdrop)
        self.resid_drop = nn.Dropout(resid_pdrop)
        self.proj = nn.Linear(n_embd, n_embd)
        self.register_buffer("mask", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))
        self.n_head = n_head

    def forward(self, x):
        B, T, C = x.size()
        k = self.key(x).view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = self.query(x).view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = self.value(x).view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_drop(att)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_drop(self.proj(y))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, block_size, pdrop):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.ln2 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size, pdrop, pdrop)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd), nn.Dropout(pdrop))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32, pdrop=0.1):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, n_embd)
        self.pos_emb = nn.Parameter(torch.randn(1, block_size, n_embd) * 0.02)
        self.drop = nn.Dropout(pdrop)
        self.blocks = nn.Sequential(*[Block(n_embd, n_head, block_size, pdrop) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx):
        b, t = idx.size()
        x = self.drop(self.tok_emb(idx) + self.pos_emb[:, :t, :])
        return self.head(self.ln_f(self.blocks(x)))


def make_model():
    torch.manual_seed(0)
    return GPT(), (torch.randint(0, 64, (2, 12)),)
