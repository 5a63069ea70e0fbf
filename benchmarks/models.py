"""Benchmark targets in plain torch: a GPT-2-small-shaped decoder with hand-written attention, and a
Llama-shaped 7B-parameter model that only the meta device can hold on a laptop.

Each factory is a graphlint target (`benchmarks/models.py:gpt2_small`); the sizes the benchmark varies are
exposed as separate factories so that the same command line measures them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class GPTAttention(nn.Module):
    def __init__(self, dim: int, heads: int, max_len: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.dropout = nn.Dropout(0.1)
        self.register_buffer("causal", torch.tril(torch.ones(max_len, max_len, dtype=torch.bool)), persistent=False)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        scores = scores.masked_fill(~self.causal[:t, :t], float("-inf"))
        probs = self.dropout(F.softmax(scores, dim=-1))
        return self.proj((probs @ v).transpose(1, 2).reshape(b, t, c))


class GPTBlock(nn.Module):
    def __init__(self, dim: int, heads: int, max_len: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = GPTAttention(dim, heads, max_len)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim), nn.Dropout(0.1))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, layers=12, dim=768, heads=12, vocab=50257, max_len=1024):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(max_len, dim)
        self.blocks = nn.ModuleList(GPTBlock(dim, heads, max_len) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def _gpt(batch: int, seq: int):
    return GPT(max_len=max(1024, seq)), (torch.randint(0, 50257, (batch, seq)),)


def gpt2_small():
    """GPT-2 small's shape: 12 layers, d_model 768, 12 heads; batch 2, sequence 128."""
    return _gpt(2, 128)


def gpt2_small_batch1():
    return _gpt(1, 128)


def gpt2_small_batch64():
    return _gpt(64, 128)


def gpt2_small_seq2048():
    return _gpt(2, 2048)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        variance = x.float().pow(2).mean(-1, keepdim=True)
        # graphlint: ignore[GL106]  the reference Llama writes its RMSNorm out; the benchmark keeps its graph
        return self.weight * (x.float() * torch.rsqrt(variance + self.eps)).type_as(x)


def rotate_half(x):
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class LlamaAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj = nn.Linear(dim, dim, bias=False)
        self.v_proj = nn.Linear(dim, dim, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x, cos, sin):
        b, t, c = x.shape
        q, k, v = (proj(x).view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, c))


class LlamaBlock(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int):
        super().__init__()
        self.input_norm = RMSNorm(dim)
        self.attn = LlamaAttention(dim, heads)
        self.post_norm = RMSNorm(dim)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.input_norm(x), cos, sin)
        h = self.post_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, layers=32, dim=4096, heads=32, hidden=11008, vocab=32000):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(LlamaBlock(dim, heads, hidden) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids):
        t = ids.shape[1]
        head_dim = self.embed.embedding_dim // self.heads
        inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, device=ids.device).float() / head_dim))
        angles = torch.outer(torch.arange(t, device=ids.device).float(), inv_freq)
        cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


def llama_7b():
    """Llama-2-7B's shape (6.7B parameters): 32 layers, d_model 4096; batch 1, sequence 128."""
    return Llama(), (torch.randint(0, 32000, (1, 128)),)
