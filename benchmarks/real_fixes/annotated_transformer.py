"""Written in the style of harvardnlp/annotated-transformer, the_annotated_transformer.py (read at commit
0a91a254735c07532e23733dce8a693e504f3a08).

The module-level `attention(query, key, value, mask=None, dropout=None)` function: `torch.matmul(query,
key.transpose(-2, -1)) / math.sqrt(d_k)`, `scores.masked_fill(mask == 0, -1e9)` (a finite fill),
`scores.softmax(dim=-1)`, the dropout module passed in as an argument (`dropout(p_attn)` when not None), returning
`torch.matmul(p_attn, value), p_attn`; `MultiHeadedAttention` keeps the probabilities on `self.attn` (the notebook
draws them) and projects with `clones(nn.Linear(d_model, d_model), 4)`. An encoder of two layers with the
notebook's pre-norm `SublayerConnection` and a padding mask `(src != pad).unsqueeze(-2)`; left out: the decoder,
the generator, the training code and the plots.
"""

import copy
import math

import torch
import torch.nn as nn

STYLE = "annotated-transformer attention() function (returns p_attn, -1e9 fill)"
REPOSITORY = "harvardnlp/annotated-transformer"
PATH = "the_annotated_transformer.py"
COMMIT = "0a91a254735c07532e23733dce8a693e504f3a08"


def clones(module, N):
    return nn.ModuleList([copy.deepcopy(module) for _ in range(N)])


def attention(query, key, value, mask=None, dropout=None):
    d_k = query.size(-1)
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    p_attn = scores.softmax(dim=-1)
    if dropout is not None:
        p_attn = dropout(p_attn)
    return torch.matmul(p_attn, value), p_attn


class MultiHeadedAttention(nn.Module):
    def __init__(self, h, d_model, dropout=0.1):
        super().__init__()
        self.d_k = d_model // h
        self.h = h
        self.linears = clones(nn.Linear(d_model, d_model), 4)
        self.attn = None
        self.dropout = nn.Dropout(p=dropout)

    def forward(self, query, key, value, mask=None):
        if mask is not None:
            mask = mask.unsqueeze(1)
        nbatches = query.size(0)
        query, key, value = [lin(x).view(nbatches, -1, self.h, self.d_k).transpose(1, 2)
                             for lin, x in zip(self.linears, (query, key, value), strict=False)]
        x, self.attn = attention(query, key, value, mask=mask, dropout=self.dropout)
        x = x.transpose(1, 2).contiguous().view(nbatches, -1, self.h * self.d_k)
        return self.linears[-1](x)


class SublayerConnection(nn.Module):
    def __init__(self, size, dropout):
        super().__init__()
        self.norm = nn.LayerNorm(size)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, sublayer):
        return x + self.dropout(sublayer(self.norm(x)))


class EncoderLayer(nn.Module):
    def __init__(self, size, self_attn, feed_forward, dropout):
        super().__init__()
        self.self_attn = self_attn
        self.feed_forward = feed_forward
        self.sublayer = clones(SublayerConnection(size, dropout), 2)

    def forward(self, x, mask):
        x = self.sublayer[0](x, lambda x: self.self_attn(x, x, x, mask))
        return self.sublayer[1](x, self.feed_forward)


class Encoder(nn.Module):
    def __init__(self, vocab=40, d_model=32, h=4, n=2, dropout=0.1):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        ff = nn.Sequential(nn.Linear(d_model, 64), nn.ReLU(), nn.Dropout(dropout), nn.Linear(64, d_model))
        self.layers = clones(EncoderLayer(d_model, MultiHeadedAttention(h, d_model), ff, dropout), n)
        self.norm = nn.LayerNorm(d_model)

    def forward(self, src, pad: int = 2):
        mask = (src != pad).unsqueeze(-2)
        x = self.embed(src) * math.sqrt(self.embed.embedding_dim)
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x)


def make_model():
    torch.manual_seed(0)
    src = torch.randint(3, 40, (2, 9))
    src[1, -3:] = 2
    return Encoder(), (src,)
