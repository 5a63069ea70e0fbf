"""The held-out zoo of benchmarks/memory_zoo.py: small real training steps of many families, each a graphlint
target (a factory returning the model, its inputs and its loss). They were written as a user writes them, not
to suit the estimate, and none is changed to make the estimate agree: the estimator is.

Families: CNNs and ResNets, recurrent taggers and seq2seq (LSTM, GRU, RNN), encoder, decoder and encoder-decoder
transformers from `transformers` configs, mixture of experts, a diffusion UNet and a ViT written in plain torch
(no diffusers or timm here), a graph network, each form of activation checkpointing.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

import graphlint

VOCAB = 1000


def _seed():
    torch.manual_seed(0)


# ---------------------------------------------------------------- CNNs


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                      if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.short(x))


class ResNet(nn.Module):
    def __init__(self, widths=(32, 64, 128), classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU())
        layers, cin = [], widths[0]
        for i, w in enumerate(widths):
            layers += [BasicBlock(cin, w, 1 if i == 0 else 2), BasicBlock(w, w)]
            cin = w
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(cin, classes)

    def forward(self, x):
        return self.head(self.layers(self.stem(x)).mean((2, 3)))


def _images(batch=8, size=32, classes=10):
    return torch.randn(batch, 3, size, size), torch.randint(0, classes, (batch,))


def resnet():
    x, y = _images()
    return graphlint.Target(ResNet(), (x,), loss=lambda out: F.cross_entropy(out, y))


def vgg_like():
    cfg = [32, 32, "M", 64, 64, "M", 128, "M"]
    layers, cin = [], 3
    for v in cfg:
        if v == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            layers += [nn.Conv2d(cin, v, 3, padding=1), nn.ReLU(inplace=True)]
            cin = v
    model = nn.Sequential(*layers, nn.Flatten(), nn.Linear(128 * 4 * 4, 256), nn.ReLU(), nn.Dropout(0.5),
                          nn.Linear(256, 10))
    x, y = _images()
    return graphlint.Target(model, (x,), loss=lambda out: F.cross_entropy(out, y))


def mobilenet_like():
    def separable(cin, cout, stride):
        return nn.Sequential(nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False), nn.BatchNorm2d(cin),
                             nn.ReLU6(), nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU6())

    model = nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU6(),
                          separable(32, 64, 1), separable(64, 128, 2), separable(128, 128, 1),
                          separable(128, 256, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 10))
    x, y = _images(16, 64)
    return graphlint.Target(model, (x,), loss=lambda out: F.cross_entropy(out, y))


def conv1d_audio():
    model = nn.Sequential(nn.Conv1d(1, 32, 9, stride=4, padding=4), nn.GroupNorm(4, 32), nn.GELU(),
                          nn.Conv1d(32, 64, 5, stride=2, padding=2), nn.GroupNorm(8, 64), nn.GELU(),
                          nn.Conv1d(64, 64, 5, stride=2, padding=2), nn.GELU(), nn.AdaptiveMaxPool1d(1),
                          nn.Flatten(), nn.Linear(64, 12))
    x, y = torch.randn(8, 1, 8000), torch.randint(0, 12, (8,))
    return graphlint.Target(model, (x,), loss=lambda out: F.cross_entropy(out, y))


# ---------------------------------------------------------------- recurrent


class Tagger(nn.Module):
    def __init__(self, cell="lstm", hidden=128, layers=1, bidirectional=False, batch_first=True, tags=17):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 64)
        rnn = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}[cell]
        self.rnn = rnn(64, hidden, num_layers=layers, bidirectional=bidirectional, batch_first=batch_first)
        self.batch_first = batch_first
        self.out = nn.Linear(hidden * (2 if bidirectional else 1), tags)

    def forward(self, ids):
        x = self.embed(ids if self.batch_first else ids.t())
        h, _ = self.rnn(x)
        return self.out(h if self.batch_first else h.transpose(0, 1))


def _tagger(**kw):
    ids, tags = torch.randint(0, VOCAB, (16, 50)), torch.randint(0, 17, (16, 50))
    return graphlint.Target(Tagger(**kw), (ids,), loss=lambda out: F.cross_entropy(out.flatten(0, 1), tags.flatten()))


def lstm_tagger():
    return _tagger()


def bilstm_tagger_2_layers():
    return _tagger(layers=2, bidirectional=True)


def lstm_time_major():
    return _tagger(batch_first=False, hidden=96)


def lstm_tagger_bf16():
    # parameters and activations in bfloat16 (model.to(torch.bfloat16)): oneDNN runs it where the CPU supports bf16
    target = _tagger()
    target.model.to(torch.bfloat16)
    return target


def gru_tagger():
    return _tagger(cell="gru")


def rnn_tagger():
    return _tagger(cell="rnn", layers=2)


class Seq2Seq(nn.Module):
    def __init__(self, cell="lstm", hidden=128):
        super().__init__()
        rnn = {"lstm": nn.LSTM, "gru": nn.GRU}[cell]
        self.src = nn.Embedding(VOCAB, 64)
        self.tgt = nn.Embedding(VOCAB, 64)
        self.encoder = rnn(64, hidden, batch_first=True)
        self.decoder = rnn(64, hidden, batch_first=True)
        self.out = nn.Linear(hidden, VOCAB)

    def forward(self, src, tgt):
        _, state = self.encoder(self.src(src))
        h, _ = self.decoder(self.tgt(tgt), state)
        return self.out(h)


def _seq2seq(cell):
    src, tgt = torch.randint(0, VOCAB, (8, 40)), torch.randint(0, VOCAB, (8, 30))
    return graphlint.Target(Seq2Seq(cell), (src, tgt[:, :-1]),
                            loss=lambda out: F.cross_entropy(out.flatten(0, 1), tgt[:, 1:].flatten()))


def lstm_seq2seq():
    return _seq2seq("lstm")


def gru_seq2seq():
    return _seq2seq("gru")


# ---------------------------------------------------------------- transformers (the library)


def _lm(config_name, model_name, **config):
    import transformers

    _seed()
    model = getattr(transformers, model_name)(getattr(transformers, config_name)(**config))
    ids = torch.randint(0, config["vocab_size"], (4, 64))
    return model, (), {"input_ids": ids, "labels": ids}


def hf_gpt2():
    return _lm("GPT2Config", "GPT2LMHeadModel", n_layer=2, n_embd=128, n_head=4, vocab_size=VOCAB, n_positions=128)


def hf_llama():
    return _lm("LlamaConfig", "LlamaForCausalLM", hidden_size=128, intermediate_size=344, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=128)


def hf_mistral():
    return _lm("MistralConfig", "MistralForCausalLM", hidden_size=128, intermediate_size=256, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=1, vocab_size=VOCAB, max_position_embeddings=128)


def hf_mixtral_moe():
    return _lm("MixtralConfig", "MixtralForCausalLM", hidden_size=128, intermediate_size=192, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
               vocab_size=VOCAB, max_position_embeddings=128)


def hf_bert_mlm():
    from transformers import BertConfig, BertForMaskedLM

    _seed()
    model = BertForMaskedLM(BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                                       intermediate_size=512, vocab_size=VOCAB, max_position_embeddings=128))
    ids = torch.randint(0, VOCAB, (4, 64))
    labels = torch.where(torch.rand(4, 64) < 0.15, ids, torch.full_like(ids, -100))
    return model, (), {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def hf_t5():
    from transformers import T5Config, T5ForConditionalGeneration

    _seed()
    model = T5ForConditionalGeneration(T5Config(d_model=128, d_ff=256, d_kv=32, num_layers=2, num_heads=4,
                                                vocab_size=VOCAB, decoder_start_token_id=0))
    src, tgt = torch.randint(0, VOCAB, (4, 48)), torch.randint(0, VOCAB, (4, 32))
    return model, (), {"input_ids": src, "labels": tgt}


def hf_vit():
    from transformers import ViTConfig, ViTForImageClassification

    _seed()
    model = ViTForImageClassification(ViTConfig(image_size=32, patch_size=4, hidden_size=128, num_hidden_layers=2,
                                                num_attention_heads=4, intermediate_size=256, num_labels=10))
    x, y = _images()
    return model, (), {"pixel_values": x, "labels": y}


def _checkpointed_lm(factory, reentrant):
    model, args, kwargs = factory()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    model.train()
    return model, args, kwargs


def hf_gpt2_gradient_checkpointing():
    return _checkpointed_lm(hf_gpt2, False)


def hf_llama_gradient_checkpointing():
    return _checkpointed_lm(hf_llama, False)


def hf_llama_gradient_checkpointing_reentrant():
    return _checkpointed_lm(hf_llama, True)


# ---------------------------------------------------------------- plain-torch transformers


class Attention(nn.Module):
    def __init__(self, dim, heads, fused):
        super().__init__()
        self.heads, self.fused = heads, fused
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        if self.fused:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(c // self.heads)
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            y = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, dim=128, heads=4, fused=False):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, fused)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """A 4-block decoder; `how` is how its blocks are checkpointed."""

    def __init__(self, how="none", fused=False, depth=4, dim=128):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.position = nn.Parameter(torch.zeros(1, 128, dim))
        self.blocks = nn.Sequential(*(Block(dim, 4, fused) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, VOCAB, bias=False)
        self.how = how
        if how == "wrapper":
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

            self.blocks = nn.Sequential(*(checkpoint_wrapper(b) for b in self.blocks))

    def forward(self, ids):
        x = self.embed(ids) + self.position[:, : ids.shape[1]]
        if self.how == "sequential":
            x = checkpoint_sequential(self.blocks, 2, x, use_reentrant=False)
        elif self.how in ("non-reentrant", "reentrant"):
            for block in self.blocks:
                x = checkpoint(block, x, use_reentrant=self.how == "reentrant")
        elif self.how == "selective":
            for block in self.blocks:
                x = checkpoint(block, x, use_reentrant=False, context_fn=_save_matmuls)
        elif self.how == "function":
            for block in self.blocks:
                x = CheckpointFunction.apply(block, 1, x, *block.parameters())
        else:
            x = self.blocks(x)
        return self.head(self.norm(x))


def _save_matmuls():
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    def policy(ctx, op, *args, **kwargs):
        wanted = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default)
        return CheckpointPolicy.MUST_SAVE if op in wanted else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


class CheckpointFunction(torch.autograd.Function):
    """Recompute in backward, written by hand as guided-diffusion and many diffusion repositories write it."""

    @staticmethod
    def forward(ctx, run_function, length, *args):
        ctx.run_function = run_function
        ctx.input_tensors = list(args[:length])
        ctx.input_params = list(args[length:])
        with torch.no_grad():
            output_tensors = ctx.run_function(*ctx.input_tensors)
        return output_tensors

    @staticmethod
    def backward(ctx, *output_grads):
        ctx.input_tensors = [x.detach().requires_grad_(True) for x in ctx.input_tensors]
        with torch.enable_grad():
            shallow_copies = [x.view_as(x) for x in ctx.input_tensors]
            output_tensors = ctx.run_function(*shallow_copies)
        input_grads = torch.autograd.grad(output_tensors, ctx.input_tensors + ctx.input_params, output_grads,
                                          allow_unused=True)
        del ctx.input_tensors, ctx.input_params, output_tensors
        return (None, None) + input_grads


def _gpt(how, fused=False):
    _seed()
    ids = torch.randint(0, VOCAB, (8, 128))
    return graphlint.Target(GPT(how, fused), (ids[:, :-1],),
                            loss=lambda out: F.cross_entropy(out.flatten(0, 1), ids[:, 1:].flatten()))


def gpt():
    return _gpt("none")


def gpt_fused_attention():
    return _gpt("none", fused=True)


def gpt_checkpoint():
    return _gpt("non-reentrant")


def gpt_checkpoint_reentrant():
    return _gpt("reentrant")


def gpt_checkpoint_sequential():
    return _gpt("sequential")


def gpt_selective_checkpoint():
    return _gpt("selective")


def gpt_checkpoint_wrapper():
    return _gpt("wrapper")


def gpt_checkpoint_function():
    return _gpt("function")


def gpt_bf16():
    return _gpt("none", fused=True)


class ViT(nn.Module):
    def __init__(self, dim=128, depth=4, patch=4, image=32, classes=10):
        super().__init__()
        self.patches = nn.Conv2d(3, dim, patch, patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.position = nn.Parameter(torch.zeros(1, (image // patch) ** 2 + 1, dim))
        self.blocks = nn.ModuleList(nn.TransformerEncoderLayer(dim, 4, 2 * dim, dropout=0.1, batch_first=True,
                                                               norm_first=True) for _ in range(depth))
        self.head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, classes))

    def forward(self, x):
        x = self.patches(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(len(x), -1, -1), x], 1) + self.position
        for block in self.blocks:
            x = block(x)
        return self.head(x[:, 0])


def vit_encoder_layers():
    x, y = _images()
    return graphlint.Target(ViT(), (x,), loss=lambda out: F.cross_entropy(out, y))


class MoE(nn.Module):
    """Top-2 routing over 4 experts, tokens gathered per expert (the usual hand-written form)."""

    def __init__(self, dim=128, experts=4, top=2):
        super().__init__()
        self.router = nn.Linear(dim, experts)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(dim, 2 * dim), nn.SiLU(), nn.Linear(2 * dim, dim))
                                     for _ in range(experts))
        self.top = top

    def forward(self, x):
        flat = x.flatten(0, 1)
        weights, chosen = self.router(flat).softmax(-1).topk(self.top, -1)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            rows, slot = torch.where(chosen == e)
            out = out.index_add(0, rows, expert(flat[rows]) * weights[rows, slot, None])
        return out.view_as(x)


class MoEModel(nn.Module):
    def __init__(self, dim=128, depth=2):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.layers = nn.ModuleList(nn.ModuleDict({"norm": nn.LayerNorm(dim), "moe": MoE(dim)}) for _ in range(depth))
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = x + layer["moe"](layer["norm"](x))
        return self.head(x)


def moe():
    _seed()
    ids = torch.randint(0, VOCAB, (8, 64))
    return graphlint.Target(MoEModel(), (ids,), loss=lambda out: F.cross_entropy(out.flatten(0, 1), ids.flatten()))


# ---------------------------------------------------------------- diffusion UNet, GNN, MLPs


class ResBlock(nn.Module):
    def __init__(self, cin, cout, tdim):
        super().__init__()
        self.norm1, self.conv1 = nn.GroupNorm(8, cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.time = nn.Linear(tdim, cout)
        self.norm2, self.conv2 = nn.GroupNorm(8, cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x, t):
        h = self.conv1(F.silu(self.norm1(x))) + self.time(t)[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return h + self.skip(x)


class SpatialAttention(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.norm = nn.GroupNorm(8, channels)
        self.qkv = nn.Conv2d(channels, 3 * channels, 1)
        self.out = nn.Conv2d(channels, channels, 1)

    def forward(self, x):
        b, c, h, w = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, 3, c, h * w).unbind(1)
        weights = torch.softmax(q.transpose(1, 2) @ k / math.sqrt(c), dim=-1)
        return x + self.out((v @ weights.transpose(1, 2)).reshape(b, c, h, w))


class UNet(nn.Module):
    def __init__(self, base=32, tdim=128):
        super().__init__()
        self.tdim = tdim
        self.time = nn.Sequential(nn.Linear(tdim, tdim), nn.SiLU(), nn.Linear(tdim, tdim))
        self.inc = nn.Conv2d(3, base, 3, padding=1)
        self.down1, self.down2 = ResBlock(base, base, tdim), ResBlock(base, 2 * base, tdim)
        self.pool = nn.AvgPool2d(2)
        self.mid, self.attn = ResBlock(2 * base, 2 * base, tdim), SpatialAttention(2 * base)
        self.up2, self.up1 = ResBlock(4 * base, base, tdim), ResBlock(2 * base, base, tdim)
        self.outc = nn.Sequential(nn.GroupNorm(8, base), nn.SiLU(), nn.Conv2d(base, 3, 3, padding=1))

    def embed(self, steps):
        half = self.tdim // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, device=steps.device) / half)
        angles = steps[:, None].float() * freqs[None]
        return self.time(torch.cat([angles.sin(), angles.cos()], -1))

    def forward(self, x, steps):
        t = self.embed(steps)
        h1 = self.down1(self.inc(x), t)
        h2 = self.down2(self.pool(h1), t)
        m = self.attn(self.mid(self.pool(h2), t))
        u2 = self.up2(torch.cat([F.interpolate(m, scale_factor=2.0), h2], 1), t)
        u1 = self.up1(torch.cat([F.interpolate(u2, scale_factor=2.0), h1], 1), t)
        return self.outc(u1)


def diffusion_unet():
    _seed()
    x, noise, steps = torch.randn(4, 3, 32, 32), torch.randn(4, 3, 32, 32), torch.randint(0, 1000, (4,))
    return graphlint.Target(UNet(), (x, steps), loss=lambda out: F.mse_loss(out, noise))


class GCN(nn.Module):
    """Two graph convolutions by message passing over an edge list (index_select, index_add), PyG's way."""

    def __init__(self, cin=64, hidden=128, classes=7):
        super().__init__()
        self.lin1, self.lin2 = nn.Linear(cin, hidden), nn.Linear(hidden, classes)

    @staticmethod
    def propagate(x, edges, norm):
        messages = x.index_select(0, edges[0]) * norm[:, None]
        return torch.zeros_like(x).index_add(0, edges[1], messages)

    def forward(self, x, edges):
        degree = torch.zeros(x.shape[0], device=x.device).index_add(0, edges[1], torch.ones_like(edges[1],
                                                                                                dtype=x.dtype))
        norm = degree.clamp(min=1).rsqrt()[edges[0]] * degree.clamp(min=1).rsqrt()[edges[1]]
        h = F.dropout(F.relu(self.propagate(self.lin1(x), edges, norm)), 0.5, self.training)
        return self.propagate(self.lin2(h), edges, norm)


