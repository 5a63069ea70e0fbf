"""Written in the style of fairseq's MultiheadAttention (facebookresearch/fairseq, fairseq/modules/multihead_attention.py).

Time-first layout (tgt_len, bsz, embed_dim), separate q/k/v projections, `q *= self.scaling` on the query
projection, heads folded into the batch for `torch.bmm`, an additive float `attn_mask`, a boolean
`key_padding_mask` applied with `masked_fill(..., float("-inf"))` on a (bsz, heads, tgt, src) view, a float32
softmax cast back with `type_as`, and a FairseqDropout module on the probabilities. Post-norm encoder layer.
"""

import torch
import torch.nn.functional as F
from torch import nn

STYLE = "fairseq MultiheadAttention"
REPOSITORY = "facebookresearch/fairseq"
BACKWARD_FAILS = False


def softmax(x, dim: int, onnx_trace: bool = False):
    if onnx_trace:
        return F.softmax(x.float(), dim=dim)
    return F.softmax(x, dim=dim, dtype=torch.float32)


class FairseqDropout(nn.Module):
    def __init__(self, p, module_name=None):
        super().__init__()
        self.p = p
        self.module_name = module_name

    def forward(self, x, inplace: bool = False):
        if self.p > 0 and self.training:
            return F.dropout(x, p=self.p, training=True, inplace=inplace)
        return x


class MultiheadAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, self_attention=False):
        super().__init__()
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.dropout_module = FairseqDropout(dropout, module_name=self.__class__.__name__)
        self.head_dim = embed_dim // num_heads
        assert self.head_dim * num_heads == self.embed_dim, "embed_dim must be divisible by num_heads"
        self.scaling = self.head_dim**-0.5
        self.self_attention = self_attention
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=False, attn_mask=None):
        tgt_len, bsz, embed_dim = query.size()
        src_len = tgt_len
        if self.self_attention:
            q = self.q_proj(query)
            k = self.k_proj(query)
            v = self.v_proj(query)
        else:
            q = self.q_proj(query)
            k = self.k_proj(key)
            v = self.v_proj(value)
            src_len = k.size(0)
        q *= self.scaling

        q = q.contiguous().view(tgt_len, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        k = k.contiguous().view(-1, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        v = v.contiguous().view(-1, bsz * self.num_heads, self.head_dim).transpose(0, 1)

        attn_weights = torch.bmm(q, k.transpose(1, 2))
        assert list(attn_weights.size()) == [bsz * self.num_heads, tgt_len, src_len]

        if attn_mask is not None:
            attn_mask = attn_mask.unsqueeze(0)
            attn_weights += attn_mask

        if key_padding_mask is not None:
            # don't attend to padding symbols
            attn_weights = attn_weights.view(bsz, self.num_heads, tgt_len, src_len)
            attn_weights = attn_weights.masked_fill(
                key_padding_mask.unsqueeze(1).unsqueeze(2).to(torch.bool), float("-inf")
            )
            attn_weights = attn_weights.view(bsz * self.num_heads, tgt_len, src_len)

        attn_weights_float = softmax(attn_weights, dim=-1)
        attn_weights = attn_weights_float.type_as(attn_weights)
        attn_probs = self.dropout_module(attn_weights)

        attn = torch.bmm(attn_probs, v)
        attn = attn.transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim)
        attn = self.out_proj(attn)
        weights = None
        if need_weights:
            weights = attn_weights_float.view(bsz, self.num_heads, tgt_len, src_len).transpose(1, 0).mean(dim=0)
        return attn, weights


class TransformerEncoderLayer(nn.Module):
    def __init__(self, embed_dim=32, heads=4, ffn_dim=64, dropout=0.1, attention_dropout=0.1):
        super().__init__()
        self.self_attn = MultiheadAttention(embed_dim, heads, dropout=attention_dropout, self_attention=True)
        self.self_attn_layer_norm = nn.LayerNorm(embed_dim)
        self.dropout_module = FairseqDropout(dropout)
        self.activation_fn = F.relu
        self.fc1 = nn.Linear(embed_dim, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, embed_dim)
        self.final_layer_norm = nn.LayerNorm(embed_dim)

    def forward(self, x, encoder_padding_mask, attn_mask=None):
        residual = x
        x, _ = self.self_attn(query=x, key=x, value=x, key_padding_mask=encoder_padding_mask,
                              need_weights=False, attn_mask=attn_mask)
        x = self.dropout_module(x)
        x = self.self_attn_layer_norm(residual + x)
        residual = x
        x = self.activation_fn(self.fc1(x))
        x = self.fc2(x)
        x = self.dropout_module(x)
        return self.final_layer_norm(residual + x)


class TransformerEncoder(nn.Module):
    def __init__(self, vocab=64, embed_dim=32, layers=2, padding_idx=1):
        super().__init__()
        self.padding_idx = padding_idx
        self.embed_tokens = nn.Embedding(vocab, embed_dim, padding_idx=padding_idx)
        self.embed_scale = embed_dim**0.5
        self.layers = nn.ModuleList([TransformerEncoderLayer(embed_dim) for _ in range(layers)])

    def forward(self, src_tokens):
        encoder_padding_mask = src_tokens.eq(self.padding_idx)
        x = self.embed_scale * self.embed_tokens(src_tokens)
        x = x.transpose(0, 1)  # B x T x C -> T x B x C
        for layer in self.layers:
            x = layer(x, encoder_padding_mask)
        return x


def make_model():
    torch.manual_seed(0)
    model = TransformerEncoder()
    tokens = torch.randint(2, 64, (2, 12))
    tokens[1, -3:] = 1  # padding at the end of the second sentence
    return model, (tokens,)
