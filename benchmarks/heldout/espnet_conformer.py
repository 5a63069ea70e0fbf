"""Written in the style of ESPnet's Conformer encoder (espnet/espnet, espnet/nets/pytorch_backend/transformer/
attention.py and conformer/convolution.py).

`MultiHeadedAttention.forward_qkv` (view to (batch, time, head, d_k) then transpose), `forward_attention` that
masks with `scores.masked_fill(mask, torch.finfo(scores.dtype).min)`, keeps the probabilities on the module as
`self.attn = torch.softmax(scores, dim=-1).masked_fill(mask, 0.0)` (zeroing the padded keys again after the
softmax), dropout, `torch.matmul(p_attn, value)`; the relative-position subclass with `pos_bias_u` /
`pos_bias_v`, `matrix_ac + matrix_bd` over `math.sqrt(self.d_k)` and ESPnet's `rel_shift`; the Conformer
convolution module (pointwise conv, GLU, depthwise conv, BatchNorm, Swish written as `x * torch.sigmoid(x)`)
and macaron feed-forwards with half-step residuals.
"""

import math

import torch
from torch import nn

STYLE = "ESPnet Conformer RelPositionMultiHeadedAttention"
REPOSITORY = "espnet/espnet"
BACKWARD_FAILS = False


class Swish(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(x)


class MultiHeadedAttention(nn.Module):
    def __init__(self, n_head, n_feat, dropout_rate):
        super().__init__()
        assert n_feat % n_head == 0
        self.d_k = n_feat // n_head
        self.h = n_head
        self.linear_q = nn.Linear(n_feat, n_feat)
        self.linear_k = nn.Linear(n_feat, n_feat)
        self.linear_v = nn.Linear(n_feat, n_feat)
        self.linear_out = nn.Linear(n_feat, n_feat)
        self.attn = None
        self.dropout = nn.Dropout(p=dropout_rate)

    def forward_qkv(self, query, key, value):
        n_batch = query.size(0)
        q = self.linear_q(query).view(n_batch, -1, self.h, self.d_k)
        k = self.linear_k(key).view(n_batch, -1, self.h, self.d_k)
        v = self.linear_v(value).view(n_batch, -1, self.h, self.d_k)
        q = q.transpose(1, 2)  # (batch, head, time1, d_k)
        k = k.transpose(1, 2)  # (batch, head, time2, d_k)
        v = v.transpose(1, 2)  # (batch, head, time2, d_k)
        return q, k, v

    def forward_attention(self, value, scores, mask):
        n_batch = value.size(0)
        if mask is not None:
            mask = mask.unsqueeze(1).eq(0)  # (batch, 1, *, time2)
            min_value = torch.finfo(scores.dtype).min
            scores = scores.masked_fill(mask, min_value)
            self.attn = torch.softmax(scores, dim=-1).masked_fill(mask, 0.0)  # (batch, head, time1, time2)
        else:
            self.attn = torch.softmax(scores, dim=-1)  # (batch, head, time1, time2)

        p_attn = self.dropout(self.attn)
        x = torch.matmul(p_attn, value)  # (batch, head, time1, d_k)
        x = x.transpose(1, 2).contiguous().view(n_batch, -1, self.h * self.d_k)  # (batch, time1, d_model)
        return self.linear_out(x)  # (batch, time1, d_model)


class RelPositionMultiHeadedAttention(MultiHeadedAttention):
    def __init__(self, n_head, n_feat, dropout_rate):
        super().__init__(n_head, n_feat, dropout_rate)
        self.linear_pos = nn.Linear(n_feat, n_feat, bias=False)
        self.pos_bias_u = nn.Parameter(torch.Tensor(self.h, self.d_k))
        self.pos_bias_v = nn.Parameter(torch.Tensor(self.h, self.d_k))
        torch.nn.init.xavier_uniform_(self.pos_bias_u)
        torch.nn.init.xavier_uniform_(self.pos_bias_v)

    def rel_shift(self, x):
        zero_pad = torch.zeros((*x.size()[:3], 1), device=x.device, dtype=x.dtype)
        x_padded = torch.cat([zero_pad, x], dim=-1)
        x_padded = x_padded.view(*x.size()[:2], x.size(3) + 1, x.size(2))
        x = x_padded[:, :, 1:].view_as(x)[:, :, :, : x.size(-1) // 2 + 1]  # only keep the positions from 0 to time2
        return x

    def forward(self, query, key, value, pos_emb, mask):
        q, k, v = self.forward_qkv(query, key, value)
        q = q.transpose(1, 2)  # (batch, time1, head, d_k)

        n_batch_pos = pos_emb.size(0)
        p = self.linear_pos(pos_emb).view(n_batch_pos, -1, self.h, self.d_k)
        p = p.transpose(1, 2)  # (batch, head, 2*time1-1, d_k)

        q_with_bias_u = (q + self.pos_bias_u).transpose(1, 2)
        q_with_bias_v = (q + self.pos_bias_v).transpose(1, 2)

        matrix_ac = torch.matmul(q_with_bias_u, k.transpose(-2, -1))
        matrix_bd = torch.matmul(q_with_bias_v, p.transpose(-2, -1))
        matrix_bd = self.rel_shift(matrix_bd)

        scores = (matrix_ac + matrix_bd) / math.sqrt(self.d_k)  # (batch, head, time1, time2)
        return self.forward_attention(v, scores, mask)


class RelPositionalEncoding(nn.Module):
    def __init__(self, d_model, dropout_rate, max_len=64):
        super().__init__()
        self.d_model = d_model
        self.xscale = math.sqrt(self.d_model)
        self.dropout = nn.Dropout(p=dropout_rate)
        position = torch.arange(0, max_len, dtype=torch.float32).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * -(math.log(10000.0) / d_model))
        pe_positive = torch.zeros(max_len, d_model)
        pe_negative = torch.zeros(max_len, d_model)
        pe_positive[:, 0::2] = torch.sin(position * div_term)
        pe_positive[:, 1::2] = torch.cos(position * div_term)
        pe_negative[:, 0::2] = torch.sin(-1 * position * div_term)
        pe_negative[:, 1::2] = torch.cos(-1 * position * div_term)
        pe_positive = torch.flip(pe_positive, [0]).unsqueeze(0)
        pe_negative = pe_negative[1:].unsqueeze(0)
        self.register_buffer("pe", torch.cat([pe_positive, pe_negative], dim=1), persistent=False)

    def forward(self, x):
        x = x * self.xscale
        center = self.pe.size(1) // 2
        pos_emb = self.pe[:, center - x.size(1) + 1: center + x.size(1)]
        return self.dropout(x), self.dropout(pos_emb)


class ConvolutionModule(nn.Module):
    def __init__(self, channels, kernel_size=5):
        super().__init__()
        self.pointwise_conv1 = nn.Conv1d(channels, 2 * channels, kernel_size=1)
        self.depthwise_conv = nn.Conv1d(channels, channels, kernel_size, padding=(kernel_size - 1) // 2,
                                        groups=channels)
        self.norm = nn.BatchNorm1d(channels)
        self.pointwise_conv2 = nn.Conv1d(channels, channels, kernel_size=1)
        self.activation = Swish()

    def forward(self, x, mask_pad):
        x = x.transpose(1, 2)  # (batch, channel, time)
        x = x.masked_fill(~mask_pad, 0.0)
        x = self.pointwise_conv1(x)
        x = nn.functional.glu(x, dim=1)
        x = self.depthwise_conv(x)
        x = self.activation(self.norm(x))
        x = self.pointwise_conv2(x)
        return x.transpose(1, 2)


class FeedForward(nn.Module):
    def __init__(self, idim, hidden_units, dropout_rate):
        super().__init__()
        self.w_1 = nn.Linear(idim, hidden_units)
        self.w_2 = nn.Linear(hidden_units, idim)
        self.dropout = nn.Dropout(dropout_rate)
        self.activation = Swish()

    def forward(self, x):
        return self.w_2(self.dropout(self.activation(self.w_1(x))))


class ConformerEncoderLayer(nn.Module):
    def __init__(self, size, heads, dropout_rate=0.1):
        super().__init__()
        self.self_attn = RelPositionMultiHeadedAttention(heads, size, dropout_rate)
        self.feed_forward_macaron = FeedForward(size, 2 * size, dropout_rate)
        self.feed_forward = FeedForward(size, 2 * size, dropout_rate)
        self.conv_module = ConvolutionModule(size)
        self.norm_ff_macaron = nn.LayerNorm(size)
        self.norm_mha = nn.LayerNorm(size)
        self.norm_conv = nn.LayerNorm(size)
        self.norm_ff = nn.LayerNorm(size)
        self.norm_final = nn.LayerNorm(size)
        self.dropout = nn.Dropout(dropout_rate)
        self.ff_scale = 0.5

    def forward(self, x, pos_emb, mask):
        x = x + self.ff_scale * self.dropout(self.feed_forward_macaron(self.norm_ff_macaron(x)))
        x_q = self.norm_mha(x)
        x = x + self.dropout(self.self_attn(x_q, x_q, x_q, pos_emb, mask))
        x = x + self.dropout(self.conv_module(self.norm_conv(x), mask))
        x = x + self.ff_scale * self.dropout(self.feed_forward(self.norm_ff(x)))
        return self.norm_final(x)


class ConformerEncoder(nn.Module):
    def __init__(self, idim=20, size=32, heads=4, num_blocks=2):
        super().__init__()
        self.embed = nn.Linear(idim, size)
        self.pos_enc = RelPositionalEncoding(size, 0.1)
        self.encoders = nn.ModuleList([ConformerEncoderLayer(size, heads) for _ in range(num_blocks)])

    def forward(self, xs_pad, ilens):
        masks = (torch.arange(xs_pad.size(1))[None, :] < ilens[:, None]).unsqueeze(1)  # (B, 1, T)
        xs, pos_emb = self.pos_enc(self.embed(xs_pad))
        for layer in self.encoders:
            xs = layer(xs, pos_emb, masks)
        return xs


def make_model():
    torch.manual_seed(0)
    return ConformerEncoder(), (torch.randn(2, 12, 20), torch.tensor([12, 9]))
