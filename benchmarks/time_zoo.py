"""Models for `benchmarks/time_accuracy.py` of classes its other zoos lack: torch's own attention and encoder
modules, batch normalisation in training, a recurrent cell written as a Python loop, an embedding bag, checkpointed
blocks, an autocast region inside the forward and a stacked GRU. They were added after the time model was built and
are not used to calibrate anything."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

# the factories time_accuracy.py runs, in its table's order
FACTORIES = ("multihead_attention", "transformer_encoder", "batchnorm_cnn", "python_cell_loop", "embedding_bag",
             "checkpointed_mlp", "autocast_region_dict_output", "layernorm_stacked_gru")


class AttentionBlock(nn.Module):
    def __init__(self, dim: int = 64, heads: int = 4):
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ff = nn.Sequential(nn.Linear(dim, 4 * dim), nn.ReLU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(x, x, x, need_weights=False)[0]
        return x + self.ff(x)


def multihead_attention():
    torch.manual_seed(0)
    return AttentionBlock(), (torch.randn(8, 32, 64),)


def transformer_encoder():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)
    return nn.TransformerEncoder(layer, 3, enable_nested_tensor=False), (torch.randn(4, 48, 64),)


def batchnorm_cnn():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    return model, (torch.randn(8, 3, 32, 32),)


class Cell(nn.Module):
    """A tanh recurrent cell stepped over the sequence in Python."""

    def __init__(self):
        super().__init__()
        self.ih, self.hh = nn.Linear(16, 32), nn.Linear(32, 32)

    def forward(self, x):
        h = x.new_zeros(x.shape[0], 32)
        outs = []
        for t in range(x.shape[1]):
            h = torch.tanh(self.ih(x[:, t]) + self.hh(h))
            outs.append(h)
        return torch.stack(outs, 1)


def python_cell_loop():
    torch.manual_seed(0)
    return Cell(), (torch.randn(4, 24, 16),)


class Bag(nn.Module):
    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(1000, 32, mode="mean")
        self.head = nn.Linear(32, 2)

    def forward(self, idx, offsets):
        return self.head(self.bag(idx, offsets))


def embedding_bag():
    torch.manual_seed(0)
    return Bag(), (torch.randint(0, 1000, (64,)), torch.arange(0, 64, 8))


class Checkpointed(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(128, 512), nn.GELU(), nn.Linear(512, 128))
                                    for _ in range(4))

    def forward(self, x):
        for block in self.blocks:
            x = x + checkpoint(block, x, use_reentrant=False)
        return x


def checkpointed_mlp():
    torch.manual_seed(0)
    return Checkpointed(), (torch.randn(32, 128),)


class AutocastRegion(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(64, 64), nn.Linear(64, 8)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = F.silu(self.a(x))
        return {"logits": self.b(h.float())}


def autocast_region_dict_output():
    torch.manual_seed(0)
    return AutocastRegion(), (torch.randn(16, 64),)


class NormGru(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(32)
        self.gru = nn.GRU(32, 32, batch_first=True, num_layers=2)
        self.out = nn.Linear(32, 5)

    def forward(self, x):
        return self.out(self.gru(self.norm(x))[0])


def layernorm_stacked_gru():
    torch.manual_seed(0)
    return NormGru(), (torch.randn(4, 20, 32),)
