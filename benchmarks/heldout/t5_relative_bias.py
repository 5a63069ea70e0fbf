"""Written in the style of T5's attention as ported from Mesh TensorFlow to PyTorch (google-research/
text-to-text-transfer-transformer's mesh layers; the PyTorch ports keep its shape).

No score scaling (T5 folds 1/sqrt(d) into the initialisation), a learned relative position bias from
`_relative_position_bucket` (log-spaced buckets, bidirectional in the encoder) computed by the first layer and
shared by the others, the padding mask added to the bias as `(1 - mask) * -1e9`, `scores += position_bias`,
`F.softmax(scores.float(), dim=-1).type_as(scores)`, dropout, `torch.matmul(attn_weights, value_states)`;
shape/unshape helpers and T5's RMS LayerNorm and ReLU feed-forward.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

STYLE = "T5 relative-position-bias attention (Mesh TF port)"
REPOSITORY = "google-research/text-to-text-transfer-transformer"
BACKWARD_FAILS = False


class T5LayerNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states


class T5Attention(nn.Module):
    def __init__(self, d_model, d_kv, n_heads, has_relative_attention_bias=False, num_buckets=8, max_distance=16,
                 dropout_rate=0.1):
        super().__init__()
        self.has_relative_attention_bias = has_relative_attention_bias
        self.relative_attention_num_buckets = num_buckets
        self.relative_attention_max_distance = max_distance
        self.d_model = d_model
        self.key_value_proj_dim = d_kv
        self.n_heads = n_heads
        self.dropout = dropout_rate
        self.inner_dim = self.n_heads * self.key_value_proj_dim
        self.q = nn.Linear(self.d_model, self.inner_dim, bias=False)
        self.k = nn.Linear(self.d_model, self.inner_dim, bias=False)
        self.v = nn.Linear(self.d_model, self.inner_dim, bias=False)
        self.o = nn.Linear(self.inner_dim, self.d_model, bias=False)
        if self.has_relative_attention_bias:
            self.relative_attention_bias = nn.Embedding(self.relative_attention_num_buckets, self.n_heads)

    @staticmethod
    def _relative_position_bucket(relative_position, num_buckets=32, max_distance=128):
        relative_buckets = 0
        num_buckets //= 2
        relative_buckets += (relative_position > 0).to(torch.long) * num_buckets
        relative_position = torch.abs(relative_position)
        max_exact = num_buckets // 2
        is_small = relative_position < max_exact
        relative_position_if_large = max_exact + (
            torch.log(relative_position.float() / max_exact) / math.log(max_distance / max_exact)
            * (num_buckets - max_exact)).to(torch.long)
        relative_position_if_large = torch.min(relative_position_if_large,
                                               torch.full_like(relative_position_if_large, num_buckets - 1))
        relative_buckets += torch.where(is_small, relative_position, relative_position_if_large)
        return relative_buckets

    def compute_bias(self, query_length, key_length, device=None):
        context_position = torch.arange(query_length, dtype=torch.long, device=device)[:, None]
        memory_position = torch.arange(key_length, dtype=torch.long, device=device)[None, :]
        relative_position = memory_position - context_position
        relative_position_bucket = self._relative_position_bucket(
            relative_position, num_buckets=self.relative_attention_num_buckets,
            max_distance=self.relative_attention_max_distance)
        values = self.relative_attention_bias(relative_position_bucket)
        values = values.permute([2, 0, 1]).unsqueeze(0)  # shape (1, num_heads, query_length, key_length)
        return values

    def forward(self, hidden_states, mask=None, position_bias=None):
        batch_size, seq_length = hidden_states.shape[:2]

        def shape(states):
            return states.view(batch_size, -1, self.n_heads, self.key_value_proj_dim).transpose(1, 2)

        def unshape(states):
            return states.transpose(1, 2).contiguous().view(batch_size, -1, self.inner_dim)

        query_states = shape(self.q(hidden_states))
        key_states = shape(self.k(hidden_states))
        value_states = shape(self.v(hidden_states))

        # compute scores; equivalent of tf.einsum("bnqd,bnkd->bnqk"), no scaling as in Mesh TensorFlow
        scores = torch.matmul(query_states, key_states.transpose(3, 2))

        if position_bias is None:
            position_bias = self.compute_bias(seq_length, seq_length, device=scores.device)
            if mask is not None:
                position_bias = position_bias + mask  # (batch_size, n_heads, seq_length, key_length)

        scores += position_bias
        attn_weights = F.softmax(scores.float(), dim=-1).type_as(scores)
        attn_weights = F.dropout(attn_weights, p=self.dropout, training=self.training)

        attn_output = unshape(torch.matmul(attn_weights, value_states))
        attn_output = self.o(attn_output)
        return attn_output, position_bias


class T5Block(nn.Module):
    def __init__(self, d_model, d_kv, n_heads, d_ff, has_relative_attention_bias):
        super().__init__()
        self.SelfAttention = T5Attention(d_model, d_kv, n_heads, has_relative_attention_bias)
        self.layer_norm = T5LayerNorm(d_model)
        self.ff_norm = T5LayerNorm(d_model)
        self.wi = nn.Linear(d_model, d_ff, bias=False)
        self.wo = nn.Linear(d_ff, d_model, bias=False)
        self.dropout = nn.Dropout(0.1)

    def forward(self, hidden_states, mask, position_bias):
        attention_output, position_bias = self.SelfAttention(self.layer_norm(hidden_states), mask=mask,
                                                             position_bias=position_bias)
        hidden_states = hidden_states + self.dropout(attention_output)
        forwarded = self.wo(self.dropout(F.relu(self.wi(self.ff_norm(hidden_states)))))
        return hidden_states + self.dropout(forwarded), position_bias


class T5Encoder(nn.Module):
    def __init__(self, vocab=64, d_model=32, d_kv=8, n_heads=4, d_ff=64, num_layers=2):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, d_model)
        self.block = nn.ModuleList([T5Block(d_model, d_kv, n_heads, d_ff, has_relative_attention_bias=bool(i == 0))
                                    for i in range(num_layers)])
        self.final_layer_norm = T5LayerNorm(d_model)

    def forward(self, input_ids, attention_mask):
        hidden_states = self.embed_tokens(input_ids)
        extended_attention_mask = attention_mask[:, None, None, :].to(hidden_states.dtype)
        extended_attention_mask = (1.0 - extended_attention_mask) * -1e9
        position_bias = None
        for layer_module in self.block:
            hidden_states, position_bias = layer_module(hidden_states, extended_attention_mask, position_bias)
        return self.final_layer_norm(hidden_states)


def make_model():
    torch.manual_seed(0)
    input_ids = torch.randint(0, 64, (2, 10))
    attention_mask = torch.ones(2, 10, dtype=torch.long)
    attention_mask[1, -3:] = 0
    return T5Encoder(), (input_ids, attention_mask)
