"""Written in the style of Graphormer (microsoft/Graphormer, graphormer/modules/multihead_attention.py and
graphormer_layers.py).

The fairseq-derived MultiheadAttention that Graphormer adds a structural bias to: `q *= self.scaling`, heads
folded into the batch, `torch.bmm(q, k.transpose(1, 2))`, `attn_weights += attn_bias.view(bsz * heads, tgt,
src)` (the spatial-encoding and virtual-node bias built by GraphAttnBias with in-place slice writes on a
repeated bias), the key padding mask applied on a 4-d view with `masked_fill(..., float("-inf"))`, a float
softmax, dropout and `torch.bmm(attn_probs, v)`; time-first pre-LayerNorm encoder layers and a graph token.
"""

import torch
import torch.nn.functional as F
from torch import nn

STYLE = "Graphormer MultiheadAttention with graph attention bias"
REPOSITORY = "microsoft/Graphormer"
BACKWARD_FAILS = False


class GraphAttnBias(nn.Module):
    def __init__(self, num_heads, num_spatial):
        super().__init__()
        self.num_heads = num_heads
        self.spatial_pos_encoder = nn.Embedding(num_spatial, num_heads, padding_idx=0)
        self.graph_token_virtual_distance = nn.Embedding(1, num_heads)

    def forward(self, attn_bias, spatial_pos):
        n_graph, n_node = spatial_pos.size()[:2]
        graph_attn_bias = attn_bias.clone()
        graph_attn_bias = graph_attn_bias.unsqueeze(1).repeat(1, self.num_heads, 1, 1)  # [n_graph, n_head, n_node+1, n_node+1]

        # spatial pos: [n_graph, n_node, n_node, n_head] -> [n_graph, n_head, n_node, n_node]
        spatial_pos_bias = self.spatial_pos_encoder(spatial_pos).permute(0, 3, 1, 2)
        graph_attn_bias[:, :, 1:, 1:] = graph_attn_bias[:, :, 1:, 1:] + spatial_pos_bias

        # reset spatial pos here
        t = self.graph_token_virtual_distance.weight.view(1, self.num_heads, 1)
        graph_attn_bias[:, :, 1:, 0] = graph_attn_bias[:, :, 1:, 0] + t
        graph_attn_bias[:, :, 0, :] = graph_attn_bias[:, :, 0, :] + t

        graph_attn_bias = graph_attn_bias + attn_bias.unsqueeze(1)  # reset
        return graph_attn_bias


class MultiheadAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, attention_dropout=0.1):
        super().__init__()
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.dropout = attention_dropout
        self.head_dim = embed_dim // num_heads
        self.scaling = self.head_dim**-0.5
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, query, key, value, attn_bias, key_padding_mask=None, need_weights=False):
        tgt_len, bsz, embed_dim = query.size()
        src_len = tgt_len
        q = self.q_proj(query)
        k = self.k_proj(query)
        v = self.v_proj(query)
        q *= self.scaling

        q = q.contiguous().view(tgt_len, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        k = k.contiguous().view(-1, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        v = v.contiguous().view(-1, bsz * self.num_heads, self.head_dim).transpose(0, 1)

        attn_weights = torch.bmm(q, k.transpose(1, 2))
        assert list(attn_weights.size()) == [bsz * self.num_heads, tgt_len, src_len]

        if attn_bias is not None:
            attn_weights += attn_bias.view(bsz * self.num_heads, tgt_len, src_len)

        if key_padding_mask is not None:
            # don't attend to padding symbols
            attn_weights = attn_weights.view(bsz, self.num_heads, tgt_len, src_len)
            attn_weights = attn_weights.masked_fill(key_padding_mask.unsqueeze(1).unsqueeze(2).to(torch.bool),
                                                    float("-inf"))
            attn_weights = attn_weights.view(bsz * self.num_heads, tgt_len, src_len)

        attn_weights_float = F.softmax(attn_weights, dim=-1, dtype=torch.float32)
        attn_weights = attn_weights_float.type_as(attn_weights)
        attn_probs = F.dropout(attn_weights, p=self.dropout, training=self.training)

        attn = torch.bmm(attn_probs, v)
        attn = attn.transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim)
        attn = self.out_proj(attn)

        attn_weights = None
        if need_weights:
            attn_weights = attn_weights_float.view(bsz, self.num_heads, tgt_len, src_len).transpose(1, 0).mean(dim=0)
        return attn, attn_weights


class GraphormerGraphEncoderLayer(nn.Module):
    def __init__(self, embedding_dim, ffn_embedding_dim, num_attention_heads, dropout=0.1):
        super().__init__()
        self.self_attn = MultiheadAttention(embedding_dim, num_attention_heads)
        self.self_attn_layer_norm = nn.LayerNorm(embedding_dim)
        self.fc1 = nn.Linear(embedding_dim, ffn_embedding_dim)
        self.fc2 = nn.Linear(ffn_embedding_dim, embedding_dim)
        self.final_layer_norm = nn.LayerNorm(embedding_dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, self_attn_bias, self_attn_padding_mask):
        residual = x
        x = self.self_attn_layer_norm(x)
        x, _ = self.self_attn(query=x, key=x, value=x, attn_bias=self_attn_bias,
                              key_padding_mask=self_attn_padding_mask, need_weights=False)
        x = residual + self.dropout(x)
        residual = x
        x = self.final_layer_norm(x)
        x = self.fc2(F.gelu(self.fc1(x)))
        return residual + self.dropout(x)


class GraphormerGraphEncoder(nn.Module):
    def __init__(self, num_atoms=32, num_spatial=16, embedding_dim=32, heads=4, layers=2):
        super().__init__()
        self.atom_encoder = nn.Embedding(num_atoms, embedding_dim, padding_idx=0)
        self.graph_token = nn.Embedding(1, embedding_dim)
        self.graph_attn_bias = GraphAttnBias(heads, num_spatial)
        self.layers = nn.ModuleList([GraphormerGraphEncoderLayer(embedding_dim, 2 * embedding_dim, heads)
                                     for _ in range(layers)])

    def forward(self, x, attn_bias, spatial_pos):
        n_graph, n_node = x.size()[:2]
        padding_mask = (x[:, :, 0]).eq(0)  # B x T x 1
        padding_mask_cls = torch.zeros(n_graph, 1, device=padding_mask.device, dtype=padding_mask.dtype)
        padding_mask = torch.cat((padding_mask_cls, padding_mask), dim=1)
        node_feature = self.atom_encoder(x).sum(dim=-2)
        graph_token_feature = self.graph_token.weight.unsqueeze(0).repeat(n_graph, 1, 1)
        x = torch.cat([graph_token_feature, node_feature], dim=1)
        bias = self.graph_attn_bias(attn_bias, spatial_pos)
        x = x.transpose(0, 1)  # B x T x C -> T x B x C
        for layer in self.layers:
            x = layer(x, bias, padding_mask)
        return x[0]  # the graph token


def make_model():
    torch.manual_seed(0)
    n_graph, n_node = 2, 7
    x = torch.randint(1, 32, (n_graph, n_node, 2))
    x[1, -2:] = 0  # a smaller second graph, padded
    attn_bias = torch.zeros(n_graph, n_node + 1, n_node + 1)
    spatial_pos = torch.randint(1, 16, (n_graph, n_node, n_node))
    return GraphormerGraphEncoder(), (x, attn_bias, spatial_pos)
