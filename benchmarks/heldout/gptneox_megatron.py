"""Written in the style of EleutherAI's gpt-neox (megatron/model/transformer.py ParallelSelfAttention, with
megatron/model/fused_softmax.py's FusedScaleMaskSoftmax on its PyTorch path).

Sequence-first layout [sq, b, np, hn] from one fused `query_key_value` projection split per head, rotary
embeddings on the first `rotary_ndims` channels, scores from `torch.baddbmm` into a preallocated
`torch.empty` with `beta=0.0, alpha=1.0 / self.norm_factor`, a `scale_mask_softmax` module whose torch path
masks in place with `attention_scores.masked_fill_(mask, -10000.0)` (the mask built by `torch.tril`), an
attention dropout, and `torch.bmm(attention_probs, value_layer.transpose(0, 1))`; parallel residual blocks.
"""

import math

import torch
from torch import nn

STYLE = "GPT-NeoX ParallelSelfAttention (baddbmm, FusedScaleMaskSoftmax torch path)"
REPOSITORY = "EleutherAI/gpt-neox"
BACKWARD_FAILS = False


def attention_mask_func(attention_scores, ltor_mask):
    attention_scores.masked_fill_(ltor_mask, -10000.0)
    return attention_scores


class FusedScaleMaskSoftmax(nn.Module):
    """The fallback path: no fused kernel on CPU."""

    def __init__(self, mask_func, softmax_in_fp32=True, scale=None):
        super().__init__()
        self.mask_func = mask_func
        self.softmax_in_fp32 = softmax_in_fp32
        self.scale = scale

    def forward(self, input, mask):
        return self.forward_torch_softmax(input, mask)

    def forward_torch_softmax(self, input, mask):
        if self.softmax_in_fp32:
            input = input.float()
        if self.scale is not None:
            input = input * self.scale
        mask_output = self.mask_func(input, mask) if mask is not None else input
        probs = torch.nn.Softmax(dim=-1)(mask_output)
        return probs


class RotaryEmbedding(nn.Module):
    def __init__(self, dim, base=10000):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))
        self.register_buffer("inv_freq", inv_freq)

    def forward(self, x, seq_dim=0):
        seq_len = x.shape[seq_dim]
        t = torch.arange(seq_len, device=x.device).type_as(self.inv_freq)
        freqs = torch.einsum("i,j->ij", t, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos()[:, None, None, :], emb.sin()[:, None, None, :]


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=x1.ndim - 1)


def apply_rotary_pos_emb(q, k, cos, sin):
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


