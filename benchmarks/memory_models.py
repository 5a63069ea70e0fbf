"""Small real models for the memory estimate's accuracy check (benchmarks/memory_accuracy.py and
tests/test_memory_accuracy.py): an MLP, a CNN with batch norm, a ViT written in plain torch, and GPT-2 and Llama
built by `transformers` from small configs with random weights. Each function is a graphlint target.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import graphlint


def mlp():
    model = nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 10))
    x = torch.randn(128, 512)
    y = torch.randint(0, 10, (128,))
    return graphlint.Target(model, (x,), loss=lambda out: F.cross_entropy(out, y))


def cnn():
    def stage(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                             nn.MaxPool2d(2))

    model = nn.Sequential(stage(3, 32), stage(32, 64), stage(64, 128), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(128, 10))
    x = torch.randn(16, 3, 32, 32)
    y = torch.randint(0, 10, (16,))
    return graphlint.Target(model, (x,), loss=lambda out: F.cross_entropy(out, y))


class ViTBlock(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(attended.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    def __init__(self, image: int = 32, patch: int = 4, dim: int = 192, depth: int = 4, heads: int = 3,
                 classes: int = 10):
        super().__init__()
        self.patches = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.position = nn.Parameter(torch.zeros(1, (image // patch) ** 2 + 1, dim))
        self.blocks = nn.ModuleList(ViTBlock(dim, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, images):
        x = self.patches(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.position
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x[:, 0]))


def vit():
    x = torch.randn(16, 3, 32, 32)
    y = torch.randint(0, 10, (16,))
    return graphlint.Target(ViT(), (x,), loss=lambda out: F.cross_entropy(out, y))


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=2000, n_positions=128)
    ids = torch.randint(0, 2000, (4, 128))
    return GPT2LMHeadModel(config), (), {"input_ids": ids, "labels": ids}


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=128, intermediate_size=352, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=2000, max_position_embeddings=256)
    ids = torch.randint(0, 2000, (4, 128))
    return LlamaForCausalLM(config), (), {"input_ids": ids, "labels": ids}


MODELS = {"MLP": mlp, "CNN with batch norm": cnn, "ViT": vit, "GPT-2 (transformers)": gpt2,
          "Llama (transformers)": llama}
