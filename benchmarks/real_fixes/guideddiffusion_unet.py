"""Written in the style of openai/guided-diffusion, guided_diffusion/unet.py (read at commit
18ff408c2d27cd385fa2735c655daa0e3c1e48ef).

`AttentionBlock` over a 1-d flattened image (GroupNorm computed in float32 as `GroupNorm32` does, a `Conv1d`
qkv, zero-initialised `proj_out`) with both of its attention modules: `QKVAttentionLegacy` (split heads before
q/k/v: `qkv.reshape(bs * n_heads, ch * 3, length).split(ch, dim=1)`) and `QKVAttention` (`qkv.chunk(3, dim=1)`,
then `view(bs * n_heads, ch, length)`); both scale q and k by `1 / math.sqrt(math.sqrt(ch))`, take
`th.einsum("bct,bcs->bts", ...)`, `th.softmax(weight.float(), dim=-1).type(weight.dtype)` and
`th.einsum("bts,bcs->bct", weight, v)`. Left out: the gradient-checkpoint wrapper (`checkpoint(self._forward, ...)`,
a custom autograd function; here `forward` calls `_forward`), the rest of the UNet; `proj_out` is not zeroed here
so that the attention reaches the output (zero_module would make its gradient the only signal).
"""

import math

import torch as th
import torch.nn as nn

STYLE = "guided-diffusion AttentionBlock (QKVAttentionLegacy + QKVAttention)"
REPOSITORY = "openai/guided-diffusion"
PATH = "guided_diffusion/unet.py"
COMMIT = "18ff408c2d27cd385fa2735c655daa0e3c1e48ef"


class GroupNorm32(nn.GroupNorm):
    def forward(self, x):
        return super().forward(x.float()).type(x.dtype)


class QKVAttentionLegacy(nn.Module):
    def __init__(self, n_heads):
        super().__init__()
        self.n_heads = n_heads

    def forward(self, qkv):
        bs, width, length = qkv.shape
        ch = width // (3 * self.n_heads)
        q, k, v = qkv.reshape(bs * self.n_heads, ch * 3, length).split(ch, dim=1)
        scale = 1 / math.sqrt(math.sqrt(ch))
        weight = th.einsum("bct,bcs->bts", q * scale, k * scale)
        weight = th.softmax(weight.float(), dim=-1).type(weight.dtype)
        a = th.einsum("bts,bcs->bct", weight, v)
        return a.reshape(bs, -1, length)


class QKVAttention(nn.Module):
    def __init__(self, n_heads):
        super().__init__()
        self.n_heads = n_heads

    def forward(self, qkv):
        bs, width, length = qkv.shape
        ch = width // (3 * self.n_heads)
        q, k, v = qkv.chunk(3, dim=1)
        scale = 1 / math.sqrt(math.sqrt(ch))
        weight = th.einsum(
            "bct,bcs->bts",
            (q * scale).view(bs * self.n_heads, ch, length),
            (k * scale).view(bs * self.n_heads, ch, length),
        )
        weight = th.softmax(weight.float(), dim=-1).type(weight.dtype)
        a = th.einsum("bts,bcs->bct", weight, v.reshape(bs * self.n_heads, ch, length))
        return a.reshape(bs, -1, length)


class AttentionBlock(nn.Module):
    def __init__(self, channels, num_heads=1, use_new_attention_order=False):
        super().__init__()
        self.norm = GroupNorm32(8, channels)
        self.qkv = nn.Conv1d(channels, channels * 3, 1)
        self.attention = QKVAttention(num_heads) if use_new_attention_order else QKVAttentionLegacy(num_heads)
        self.proj_out = nn.Conv1d(channels, channels, 1)

    def forward(self, x):
        return self._forward(x)

    def _forward(self, x):
        b, c, *spatial = x.shape
        x = x.reshape(b, c, -1)
        qkv = self.qkv(self.norm(x))
        h = self.attention(qkv)
        h = self.proj_out(h)
        return (x + h).reshape(b, c, *spatial)


class TinyUNetMiddle(nn.Module):
    def __init__(self, channels=32):
        super().__init__()
        self.conv_in = nn.Conv2d(3, channels, 3, padding=1)
        self.legacy = AttentionBlock(channels, num_heads=4)
        self.new_order = AttentionBlock(channels, num_heads=4, use_new_attention_order=True)
        self.conv_out = nn.Conv2d(channels, 3, 3, padding=1)

    def forward(self, x):
        return self.conv_out(self.new_order(self.legacy(self.conv_in(x))))


def make_model():
    torch_seed = 0
    th.manual_seed(torch_seed)
    return TinyUNetMiddle(), (th.randn(2, 3, 6, 6),)