class ParallelSelfAttention(nn.Module):
    def __init__(self, hidden_size, num_attention_heads, rotary_pct=0.25, attention_dropout=0.1):
        super().__init__()
        self.hidden_size_per_partition = hidden_size
        self.num_attention_heads_per_partition = num_attention_heads
        self.hidden_size_per_attention_head = hidden_size // num_attention_heads
        self.query_key_value = nn.Linear(hidden_size, 3 * hidden_size)
        self.norm_factor = math.sqrt(self.hidden_size_per_attention_head)
        self.rotary_ndims = int(self.hidden_size_per_attention_head * rotary_pct)
        self.rotary_emb = RotaryEmbedding(self.rotary_ndims)
        self.scale_mask_softmax = FusedScaleMaskSoftmax(mask_func=attention_mask_func)
        self.attention_dropout = nn.Dropout(attention_dropout)
        self.dense = nn.Linear(hidden_size, hidden_size)

    def attention(self, query_layer, key_layer, value_layer, attention_mask):
        # [b, np, sq, sk]
        output_size = (query_layer.size(1), query_layer.size(2), query_layer.size(0), key_layer.size(0))
        # [sq, b, np, hn] -> [sq, b * np, hn]
        query_layer = query_layer.view(output_size[2], output_size[0] * output_size[1], -1)
        key_layer = key_layer.view(output_size[3], output_size[0] * output_size[1], -1)

        # preallocating result tensor: [b * np, sq, sk]
        matmul_result = torch.empty(output_size[0] * output_size[1], output_size[2], output_size[3],
                                    dtype=query_layer.dtype, device=query_layer.device)
        matmul_result = torch.baddbmm(matmul_result, query_layer.transpose(0, 1),
                                      key_layer.transpose(0, 1).transpose(1, 2),
                                      beta=0.0, alpha=(1.0 / self.norm_factor))
        attention_scores = matmul_result.view(*output_size)

        attention_probs = self.scale_mask_softmax(attention_scores, attention_mask)
        attention_probs = self.attention_dropout(attention_probs)

        # context layer shape: [b, np, sq, hn]
        output_size = (value_layer.size(1), value_layer.size(2), query_layer.size(0), value_layer.size(3))
        value_layer = value_layer.view(value_layer.size(0), output_size[0] * output_size[1], -1)
        attention_probs = attention_probs.view(output_size[0] * output_size[1], output_size[2], -1)
        context_layer = torch.bmm(attention_probs.to(value_layer.dtype), value_layer.transpose(0, 1))
        context_layer = context_layer.view(*output_size)
        return context_layer

    def forward(self, hidden_states, attention_mask):
        mixed_x_layer = self.query_key_value(hidden_states)
        new_tensor_shape = mixed_x_layer.size()[:-1] + (
            self.num_attention_heads_per_partition, 3 * self.hidden_size_per_attention_head)
        mixed_x_layer = mixed_x_layer.view(*new_tensor_shape)
        query_layer, key_layer, value_layer = torch.split(mixed_x_layer, self.hidden_size_per_attention_head, dim=-1)

        query_rot, query_pass = query_layer[..., : self.rotary_ndims], query_layer[..., self.rotary_ndims:]
        key_rot, key_pass = key_layer[..., : self.rotary_ndims], key_layer[..., self.rotary_ndims:]
        cos, sin = self.rotary_emb(value_layer, seq_dim=0)
        query_layer, key_layer = apply_rotary_pos_emb(query_rot, key_rot, cos, sin)
        query_layer = torch.cat((query_layer, query_pass), dim=-1)
        key_layer = torch.cat((key_layer, key_pass), dim=-1)

        context_layer = self.attention(query_layer, key_layer, value_layer, attention_mask)
        # [b, np, sq, hn] --> [sq, b, np, hn]
        context_layer = context_layer.permute(2, 0, 1, 3).contiguous()
        new_context_layer_shape = context_layer.size()[:-2] + (self.hidden_size_per_partition,)
        context_layer = context_layer.view(*new_context_layer_shape)
        return self.dense(context_layer)


class ParallelTransformerLayer(nn.Module):
    def __init__(self, hidden_size, heads):
        super().__init__()
        self.input_layernorm = nn.LayerNorm(hidden_size)
        self.post_attention_layernorm = nn.LayerNorm(hidden_size)
        self.attention = ParallelSelfAttention(hidden_size, heads)
        self.mlp = nn.Sequential(nn.Linear(hidden_size, 4 * hidden_size), nn.GELU(), nn.Linear(4 * hidden_size, hidden_size))

    def forward(self, x, attention_mask):
        # gpt-j style parallel residual: x + attn(ln1(x)) + mlp(ln2(x))
        attention_output = self.attention(self.input_layernorm(x), attention_mask)
        mlp_output = self.mlp(self.post_attention_layernorm(x))
        return x + attention_output + mlp_output


class GPTNeoX(nn.Module):
    def __init__(self, vocab=64, hidden_size=32, heads=4, layers=2, max_len=16):
        super().__init__()
        self.embed_in = nn.Embedding(vocab, hidden_size)
        self.layers = nn.ModuleList([ParallelTransformerLayer(hidden_size, heads) for _ in range(layers)])
        self.final_norm = nn.LayerNorm(hidden_size)
        self.embed_out = nn.Linear(hidden_size, vocab, bias=False)
        mask = torch.tril(torch.ones((1, max_len, max_len))).view(1, 1, max_len, max_len)
        self.register_buffer("causal_mask", mask < 0.5, persistent=False)

    def forward(self, input_ids):
        seq = input_ids.shape[1]
        x = self.embed_in(input_ids).transpose(0, 1).contiguous()  # [s, b, h]
        mask = self.causal_mask[:, :, :seq, :seq]
        for layer in self.layers:
            x = layer(x, mask)
        return self.embed_out(self.final_norm(x)).transpose(0, 1)


def make_model():
    torch.manual_seed(0)
    return GPTNeoX(), (torch.randint(0, 64, (2, 12)),)
