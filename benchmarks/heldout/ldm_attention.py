"""Written in the style of stable-diffusion's ldm modules (CompVis/stable-diffusion, ldm/modules/attention.py and
ldm/modules/diffusionmodules/model.py).

Two attentions: the UNet's `CrossAttention` (heads folded into the batch, `'b n (h d) -> (b h) n d'`, here spelled
with reshape/permute since einops is no dependency of this set; `einsum('b i d, b j d -> b i j', q, k) *
self.scale`, an optional boolean mask applied in place with `sim.masked_fill_(~mask, -finfo.max)`,
`sim.softmax(dim=-1)`, `einsum('b i j, b j d -> b i d', attn, v)`), inside a BasicTransformerBlock with GEGLU;
and the autoencoder's single-head `AttnBlock` over an image (`torch.bmm(q, k)` with q permuted, `w_ * (int(c) **
(-0.5))`, `softmax(w_, dim=2)`, then `torch.bmm(v, w_.permute(0, 2, 1))`: the probabilities transposed into the
values product) with ldm's `nonlinearity(x) = x * torch.sigmoid(x)` and GroupNorm.
"""

import torch
import torch.nn.functional as F
from torch import einsum, nn

STYLE = "stable-diffusion ldm CrossAttention + VAE AttnBlock"
REPOSITORY = "CompVis/stable-diffusion"
BACKWARD_FAILS = False


def exists(val):
    return val is not None


def default(val, d):
    return val if exists(val) else d


