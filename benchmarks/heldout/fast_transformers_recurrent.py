"""Written in the style of fast-transformers' recurrent linear attention (idiap/fast-transformers,
fast_transformers/recurrent/attention/self_attention/linear_attention.py, before the change that made its
state updates out of place when gradients are needed).

The elu(x) + 1 feature map, and `RecurrentLinearAttention.forward(query, key, value, state)` for one time step:
`Si, Zi = state` (zeros on the first step), `Zi += K` and `Si += torch.einsum("nhd,nhm->nhdm", K, value)` in
place, `Z = 1. / (torch.einsum("nhd,nhd->nh", Q, Zi) + self.eps)`, `V = torch.einsum("nhd,nhdm,nh->nhm", Q, Si,
Z)`, returning `V, [Si, Zi]`. Run over a sequence one step at a time (as its recurrent encoder does), the
in-place updates of step t overwrite the state that step t-1's einsums saved, so a backward through more
than one step fails. Linear attention has no softmax: graphlint must report no GL101 here.
"""

import torch
import torch.nn.functional as F
from torch import nn

STYLE = "fast-transformers RecurrentLinearAttention (in-place state updates)"
REPOSITORY = "idiap/fast-transformers"
BACKWARD_FAILS = True  # Zi += K / Si += ... overwrite the previous step's saved state


def elu_feature_map(x):
    return F.elu(x) + 1


class RecurrentLinearAttention(nn.Module):
    def __init__(self, query_dimensions, eps=1e-6):
        super().__init__()
        self.feature_map = elu_feature_map
        self.eps = eps

    def forward(self, query, key, value, state=None):
        Q = self.feature_map(query)
        K = self.feature_map(key)

        N, H, D = Q.shape
        _, _, M = value.shape

        if state is None:
            Si = query.new_zeros((N, H, D, M))
            Zi = query.new_zeros((N, H, D))
        else:
            Si, Zi = state

        # Ensure the batch size did not change
        if len(Si) != N:
            raise ValueError("The batch size changed during iteration")

        # Update the internal state
        Zi += K
        Si += torch.einsum("nhd,nhm->nhdm", K, value)

        # Compute the output
        Z = 1.0 / (torch.einsum("nhd,nhd->nh", Q, Zi) + self.eps)
        V = torch.einsum("nhd,nhdm,nh->nhm", Q, Si, Z)

        return V, [Si, Zi]


class RecurrentAttentionLayer(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        d_keys = d_model // n_heads
        self.inner_attention = RecurrentLinearAttention(d_keys)
        self.query_projection = nn.Linear(d_model, d_keys * n_heads)
        self.key_projection = nn.Linear(d_model, d_keys * n_heads)
        self.value_projection = nn.Linear(d_model, d_keys * n_heads)
        self.out_projection = nn.Linear(d_keys * n_heads, d_model)
        self.n_heads = n_heads

    def forward(self, query, key, value, state=None):
        N, D = query.shape
        H = self.n_heads
        query = self.query_projection(query).view(N, H, -1)
        key = self.key_projection(key).view(N, H, -1)
        value = self.value_projection(value).view(N, H, -1)
        new_value, state = self.inner_attention(query, key, value, state)
        new_value = new_value.view(N, -1)
        return self.out_projection(new_value), state


class RecurrentTransformerEncoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, d_ff):
        super().__init__()
        self.attention = RecurrentAttentionLayer(d_model, n_heads)
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x, state=None):
        x2, state = self.attention(x, x, x, state=state)
        x = self.norm1(x + self.dropout(x2))
        y = self.dropout(F.gelu(self.linear1(x)))
        return self.norm2(x + self.dropout(self.linear2(y))), state


class RecurrentEncoder(nn.Module):
    def __init__(self, d_model=32, n_heads=4, layers=2):
        super().__init__()
        self.layers = nn.ModuleList([RecurrentTransformerEncoderLayer(d_model, n_heads, 2 * d_model)
                                     for _ in range(layers)])

    def forward(self, x):
        """x: (N, T, d_model), fed one step at a time as in autoregressive inference or training."""
        states = [None] * len(self.layers)
        outputs = []
        for t in range(x.shape[1]):
            h = x[:, t]
            for i, layer in enumerate(self.layers):
                h, states[i] = layer(h, state=states[i])
            outputs.append(h)
        return torch.stack(outputs, dim=1)


def make_model():
    torch.manual_seed(0)
    return RecurrentEncoder(), (torch.randn(2, 4, 32),)
