"""Written in the style of OpenNMT-py's MultiHeadedAttention (OpenNMT/OpenNMT-py, onmt/modules/multi_headed_attn.py).

Batch-first, `shape`/`unshape` closures that split and merge heads with view/transpose, the query divided by
sqrt(dim_per_head) before the product, `torch.matmul` scores cast to float, a boolean mask unsqueezed over the
heads and applied with `masked_fill(mask, -1e18)`, an `nn.Softmax(dim=-1)` module, dropout, and the attention
of the first head returned to the caller (OpenNMT's `top_attn`). Pre-norm encoder layer with a
PositionwiseFeedForward.
"""

import math

import torch
from torch import nn

STYLE = "OpenNMT-py MultiHeadedAttention"
REPOSITORY = "OpenNMT/OpenNMT-py"
BACKWARD_FAILS = False


class MultiHeadedAttention(nn.Module):
    def __init__(self, head_count, model_dim, dropout=0.1):
        assert model_dim % head_count == 0
        self.dim_per_head = model_dim // head_count
        self.model_dim = model_dim
        super().__init__()
        self.head_count = head_count
        self.linear_keys = nn.Linear(model_dim, head_count * self.dim_per_head)
        self.linear_values = nn.Linear(model_dim, head_count * self.dim_per_head)
        self.linear_query = nn.Linear(model_dim, head_count * self.dim_per_head)
        self.softmax = nn.Softmax(dim=-1)
        self.dropout = nn.Dropout(dropout)
        self.final_linear = nn.Linear(model_dim, model_dim)

    def forward(self, key, value, query, mask=None):
        batch_size = key.size(0)
        dim_per_head = self.dim_per_head
        head_count = self.head_count

        def shape(x):
            """Projection."""
            return x.view(batch_size, -1, head_count, dim_per_head).transpose(1, 2)

        def unshape(x):
            """Compute context."""
            return x.transpose(1, 2).contiguous().view(batch_size, -1, head_count * dim_per_head)

        key = shape(self.linear_keys(key))
        value = shape(self.linear_values(value))
        query = shape(self.linear_query(query))

        query = query / math.sqrt(dim_per_head)
        query_key = torch.matmul(query, key.transpose(2, 3))
        scores = query_key.float()

        if mask is not None:
            mask = mask.unsqueeze(1)  # [B, 1, 1, T_values]
            scores = scores.masked_fill(mask, -1e18)

        attn = self.softmax(scores).to(query.dtype)
        drop_attn = self.dropout(attn)
        context_original = torch.matmul(drop_attn, value)
        context = unshape(context_original)
        output = self.final_linear(context)
        attns = attn.view(batch_size, head_count, query.size(2), key.size(2))
        return output, attns


class PositionwiseFeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.1):
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.layer_norm = nn.LayerNorm(d_model, eps=1e-6)
        self.dropout_1 = nn.Dropout(dropout)
        self.relu = nn.ReLU()
        self.dropout_2 = nn.Dropout(dropout)

    def forward(self, x):
        inter = self.dropout_1(self.relu(self.w_1(self.layer_norm(x))))
        output = self.dropout_2(self.w_2(inter))
        return output + x


class TransformerEncoderLayer(nn.Module):
    def __init__(self, d_model, heads, d_ff, dropout=0.1, attention_dropout=0.1):
        super().__init__()
        self.self_attn = MultiHeadedAttention(heads, d_model, dropout=attention_dropout)
        self.feed_forward = PositionwiseFeedForward(d_model, d_ff, dropout)
        self.layer_norm = nn.LayerNorm(d_model, eps=1e-6)
        self.dropout = nn.Dropout(dropout)

    def forward(self, inputs, mask):
        input_norm = self.layer_norm(inputs)
        context, _ = self.self_attn(input_norm, input_norm, input_norm, mask=mask)
        out = self.dropout(context) + inputs
        return self.feed_forward(out)


class TransformerEncoder(nn.Module):
    def __init__(self, vocab=64, d_model=32, heads=4, d_ff=64, num_layers=2, padding_idx=1):
        super().__init__()
        self.padding_idx = padding_idx
        self.embeddings = nn.Embedding(vocab, d_model, padding_idx=padding_idx)
        self.transformer = nn.ModuleList([TransformerEncoderLayer(d_model, heads, d_ff) for _ in range(num_layers)])
        self.layer_norm = nn.LayerNorm(d_model, eps=1e-6)

    def forward(self, src):
        emb = self.embeddings(src)
        mask = src.eq(self.padding_idx).unsqueeze(1)  # [B, 1, T]
        out = emb
        for layer in self.transformer:
            out = layer(out, mask)
        return self.layer_norm(out)


def make_model():
    torch.manual_seed(0)
    model = TransformerEncoder()
    src = torch.randint(2, 64, (2, 10))
    src[0, -2:] = 1
    return model, (src,)
