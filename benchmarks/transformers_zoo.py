"""Real `transformers` architectures as graphlint targets, each built from its own configuration class shrunk to a
small size (two layers, 64 wide, random weights, no downloads): the sweep `benchmarks/compile_agreement.py`
judges GL301/GL302 on against plain torch.compile.

One factory per architecture (`benchmarks/transformers_zoo.py:llama`); `ARCHITECTURES` lists them. Text models
take `input_ids` of batch 2 and length 16, encoder-decoders `decoder_input_ids` too, vision models 32x32 images,
speech models their features.
"""

from __future__ import annotations

import torch
import transformers
from transformers import CONFIG_MAPPING

# Every size a configuration may name, shrunk; a configuration takes the names it has and ignores the others.
SMALL = {
    "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128, "max_position_embeddings": 64,
    "n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 64, "n_inner": 128, "n_ctx": 64,
    "d_model": 64, "d_ff": 128, "d_kv": 16, "num_layers": 2, "num_heads": 4, "num_decoder_layers": 2,
    "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
    "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "ffn_dim": 128, "word_embed_proj_dim": 64,
    "num_local_experts": 4, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 64, "rotary_dim": 8, "embedding_size": 64, "dim": 64, "hidden_dim": 128,
    "n_heads": 4, "n_layers": 2, "attention_window": 16, "image_size": 32, "patch_size": 8,
    "num_mel_bins": 16, "max_source_positions": 32, "max_target_positions": 64, "decoder_start_token_id": 0,
    "pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0,
}


def _config(kind: str, shrink: bool = True, **extra):
    config_class = type(CONFIG_MAPPING[kind]())
    defaults = config_class()
    # A size the configuration derives (a property without a setter, Falcon's `head_dim`) is left to it.
    settable = {name for name in SMALL if hasattr(defaults, name)
                and not isinstance(getattr(config_class, name, None), property)}
    kept = {name: SMALL[name] for name in settable} if shrink else {}
    return config_class(**{**kept, **extra})


def _text(kind: str, auto=transformers.AutoModelForCausalLM, **extra):
    torch.manual_seed(0)
    model = auto.from_config(_config(kind, **extra))
    return model, (), {"input_ids": torch.randint(1, 128, (2, 16))}


def _seq2seq(kind: str, **extra):
    torch.manual_seed(0)
    model = transformers.AutoModelForSeq2SeqLM.from_config(_config(kind, **extra))
    return model, (), {"input_ids": torch.randint(1, 128, (2, 16)), "decoder_input_ids": torch.randint(1, 128, (2, 8))}


def _vision(kind: str, shrink: bool = True, **extra):
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(_config(kind, shrink, **extra))
    return model, (), {"pixel_values": torch.randn(2, 3, 32, 32)}


def gpt2(): return _text("gpt2")
def gpt_neo(): return _text("gpt_neo", attention_types=[[["global", "local"], 1]], window_size=8)
def gptj(): return _text("gptj")
def gpt_neox(): return _text("gpt_neox")
def gpt_bigcode(): return _text("gpt_bigcode")
def llama(): return _text("llama")
def mistral(): return _text("mistral")
def mixtral(): return _text("mixtral")
def qwen2(): return _text("qwen2")
def qwen2_moe(): return _text("qwen2_moe")
def qwen3(): return _text("qwen3")
def phi(): return _text("phi")
def phi3(): return _text("phi3")
def gemma(): return _text("gemma")
def gemma2(): return _text("gemma2")
def falcon(): return _text("falcon")
def bloom(): return _text("bloom")
def opt(): return _text("opt")
def codegen(): return _text("codegen")
def stablelm(): return _text("stablelm")
def olmo(): return _text("olmo")
def starcoder2(): return _text("starcoder2")
def mpt(): return _text("mpt", d_model=64, n_heads=4, n_layers=2, expansion_ratio=2, max_seq_len=64)
def bert(): return _text("bert", transformers.AutoModel)
def roberta(): return _text("roberta", transformers.AutoModel, max_position_embeddings=80)
def distilbert(): return _text("distilbert", transformers.AutoModel)
def albert(): return _text("albert", transformers.AutoModel)
def electra(): return _text("electra", transformers.AutoModel)
def deberta_v2(): return _text("deberta-v2", transformers.AutoModel)
def t5(): return _seq2seq("t5")
def bart(): return _seq2seq("bart")
def vit(): return _vision("vit")
def dinov2(): return _vision("dinov2")
def convnext(): return _vision("convnext", False, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], image_size=32)
def resnet(): return _vision("resnet", False, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], embedding_size=16)
def swin(): return _vision("swin", False, image_size=32, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=2,
                           patch_size=4)


def whisper():
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(_config("whisper"))
    return model, (), {"input_features": torch.randn(2, 16, 64), "decoder_input_ids": torch.randint(1, 128, (2, 8))}


def wav2vec2():
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(_config(
        "wav2vec2", conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4))
    return model, (torch.randn(2, 800),), {}


ARCHITECTURES = [name for name, value in list(globals().items())
                 if callable(value) and not name.startswith("_") and value.__module__ == __name__]
