"""Written in the style of lucidrains/imagen-pytorch, imagen_pytorch/imagen_pytorch.py (read at commit
00f4bab5a471f08c814f9ed780ca0c39dee0be20).

`PerceiverAttention` of the `PerceiverResampler` (text-conditioning pooling): LayerNorms on the input and on the
latents, queries from the latents, keys/values from `torch.cat((x, latents), dim=-2)`, heads
`'b n (h d) -> b h n d'`, `q = q * self.scale`, `einsum('... i d, ... j d -> ... i j', q, k)`, an optional key
mask padded with True for the latents (`F.pad(mask, (0, latents.shape[-2]), value=True)`) applied with
`sim.masked_fill(~mask, -torch.finfo(sim.dtype).max)`, `sim.softmax(dim=-1, dtype=torch.float32)` (the
probabilities in float32 whatever the input dtype), `einsum('... i j, ... j d -> ... i d', attn, v)`, `to_out` a
bias-free Linear + LayerNorm. Left out: the mean-pooled latents and the rest of Imagen; einops spelled with
reshape/permute.
"""

import torch
import torch.nn.functional as F
from torch import einsum, nn

STYLE = "imagen-pytorch PerceiverAttention (float32 softmax, finite fill)"
REPOSITORY = "lucidrains/imagen-pytorch"
PATH = "imagen_pytorch/imagen_pytorch.py"
COMMIT = "00f4bab5a471f08c814f9ed780ca0c39dee0be20"


def exists(val):
    return val is not None


class PerceiverAttention(nn.Module):
    def __init__(self, *, dim, dim_head=8, heads=4):
        super().__init__()
        self.scale = dim_head**-0.5
        self.heads = heads
        inner_dim = dim_head * heads
        self.norm = nn.LayerNorm(dim)
        self.norm_latents = nn.LayerNorm(dim)
        self.to_q = nn.Linear(dim, inner_dim, bias=False)
        self.to_kv = nn.Linear(dim, inner_dim * 2, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner_dim, dim, bias=False), nn.LayerNorm(dim))

    def forward(self, x, latents, mask=None):
        x = self.norm(x)
        latents = self.norm_latents(latents)
        b, h = x.shape[0], self.heads
        q = self.to_q(latents)
        kv_input = torch.cat((x, latents), dim=-2)
        k, v = self.to_kv(kv_input).chunk(2, dim=-1)

        def split(t):  # rearrange_many(..., 'b n (h d) -> b h n d', h=h)
            return t.reshape(b, t.shape[1], h, -1).permute(0, 2, 1, 3)

        q, k, v = split(q), split(k), split(v)
        q = q * self.scale
        sim = einsum("... i d, ... j d  -> ... i j", q, k)
        if exists(mask):
            max_neg_value = -torch.finfo(sim.dtype).max
            mask = F.pad(mask, (0, latents.shape[-2]), value=True)
            mask = mask[:, None, None, :]  # rearrange(mask, 'b j -> b 1 1 j')
            sim = sim.masked_fill(~mask, max_neg_value)
        attn = sim.softmax(dim=-1, dtype=torch.float32)
        out = einsum("... i j, ... j d -> ... i d", attn, v)
        out = out.permute(0, 2, 1, 3).reshape(b, out.shape[2], -1)  # rearrange(out, 'b h n d -> b n (h d)')
        return self.to_out(out)


class PerceiverResampler(nn.Module):
    def __init__(self, *, dim=32, depth=2, num_latents=4, max_seq_len=16):
        super().__init__()
        self.pos_emb = nn.Embedding(max_seq_len, dim)
        self.latents = nn.Parameter(torch.randn(num_latents, dim))
        self.layers = nn.ModuleList([nn.ModuleList([PerceiverAttention(dim=dim),
                                                    nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim * 2), nn.GELU(),
                                                                  nn.Linear(dim * 2, dim))]) for _ in range(depth)])

    def forward(self, x, mask=None):
        n = x.shape[1]
        x = x + self.pos_emb(torch.arange(n, device=x.device))
        latents = self.latents.unsqueeze(0).expand(x.shape[0], -1, -1)
        for attn, ff in self.layers:
            latents = attn(x, latents, mask=mask) + latents
            latents = ff(latents) + latents
        return latents


def make_model():
    torch.manual_seed(0)
    x = torch.randn(2, 10, 32)
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[1, -3:] = False
    return PerceiverResampler(), (x, mask)
