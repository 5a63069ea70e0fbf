"""A third held-out set for `graphlint memory`: families neither zoo has (speech, detection, recommendation, graph
attention, a diffusion transformer, a state-space model), written for this check in plain torch, small, with
random weights, and measured against PyTorch's CPU memory profiler as benchmarks/memory_zoo.py measures its own.

    python benchmarks/memory_heldout3.py          # print the table

A model is never changed to make its row agree: the estimator is.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import graphlint  # noqa: E402


class SpeechEncoder(nn.Module):
    """Whisper-like: two Conv1d over mel bins (the second with stride 2), then pre-norm attention blocks."""

    def __init__(self, mels: int = 80, width: int = 128, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(mels, width, 3, padding=1)
        self.conv2 = nn.Conv1d(width, width, 3, stride=2, padding=1)
        self.blocks = nn.ModuleList(_Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 32)

    def forward(self, mel):
        x = F.gelu(self.conv2(F.gelu(self.conv1(mel)))).transpose(1, 2)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class _Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        x = x + self.out(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.norm2(x))


def speech_encoder():
    labels = torch.randint(0, 32, (4, 150))
    return graphlint.Target(SpeechEncoder(), (torch.randn(4, 80, 300),),
                            loss=lambda out: F.cross_entropy(out.flatten(0, 1), labels.flatten()))


class Detector(nn.Module):
    """A small FPN detector: a strided backbone, top-down merging, and per-level class and box heads."""

    def __init__(self, classes: int = 8, anchors: int = 3) -> None:
        super().__init__()
        self.stages = nn.ModuleList(nn.Sequential(nn.Conv2d(a, b, 3, stride=2, padding=1), nn.BatchNorm2d(b),
                                                  nn.ReLU()) for a, b in ((3, 32), (32, 64), (64, 128)))
        self.lateral = nn.ModuleList(nn.Conv2d(c, 64, 1) for c in (32, 64, 128))
        self.cls = nn.Conv2d(64, anchors * classes, 3, padding=1)
        self.box = nn.Conv2d(64, anchors * 4, 3, padding=1)

    def forward(self, images):
        features, x = [], images
        for stage in self.stages:
            x = stage(x)
            features.append(x)
        merged = self.lateral[2](features[2])
        levels = [merged]
        for i in (1, 0):
            merged = self.lateral[i](features[i]) + F.interpolate(merged, scale_factor=2.0, mode="nearest")
            levels.append(merged)
        return torch.cat([self.cls(p).flatten(2) for p in levels], 2), torch.cat([self.box(p).flatten(2) for p in levels], 2)


def detector():
    def loss(out):
        scores, boxes = out
        return F.binary_cross_entropy_with_logits(scores, torch.zeros_like(scores)) + F.smooth_l1_loss(
            boxes, torch.ones_like(boxes))
    return graphlint.Target(Detector(), (torch.randn(8, 3, 128, 128),), loss=loss)


class Recommender(nn.Module):
    """A DLRM shape: a bottom MLP on dense features, embedding bags per table, pairwise dot interactions, a top
    MLP."""

    def __init__(self, tables: int = 6, rows: int = 20000, width: int = 32) -> None:
        super().__init__()
        self.bags = nn.ModuleList(nn.EmbeddingBag(rows, width, mode="sum") for _ in range(tables))
        self.bottom = nn.Sequential(nn.Linear(13, 64), nn.ReLU(), nn.Linear(64, width))
        pairs = (tables + 1) * tables // 2
        self.top = nn.Sequential(nn.Linear(width + pairs, 128), nn.ReLU(), nn.Linear(128, 1))

    def forward(self, dense, ids, offsets):
        features = torch.stack([self.bottom(dense)] + [bag(ids[i], offsets[i]) for i, bag in enumerate(self.bags)], 1)
        products = features @ features.transpose(1, 2)
        rows, cols = torch.triu_indices(features.shape[1], features.shape[1], 1)
        return self.top(torch.cat([features[:, 0], products[:, rows, cols]], 1))


def recommender():
    batch, per = 256, 20
    ids = torch.randint(0, 20000, (6, batch * per))
    offsets = torch.arange(0, batch * per, per).repeat(6, 1)
    clicks = torch.randint(0, 2, (batch, 1)).float()
    return graphlint.Target(Recommender(), (torch.randn(batch, 13), ids, offsets),
                            loss=lambda out: F.binary_cross_entropy_with_logits(out, clicks))


class GraphAttention(nn.Module):
    """GAT layers over an edge list: per-edge scores, a softmax over each node's incoming edges by scatter, and
    messages summed with index_add_."""

    def __init__(self, features: int = 64, width: int = 64, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.projections = nn.ModuleList(nn.Linear(features if i == 0 else width, width) for i in range(layers))
        self.attention = nn.ParameterList(nn.Parameter(torch.randn(2, heads, width // heads)) for _ in range(layers))
        self.head = nn.Linear(width, 7)

    def forward(self, x, edges):
        source, target = edges
        nodes = x.shape[0]
        for projection, attention in zip(self.projections, self.attention, strict=True):
            h = projection(x).view(nodes, self.heads, -1)
            scores = F.leaky_relu((h[source] * attention[0]).sum(-1) + (h[target] * attention[1]).sum(-1), 0.2)
            scores = (scores - scores.max()).exp()
            total = torch.zeros(nodes, self.heads).index_add_(0, target, scores)
            weights = scores / total[target]
            x = F.elu(torch.zeros_like(h).index_add_(0, target, h[source] * weights.unsqueeze(-1)).flatten(1))
        return self.head(x)


def graph_attention():
    nodes = 2000
    edges = torch.randint(0, nodes, (2, 16000))
    labels = torch.randint(0, 7, (nodes,))
    return graphlint.Target(GraphAttention(), (torch.randn(nodes, 64), edges),
                            loss=lambda out: F.cross_entropy(out, labels))


class DiT(nn.Module):
    """A diffusion transformer: patchified latents, a timestep embedding, blocks modulated by adaLN-Zero."""

    def __init__(self, channels: int = 4, patch: int = 2, width: int = 192, heads: int = 4, layers: int = 3) -> None:
        super().__init__()
        self.patch = patch
        self.embed = nn.Conv2d(channels, width, patch, stride=patch)
        self.time = nn.Sequential(nn.Linear(128, width), nn.SiLU(), nn.Linear(width, width))
        self.blocks = nn.ModuleList(_DiTBlock(width, heads) for _ in range(layers))
        self.final = nn.Linear(width, patch * patch * channels)

    def forward(self, latents, t):
        half = torch.exp(-math.log(10000) * torch.arange(64, device=t.device) / 64)
        c = self.time(torch.cat([torch.cos(t[:, None] * half), torch.sin(t[:, None] * half)], 1))
        x = self.embed(latents).flatten(2).transpose(1, 2)
        for block in self.blocks:
            x = block(x, c)
        return self.final(x)


class _DiTBlock(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.attn = _Block(width, heads)
        self.norm = nn.LayerNorm(width, elementwise_affine=False)
        self.modulation = nn.Sequential(nn.SiLU(), nn.Linear(width, 3 * width))

    def forward(self, x, c):
        shift, scale, gate = self.modulation(c).unsqueeze(1).chunk(3, -1)
        return x + gate * self.attn(self.norm(x) * (1 + scale) + shift)


def dit():
    latents = torch.randn(8, 4, 32, 32)
    noise = torch.randn(8, 256, 16)
    return graphlint.Target(DiT(), (latents, torch.rand(8) * 1000), loss=lambda out: F.mse_loss(out, noise))


class StateSpace(nn.Module):
    """A selective state-space layer (Mamba-like) in plain torch: input-dependent step sizes and projections, a
    scan over time with a diagonal state, a gated output."""

    def __init__(self, width: int = 64, state: int = 16, layers: int = 2) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_Selective(width, state) for _ in range(layers))
        self.embed = nn.Embedding(500, width)
        self.head = nn.Linear(width, 500)

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = x + layer(x)
        return self.head(x)


class _Selective(nn.Module):
    def __init__(self, width: int, state: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.inner = nn.Linear(width, 2 * width)
        self.conv = nn.Conv1d(width, width, 4, padding=3, groups=width)
        self.dt, self.b, self.c = nn.Linear(width, width), nn.Linear(width, state), nn.Linear(width, state)
        self.log_a = nn.Parameter(torch.log(torch.arange(1, state + 1).float()).repeat(width, 1))
        self.out = nn.Linear(width, width)

    def forward(self, x):
        u, gate = self.inner(self.norm(x)).chunk(2, -1)
        u = F.silu(self.conv(u.transpose(1, 2))[..., :x.shape[1]].transpose(1, 2))
        dt, b, c = F.softplus(self.dt(u)), self.b(u), self.c(u)
        decay = torch.exp(-dt.unsqueeze(-1) * self.log_a.exp())  # (B, T, D, N)
        h = torch.zeros(x.shape[0], x.shape[2], b.shape[-1])
        outputs = []
        for step in range(x.shape[1]):
            h = decay[:, step] * h + (dt[:, step] * u[:, step]).unsqueeze(-1) * b[:, step].unsqueeze(1)
            outputs.append((h * c[:, step].unsqueeze(1)).sum(-1))
        return self.out(torch.stack(outputs, 1) * F.silu(gate))


def state_space():
    ids = torch.randint(0, 500, (8, 64))
    return graphlint.Target(StateSpace(), (ids,),
                            loss=lambda out: F.cross_entropy(out[:, :-1].flatten(0, 1), ids[:, 1:].flatten()))


HELDOUT = [
    ("Speech encoder (Conv1d over mel bins, attention)", "speech_encoder", "adamw"),
    ("Detector (FPN, class and box heads)", "detector", "sgd-momentum"),
    ("Recommender (DLRM: embedding bags, interactions)", "recommender", "adam"),
    ("Graph attention (scatter softmax, index_add_)", "graph_attention", "adamw"),
    ("Diffusion transformer (adaLN-Zero)", "dit", "adamw"),
    ("Selective state-space layers (scan over time)", "state_space", "adamw"),
]


def table(only: str | None = None) -> str:
    import memory_accuracy

    module = sys.modules[__name__]
    rows = ["| model | optimizer | estimate | profiler | error |", "|---|---|---:|---:|---:|"]
    errors = []
    for name, factory, optimizer in HELDOUT:
        if only and only not in factory:
            continue
        started = time.perf_counter()
        guess = memory_accuracy.estimated(factory, optimizer, "cpu", module=module)
        real = memory_accuracy.profiled(factory, optimizer, None, module=module)
        errors.append(abs(guess - real) / real)
        rows.append(f"| {name} | {optimizer} | {guess / 2**20:.2f} MiB | {real / 2**20:.2f} MiB | "
                    f"{(guess - real) / real:+.2%} |")
        print(rows[-1], f"({time.perf_counter() - started:.1f} s)", file=sys.stderr, flush=True)
    summary = (f"{len(errors)} models: {sum(e <= 0.05 for e in errors)} within 5%, median error "
               f"{statistics.median(errors):.2%}, worst {max(errors):.2%}." if errors else "no rows")
    return "\n".join(rows) + f"\n\n{summary} {memory_accuracy._measured()} (`python benchmarks/memory_heldout3.py`).\n"


if __name__ == "__main__":
    print(table(sys.argv[1] if len(sys.argv) > 1 else None))
