"""Written in the style of lucidrains/vit-pytorch, vit_pytorch/vit.py (read at commit 0ebd4edab94c211eff78406248896588d155a10c).

`Attention` with a pre-LayerNorm, one bias-free `to_qkv` Linear chunked in three, heads split
`'b n (h d) -> b h n d'`, `torch.matmul(q, k.transpose(-1, -2)) * self.scale`, the softmax as a module
(`self.attend = nn.Softmax(dim=-1)`), `self.dropout(attn)` (nn.Dropout), `torch.matmul(attn, v)`, and `to_out`
a Linear + Dropout (or Identity when one head spans the width). einops' `rearrange`/`repeat` (no dependency of
this set) are spelled with reshape/permute/expand; the patch embedding's `Rearrange` layer likewise.
"""

import torch
from torch import nn

STYLE = "vit-pytorch Attention (nn.Softmax module)"
REPOSITORY = "lucidrains/vit-pytorch"
PATH = "vit_pytorch/vit.py"
COMMIT = "0ebd4edab94c211eff78406248896588d155a10c"


def split_heads(t, h):  # rearrange(t, 'b n (h d) -> b h n d', h=h)
    b, n, hd = t.shape
    return t.reshape(b, n, h, hd // h).permute(0, 2, 1, 3)


class FeedForward(nn.Module):
    def __init__(self, dim, hidden_dim, dropout=0.0):
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, hidden_dim), nn.GELU(), nn.Dropout(dropout),
                                 nn.Linear(hidden_dim, dim), nn.Dropout(dropout))

    def forward(self, x):
        return self.net(x)


class Attention(nn.Module):
    def __init__(self, dim, heads=8, dim_head=64, dropout=0.0):
        super().__init__()
        inner_dim = dim_head * heads
        project_out = not (heads == 1 and dim_head == dim)
        self.heads = heads
        self.scale = dim_head**-0.5
        self.norm = nn.LayerNorm(dim)
        self.attend = nn.Softmax(dim=-1)
        self.dropout = nn.Dropout(dropout)
        self.to_qkv = nn.Linear(dim, inner_dim * 3, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner_dim, dim), nn.Dropout(dropout)) if project_out else nn.Identity()

    def forward(self, x):
        x = self.norm(x)
        qkv = self.to_qkv(x).chunk(3, dim=-1)
        q, k, v = map(lambda t: split_heads(t, self.heads), qkv)
        dots = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        attn = self.attend(dots)
        attn = self.dropout(attn)
        out = torch.matmul(attn, v)
        b, h, n, d = out.shape
        out = out.permute(0, 2, 1, 3).reshape(b, n, h * d)  # rearrange(out, 'b h n d -> b n (h d)')
        return self.to_out(out)


class Transformer(nn.Module):
    def __init__(self, dim, depth, heads, dim_head, mlp_dim, dropout=0.0):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.layers = nn.ModuleList([nn.ModuleList([Attention(dim, heads=heads, dim_head=dim_head, dropout=dropout),
                                                    FeedForward(dim, mlp_dim, dropout=dropout)]) for _ in range(depth)])

    def forward(self, x):
        for attn, ff in self.layers:
            x = attn(x) + x
            x = ff(x) + x
        return self.norm(x)


class ViT(nn.Module):
    def __init__(self, image_size=16, patch_size=4, num_classes=10, dim=32, depth=2, heads=4, mlp_dim=64, channels=3,
                 dim_head=8, dropout=0.1, emb_dropout=0.1):
        super().__init__()
        num_patches = (image_size // patch_size) ** 2
        patch_dim = channels * patch_size * patch_size
        self.patch_size = patch_size
        self.to_patch_embedding = nn.Sequential(nn.LayerNorm(patch_dim), nn.Linear(patch_dim, dim), nn.LayerNorm(dim))
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim))
        self.pos_embedding = nn.Parameter(torch.randn(1, num_patches + 1, dim))
        self.dropout = nn.Dropout(emb_dropout)
        self.transformer = Transformer(dim, depth, heads, dim_head, mlp_dim, dropout)
        self.mlp_head = nn.Linear(dim, num_classes)

    def forward(self, img):
        b, c, hh, ww = img.shape
        p = self.patch_size  # Rearrange('b c (h p1) (w p2) -> b (h w) (p1 p2 c)')
        x = img.reshape(b, c, hh // p, p, ww // p, p).permute(0, 2, 4, 3, 5, 1).reshape(b, (hh // p) * (ww // p), p * p * c)
        x = self.to_patch_embedding(x)
        b, n, _ = x.shape
        cls_tokens = self.cls_token.expand(b, -1, -1)
        x = torch.cat((cls_tokens, x), dim=1)
        x = x + self.pos_embedding[:, : (n + 1)]
        x = self.dropout(x)
        x = self.transformer(x)
        return self.mlp_head(x[:, 0])


def make_model():
    torch.manual_seed(0)
    return ViT(), (torch.randn(2, 3, 16, 16),)
