"""Targets for the many-targets scenario: distinct small models, each in its own folder with its own
`layers.py` (as model repositories are laid out), and small Hugging Face `transformers` models.

    write_small_targets(folder, count) -> target strings
    write_transformers_targets(folder) -> target strings
"""

from __future__ import annotations

from pathlib import Path

SMALL_LAYERS = '''
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim={dim}):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.mlp = nn.Sequential(nn.Linear(dim, {hidden}), nn.GELU(), nn.Linear({hidden}, dim))

    def forward(self, x):
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        x = x + {attention}
        return x + self.mlp(x)
'''
SMALL_MODEL = '''
import torch
from torch import nn

from layers import Block


def make():
    model = nn.Sequential(*(Block() for _ in range({layers})))
    return model, (torch.randn(2, 16, {dim}),)
'''
ATTENTIONS = ("torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v",
              "torch.nn.functional.scaled_dot_product_attention(q, k, v)")

TRANSFORMERS = '''
import torch
from transformers import AutoModel, AutoModelForCausalLM, BertConfig, GPT2Config, LlamaConfig

CONFIGS = {
    "gpt2": lambda: GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64),
    "llama": lambda: LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=128),
    "bert": lambda: BertConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                               vocab_size=128),
}


def build(family, implementation):
    auto = AutoModel if family == "bert" else AutoModelForCausalLM
    model = auto.from_config(CONFIGS[family](), attn_implementation=implementation)
    return model, (), {"input_ids": torch.randint(0, 128, (2, 16))}


def gpt2_eager(): return build("gpt2", "eager")
def gpt2_sdpa(): return build("gpt2", "sdpa")
def llama_eager(): return build("llama", "eager")
def llama_sdpa(): return build("llama", "sdpa")
def bert_eager(): return build("bert", "eager")
def bert_sdpa(): return build("bert", "sdpa")
'''
TRANSFORMERS_FACTORIES = ("gpt2_eager", "gpt2_sdpa", "llama_eager", "llama_sdpa", "bert_eager", "bert_sdpa")


def write_small_targets(folder: Path, count: int = 12) -> list[str]:
    targets = []
    for number in range(count):
        where = folder / f"model_{number}"
        where.mkdir(parents=True)
        dim = 32 + 8 * (number % 4)
        (where / "layers.py").write_text(SMALL_LAYERS.format(
            dim=dim, hidden=4 * dim, attention=ATTENTIONS[number % 2]), encoding="utf-8")
        (where / "model.py").write_text(SMALL_MODEL.format(layers=2 + number % 3, dim=dim), encoding="utf-8")
        targets.append(f"{where / 'model.py'}:make")
    return targets


def write_transformers_targets(folder: Path) -> list[str]:
    path = folder / "hf_models.py"
    path.write_text(TRANSFORMERS, encoding="utf-8")
    return [f"{path}:{name}" for name in TRANSFORMERS_FACTORIES]
