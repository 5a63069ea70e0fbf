"""Written in the style of SAM 2's Hiera backbone (facebookresearch/sam2, sam2/modeling/backbones/hieradet.py).

MultiScaleAttention: `qkv.reshape(B, H * W, 3, heads, -1)`, `torch.unbind(qkv, 2)`, an optional max-pool of the
query (`do_pool` over a (B, H, W, C) view), and `F.scaled_dot_product_attention(q.transpose(1, 2),
k.transpose(1, 2), v.transpose(1, 2))`. Attention is already fused here: graphlint must report no GL101.
"""

import torch
import torch.nn.functional as F
from torch import nn

STYLE = "SAM 2 Hiera MultiScaleAttention (already fused)"
REPOSITORY = "facebookresearch/sam2"
BACKWARD_FAILS = False
FUSED = True


def do_pool(x, pool, norm=None):
    if pool is None:
        return x
    x = x.permute(0, 3, 1, 2)
    x = pool(x)
    x = x.permute(0, 2, 3, 1)
    if norm:
        x = norm(x)
    return x


class MultiScaleAttention(nn.Module):
    def __init__(self, dim, dim_out, num_heads, q_pool=None):
        super().__init__()
        self.dim = dim
        self.dim_out = dim_out
        self.num_heads = num_heads
        self.q_pool = q_pool
        self.qkv = nn.Linear(dim, dim_out * 3)
        self.proj = nn.Linear(dim_out, dim_out)

    def forward(self, x):
        B, H, W, _ = x.shape
        qkv = self.qkv(x).reshape(B, H * W, 3, self.num_heads, -1)
        q, k, v = torch.unbind(qkv, 2)
        if self.q_pool:
            q = do_pool(q.reshape(B, H, W, -1), self.q_pool)
            H, W = q.shape[1:3]
            q = q.reshape(B, H * W, self.num_heads, -1)
        x = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        x = x.transpose(1, 2)
        x = x.reshape(B, H, W, -1)
        return self.proj(x)


class MultiScaleBlock(nn.Module):
    def __init__(self, dim, dim_out, num_heads, q_stride=None):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.pool = nn.MaxPool2d(kernel_size=q_stride, stride=q_stride, ceil_mode=False) if q_stride else None
        self.attn = MultiScaleAttention(dim, dim_out, num_heads=num_heads, q_pool=self.pool)
        self.norm2 = nn.LayerNorm(dim_out, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim_out, 4 * dim_out), nn.GELU(), nn.Linear(4 * dim_out, dim_out))
        self.proj = nn.Linear(dim, dim_out) if dim != dim_out else None

    def forward(self, x):
        shortcut = x
        x = self.norm1(x)
        if self.proj is not None:
            shortcut = do_pool(self.proj(x), self.pool)
        x = shortcut + self.attn(x)
        return x + self.mlp(self.norm2(x))


class Hiera(nn.Module):
    def __init__(self, embed_dim=16, num_heads=2):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, embed_dim, kernel_size=7, stride=4, padding=3)
        self.blocks = nn.ModuleList([
            MultiScaleBlock(embed_dim, embed_dim, num_heads),
            MultiScaleBlock(embed_dim, 2 * embed_dim, 2 * num_heads, q_stride=2),
            MultiScaleBlock(2 * embed_dim, 2 * embed_dim, 2 * num_heads),
        ])

    def forward(self, x):
        x = self.patch_embed(x).permute(0, 2, 3, 1)
        for blk in self.blocks:
            x = blk(x)
        return x.permute(0, 3, 1, 2)


def make_model():
    torch.manual_seed(0)
    return Hiera(), (torch.randn(1, 3, 32, 32),)
