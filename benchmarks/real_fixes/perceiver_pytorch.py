"""Written in the style of lucidrains/perceiver-pytorch, perceiver_pytorch/perceiver_pytorch.py (read at commit
111523c7ba03b66749132bf956f26ec1c5c42855).

`Attention` (cross- and self-attention over latents): bias-free `to_q` and `to_kv` (chunked in two), heads folded
into the batch `'b n (h d) -> (b h) n d'`, `einsum('b i d, b j d -> b i j', q, k) * self.scale`, an optional
boolean key mask applied in place with `sim.masked_fill_(~mask, max_neg_value)` where
`max_neg_value = -torch.finfo(sim.dtype).max`, `sim.softmax(dim = -1)`, `einsum('b i j, b j d -> b i d', attn, v)`,
`to_out` a Linear + Dropout; `PreNorm` with a context norm; GEGLU feed-forward. Left out: the Fourier position
encoding and the `cache_fn` weight tying of the full `Perceiver` (one cross and one latent layer, data already
flattened); einops spelled with reshape/permute/repeat_interleave.
"""

import torch
import torch.nn.functional as F
from torch import einsum, nn

STYLE = "perceiver-pytorch Attention (finite -finfo.max fill)"
REPOSITORY = "lucidrains/perceiver-pytorch"
PATH = "perceiver_pytorch/perceiver_pytorch.py"
COMMIT = "111523c7ba03b66749132bf956f26ec1c5c42855"


def exists(val):
    return val is not None


def default(val, d):
    return val if exists(val) else d


class PreNorm(nn.Module):
    def __init__(self, dim, fn, context_dim=None):
        super().__init__()
        self.fn = fn
        self.norm = nn.LayerNorm(dim)
        self.norm_context = nn.LayerNorm(context_dim) if exists(context_dim) else None

    def forward(self, x, **kwargs):
        x = self.norm(x)
        if exists(self.norm_context):
            kwargs.update(context=self.norm_context(kwargs["context"]))
        return self.fn(x, **kwargs)


class GEGLU(nn.Module):
    def forward(self, x):
        x, gates = x.chunk(2, dim=-1)
        return x * F.gelu(gates)


class FeedForward(nn.Module):
    def __init__(self, dim, mult=2, dropout=0.0):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, dim * mult * 2), GEGLU(), nn.Dropout(dropout), nn.Linear(dim * mult, dim))

    def forward(self, x):
        return self.net(x)


class Attention(nn.Module):
    def __init__(self, query_dim, context_dim=None, heads=8, dim_head=64, dropout=0.0):
        super().__init__()
        inner_dim = dim_head * heads
        context_dim = default(context_dim, query_dim)
        self.scale = dim_head**-0.5
        self.heads = heads
        self.to_q = nn.Linear(query_dim, inner_dim, bias=False)
        self.to_kv = nn.Linear(context_dim, inner_dim * 2, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner_dim, query_dim), nn.Dropout(dropout))

    def forward(self, x, context=None, mask=None):
        h = self.heads
        q = self.to_q(x)
        context = default(context, x)
        k, v = self.to_kv(context).chunk(2, dim=-1)

        def fold(t):  # rearrange(t, 'b n (h d) -> (b h) n d', h=h)
            b, n, hd = t.shape
            return t.reshape(b, n, h, hd // h).permute(0, 2, 1, 3).reshape(b * h, n, hd // h)

        q, k, v = map(fold, (q, k, v))
        sim = einsum("b i d, b j d -> b i j", q, k) * self.scale
        if exists(mask):
            max_neg_value = -torch.finfo(sim.dtype).max
            mask = mask.repeat_interleave(h, dim=0)[:, None, :]  # repeat(mask, 'b j -> (b h) () j', h=h)
            sim.masked_fill_(~mask, max_neg_value)
        attn = sim.softmax(dim=-1)
        out = einsum("b i j, b j d -> b i d", attn, v)
        bh, n, d = out.shape
        out = out.reshape(bh // h, h, n, d).permute(0, 2, 1, 3).reshape(bh // h, n, h * d)
        return self.to_out(out)


class TinyPerceiver(nn.Module):
    def __init__(self, input_dim=12, num_latents=6, latent_dim=32, num_classes=5):
        super().__init__()
        self.latents = nn.Parameter(torch.randn(num_latents, latent_dim))
        self.cross_attn = PreNorm(latent_dim, Attention(latent_dim, input_dim, heads=1, dim_head=16, dropout=0.1),
                                  context_dim=input_dim)
        self.cross_ff = PreNorm(latent_dim, FeedForward(latent_dim, dropout=0.1))
        self.latent_attn = PreNorm(latent_dim, Attention(latent_dim, heads=4, dim_head=8, dropout=0.1))
        self.latent_ff = PreNorm(latent_dim, FeedForward(latent_dim, dropout=0.1))
        self.to_logits = nn.Sequential(nn.LayerNorm(latent_dim), nn.Linear(latent_dim, num_classes))

    def forward(self, data, mask=None):
        b = data.shape[0]
        x = self.latents.unsqueeze(0).expand(b, -1, -1)
        x = self.cross_attn(x, context=data, mask=mask) + x
        x = self.cross_ff(x) + x
        x = self.latent_attn(x) + x
        x = self.latent_ff(x) + x
        return self.to_logits(x.mean(dim=-2))


def make_model():
    torch.manual_seed(0)
    data = torch.randn(2, 10, 12)
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[1, -4:] = False
    return TinyPerceiver(), (data, mask)