def gcn():
    _seed()
    nodes, edges = 2000, torch.randint(0, 2000, (2, 16000))
    x, y = torch.randn(nodes, 64), torch.randint(0, 7, (nodes,))
    return graphlint.Target(GCN(), (x, edges), loss=lambda out: F.cross_entropy(out, y))


def mlp_mse():
    _seed()
    model = nn.Sequential(nn.Linear(256, 512), nn.Tanh(), nn.Linear(512, 512), nn.Tanh(), nn.Linear(512, 32))
    x, y = torch.randn(256, 256), torch.randn(256, 32)
    return graphlint.Target(model, (x,), loss=lambda out: F.mse_loss(out, y))


def autoencoder_bce():
    _seed()
    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 32), nn.ReLU(), nn.Linear(32, 256),
                          nn.ReLU(), nn.Linear(256, 784))
    x = torch.rand(128, 784)
    return graphlint.Target(model, (x,), loss=lambda out: F.binary_cross_entropy_with_logits(out, x))


# (row name, factory, optimizer, autocast): the benchmark's rows.
ZOO = [
    ("ResNet (basic blocks)", "resnet", "sgd-momentum", None),
    ("VGG-like CNN, dropout", "vgg_like", "adam", None),
    ("MobileNet-like, depthwise", "mobilenet_like", "adamw", None),
    ("1-D conv audio, group norm", "conv1d_audio", "adamw", None),
    ("LSTM tagger", "lstm_tagger", "adamw", None),
    ("BiLSTM tagger, 2 layers", "bilstm_tagger_2_layers", "adamw", None),
    ("LSTM tagger, time-major", "lstm_time_major", "sgd", None),
    ("LSTM tagger, bfloat16 parameters", "lstm_tagger_bf16", "adamw", None),
    ("GRU tagger", "gru_tagger", "adamw", None),
    ("RNN tagger, 2 layers", "rnn_tagger", "adam", None),
    ("LSTM seq2seq", "lstm_seq2seq", "adamw", None),
    ("GRU seq2seq", "gru_seq2seq", "sgd-momentum", None),
    ("GPT-2 (transformers)", "hf_gpt2", "adamw", None),
    ("Llama (transformers)", "hf_llama", "adamw", None),
    ("Mistral (transformers)", "hf_mistral", "sgd", None),
    ("Mixtral MoE (transformers)", "hf_mixtral_moe", "adamw", None),
    ("BERT MLM (transformers)", "hf_bert_mlm", "adamw", None),
    ("T5 (transformers)", "hf_t5", "adam", None),
    ("ViT (transformers)", "hf_vit", "adamw", None),
    ("GPT-2, gradient_checkpointing_enable", "hf_gpt2_gradient_checkpointing", "adamw", None),
    ("Llama, gradient_checkpointing_enable", "hf_llama_gradient_checkpointing", "adamw", None),
    ("Llama, gradient checkpointing, reentrant", "hf_llama_gradient_checkpointing_reentrant", "adamw", None),
    ("GPT, hand-written attention", "gpt", "adamw", None),
    ("GPT, fused attention", "gpt_fused_attention", "none", None),
    ("GPT, checkpoint (non-reentrant)", "gpt_checkpoint", "adamw", None),
    ("GPT, checkpoint (reentrant)", "gpt_checkpoint_reentrant", "adamw", None),
    ("GPT, checkpoint_sequential", "gpt_checkpoint_sequential", "adamw", None),
    ("GPT, selective checkpoint policy", "gpt_selective_checkpoint", "adamw", None),
    ("GPT, checkpoint_wrapper", "gpt_checkpoint_wrapper", "adamw", None),
    ("GPT, autograd.Function recompute", "gpt_checkpoint_function", "adamw", None),
    ("GPT, fused attention, bf16 autocast", "gpt_bf16", "adamw", "bf16"),
    ("ViT (TransformerEncoderLayer)", "vit_encoder_layers", "adamw", None),
    ("MoE, top-2 of 4 experts", "moe", "adamw", None),
    ("Diffusion UNet", "diffusion_unet", "adamw", None),
    ("GCN, message passing", "gcn", "adam", None),
    ("MLP, MSE", "mlp_mse", "sgd", None),
    ("Autoencoder, BCE", "autoencoder_bce", "none", None),
]

