"""Written in the style of openai/whisper's model.py MultiHeadAttention with its SDPA path (`use_sdpa = True`).

The same block as `whisper_mha.py`, but `qkv_attention` calls `F.scaled_dot_product_attention(q, k, v,
is_causal=mask is not None and n_ctx > 1)` and returns `qk = None`, as whisper does when SDPA is available.
Attention is already fused here: graphlint must report no GL101 on this module.
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

STYLE = "whisper MultiHeadAttention, SDPA path (already fused)"
REPOSITORY = "openai/whisper"
BACKWARD_FAILS = False
FUSED = True


class MultiHeadAttention(nn.Module):
    use_sdpa = True

    def __init__(self, n_state: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.query = nn.Linear(n_state, n_state)
        self.key = nn.Linear(n_state, n_state, bias=False)
        self.value = nn.Linear(n_state, n_state)
        self.out = nn.Linear(n_state, n_state)

    def forward(self, x: Tensor, xa: Tensor | None = None, mask: Tensor | None = None):
        q = self.query(x)
        k = self.key(x if xa is None else xa)
        v = self.value(x if xa is None else xa)
        wv, qk = self.qkv_attention(q, k, v, mask)
        return self.out(wv), qk

    def qkv_attention(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None):
        n_batch, n_ctx, n_state = q.shape
        q = q.view(*q.shape[:2], self.n_head, -1).permute(0, 2, 1, 3)
        k = k.view(*k.shape[:2], self.n_head, -1).permute(0, 2, 1, 3)
        v = v.view(*v.shape[:2], self.n_head, -1).permute(0, 2, 1, 3)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=mask is not None and n_ctx > 1)
        out = a.permute(0, 2, 1, 3).flatten(start_dim=2)
        return out, None


class ResidualAttentionBlock(nn.Module):
    def __init__(self, n_state: int, n_head: int):
        super().__init__()
        self.attn = MultiHeadAttention(n_state, n_head)
        self.attn_ln = nn.LayerNorm(n_state)
        self.cross_attn = MultiHeadAttention(n_state, n_head)
        self.cross_attn_ln = nn.LayerNorm(n_state)
        self.mlp = nn.Sequential(nn.Linear(n_state, 4 * n_state), nn.GELU(), nn.Linear(4 * n_state, n_state))
        self.mlp_ln = nn.LayerNorm(n_state)

    def forward(self, x: Tensor, xa: Tensor, mask: Tensor | None = None):
        x = x + self.attn(self.attn_ln(x), mask=mask)[0]
        x = x + self.cross_attn(self.cross_attn_ln(x), xa)[0]
        return x + self.mlp(self.mlp_ln(x))


class TextDecoder(nn.Module):
    def __init__(self, n_vocab=64, n_ctx=16, n_state=32, n_head=4, n_layer=2):
        super().__init__()
        self.token_embedding = nn.Embedding(n_vocab, n_state)
        self.positional_embedding = nn.Parameter(torch.empty(n_ctx, n_state).normal_(0, 0.02))
        self.blocks = nn.ModuleList([ResidualAttentionBlock(n_state, n_head) for _ in range(n_layer)])
        self.ln = nn.LayerNorm(n_state)
        self.register_buffer("mask", torch.empty(n_ctx, n_ctx).fill_(-float("inf")).triu_(1), persistent=False)

    def forward(self, x: Tensor, xa: Tensor):
        x = self.token_embedding(x) + self.positional_embedding[: x.shape[-1]]
        for block in self.blocks:
            x = block(x, xa, mask=self.mask)
        x = self.ln(x)
        return x @ self.token_embedding.weight.t()


def make_model():
    torch.manual_seed(0)
    return TextDecoder(), (torch.randint(0, 64, (2, 12)), torch.randn(2, 20, 32))
