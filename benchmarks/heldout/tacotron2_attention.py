"""Written in the style of NVIDIA's Tacotron 2 (NVIDIA/tacotron2, model.py `Attention`, `LocationLayer` and the
decoder's attention step).

Location-sensitive additive attention: `processed_query = self.query_layer(query.unsqueeze(1))`, location
features from a conv over `torch.cat((attention_weights, attention_weights_cum))`, energies `self.v(torch.tanh(
processed_query + processed_attention_weights + processed_memory))`, the padding masked through `.data`
(`alignment.data.masked_fill_(mask, self.score_mask_value)`), `F.softmax(alignment, dim=1)`, the context
`torch.bmm(attention_weights.unsqueeze(1), memory)`, and the cumulative weights updated with
`attention_weights_cum += attention_weights` over decoder steps. Additive attention has no QKᵀ product:
graphlint must report no GL101 here, and none of the in-place writes overwrites a saved tensor.
"""

import torch
import torch.nn.functional as F
from torch import nn

STYLE = "Tacotron 2 location-sensitive attention (additive, not QKᵀ)"
REPOSITORY = "NVIDIA/tacotron2"
BACKWARD_FAILS = False


class LinearNorm(nn.Module):
    def __init__(self, in_dim, out_dim, bias=True, w_init_gain="linear"):
        super().__init__()
        self.linear_layer = nn.Linear(in_dim, out_dim, bias=bias)
        nn.init.xavier_uniform_(self.linear_layer.weight, gain=nn.init.calculate_gain(w_init_gain))

    def forward(self, x):
        return self.linear_layer(x)


class ConvNorm(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size=1, padding=None, bias=True):
        super().__init__()
        if padding is None:
            padding = int((kernel_size - 1) / 2)
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size=kernel_size, padding=padding, bias=bias)

    def forward(self, signal):
        return self.conv(signal)


class LocationLayer(nn.Module):
    def __init__(self, attention_n_filters, attention_kernel_size, attention_dim):
        super().__init__()
        self.location_conv = ConvNorm(2, attention_n_filters, kernel_size=attention_kernel_size, bias=False)
        self.location_dense = LinearNorm(attention_n_filters, attention_dim, bias=False, w_init_gain="tanh")

    def forward(self, attention_weights_cat):
        processed_attention = self.location_conv(attention_weights_cat)
        processed_attention = processed_attention.transpose(1, 2)
        return self.location_dense(processed_attention)


class Attention(nn.Module):
    def __init__(self, attention_rnn_dim, embedding_dim, attention_dim, attention_location_n_filters,
                 attention_location_kernel_size):
        super().__init__()
        self.query_layer = LinearNorm(attention_rnn_dim, attention_dim, bias=False, w_init_gain="tanh")
        self.memory_layer = LinearNorm(embedding_dim, attention_dim, bias=False, w_init_gain="tanh")
        self.v = LinearNorm(attention_dim, 1, bias=False)
        self.location_layer = LocationLayer(attention_location_n_filters, attention_location_kernel_size, attention_dim)
        self.score_mask_value = -float("inf")

    def get_alignment_energies(self, query, processed_memory, attention_weights_cat):
        processed_query = self.query_layer(query.unsqueeze(1))
        processed_attention_weights = self.location_layer(attention_weights_cat)
        energies = self.v(torch.tanh(processed_query + processed_attention_weights + processed_memory))
        energies = energies.squeeze(-1)
        return energies

    def forward(self, attention_hidden_state, memory, processed_memory, attention_weights_cat, mask):
        alignment = self.get_alignment_energies(attention_hidden_state, processed_memory, attention_weights_cat)
        if mask is not None:
            alignment.data.masked_fill_(mask, self.score_mask_value)
        attention_weights = F.softmax(alignment, dim=1)
        attention_context = torch.bmm(attention_weights.unsqueeze(1), memory)
        attention_context = attention_context.squeeze(1)
        return attention_context, attention_weights


class Decoder(nn.Module):
    def __init__(self, n_mel=8, enc_dim=16, rnn_dim=24, attention_dim=16):
        super().__init__()
        self.n_mel = n_mel
        self.attention_rnn = nn.LSTMCell(n_mel + enc_dim, rnn_dim)
        self.attention_layer = Attention(rnn_dim, enc_dim, attention_dim, 4, 5)
        self.linear_projection = LinearNorm(rnn_dim + enc_dim, n_mel)

    def forward(self, memory, decoder_inputs, memory_lengths):
        B, T_in, _ = memory.shape
        mask = torch.arange(T_in)[None, :] >= memory_lengths[:, None]
        attention_hidden = memory.new_zeros(B, self.attention_rnn.hidden_size)
        attention_cell = memory.new_zeros(B, self.attention_rnn.hidden_size)
        attention_weights = memory.new_zeros(B, T_in)
        attention_weights_cum = memory.new_zeros(B, T_in)
        attention_context = memory.new_zeros(B, memory.size(2))
        processed_memory = self.attention_layer.memory_layer(memory)
        outputs = []
        for t in range(decoder_inputs.size(1)):
            cell_input = torch.cat((decoder_inputs[:, t], attention_context), -1)
            attention_hidden, attention_cell = self.attention_rnn(cell_input, (attention_hidden, attention_cell))
            attention_weights_cat = torch.cat((attention_weights.unsqueeze(1), attention_weights_cum.unsqueeze(1)), dim=1)
            attention_context, attention_weights = self.attention_layer(
                attention_hidden, memory, processed_memory, attention_weights_cat, mask)
            attention_weights_cum += attention_weights
            outputs.append(self.linear_projection(torch.cat((attention_hidden, attention_context), dim=1)))
        return torch.stack(outputs, dim=1)


def make_model():
    torch.manual_seed(0)
    memory = torch.randn(2, 7, 16)  # encoder outputs
    decoder_inputs = torch.randn(2, 4, 8)  # teacher-forced mel frames
    return Decoder(), (memory, decoder_inputs, torch.tensor([7, 5]))
