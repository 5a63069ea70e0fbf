"""Small training steps whose memory on the meta device depends on graphlint's stand-ins for what meta does not
do itself: autocast regions in the forward, the attention inside `nn.MultiheadAttention`, the CPU's fused
attention kernel and its layouts, and fused attention under a non-reentrant checkpoint. Each is a graphlint
target; tests/test_memory_standins.py checks them against PyTorch's CPU memory profiler.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import graphlint

VOCAB = 512


class AutocastMLP(nn.Module):
    """A residual MLP whose forward runs under CPU autocast, written in one of the three ways users write it."""

    def __init__(self, how: str, dim: int = 256, depth: int = 4):
        super().__init__()
        self.how = how
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 4 * dim), nn.GELU(),
                                                  nn.Linear(4 * dim, dim)) for _ in range(depth))
        self.head = nn.Linear(dim, 10)

    def layers(self, x):
        for block in self.blocks:
            x = x + block(x)
        return self.head(x).softmax(-1)

    def forward(self, x):
        if self.how == "with":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return self.layers(x)
        if self.how == "amp":
            with torch.amp.autocast("cpu", dtype=torch.bfloat16):
                return self.layers(x)
        return self.decorated(x)

    @torch.autocast("cpu", dtype=torch.bfloat16)
    def decorated(self, x):
        return self.layers(x)


def _autocast_mlp(how):
    x, y = torch.randn(64, 32, 256), torch.randn(64, 32, 10)
    return graphlint.Target(AutocastMLP(how), (x,), loss=lambda out: (out - y).square().mean())


def autocast_with():
    return _autocast_mlp("with")


def autocast_decorator():
    return _autocast_mlp("decorator")


def autocast_amp():
    return _autocast_mlp("amp")


class EncoderViT(nn.Module):
    """A ViT of `nn.TransformerEncoderLayer`, without dropout (so the CPU runs its fused attention)."""

    def __init__(self, dim=128, depth=4, patch=4, image=32, classes=10):
        super().__init__()
        self.patches = nn.Conv2d(3, dim, patch, patch)
        self.position = nn.Parameter(torch.zeros(1, (image // patch) ** 2, dim))
        self.blocks = nn.ModuleList(nn.TransformerEncoderLayer(dim, 4, 2 * dim, dropout=0.0, batch_first=True,
                                                               norm_first=True) for _ in range(depth))
        self.head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, classes))

    def forward(self, x):
        x = self.patches(x).flatten(2).transpose(1, 2) + self.position
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(1))


def encoder_vit():
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    return graphlint.Target(EncoderViT(), (x,), loss=lambda out: F.cross_entropy(out, y))


class AttentionStack(nn.Module):
    """`nn.MultiheadAttention` called directly, with or without the attention weights."""

    def __init__(self, need_weights: bool, dim=128, depth=3):
        super().__init__()
        self.need_weights = need_weights
        self.layers = nn.ModuleList(nn.MultiheadAttention(dim, 4, batch_first=True) for _ in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x, x, x, need_weights=self.need_weights)[0]
        return x


def _attention_stack(need_weights):
    x, y = torch.randn(8, 96, 128), torch.randn(8, 96, 128)
    return graphlint.Target(AttentionStack(need_weights), (x,), loss=lambda out: (out - y).square().mean())


def mha_without_weights():
    return _attention_stack(False)


def mha_with_weights():
    return _attention_stack(True)


class Decoder(nn.Module):
    """A decoder whose attention builds its queries by concatenation (partial rotary embeddings, as Phi and GPT-NeoX
    do), so they are laid out (batch, heads, positions, features) and the CPU's kernel returns its output so too;
    `checkpointed`: each attention call under non-reentrant `torch.utils.checkpoint`."""

    def __init__(self, checkpointed=False, dim=128, heads=4, depth=3):
        super().__init__()
        self.heads, self.checkpointed = heads, checkpointed
        self.embed = nn.Embedding(VOCAB, dim)
        self.qkv = nn.ModuleList(nn.Linear(dim, 3 * dim) for _ in range(depth))
        self.out = nn.ModuleList(nn.Linear(dim, dim) for _ in range(depth))
        self.head = nn.Linear(dim, VOCAB)

    def attend(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def forward(self, ids):
        x = self.embed(ids)
        b, t, c = x.shape
        for qkv, out in zip(self.qkv, self.out, strict=True):
            q, k, v = qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
            half = c // self.heads // 2
            q = torch.cat([q[..., :half] * 0.5, q[..., half:]], -1)  # the rotated half and the rest
            k = torch.cat([k[..., :half] * 0.5, k[..., half:]], -1)
            y = checkpoint(self.attend, q, k, v, use_reentrant=False) if self.checkpointed else self.attend(q, k, v)
            x = x + out(y.transpose(1, 2).contiguous().view(b, t, c))
        return self.head(x)


def _decoder(checkpointed):
    ids = torch.randint(0, VOCAB, (8, 128))
    return graphlint.Target(Decoder(checkpointed), (ids,),
                            loss=lambda out: F.cross_entropy(out.flatten(0, 1), ids.flatten()))


def decoder_concatenated_queries():
    return _decoder(False)


def decoder_checkpointed_attention():
    return _decoder(True)


def frozen_encoder():
    """The ViT above frozen and in eval mode but for its head: `nn.TransformerEncoderLayer` then takes its fast
    path on CPU (`torch._transformer_encoder_layer_fwd`), which it never takes on the meta device."""
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    model = EncoderViT()
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name.startswith("head."))
    model.patches.eval()
    model.blocks.eval()
    return graphlint.Target(model, (x,), loss=lambda out: F.cross_entropy(out, y))


def _lm(config_name, model_name, **config):
    import transformers

    torch.manual_seed(0)
    model = getattr(transformers, model_name)(getattr(transformers, config_name)(**config))
    ids = torch.randint(0, config["vocab_size"], (4, 64))
    return model, (), {"input_ids": ids, "labels": ids}


def hf_gpt_neox():
    """transformers' GPT-NeoX: rotary embeddings on a quarter of each head, the queries concatenated."""
    return _lm("GPTNeoXConfig", "GPTNeoXForCausalLM", num_hidden_layers=2, hidden_size=128, num_attention_heads=4,
               intermediate_size=512, vocab_size=1000, max_position_embeddings=128, rotary_pct=0.25,
               attn_implementation="sdpa")


def hf_phi():
    """transformers' Phi: rotary embeddings on half of each head, likewise."""
    return _lm("PhiConfig", "PhiForCausalLM", num_hidden_layers=2, hidden_size=128, num_attention_heads=4,
               intermediate_size=512, vocab_size=1000, max_position_embeddings=128, partial_rotary_factor=0.5,
               attn_implementation="sdpa")