def split_heads(t, h):  # rearrange(t, 'b n (h d) -> (b h) n d', h=h)
    b, n, hd = t.shape
    return t.reshape(b, n, h, hd // h).permute(0, 2, 1, 3).reshape(b * h, n, hd // h)


def merge_heads(t, h):  # rearrange(t, '(b h) n d -> b n (h d)', h=h)
    bh, n, d = t.shape
    return t.reshape(bh // h, h, n, d).permute(0, 2, 1, 3).reshape(bh // h, n, h * d)


class GEGLU(nn.Module):
    def __init__(self, dim_in, dim_out):
        super().__init__()
        self.proj = nn.Linear(dim_in, dim_out * 2)

    def forward(self, x):
        x, gate = self.proj(x).chunk(2, dim=-1)
        return x * F.gelu(gate)


class FeedForward(nn.Module):
    def __init__(self, dim, mult=4, dropout=0.0):
        super().__init__()
        inner_dim = int(dim * mult)
        self.net = nn.Sequential(GEGLU(dim, inner_dim), nn.Dropout(dropout), nn.Linear(inner_dim, dim))

    def forward(self, x):
        return self.net(x)


class CrossAttention(nn.Module):
    def __init__(self, query_dim, context_dim=None, heads=4, dim_head=8, dropout=0.0):
        super().__init__()
        inner_dim = dim_head * heads
        context_dim = default(context_dim, query_dim)
        self.scale = dim_head**-0.5
        self.heads = heads
        self.to_q = nn.Linear(query_dim, inner_dim, bias=False)
        self.to_k = nn.Linear(context_dim, inner_dim, bias=False)
        self.to_v = nn.Linear(context_dim, inner_dim, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner_dim, query_dim), nn.Dropout(dropout))

    def forward(self, x, context=None, mask=None):
        h = self.heads
        q = self.to_q(x)
        context = default(context, x)
        k = self.to_k(context)
        v = self.to_v(context)
        q, k, v = (split_heads(t, h) for t in (q, k, v))

        sim = einsum("b i d, b j d -> b i j", q, k) * self.scale

        if exists(mask):
            mask = mask.reshape(mask.shape[0], -1)
            max_neg_value = -torch.finfo(sim.dtype).max
            mask = mask[:, None, :].repeat_interleave(h, dim=0)
            sim.masked_fill_(~mask, max_neg_value)

        # attention, what we cannot get enough of
        attn = sim.softmax(dim=-1)

        out = einsum("b i j, b j d -> b i d", attn, v)
        out = merge_heads(out, h)
        return self.to_out(out)


class BasicTransformerBlock(nn.Module):
    def __init__(self, dim, n_heads, d_head, context_dim=None):
        super().__init__()
        self.attn1 = CrossAttention(query_dim=dim, heads=n_heads, dim_head=d_head)
        self.ff = FeedForward(dim)
        self.attn2 = CrossAttention(query_dim=dim, context_dim=context_dim, heads=n_heads, dim_head=d_head)
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.norm3 = nn.LayerNorm(dim)

    def forward(self, x, context=None, mask=None):
        x = self.attn1(self.norm1(x)) + x
        x = self.attn2(self.norm2(x), context=context, mask=mask) + x
        x = self.ff(self.norm3(x)) + x
        return x


def nonlinearity(x):
    # swish
    return x * torch.sigmoid(x)


def Normalize(in_channels):
    return nn.GroupNorm(num_groups=8, num_channels=in_channels, eps=1e-6, affine=True)


class AttnBlock(nn.Module):
    def __init__(self, in_channels):
        super().__init__()
        self.in_channels = in_channels
        self.norm = Normalize(in_channels)
        self.q = nn.Conv2d(in_channels, in_channels, kernel_size=1, stride=1, padding=0)
        self.k = nn.Conv2d(in_channels, in_channels, kernel_size=1, stride=1, padding=0)
        self.v = nn.Conv2d(in_channels, in_channels, kernel_size=1, stride=1, padding=0)
        self.proj_out = nn.Conv2d(in_channels, in_channels, kernel_size=1, stride=1, padding=0)

    def forward(self, x):
        h_ = x
        h_ = self.norm(h_)
        q = self.q(h_)
        k = self.k(h_)
        v = self.v(h_)

        # compute attention
        b, c, h, w = q.shape
        q = q.reshape(b, c, h * w)
        q = q.permute(0, 2, 1)  # b,hw,c
        k = k.reshape(b, c, h * w)  # b,c,hw
        w_ = torch.bmm(q, k)  # b,hw,hw    w[b,i,j]=sum_c q[b,i,c]k[b,c,j]
        w_ = w_ * (int(c) ** (-0.5))
        w_ = torch.nn.functional.softmax(w_, dim=2)

        # attend to values
        v = v.reshape(b, c, h * w)
        w_ = w_.permute(0, 2, 1)  # b,hw,hw (first hw of k, second of q)
        h_ = torch.bmm(v, w_)  # b, c,hw (hw of q) h_[b,c,j] = sum_i v[b,c,i] w_[b,i,j]
        h_ = h_.reshape(b, c, h, w)

        h_ = self.proj_out(h_)
        return x + h_


class TinyLDM(nn.Module):
    """A VAE mid-block (ResnetBlock-free) followed by a spatial transformer over the latent."""

    def __init__(self, channels=16, context_dim=24):
        super().__init__()
        self.conv_in = nn.Conv2d(3, channels, 3, padding=1)
        self.mid_attn = AttnBlock(channels)
        self.norm_out = Normalize(channels)
        self.proj_in = nn.Linear(channels, 32)
        self.transformer = BasicTransformerBlock(32, n_heads=4, d_head=8, context_dim=context_dim)
        self.proj_out = nn.Linear(32, channels)

    def forward(self, x, context, mask):
        h = self.conv_in(x)
        h = self.mid_attn(h)
        h = nonlinearity(self.norm_out(h))
        b, c, hh, ww = h.shape
        t = h.reshape(b, c, hh * ww).transpose(1, 2)
        t = self.proj_out(self.transformer(self.proj_in(t), context=context, mask=mask))
        return t.transpose(1, 2).reshape(b, c, hh, ww) + h


def make_model():
    torch.manual_seed(0)
    model = TinyLDM()
    x = torch.randn(2, 3, 8, 8)
    context = torch.randn(2, 6, 24)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, -2:] = False
    return model, (x, context, mask)
