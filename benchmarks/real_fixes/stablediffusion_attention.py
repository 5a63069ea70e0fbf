"""Written in the style of CompVis/stable-diffusion, ldm/modules/attention.py (read at commit
09bf6dd7c1d3f4c1add1a8de6fd4acce075b9477, a version whose CrossAttention computes through `einsum_op`).

Two attentions of that file: `SpatialSelfAttention` (1x1 Conv2d q/k/v over a GroupNorm, `einsum('bij,bjk->bik', q, k)`
with q as `b (h w) c` and k as `b c (h w)`, `w_ * (int(c)**(-0.5))`, `torch.nn.functional.softmax(w_, dim=2)`, the
probabilities transposed `b i j -> b j i` into `einsum('bij,bjk->bik', v, w_)`), and `CrossAttention` on the CPU
path of `einsum_op` (`einsum_op_compvis`: keys pre-scaled `self.to_k(context) * self.scale`, heads folded into the
batch, `s.softmax(dim=-1, dtype=s.dtype)`, `einsum('b i j, b j d -> b i d', s, v)`), which on CPU goes through
`einsum_op_tensor_mem` and so compvis directly for small tensors. Left out: the CUDA/MPS slicing variants (not
reached on CPU at these sizes; `einsum_op_tensor_mem`'s slicing kept out too), psutil's memory probe, the
checkpoint wrapper; einops spelled with reshape/permute; GroupNorm with 8 groups at this width.
"""

import torch
import torch.nn.functional as F
from torch import einsum, nn

STYLE = "stable-diffusion SpatialSelfAttention + CrossAttention (einsum_op_compvis)"
REPOSITORY = "CompVis/stable-diffusion"
PATH = "ldm/modules/attention.py"
COMMIT = "09bf6dd7c1d3f4c1add1a8de6fd4acce075b9477"


def exists(val):
    return val is not None


def default(val, d):
    return val if exists(val) else d


def Normalize(in_channels):
    return torch.nn.GroupNorm(num_groups=8, num_channels=in_channels, eps=1e-6, affine=True)


class SpatialSelfAttention(nn.Module):
    def __init__(self, in_channels):
        super().__init__()
        self.norm = Normalize(in_channels)
        self.q = torch.nn.Conv2d(in_channels, in_channels, kernel_size=1, stride=1, padding=0)
        self.k = torch.nn.Conv2d(in_channels, in_channels, kernel_size=1, stride=1, padding=0)
        self.v = torch.nn.Conv2d(in_channels, in_channels, kernel_size=1, stride=1, padding=0)
        self.proj_out = torch.nn.Conv2d(in_channels, in_channels, kernel_size=1, stride=1, padding=0)

    def forward(self, x):
        h_ = self.norm(x)
        q = self.q(h_)
        k = self.k(h_)
        v = self.v(h_)
        b, c, h, w = q.shape
        q = q.reshape(b, c, h * w).permute(0, 2, 1)  # rearrange(q, 'b c h w -> b (h w) c')
        k = k.reshape(b, c, h * w)  # rearrange(k, 'b c h w -> b c (h w)')
        w_ = torch.einsum("bij,bjk->bik", q, k)
        w_ = w_ * (int(c) ** (-0.5))
        w_ = torch.nn.functional.softmax(w_, dim=2)
        v = v.reshape(b, c, h * w)
        w_ = w_.permute(0, 2, 1)  # rearrange(w_, 'b i j -> b j i')
        h_ = torch.einsum("bij,bjk->bik", v, w_)
        h_ = h_.reshape(b, c, h, w)
        h_ = self.proj_out(h_)
        return x + h_


class CrossAttention(nn.Module):
    def __init__(self, query_dim, context_dim=None, heads=8, dim_head=64, dropout=0.0):
        super().__init__()
        inner_dim = dim_head * heads
        context_dim = default(context_dim, query_dim)
        self.scale = dim_head**-0.5
        self.heads = heads
        self.to_q = nn.Linear(query_dim, inner_dim, bias=False)
        self.to_k = nn.Linear(context_dim, inner_dim, bias=False)
        self.to_v = nn.Linear(context_dim, inner_dim, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner_dim, query_dim), nn.Dropout(dropout))

    def einsum_op_compvis(self, q, k, v):
        s = einsum("b i d, b j d -> b i j", q, k)
        s = s.softmax(dim=-1, dtype=s.dtype)
        return einsum("b i j, b j d -> b i d", s, v)

    def forward(self, x, context=None):
        h = self.heads
        q = self.to_q(x)
        context = default(context, x)
        k = self.to_k(context) * self.scale
        v = self.to_v(context)

        def fold(t):  # rearrange(t, 'b n (h d) -> (b h) n d', h=h)
            b, n, hd = t.shape
            return t.reshape(b, n, h, hd // h).permute(0, 2, 1, 3).reshape(b * h, n, hd // h)

        q, k, v = map(fold, (q, k, v))
        r = self.einsum_op_compvis(q, k, v)
        bh, n, d = r.shape
        return self.to_out(r.reshape(bh // h, h, n, d).permute(0, 2, 1, 3).reshape(bh // h, n, h * d))


class GEGLU(nn.Module):
    def __init__(self, dim_in, dim_out):
        super().__init__()
        self.proj = nn.Linear(dim_in, dim_out * 2)

    def forward(self, x):
        x, gate = self.proj(x).chunk(2, dim=-1)
        return x * F.gelu(gate)


class BasicTransformerBlock(nn.Module):
    def __init__(self, dim, n_heads, d_head, dropout=0.0, context_dim=None):
        super().__init__()
        self.attn1 = CrossAttention(query_dim=dim, heads=n_heads, dim_head=d_head, dropout=dropout)
        self.ff = nn.Sequential(GEGLU(dim, dim * 4), nn.Dropout(dropout), nn.Linear(dim * 4, dim))
        self.attn2 = CrossAttention(query_dim=dim, context_dim=context_dim, heads=n_heads, dim_head=d_head, dropout=dropout)
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.norm3 = nn.LayerNorm(dim)

    def forward(self, x, context=None):
        x = x + self.attn1(self.norm1(x))
        x = x + self.attn2(self.norm2(x), context=context)
        return x + self.ff(self.norm3(x))


class TinyUNetStage(nn.Module):
    def __init__(self, channels=16, heads=2, context_dim=24):
        super().__init__()
        self.conv_in = nn.Conv2d(3, channels, 3, padding=1)
        self.spatial = SpatialSelfAttention(channels)
        self.block = BasicTransformerBlock(channels, heads, channels // heads, dropout=0.1, context_dim=context_dim)
        self.conv_out = nn.Conv2d(channels, 3, 3, padding=1)

    def forward(self, x, context):
        h = self.spatial(self.conv_in(x))
        b, c, hh, ww = h.shape
        t = h.reshape(b, c, hh * ww).permute(0, 2, 1)
        t = self.block(t, context=context)
        return self.conv_out(t.permute(0, 2, 1).reshape(b, c, hh, ww))


def make_model():
    torch.manual_seed(0)
    return TinyUNetStage(), (torch.randn(2, 3, 6, 6), torch.randn(2, 5, 24))
