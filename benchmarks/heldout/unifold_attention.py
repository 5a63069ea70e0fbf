"""Written in the style of Uni-Fold (dptech-corp/Uni-Fold, unifold/modules/attentions.py) on Uni-Core's
`softmax_dropout` (dptech-corp/Uni-Core, unicore/modules/softmax_dropout.py, its PyTorch path).

An AlphaFold port other than OpenFold: `Attention` with separate q/k/v projections, heads moved with
`view(...).transpose(-2, -3)`, `q = q * self.norm` (head_dim ** -0.5), `attn = torch.matmul(q, k.transpose(-1,
-2))`, `del q, k`, then `softmax_dropout(attn, self.dropout, self.training, mask=mask, bias=bias)` whose
PyTorch path adds the mask and the pair bias in place (`input += mask`, `input += bias`) before
`F.dropout(F.softmax(input, dim=-1), ...)`, `o = torch.matmul(attn, v)`, a sigmoid gate and the output
projection; MSA row attention with pair bias, as in the Evoformer, and a transition.
"""

import torch
import torch.nn.functional as F
from torch import nn

STYLE = "Uni-Fold gated Attention on Uni-Core softmax_dropout"
REPOSITORY = "dptech-corp/Uni-Fold"
BACKWARD_FAILS = False


def softmax_dropout(input, dropout_prob, is_training=True, mask=None, bias=None, inplace=True):
    input = input.contiguous()
    if not inplace:
        # copy a input for non-inplace case
        input = input.clone()
    if mask is not None:
        input += mask
    if bias is not None:
        input += bias
    return F.dropout(F.softmax(input, dim=-1), p=dropout_prob, training=is_training)


def permute_final_dims(tensor, inds):
    zero_index = -1 * len(inds)
    first_inds = list(range(len(tensor.shape[:zero_index])))
    return tensor.permute(first_inds + [zero_index + i for i in inds])


class Attention(nn.Module):
    def __init__(self, q_dim, k_dim, v_dim, head_dim, num_heads, gating=True, dropout=0.1):
        super().__init__()
        self.num_heads = num_heads
        total_dim = head_dim * self.num_heads
        self.gating = gating
        self.linear_q = nn.Linear(q_dim, total_dim, bias=False)
        self.linear_k = nn.Linear(k_dim, total_dim, bias=False)
        self.linear_v = nn.Linear(v_dim, total_dim, bias=False)
        self.linear_o = nn.Linear(total_dim, q_dim)
        self.linear_g = nn.Linear(q_dim, total_dim) if gating else None
        self.norm = head_dim**-0.5
        self.dropout = dropout

    def forward(self, q, k, v, mask=None, bias=None):
        g = None
        if self.linear_g is not None:
            # gating, use raw query input
            g = self.linear_g(q)

        q = self.linear_q(q)
        q = q * self.norm
        k = self.linear_k(k)
        v = self.linear_v(v)

        q = q.view(q.shape[:-1] + (self.num_heads, -1)).transpose(-2, -3).contiguous()
        k = k.view(k.shape[:-1] + (self.num_heads, -1)).transpose(-2, -3).contiguous()
        v = v.view(v.shape[:-1] + (self.num_heads, -1)).transpose(-2, -3)

        attn = torch.matmul(q, k.transpose(-1, -2))
        del q, k

        attn = softmax_dropout(attn, self.dropout, self.training, mask=mask, bias=bias)
        o = torch.matmul(attn, v)
        del attn, v

        o = o.transpose(-2, -3).contiguous()
        o = o.view(*o.shape[:-2], -1)

        if g is not None:
            o = torch.sigmoid(g) * o

        # merge heads
        o = self.linear_o(o)
        return o


class MSARowAttentionWithPairBias(nn.Module):
    def __init__(self, d_msa, d_pair, d_hid, num_heads):
        super().__init__()
        self.layer_norm_m = nn.LayerNorm(d_msa)
        self.layer_norm_z = nn.LayerNorm(d_pair)
        self.linear_z = nn.Linear(d_pair, num_heads, bias=False)
        self.mha = Attention(d_msa, d_msa, d_msa, d_hid, num_heads)

    def forward(self, m, z, attn_mask):
        m = self.layer_norm_m(m)
        z = self.layer_norm_z(z)
        bias = permute_final_dims(self.linear_z(z), (2, 0, 1)).unsqueeze(-4)  # [*, 1, H, N_res, N_res]
        return self.mha(q=m, k=m, v=m, mask=attn_mask, bias=bias)


class EvoformerLite(nn.Module):
    def __init__(self, d_msa=16, d_pair=8, d_hid=8, num_heads=2, blocks=2):
        super().__init__()
        self.row_attn = nn.ModuleList([MSARowAttentionWithPairBias(d_msa, d_pair, d_hid, num_heads)
                                       for _ in range(blocks)])
        self.transition = nn.ModuleList([nn.Sequential(nn.LayerNorm(d_msa), nn.Linear(d_msa, 2 * d_msa), nn.ReLU(),
                                                       nn.Linear(2 * d_msa, d_msa)) for _ in range(blocks)])

    def forward(self, m, z, msa_mask):
        # [*, N_seq, 1, 1, N_res]: -inf-like on masked residues, as Uni-Fold's gen_msa_attn_mask builds it
        attn_mask = ((msa_mask - 1.0) * 1e9)[..., :, None, None, :]
        for attn, transition in zip(self.row_attn, self.transition, strict=True):
            m = m + attn(m, z, attn_mask)
            m = m + transition(m)
        return m


def make_model():
    torch.manual_seed(0)
    n_seq, n_res = 3, 6
    m = torch.randn(1, n_seq, n_res, 16)
    z = torch.randn(1, n_res, n_res, 8)
    msa_mask = torch.ones(1, n_seq, n_res)
    msa_mask[..., -1] = 0.0
    return EvoformerLite(), (m, z, msa_mask)
