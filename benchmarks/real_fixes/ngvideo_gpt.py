"""Written in the style of karpathy/ng-video-lecture, gpt.py (read at commit 0ceb0055aad7a7b255730be650dd667d6daffd9f).

One `Head` per attention head (its own bias-free key/query/value Linears and a `tril` buffer), scores
`q @ k.transpose(-2,-1) * C**-0.5` (scaled by the embedding width C, not the head size, as the lecture does),
`masked_fill(self.tril[:T, :T] == 0, float('-inf'))`, `F.softmax`, `self.dropout(wei)` (nn.Dropout), `wei @ v`;
`MultiHeadAttention` concatenates the heads. Hyperparameters are module globals as in the script, made small;
left out: the data loading, training loop and generate.
"""

import torch
import torch.nn as nn
from torch.nn import functional as F

STYLE = "ng-video-lecture Head (one module per head)"
REPOSITORY = "karpathy/ng-video-lecture"
PATH = "gpt.py"
COMMIT = "0ceb0055aad7a7b255730be650dd667d6daffd9f"

vocab_size = 48
block_size = 16
n_embd = 32
n_head = 4
n_layer = 2
dropout = 0.2


class Head(nn.Module):
    def __init__(self, head_size):
        super().__init__()
        self.key = nn.Linear(n_embd, head_size, bias=False)
        self.query = nn.Linear(n_embd, head_size, bias=False)
        self.value = nn.Linear(n_embd, head_size, bias=False)
        self.register_buffer("tril", torch.tril(torch.ones(block_size, block_size)))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        B, T, C = x.shape
        k = self.key(x)
        q = self.query(x)
        wei = q @ k.transpose(-2, -1) * C**-0.5
        wei = wei.masked_fill(self.tril[:T, :T] == 0, float("-inf"))
        wei = F.softmax(wei, dim=-1)
        wei = self.dropout(wei)
        v = self.value(x)
        out = wei @ v
        return out


class MultiHeadAttention(nn.Module):
    def __init__(self, num_heads, head_size):
        super().__init__()
        self.heads = nn.ModuleList([Head(head_size) for _ in range(num_heads)])
        self.proj = nn.Linear(n_embd, n_embd)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        out = torch.cat([h(x) for h in self.heads], dim=-1)
        return self.dropout(self.proj(out))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.sa = MultiHeadAttention(n_head, n_embd // n_head)
        self.ffwd = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.ReLU(), nn.Linear(4 * n_embd, n_embd), nn.Dropout(dropout))
        self.ln1 = nn.LayerNorm(n_embd)
        self.ln2 = nn.LayerNorm(n_embd)

    def forward(self, x):
        x = x + self.sa(self.ln1(x))
        return x + self.ffwd(self.ln2(x))


class BigramLanguageModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.token_embedding_table = nn.Embedding(vocab_size, n_embd)
        self.position_embedding_table = nn.Embedding(block_size, n_embd)
        self.blocks = nn.Sequential(*[Block() for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size)

    def forward(self, idx):
        B, T = idx.shape
        x = self.token_embedding_table(idx) + self.position_embedding_table(torch.arange(T, device=idx.device))
        return self.lm_head(self.ln_f(self.blocks(x)))


def make_model():
    torch.manual_seed(0)
    return BigramLanguageModel(), (torch.randint(0, vocab_size, (2, 12)),)
