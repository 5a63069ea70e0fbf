"""Written in the style of BLIP's med.py (salesforce/BLIP, models/med.py BertSelfAttention), BERT's attention as
BLIP extends it for image-grounded text encoding.

`transpose_for_scores` (view to (B, T, heads, head_size) then permute(0, 2, 1, 3)), key/value from
`encoder_hidden_states` in the cross-attention layers, `torch.matmul(query_layer, key_layer.transpose(-1, -2))
/ math.sqrt(self.attention_head_size)`, `+ attention_mask` (the extended (1 - mask) * -10000.0 mask), an inline
`nn.Softmax(dim=-1)(attention_scores)`, BLIP's `save_attention` hook that keeps the cross-attention map and
registers a gradient hook on it (for Grad-CAM), dropout, an optional `head_mask` product, and the context
`torch.matmul(attention_probs_dropped, value_layer)`.
"""

import math

import torch
from torch import nn

STYLE = "BLIP med.py BertSelfAttention (cross-attention with save_attention)"
REPOSITORY = "salesforce/BLIP"
BACKWARD_FAILS = False


class BertSelfAttention(nn.Module):
    def __init__(self, hidden_size, num_attention_heads, is_cross_attention, encoder_width=None, dropout=0.1):
        super().__init__()
        self.num_attention_heads = num_attention_heads
        self.attention_head_size = int(hidden_size / num_attention_heads)
        self.all_head_size = self.num_attention_heads * self.attention_head_size
        self.query = nn.Linear(hidden_size, self.all_head_size)
        if is_cross_attention:
            self.key = nn.Linear(encoder_width, self.all_head_size)
            self.value = nn.Linear(encoder_width, self.all_head_size)
        else:
            self.key = nn.Linear(hidden_size, self.all_head_size)
            self.value = nn.Linear(hidden_size, self.all_head_size)
        self.dropout = nn.Dropout(dropout)
        self.save_attention = False

    def save_attn_gradients(self, attn_gradients):
        self.attn_gradients = attn_gradients

    def save_attention_map(self, attention_map):
        self.attention_map = attention_map

    def transpose_for_scores(self, x):
        new_x_shape = x.size()[:-1] + (self.num_attention_heads, self.attention_head_size)
        x = x.view(*new_x_shape)
        return x.permute(0, 2, 1, 3)

    def forward(self, hidden_states, attention_mask=None, head_mask=None, encoder_hidden_states=None,
                encoder_attention_mask=None, output_attentions=False):
        mixed_query_layer = self.query(hidden_states)
        is_cross_attention = encoder_hidden_states is not None
        if is_cross_attention:
            key_layer = self.transpose_for_scores(self.key(encoder_hidden_states))
            value_layer = self.transpose_for_scores(self.value(encoder_hidden_states))
            attention_mask = encoder_attention_mask
        else:
            key_layer = self.transpose_for_scores(self.key(hidden_states))
            value_layer = self.transpose_for_scores(self.value(hidden_states))
        query_layer = self.transpose_for_scores(mixed_query_layer)

        # Take the dot product between "query" and "key" to get the raw attention scores.
        attention_scores = torch.matmul(query_layer, key_layer.transpose(-1, -2))
        attention_scores = attention_scores / math.sqrt(self.attention_head_size)
        if attention_mask is not None:
            attention_scores = attention_scores + attention_mask

        # Normalize the attention scores to probabilities.
        attention_probs = nn.Softmax(dim=-1)(attention_scores)

        if is_cross_attention and self.save_attention:
            self.save_attention_map(attention_probs)
            attention_probs.register_hook(self.save_attn_gradients)

        attention_probs_dropped = self.dropout(attention_probs)
        if head_mask is not None:
            attention_probs_dropped = attention_probs_dropped * head_mask

        context_layer = torch.matmul(attention_probs_dropped, value_layer)
        context_layer = context_layer.permute(0, 2, 1, 3).contiguous()
        new_context_layer_shape = context_layer.size()[:-2] + (self.all_head_size,)
        context_layer = context_layer.view(*new_context_layer_shape)
        outputs = (context_layer, attention_probs) if output_attentions else (context_layer,)
        return outputs


class BertLayer(nn.Module):
    def __init__(self, hidden_size, heads, encoder_width):
        super().__init__()
        self.attention = BertSelfAttention(hidden_size, heads, is_cross_attention=False)
        self.attention_output = nn.Linear(hidden_size, hidden_size)
        self.attention_norm = nn.LayerNorm(hidden_size, eps=1e-12)
        self.crossattention = BertSelfAttention(hidden_size, heads, is_cross_attention=True, encoder_width=encoder_width)
        self.crossattention_output = nn.Linear(hidden_size, hidden_size)
        self.crossattention_norm = nn.LayerNorm(hidden_size, eps=1e-12)
        self.intermediate = nn.Linear(hidden_size, 4 * hidden_size)
        self.output = nn.Linear(4 * hidden_size, hidden_size)
        self.output_norm = nn.LayerNorm(hidden_size, eps=1e-12)
        self.dropout = nn.Dropout(0.1)

    def forward(self, hidden_states, attention_mask, encoder_hidden_states, encoder_attention_mask):
        self_outputs = self.attention(hidden_states, attention_mask)
        x = self.attention_norm(self.dropout(self.attention_output(self_outputs[0])) + hidden_states)
        cross_outputs = self.crossattention(x, attention_mask, encoder_hidden_states=encoder_hidden_states,
                                            encoder_attention_mask=encoder_attention_mask)
        x = self.crossattention_norm(self.dropout(self.crossattention_output(cross_outputs[0])) + x)
        y = self.output(nn.functional.gelu(self.intermediate(x)))
        return self.output_norm(self.dropout(y) + x)


class BertModel(nn.Module):
    """Image-grounded text encoder: text tokens attend to ViT image embeddings."""

    def __init__(self, vocab=64, hidden_size=32, heads=4, layers=2, encoder_width=24):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden_size)
        self.layer = nn.ModuleList([BertLayer(hidden_size, heads, encoder_width) for _ in range(layers)])

    def get_extended_attention_mask(self, attention_mask, dtype):
        extended_attention_mask = attention_mask[:, None, None, :].to(dtype=dtype)
        return (1.0 - extended_attention_mask) * -10000.0

    def forward(self, input_ids, attention_mask, encoder_embeds):
        x = self.word_embeddings(input_ids)
        extended = self.get_extended_attention_mask(attention_mask, x.dtype)
        image_atts = torch.ones(encoder_embeds.size()[:-1], dtype=torch.long, device=encoder_embeds.device)
        encoder_extended = self.get_extended_attention_mask(image_atts, x.dtype)
        for layer_module in self.layer:
            x = layer_module(x, extended, encoder_embeds, encoder_extended)
        return x


def make_model():
    torch.manual_seed(0)
    input_ids = torch.randint(0, 64, (2, 10))
    attention_mask = torch.ones(2, 10, dtype=torch.long)
    attention_mask[0, -4:] = 0
    image_embeds = torch.randn(2, 17, 24)
    return BertModel(), (input_ids, attention_mask, image_embeds)
